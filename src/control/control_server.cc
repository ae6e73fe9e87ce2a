#include "control/control_server.h"

#include <arpa/inet.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/server_interceptor.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/endpoint.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "control/keepalive.h"
#include "control/listener.h"
#include "control/reason_metadata.h"
#include "control/session_hooks.h"
#include "control/status_service.h"
#include "control/switchml.grpc.pb.h"
#include "control/switchml.pb.h"
#include "control/tls_files.h"
#include "proto/wire.h"

namespace switchml::control {
namespace {

// How long Shutdown() lets in-flight RPCs finish before gRPC cancels them.
constexpr auto kShutdownGrace = std::chrono::seconds(2);

// Calls that may block (the hooks': a hierarchy's forwarded barriers and registrations) running
// at once, each on a thread of its own (Impl::RunBlocking).
constexpr size_t kMaxBlockingCalls = 1024;

// Control connections (listener.h): how long gRPC waits for a new one's first frames (a client's
// HTTP/2 preface and settings, after a TLS handshake) before it closes it, and how long it keeps
// one open without any call (a client that connects again when it needs to: a worker's stream
// keeps its connection busy for the whole job).
constexpr int kHandshakeTimeoutMs = 10000;
constexpr int kMaxConnectionIdleMs = 120000;
// Calls open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a client's
// further calls wait on its side (gRPC's default is unbounded). Above what a top-of-rack
// switch's connection carries for a full table of jobs (an Attach stream and a forwarded call
// per rack worker each).
constexpr int kMaxConcurrentStreams = 4096;
// How often (ticks of a second) the ticker gives the memory that calls freed back to the system:
// glibc's malloc keeps it. After a flood of 16,800 barriers and one of 20,000 streams the switch
// kept 296 MB resident, all of it free (malloc_trim brought it to 49 MB).
constexpr int kTrimEveryTicks = 10;
// File descriptors kept out of the control connections' share (data-plane sockets, files, gRPC's
// own); each connection takes two (gRPC's and the listener's).
constexpr uint64_t kReservedFds = 256;

// Tells the listener which connections carry calls (it never closes those to make room): called
// by gRPC as each call starts; intercepts nothing.
class CallMarker final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallMarker(Listener* listener) : listener_(listener) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (info != nullptr && info->server_context() != nullptr) {
      listener_->MarkUsed(info->server_context()->peer());
    }
    return nullptr;
  }

 private:
  Listener* listener_;
};

grpc::StatusCode ToGrpcCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
  }
  return grpc::StatusCode::UNKNOWN;
}

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(ToGrpcCode(s.code()), s.message());
}

// "host:port", bracketing IPv6 literals.
std::string HostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return "[" + host + "]:" + std::to_string(port);
  }
  return host + ":" + std::to_string(port);
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

Caller CallerOf(const grpc::CallbackServerContext* ctx) {
  Caller c;
  c.peer = ctx->peer();
  c.has_ipv4 = ParsePeerIpv4(c.peer, &c.ipv4);
  return c;
}

}  // namespace

bool ParsePeerIpv4(const std::string& peer_text, uint32_t* ipv4) {
  const std::string peer = PercentDecode(peer_text);
  if (peer.rfind("ipv4:", 0) == 0) {
    const size_t colon = peer.rfind(':');
    if (colon <= 5) return false;
    return ParseIpv4(peer.substr(5, colon - 5), ipv4);
  }
  if (peer.rfind("ipv6:", 0) == 0) {
    std::string addr = peer.substr(5);
    if (!addr.empty() && addr.front() == '[') {
      const size_t close = addr.find(']');
      if (close == std::string::npos) return false;
      addr = addr.substr(1, close - 1);
    }
    // Drop a zone ("%eth0").
    if (const size_t zone = addr.find('%'); zone != std::string::npos) addr.resize(zone);
    in6_addr a6{};
    if (inet_pton(AF_INET6, addr.c_str(), &a6) != 1) return false;
    if (IN6_IS_ADDR_LOOPBACK(&a6)) {
      *ipv4 = kLoopbackIpv4;
      return true;
    }
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      const uint8_t* b = a6.s6_addr;
      *ipv4 = (uint32_t{b[12]} << 24) | (uint32_t{b[13]} << 16) | (uint32_t{b[14]} << 8) | b[15];
      return true;
    }
  }
  return false;
}

Status ControlServerOptions::Validate() const {
  if (bind_address.empty()) {
    return InvalidArgumentError("control server bind address is empty: use e.g. 0.0.0.0");
  }
  if (data_port == 0) {
    return InvalidArgumentError("switch data port is 0: the workers need the real UDP port");
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return InvalidArgumentError("TLS needs both a certificate and its key (--tls-cert, --tls-key)");
  }
  if (!tls_client_ca_file.empty() && tls_cert_file.empty()) {
    return InvalidArgumentError(
        "mutual TLS (--tls-client-ca) needs the server's own certificate and key too");
  }
  return registry.Validate();
}

struct ControlServer::Impl {
  Impl(const ControlServerOptions& o, dataplane::LockedSwitch* sw)
      : options(o),
        registry(o.registry, sw, {}, o.registry_hooks),
        session_service(this),
        sync_service(this),
        monitor_service(this) {}

  // Barrier and Broadcast: registered with the registry, finished by its callback.
  class SyncReactor final : public grpc::ServerUnaryReactor {
   public:
    SyncReactor(Impl* impl, grpc::CallbackServerContext* ctx, const SyncRequest& q,
                switchml_proto::BroadcastResponse* broadcast_response)
        : impl_(impl),
          ctx_(ctx),
          ticket_(impl->registry.NewTicket()),
          broadcast_(q.broadcast),
          job_id_(q.job_id) {
      impl->registry.Sync(
          ticket_, q, CallerOf(ctx),
          [this, broadcast_response](const Status& st, ErrorReason reason, uint64_t value) {
            if (broadcast_response != nullptr) broadcast_response->set_value(value);
            SetReason(ctx_, reason);
            Finish(ToGrpc(st));
          });
      // Shortly before the caller's deadline, end the wait here with the ranks that did not
      // arrive (Registry::ExpireWait): the caller's own deadline could only say that one is
      // missing. The margin covers the answer's way back; a caller whose deadline passes
      // first gets its own error, as before. The alarm's callback holds no pointer to this
      // reactor, which may be gone when it runs (it is then cancelled: ok == false).
      const auto now = std::chrono::system_clock::now();
      const auto deadline = ctx->deadline();
      if (deadline > now && deadline - now < std::chrono::hours(24)) {
        const auto margin = std::clamp<std::chrono::system_clock::duration>(
            (deadline - now) / 10, std::chrono::milliseconds(20), std::chrono::milliseconds(500));
        expiry_.Set(deadline - margin, [impl, ticket = ticket_](bool ok) {
          if (ok) impl->registry.ExpireWait(ticket);
        });
      }
    }
    void OnCancel() override {
      // (The text is made here, on the cancelling thread, from plain fields: under TSan this
      // file is not instrumented, but std::string's code may be, and TSan cannot see how gRPC
      // orders this call after the constructor.)
      const std::string scope =
          std::string(broadcast_ ? "broadcast" : "barrier") +
          (job_id_ == 0 ? " (unscoped)" : " of session " + std::to_string(job_id_));
      const bool late = std::chrono::system_clock::now() >= ctx_->deadline();
      impl_->registry.CancelWait(ticket_, late ? DeadlineExceededError(scope + ": deadline passed")
                                               : CancelledError(scope + ": cancelled"));
    }
    void OnDone() override { delete this; }

   private:
    Impl* impl_;
    grpc::CallbackServerContext* ctx_;
    const uint64_t ticket_;
    const bool broadcast_;
    const uint64_t job_id_;
    grpc::Alarm expiry_;
  };

  // One worker's Attach stream. The registry may end it (job failed or closed) or confirm a
  // check from any thread, through `Shared`, which outlives the reactor.
  class AttachReactor final
      : public grpc::ServerBidiReactor<switchml_proto::AttachRequest, switchml_proto::AttachEvent> {
   public:
    AttachReactor(Impl* impl, grpc::CallbackServerContext* ctx)
        : impl_(impl),
          caller_(CallerOf(ctx)),
          ticket_(impl->registry.NewTicket()),
          shared_(std::make_shared<Shared>()) {
      shared_->reactor = this;
      // Counted from now on, not from its first message: a stream that never sends one is a
      // stranger's call until it is evicted or times out (Registry::OpenStream).
      if (Status st = impl->registry.OpenStream(
              ticket_, caller_,
              [shared = shared_](const Status& why) { shared->Finish(ToGrpc(why)); });
          !st.ok()) {
        shared_->Finish(ToGrpc(st));
        return;
      }
      StartSendInitialMetadata();
      StartRead(&request_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {  // the worker closed its side, or the connection broke
        impl_->registry.Detach(ticket_);
        shared_->Finish(grpc::Status::OK);
        return;
      }
      if (!attached_) {
        if (SessionHooks* hooks = impl_->options.hooks) {
          if (Status st = hooks->BeforeAttach(&request_); !st.ok()) {
            shared_->Finish(ToGrpc(st));
            return;
          }
        }
        AttachRequest q;
        q.job_id = request_.session_id();
        q.rank = request_.rank();
        q.secret = request_.job_secret();
        q.label = request_.member();
        q.opened = true;
        std::weak_ptr<Shared> weak = shared_;
        Status st = impl_->registry.Attach(
            ticket_, q, caller_,
            [shared = shared_](const Status& why) { shared->Finish(ToGrpc(why)); },
            [weak](uint64_t allreduce) {
              if (auto s = weak.lock()) s->Write(allreduce);
            });
        if (!st.ok()) {
          shared_->Finish(ToGrpc(st));
          return;
        }
        attached_ = true;
      } else if (!request_.failure().empty()) {
        impl_->registry.ReportFailure(ticket_, request_.failure());
      } else {
        impl_->registry.Report(ticket_, request_.op(), request_.count(), request_.dtype());
      }
      if (!shared_->finished()) StartRead(&request_);
    }
    void OnWriteDone(bool ok) override { shared_->WriteDone(ok); }
    void OnCancel() override {
      impl_->registry.Detach(ticket_);
      shared_->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    }
    void OnDone() override {
      {
        std::lock_guard lock(shared_->mu);
        shared_->reactor = nullptr;
      }
      delete this;
    }

   private:
    struct Shared {
      std::mutex mu;
      AttachReactor* reactor = nullptr;  // null once done
      bool is_finished = false;
      bool writing = false;
      std::deque<switchml_proto::AttachEvent> queue;  // front: being written

      bool finished() {
        std::lock_guard lock(mu);
        return is_finished;
      }
      void Finish(const grpc::Status& status) {
        AttachReactor* r;
        {
          std::lock_guard lock(mu);
          if (is_finished || reactor == nullptr) return;
          is_finished = true;
          r = reactor;
        }
        // Outside mu (OnDone takes it). r stays valid: only this Finish can lead to OnDone.
        r->Finish(status);
      }
      void Write(uint64_t allreduce) {
        std::lock_guard lock(mu);
        if (is_finished || reactor == nullptr) return;
        queue.emplace_back().set_op(allreduce);
        if (!writing) {
          writing = true;
          reactor->StartWrite(&queue.front());
        }
      }
      void WriteDone(bool ok) {
        std::lock_guard lock(mu);
        queue.pop_front();
        if (!ok || is_finished || queue.empty() || reactor == nullptr) {
          writing = false;
          return;
        }
        reactor->StartWrite(&queue.front());
      }
    };

    Impl* impl_;
    const Caller caller_;
    const uint64_t ticket_;
    std::shared_ptr<Shared> shared_;
    switchml_proto::AttachRequest request_;
    bool attached_ = false;
  };

  class SessionService final : public switchml_proto::Session::CallbackService {
   public:
    explicit SessionService(Impl* impl) : impl_(impl) {}
    grpc::ServerUnaryReactor* RdmaSession(grpc::CallbackServerContext* ctx,
                                          const switchml_proto::RdmaSessionRequest*,
                                          switchml_proto::RdmaSessionResponse*) override {
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                   "RDMA sessions are not supported by the software switch; use "
                                   "UDP"));
      return reactor;
    }
    grpc::ServerUnaryReactor* UdpSession(grpc::CallbackServerContext* ctx,
                                         const switchml_proto::UdpSessionRequest* req,
                                         switchml_proto::UdpSessionResponse* resp) override {
      if (impl_->options.hooks != nullptr) {  // the hooks may block
        return impl_->RunBlocking(
            ctx, req->session_id(), req->job_secret(), /*upstream=*/false,
            [impl = impl_, ctx, req, resp] { return impl->UdpSession(ctx, *req, resp); });
      }
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(impl_->UdpSession(ctx, *req, resp));
      return reactor;
    }
    grpc::ServerUnaryReactor* Close(grpc::CallbackServerContext* ctx,
                                    const switchml_proto::CloseRequest* req,
                                    switchml_proto::CloseResponse*) override {
      auto* reactor = ctx->DefaultReactor();
      switchml_proto::CloseRequest mapped = *req;
      if (SessionHooks* hooks = impl_->options.hooks) {
        if (Status st = hooks->BeforeClose(&mapped); !st.ok()) {
          reactor->Finish(ToGrpc(st));
          return reactor;
        }
        req = &mapped;
      }
      CloseRequest q;
      q.job_id = req->session_id();
      q.secret = req->job_secret();
      q.has_rank = req->has_rank();
      q.rank = req->rank();
      q.failure = req->failure();
      reactor->Finish(ToGrpc(impl_->registry.Close(q, CallerOf(ctx))));
      return reactor;
    }
    grpc::ServerUnaryReactor* Diagnose(grpc::CallbackServerContext* ctx,
                                       const switchml_proto::DiagnoseRequest* req,
                                       switchml_proto::DiagnoseResponse* resp) override {
      auto* reactor = ctx->DefaultReactor();
      Result<std::string> text =
          impl_->registry.DescribeAllReduce(req->session_id(), req->job_secret(), req->op());
      if (text.ok()) resp->set_text(*text);
      reactor->Finish(ToGrpc(text.status()));
      return reactor;
    }
    grpc::ServerBidiReactor<switchml_proto::AttachRequest, switchml_proto::AttachEvent>* Attach(
        grpc::CallbackServerContext* ctx) override {
      return new AttachReactor(impl_, ctx);
    }

   private:
    Impl* impl_;
  };

  // Monitor.Status: read-only (status_service.h).
  class MonitorService final : public switchml_proto::Monitor::CallbackService {
   public:
    explicit MonitorService(Impl* impl) : impl_(impl) {}
    grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                     const switchml_proto::StatusRequest* req,
                                     switchml_proto::StatusResponse* resp) override {
      auto* reactor = ctx->DefaultReactor();
      std::optional<SwitchSnapshot> snapshot;
      if (impl_->options.snapshot) snapshot = impl_->options.snapshot();
      reactor->Finish(AnswerStatus(impl_->registry, impl_->call_stats,
                                   snapshot ? &*snapshot : nullptr, *req, resp));
      return reactor;
    }

   private:
    Impl* impl_;
  };

  class SyncService final : public switchml_proto::Sync::CallbackService {
   public:
    explicit SyncService(Impl* impl) : impl_(impl) {}
    grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                      const switchml_proto::BarrierRequest* req,
                                      switchml_proto::BarrierResponse*) override {
      if (SessionHooks* hooks = impl_->options.hooks; hooks != nullptr && hooks->ForwardsSync()) {
        // (The upstream switch's reason goes on with its error: a top-of-rack switch passes
        // its answer on.)
        return impl_->RunBlocking(
            ctx, req->session_id(), req->job_secret(), /*upstream=*/true, [hooks, ctx, req] {
              ErrorReason reason = ErrorReason::kNone;
              const Status st = hooks->Barrier(*req, ctx->deadline(), &reason);
              SetReason(ctx, reason);
              return ToGrpc(st);
            });
      }
      SyncRequest q;
      q.job_id = req->session_id();
      q.num_workers = req->num_workers();
      q.secret = req->job_secret();
      q.has_rank = req->has_rank();
      q.rank = req->rank();
      return new SyncReactor(impl_, ctx, q, nullptr);
    }
    grpc::ServerUnaryReactor* Broadcast(grpc::CallbackServerContext* ctx,
                                        const switchml_proto::BroadcastRequest* req,
                                        switchml_proto::BroadcastResponse* resp) override {
      if (SessionHooks* hooks = impl_->options.hooks; hooks != nullptr && hooks->ForwardsSync()) {
        return impl_->RunBlocking(
            ctx, req->session_id(), req->job_secret(), /*upstream=*/true, [hooks, ctx, req, resp] {
              ErrorReason reason = ErrorReason::kNone;
              Result<uint64_t> r = hooks->Broadcast(*req, ctx->deadline(), &reason);
              if (r.ok()) resp->set_value(r.value());
              SetReason(ctx, reason);
              return ToGrpc(r.status());
            });
      }
      SyncRequest q;
      q.broadcast = true;
      q.job_id = req->session_id();
      q.num_workers = req->num_workers();
      q.secret = req->job_secret();
      q.has_rank = true;
      q.rank = req->rank();
      q.root = req->root();
      q.value = req->value();
      return new SyncReactor(impl_, ctx, q, resp);
    }

   private:
    Impl* impl_;
  };

  grpc::Status UdpSession(grpc::CallbackServerContext* ctx,
                          const switchml_proto::UdpSessionRequest& request,
                          switchml_proto::UdpSessionResponse* resp) {
    switchml_proto::UdpSessionRequest req = request;  // the hierarchy's hooks may rewrite it
    SessionHooks* hooks = options.hooks;
    if (hooks != nullptr) {
      if (Status st = hooks->BeforeUdpSession(&req, ctx->deadline()); !st.ok()) {
        registry.Fail(
            req.session_id(), req.job_secret(),
            FailedPreconditionError("session " + std::to_string(req.session_id()) +
                                    " failed at setup: rank " + std::to_string(request.rank()) +
                                    " was refused: " + st.message()));
        return ToGrpc(st);
      }
    }
    RegisterRequest q;
    q.job_id = req.session_id();
    q.rank = req.rank();
    q.num_workers = req.num_workers();
    q.ipv4 = req.ipv4();
    q.packet_size = req.packet_size();
    q.udp_port = req.udp_port();
    q.num_udp_ports = req.num_udp_ports();
    q.max_outstanding_packets = req.max_outstanding_packets();
    q.running_tsi = req.running_tsi();
    q.secret = req.job_secret();
    q.authenticate_data = req.authenticate_data();
    q.multicast_group_ipv4 = req.multicast_group_ipv4();
    q.multicast_group_port = req.multicast_group_port();
    q.switch_list = req.switch_list();
    q.sparse = req.sparse();
    q.sparse_auto = req.sparse_auto();
    std::string data_key;
    bool multicast_group_kept = false;
    Status st = registry.Register(q, CallerOf(ctx), &data_key, &multicast_group_kept);
    if (!st.ok()) {
      if (hooks != nullptr) hooks->UdpSessionRefused(request, req, st);
      return ToGrpc(st);
    }
    if (hooks != nullptr) {
      if (st = hooks->AfterUdpSession(request, req, ctx->deadline()); !st.ok()) {
        registry.Fail(
            req.session_id(), req.job_secret(),
            FailedPreconditionError("session " + std::to_string(req.session_id()) +
                                    " failed at setup: rank " + std::to_string(request.rank()) +
                                    " was refused: " + st.message()));
        return ToGrpc(st);
      }
    }
    const dataplane::SwitchConfig& config = registry_switch_config;
    resp->set_session_id(req.session_id());
    resp->set_mac(0);
    resp->set_ipv4(options.switch_ipv4);
    resp->set_udp_port(options.data_port);
    resp->set_max_workers(config.max_workers_per_job);
    resp->set_num_slots(config.slots_per_job);
    resp->set_num_data_ports(options.num_data_ports);
    resp->set_data_key(data_key);
    resp->set_multicast_group_kept(multicast_group_kept);
    resp->set_sparse(q.sparse);  // the job spec, which every rank sent alike
    resp->set_sparse_auto(q.sparse_auto);
    return grpc::Status::OK;
  }

  // Runs `work` (a call that may block: the hooks') on a thread of its own and answers the call
  // with its status. gRPC's callback API runs handlers on a small pool of threads (gRPC 1.51: 2
  // on a 2-core host) that also serve every other call: a handler that waits there (a forwarded
  // barrier waits for the whole job at the upstream switch) would hold one, and a few such
  // waits would stop the control plane, the waits' own peers included (a rack's third worker's
  // barrier was never read). Each is admitted by the registry first, as a member's call of the
  // job of job_id when it carries that job's secret, else as a stranger's
  // (Registry::AdmitForwarded: the threads and this switch's calls upstream stay bounded); and
  // at most kMaxBlockingCalls at once (RESOURCE_EXHAUSTED beyond). Shutdown joins them once gRPC
  // is done with the calls.
  grpc::ServerUnaryReactor* RunBlocking(grpc::CallbackServerContext* ctx, uint64_t job_id,
                                        const std::string& secret, bool upstream,
                                        std::function<grpc::Status()> work) {
    auto* reactor = ctx->DefaultReactor();
    const uint64_t ticket = registry.NewTicket();
    if (Status st = registry.AdmitForwarded(ticket, CallerOf(ctx), job_id, secret, upstream);
        !st.ok()) {
      reactor->Finish(ToGrpc(st));
      return reactor;
    }
    std::lock_guard lock(blocking_mu);
    // Join the threads that are done (each holds a stack until joined).
    for (auto it = blocking_threads.begin(); it != blocking_threads.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = blocking_threads.erase(it);
      } else {
        ++it;
      }
    }
    if (blocking_closed) {
      registry.ReleaseForwarded(ticket);
      reactor->Finish(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "the switch control plane is shutting down"));
      return reactor;
    }
    if (blocking_threads.size() >= kMaxBlockingCalls) {
      registry.ReleaseForwarded(ticket);
      reactor->Finish(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          "the switch already has " + std::to_string(kMaxBlockingCalls) +
              " calls waiting for its upstream switch or its rack's first rank, its limit"));
      return reactor;
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    blocking_threads.push_back(
        BlockingThread{std::thread([this, reactor, work = std::move(work), done, ticket] {
                         grpc::Status status = work();
                         registry.ReleaseForwarded(ticket);
                         reactor->Finish(status);  // (the call, and ctx, may be gone after this)
                         done->store(true);
                       }),
                       done});
    return reactor;
  }

  void Tick() {
    std::unique_lock lock(ticker_mu);
    for (int tick = 1; !ticker_stop; ++tick) {
      ticker_cv.wait_for(lock, std::chrono::seconds(1));
      if (ticker_stop) break;
      lock.unlock();
      registry.Tick();
#ifdef __GLIBC__
      if (tick % kTrimEveryTicks == 0) malloc_trim(0);
#endif
      lock.lock();
    }
  }

  void Shutdown() {
    std::lock_guard shutdown_lock(shutdown_mu);
    if (shut_down) return;
    shut_down = true;
    {
      std::lock_guard lock(ticker_mu);
      ticker_stop = true;
      ticker_cv.notify_all();
    }
    if (ticker.joinable()) ticker.join();
    if (listener) listener->Stop();
    registry.Shutdown();
    if (server) server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    // gRPC has no calls left: each blocking thread answered its call (the hooks' waits end by
    // their own bounds; their owner releases them first, e.g. Uplink::Shutdown).
    std::list<BlockingThread> threads;
    {
      std::lock_guard lock(blocking_mu);
      blocking_closed = true;
      threads.swap(blocking_threads);
    }
    for (BlockingThread& t : threads) t.thread.join();
  }

  const ControlServerOptions options;
  dataplane::SwitchConfig registry_switch_config;
  Registry registry;
  SessionService session_service;
  SyncService sync_service;
  MonitorService monitor_service;
  CallStats call_stats;  // filled by the interceptor installed in Start
  std::unique_ptr<Listener> listener;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor;
  std::unique_ptr<grpc::Server> server;
  uint16_t port = 0;
  std::mutex shutdown_mu;
  bool shut_down = false;
  std::mutex ticker_mu;
  std::condition_variable ticker_cv;
  bool ticker_stop = false;
  std::thread ticker;
  // RunBlocking's threads, and whether it still starts them.
  struct BlockingThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex blocking_mu;
  std::list<BlockingThread> blocking_threads;
  bool blocking_closed = false;
};

ControlServer::ControlServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ControlServer::~ControlServer() { Shutdown(); }

uint16_t ControlServer::port() const { return impl_->port; }

void ControlServer::Shutdown() { impl_->Shutdown(); }

ControlServer::ConnectionStats ControlServer::connection_stats() const {
  const Listener::Stats s = impl_->listener->stats();
  return ConnectionStats{s.open, s.accepted, s.refused, s.evicted, s.shed};
}

Registry& ControlServer::registry() { return impl_->registry; }

const Registry& ControlServer::registry() const { return impl_->registry; }

const CallStats& ControlServer::call_stats() const { return impl_->call_stats; }

namespace {
// Whether gRPC takes these TLS credentials: it refuses a certificate that is not one or a key
// that does not match it only when it builds a listening port with them, which an external
// connection acceptor does not report. So a throw-away server on a loopback port tries them.
bool GrpcTakesCredentials(const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", credentials, &port);
  switchml_proto::Sync::CallbackService unimplemented;  // gRPC needs a service to start
  builder.RegisterService(&unimplemented);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return false;
  server->Shutdown();
  return port != 0;
}

Result<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const ControlServerOptions& options) {
  if (options.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  ASSIGN_OR_RETURN(std::string cert, ReadTlsPem(options.tls_cert_file, "certificate"));
  ASSIGN_OR_RETURN(std::string key, ReadTlsPem(options.tls_key_file, "key"));
  const bool mutual = !options.tls_client_ca_file.empty();
  grpc::SslServerCredentialsOptions ssl(
      mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (mutual) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadTlsPem(options.tls_client_ca_file, "client CA"));
  }
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}
}  // namespace

Result<std::unique_ptr<ControlServer>> ControlServer::Start(const ControlServerOptions& options,
                                                            dataplane::LockedSwitch* sw) {
  RETURN_IF_ERROR(options.Validate());
  if (sw == nullptr) return InvalidArgumentError("ControlServer::Start needs a switch");
  ASSIGN_OR_RETURN(auto credentials, ServerCredentialsFor(options));
  if (!options.tls_cert_file.empty() && !GrpcTakesCredentials(credentials)) {
    return InvalidArgumentError(
        "cannot listen for the control plane with the TLS certificate " + options.tls_cert_file +
        " and key " + options.tls_key_file +
        ": gRPC refused them (is the certificate a PEM certificate chain and the key its "
        "private key? `openssl x509 -noout -pubkey -in CERT` and `openssl pkey -pubout -in "
        "KEY` must print the same key)");
  }
  auto impl = std::make_unique<Impl>(options, sw);
  impl->registry_switch_config = sw->sw.config();
  const std::string address = HostPort(options.bind_address, options.port);

  // Our own listener (listener.h): gRPC 1.51's stops for good when the process runs out of
  // file descriptors.
  const uint64_t fds = RaiseOpenFileLimit();
  ListenerOptions lo;
  lo.bind_address = options.bind_address;
  lo.port = options.port;
  lo.limits.per_address = std::max<uint32_t>(1, options.max_connections_per_address);
  lo.limits.total =
      static_cast<uint32_t>(std::clamp<uint64_t>(fds > kReservedFds ? (fds - kReservedFds) / 2 : 16,
                                                 16, std::max(16u, options.max_connections)));
  auto listener = Listener::Bind(lo);
  if (!listener.ok()) {
    return UnavailableError("cannot listen for the control plane on " + address + " (" +
                            listener.status().message() +
                            "; is the port in use, e.g. by another `switchml switch`, or the "
                            "address not local?): pick another --control-port");
  }
  impl->listener = std::move(listener).value();

  grpc::ServerBuilder builder;
  impl->acceptor = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, credentials);
  // A connection that sends no frame within this long is closed; one without calls for longer
  // than kMaxConnectionIdleMs too (its client reconnects when it needs to).
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kMaxConnectionIdleMs);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreams);
  // Keepalive pings on idle connections, so that a worker host that vanishes (no FIN, no RST)
  // is noticed in bounded time while a stalled one is not failed (control/keepalive.h).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Workers ping every kKeepaliveTimeMs too (to notice a switch that vanished): accept pings
  // twice as often, and never count a ping as a strike against its sender.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveTimeMs / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Control messages are small: refuse big ones before they are parsed.
  builder.SetMaxReceiveMessageSize(64 << 10);
  builder.RegisterService(&impl->session_service);
  builder.RegisterService(&impl->sync_service);
  builder.RegisterService(&impl->monitor_service);
  {
    // The call counts, and which connections carry calls (the listener never closes those to
    // make room).
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeCallStatsInterceptor(&impl->call_stats));
    creators.push_back(std::make_unique<CallMarker>(impl->listener.get()));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr) {
    impl->listener.reset();
    return InternalError("gRPC could not start the control plane on " + address);
  }
  const int selected_port = impl->listener->port();
  impl->listener->Start([acceptor = impl->acceptor.get()](int fd) {
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
    p.fd = fd;
    acceptor->HandleNewConnection(&p);
  });
  impl->port = static_cast<uint16_t>(selected_port);
  impl->ticker = std::thread([p = impl.get()] { p->Tick(); });
  LOG(kInfo, kControl) << "control plane listening on "
                       << HostPort(options.bind_address, impl->port)
                       << (options.tls_cert_file.empty()        ? " (plaintext)"
                           : options.tls_client_ca_file.empty() ? " (TLS)"
                                                                : " (mutual TLS)");
  return std::unique_ptr<ControlServer>(new ControlServer(std::move(impl)));
}

}  // namespace switchml::control
