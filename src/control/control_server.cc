#include "control/control_server.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include <cctype>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/endpoint.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "control/switchml.grpc.pb.h"
#include "control/switchml.pb.h"
#include "proto/wire.h"

namespace switchml::control {
namespace {

// How often a waiting Barrier/Broadcast wakes up to look at cancellation and its deadline.
constexpr auto kWaitSlice = std::chrono::milliseconds(50);
// Enough threads for many workers blocked in barriers at once.
constexpr int kMaxServerThreads = 1024;
// How long Shutdown() lets in-flight RPCs finish before gRPC cancels them.
constexpr auto kShutdownGrace = std::chrono::seconds(2);
constexpr uint32_t kDefaultWindow = 256;

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

enum class SyncKind : uint8_t { kBarrier, kBroadcast };

// One rendezvous scope: a session's barrier (or broadcast), or the unscoped group of a
// num_workers (session_id 0).
struct ScopeKey {
  SyncKind kind;
  uint64_t session_id;
  uint32_t unscoped_num_workers;  // 0 for scoped keys
  auto operator<=>(const ScopeKey&) const = default;
};

std::string ScopeName(const ScopeKey& key) {
  const char* what = key.kind == SyncKind::kBarrier ? "barrier" : "broadcast";
  if (key.session_id == 0) {
    return std::string("unscoped ") + what + " of " + std::to_string(key.unscoped_num_workers) +
           " workers";
  }
  return std::string(what) + " of session " + std::to_string(key.session_id);
}

// The round currently filling in one scope. Shared between the waiting calls so that a call
// always reads the outcome of its own round, even after the scope has moved on.
struct Round {
  uint32_t num_workers = 0;
  uint32_t arrived = 0;
  bool done = false;
  // Set when the round is torn down without completing (session failed, server shutting down).
  grpc::Status failure;
  bool failed = false;
  // Broadcast only.
  uint32_t root = 0;
  uint64_t value = 0;
  std::vector<bool> rank_arrived;
  std::condition_variable cv;
};

// One Barrier or Broadcast call.
struct SyncCall {
  ScopeKey key;
  uint32_t num_workers = 0;
  uint32_t rank = 0;
  uint32_t root = 0;
  uint64_t value = 0;
};

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
  return Status::Ok();
}

struct ControlServer::Impl {
  Impl(const ControlServerOptions& o, dataplane::LockedSwitch* s)
      : options(o), sw(s), session_service(this), sync_service(this) {}

  // Handlers of the two gRPC services; each forwards to the Impl.
  class SessionService final : public switchml_proto::Session::Service {
   public:
    explicit SessionService(Impl* impl) : impl_(impl) {}
    grpc::Status RdmaSession(grpc::ServerContext*, const switchml_proto::RdmaSessionRequest*,
                             switchml_proto::RdmaSessionResponse*) override {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "RDMA sessions are not supported by the software switch; use UDP");
    }
    grpc::Status UdpSession(grpc::ServerContext* ctx, const switchml_proto::UdpSessionRequest* req,
                            switchml_proto::UdpSessionResponse* resp) override {
      return impl_->UdpSession(ctx, *req, resp);
    }

   private:
    Impl* impl_;
  };

  class SyncService final : public switchml_proto::Sync::Service {
   public:
    explicit SyncService(Impl* impl) : impl_(impl) {}
    grpc::Status Barrier(grpc::ServerContext* ctx, const switchml_proto::BarrierRequest* req,
                         switchml_proto::BarrierResponse*) override {
      if (impl_->options.hooks != nullptr) {
        if (auto st = impl_->options.hooks->Barrier(*req)) return ToGrpc(*st);
      }
      SyncCall call;
      call.key = {SyncKind::kBarrier, req->session_id(),
                  req->session_id() == 0 ? req->num_workers() : 0};
      call.num_workers = req->num_workers();
      uint64_t unused = 0;
      return impl_->Rendezvous(ctx, call, &unused);
    }
    grpc::Status Broadcast(grpc::ServerContext* ctx, const switchml_proto::BroadcastRequest* req,
                           switchml_proto::BroadcastResponse* resp) override {
      if (impl_->options.hooks != nullptr) {
        if (auto r = impl_->options.hooks->Broadcast(*req)) {
          if (r->ok()) resp->set_value(r->value());
          return ToGrpc(r->status());
        }
      }
      SyncCall call;
      call.key = {SyncKind::kBroadcast, req->session_id(),
                  req->session_id() == 0 ? req->num_workers() : 0};
      call.num_workers = req->num_workers();
      call.rank = req->rank();
      call.root = req->root();
      call.value = req->value();
      uint64_t value = 0;
      grpc::Status st = impl_->Rendezvous(ctx, call, &value);
      if (st.ok()) resp->set_value(value);
      return st;
    }

   private:
    Impl* impl_;
  };

  grpc::Status UdpSession(grpc::ServerContext* ctx, const switchml_proto::UdpSessionRequest& req,
                          switchml_proto::UdpSessionResponse* resp);
  // Registers the worker in the switch; the Status says why it was refused.
  Status RegisterUdpWorker(grpc::ServerContext* ctx, const switchml_proto::UdpSessionRequest& req);
  // Marks a session failed (keeping the first reason) and releases its waiting sync calls.
  void FailSession(uint64_t session_id, const std::string& reason);
  grpc::Status Rendezvous(grpc::ServerContext* ctx, const SyncCall& call, uint64_t* value);
  // Tears a round down: its waiting calls return `failure`. Requires mu.
  void FailRoundLocked(std::map<ScopeKey, std::shared_ptr<Round>>::iterator it,
                       const grpc::Status& failure);
  void Shutdown();

  const ControlServerOptions options;
  dataplane::LockedSwitch* const sw;  // not owned
  SessionService session_service;
  SyncService sync_service;
  // Declared after the services: destroyed (stopped) before them.
  std::unique_ptr<grpc::Server> server;
  uint16_t port = 0;

  std::mutex shutdown_mu;  // serializes Shutdown()

  mutable std::mutex mu;  // guards everything below
  bool shutting_down = false;
  // Sessions whose setup refused a worker -> the message their sync calls fail with, and when.
  // A mark fails the session's waiting and later calls for options.failure_memory.
  struct Failure {
    std::string message;
    std::chrono::steady_clock::time_point at;
  };
  std::unordered_map<uint64_t, Failure> failed_sessions;
  // The message of a session's current failure mark, or nullptr (expired marks are removed).
  const std::string* FailureOf(uint64_t session_id);
  // Marks a session failed (keeping a current mark's message); returns the message in force.
  const std::string& MarkFailed(uint64_t session_id, const std::string& message);
  // The round filling in each scope; erased when it completes, fails or empties.
  std::map<ScopeKey, std::shared_ptr<Round>> rounds;
  uint32_t waiting = 0;
};

grpc::Status ControlServer::Impl::UdpSession(grpc::ServerContext* ctx,
                                             const switchml_proto::UdpSessionRequest& request,
                                             switchml_proto::UdpSessionResponse* resp) {
  switchml_proto::UdpSessionRequest req = request;  // the hooks may rewrite it
  {
    std::lock_guard lock(mu);
    if (shutting_down) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the switch control plane is shutting down");
    }
  }
  SessionHooks* hooks = options.hooks;
  Status st = hooks != nullptr ? hooks->BeforeUdpSession(&req) : Status::Ok();
  if (st.ok()) st = RegisterUdpWorker(ctx, req);
  if (st.ok() && hooks != nullptr) st = hooks->AfterUdpSession(req);
  if (!st.ok()) {
    LOG(kWarning, kControl) << "session " << req.session_id() << ": rank " << req.rank()
                            << " refused: " << st.ToString();
    FailSession(req.session_id(), "session " + std::to_string(req.session_id()) +
                                      " failed at setup: rank " + std::to_string(req.rank()) +
                                      " was refused: " + st.message());
    return ToGrpc(st);
  }
  resp->set_session_id(req.session_id());
  resp->set_mac(0);
  resp->set_ipv4(options.switch_ipv4);
  resp->set_udp_port(options.data_port);
  resp->set_num_data_ports(options.num_data_ports);
  resp->set_max_workers(sw->sw.config().max_workers_per_job);
  resp->set_num_slots(sw->sw.config().slots_per_job);
  return grpc::Status::OK;
}

Status ControlServer::Impl::RegisterUdpWorker(grpc::ServerContext* ctx,
                                              const switchml_proto::UdpSessionRequest& req) {
  const uint64_t session = req.session_id();
  const std::string session_name = "session " + std::to_string(session);
  const uint32_t rank = req.rank();
  const uint32_t num_workers = req.num_workers();

  const int packet_size = req.packet_size();
  if (!switchml_proto::PacketSize_IsValid(packet_size)) {
    return InvalidArgumentError("packet size " + std::to_string(packet_size) +
                                " is not a PacketSize; use 64 or 256 elements per packet");
  }
  const auto size = static_cast<proto::SizeCode>(packet_size);
  if (!proto::IsSupportedSize(size)) {
    return InvalidArgumentError(
        "packet size " +
        switchml_proto::PacketSize_Name(static_cast<switchml_proto::PacketSize>(packet_size)) +
        " is not supported; use 64 or 256 elements per packet");
  }
  if (num_workers == 0) {
    return InvalidArgumentError(session_name + ": num_workers is 0; it must be at least 1");
  }
  if (rank >= num_workers) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is out of range for " +
                                std::to_string(num_workers) + " workers (ranks are 0.." +
                                std::to_string(num_workers - 1) + ")");
  }
  const uint32_t num_ports = req.num_udp_ports() == 0 ? 1 : req.num_udp_ports();
  const uint32_t window =
      req.max_outstanding_packets() == 0 ? kDefaultWindow : req.max_outstanding_packets();
  if (req.udp_port() == 0 && num_ports > 1) {
    return InvalidArgumentError(
        "udp_port 0 (any port) cannot go with " + std::to_string(num_ports) +
        " UDP ports per worker: replies are routed by port offset from each worker's base port, "
        "so register the base port");
  }
  if (req.udp_port() > 65535 ||
      (req.udp_port() != 0 && uint64_t{req.udp_port()} + num_ports > 65536)) {
    return InvalidArgumentError("UDP ports [" + std::to_string(req.udp_port()) + ", " +
                                std::to_string(uint64_t{req.udp_port()} + num_ports) +
                                ") do not fit below 65536");
  }

  dataplane::WorkerSpec worker;
  worker.port = static_cast<uint16_t>(req.udp_port());
  worker.ipv4 = req.ipv4();
  if (worker.ipv4 == 0 && !ParsePeerIpv4(ctx->peer(), &worker.ipv4)) {
    return InvalidArgumentError("cannot tell the worker's IPv4 address from the gRPC peer \"" +
                                ctx->peer() +
                                "\": send it in UdpSessionRequest.ipv4 (the worker's data-plane "
                                "address, host byte order)");
  }

  if (rank != 0) {
    std::lock_guard lock(mu);
    if (const std::string* failure = FailureOf(session)) {
      return FailedPreconditionError(*failure);
    }
  }

  dataplane::JobSpec spec;
  spec.session_id = session;
  spec.num_workers = num_workers;
  spec.size = size;
  spec.num_ports = num_ports;
  spec.max_outstanding_packets = window;
  spec.running_tsi = req.running_tsi();
  std::vector<uint64_t> evicted;  // dead jobs the switch removed to make room (logged below)
  {
    std::lock_guard lock(sw->mu);
    if (rank == 0) {
      RETURN_IF_ERROR(sw->sw.CreateJob(spec, &evicted));
      Status added = sw->sw.AddWorker(session, 0, worker, &evicted);
      if (!added.ok()) {
        // Without rank 0 the job can never run: do not leave it holding a job entry.
        sw->sw.RemoveJob(session).IgnoreError();
        return added;
      }
    } else {
      const dataplane::JobSpec* job = sw->sw.FindJob(session);
      if (job == nullptr) {
        return FailedPreconditionError(session_name +
                                       " does not exist on the switch: rank 0 must open it "
                                       "before the other ranks (was rank 0 started, and with the "
                                       "same session id?)");
      }
      auto mismatch = [&](const std::string& field, const std::string& mine,
                          const std::string& theirs, const std::string& fix) {
        return InvalidArgumentError(field + " " + mine + " does not match " + session_name + "'s " +
                                    theirs + " (set by rank 0): " + fix);
      };
      if (job->num_workers != num_workers) {
        return mismatch("num_workers", std::to_string(num_workers),
                        std::to_string(job->num_workers),
                        "start every worker with the same --workers");
      }
      if (job->size != size) {
        return mismatch(
            "packet size",
            switchml_proto::PacketSize_Name(static_cast<switchml_proto::PacketSize>(size)),
            switchml_proto::PacketSize_Name(static_cast<switchml_proto::PacketSize>(job->size)),
            "start every worker with the same elements per packet");
      }
      if (job->num_ports != num_ports) {
        return mismatch("num_udp_ports", std::to_string(num_ports), std::to_string(job->num_ports),
                        "start every worker with the same number of worker threads");
      }
      if (job->max_outstanding_packets != window) {
        return mismatch("max_outstanding_packets", std::to_string(window),
                        std::to_string(job->max_outstanding_packets),
                        "start every worker with the same window (max outstanding packets)");
      }
      if (job->running_tsi != spec.running_tsi) {
        return mismatch("running_tsi", spec.running_tsi ? "true" : "false",
                        job->running_tsi ? "true" : "false",
                        "do not mix this project's workers with other clients in one job");
      }
      RETURN_IF_ERROR(sw->sw.AddWorker(session, rank, worker, &evicted));
    }
  }
  for (uint64_t gone : evicted) {
    LOG(kInfo, kControl) << "session " << gone << " evicted from the switch to make room for "
                         << session_name << " (its ports were taken over, or it was the least "
                         << "recently active job)";
    std::lock_guard lock(mu);
    failed_sessions.erase(gone);
  }

  if (rank == 0) {
    std::lock_guard lock(mu);
    failed_sessions.erase(session);
  }
  LOG(kInfo, kControl) << session_name << ": rank " << rank << " of " << num_workers
                       << " registered at " << Ipv4ToString(worker.ipv4) << " ports "
                       << (worker.port == 0
                               ? std::string("any")
                               : std::to_string(worker.port) + "+" + std::to_string(num_ports))
                       << (rank == 0 ? " (job created)" : "");
  return Status::Ok();
}

const std::string* ControlServer::Impl::FailureOf(uint64_t session_id) {
  auto it = failed_sessions.find(session_id);
  if (it == failed_sessions.end()) return nullptr;
  if (std::chrono::steady_clock::now() - it->second.at > options.failure_memory) {
    failed_sessions.erase(it);
    return nullptr;
  }
  return &it->second.message;
}

const std::string& ControlServer::Impl::MarkFailed(uint64_t session_id,
                                                   const std::string& message) {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(failed_sessions,
                [&](const auto& f) { return now - f.second.at > options.failure_memory; });
  auto [it, inserted] = failed_sessions.try_emplace(session_id, Failure{message, now});
  return it->second.message;
}

void ControlServer::Impl::FailSession(uint64_t session_id, const std::string& reason) {
  if (session_id == 0) return;  // 0 is the unscoped sync group, never a failed session
  std::lock_guard lock(mu);
  const grpc::Status failure(grpc::StatusCode::FAILED_PRECONDITION, MarkFailed(session_id, reason));
  for (auto it = rounds.begin(); it != rounds.end();) {
    auto next = std::next(it);
    if (it->first.session_id == session_id) FailRoundLocked(it, failure);
    it = next;
  }
}

void ControlServer::Impl::FailRoundLocked(std::map<ScopeKey, std::shared_ptr<Round>>::iterator it,
                                          const grpc::Status& failure) {
  Round& round = *it->second;
  round.failed = true;
  round.failure = failure;
  round.cv.notify_all();
  rounds.erase(it);
}

grpc::Status ControlServer::Impl::Rendezvous(grpc::ServerContext* ctx, const SyncCall& call,
                                             uint64_t* value) {
  const bool broadcast = call.key.kind == SyncKind::kBroadcast;
  const std::string scope = ScopeName(call.key);
  std::unique_lock lock(mu);
  if (shutting_down) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the switch control plane is shutting down");
  }
  if (call.num_workers == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        scope + ": num_workers is 0; it must be at least 1");
  }
  if (broadcast && (call.rank >= call.num_workers || call.root >= call.num_workers)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        scope + ": rank " + std::to_string(call.rank) + " and root " +
                            std::to_string(call.root) + " must both be below num_workers " +
                            std::to_string(call.num_workers));
  }
  if (call.key.session_id != 0) {
    if (const std::string* failure = FailureOf(call.key.session_id)) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, *failure);
    }
  }

  std::shared_ptr<Round>& slot = rounds[call.key];
  if (!slot) {
    slot = std::make_shared<Round>();
    slot->num_workers = call.num_workers;
    slot->root = call.root;
    if (broadcast) slot->rank_arrived.assign(call.num_workers, false);
  }
  const std::shared_ptr<Round> round = slot;
  if (round->num_workers != call.num_workers) {
    // The job cannot come together: fail the waiting workers too (and, for a session, every
    // later call of it), instead of leaving them to time out.
    const grpc::Status failure(grpc::StatusCode::INVALID_ARGUMENT,
                               scope + ": num_workers " + std::to_string(call.num_workers) +
                                   " of one worker does not " + "match the " +
                                   std::to_string(round->num_workers) +
                                   " of another: start every worker " + "with the same --workers");
    if (call.key.session_id != 0) {
      MarkFailed(call.key.session_id, failure.error_message());
    }
    FailRoundLocked(rounds.find(call.key), failure);
    return failure;
  }
  if (broadcast) {
    if (round->root != call.root) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          scope + ": root " + std::to_string(call.root) + " does not match the " +
                              std::to_string(round->root) + " of the workers already waiting");
    }
    if (round->rank_arrived[call.rank]) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          scope + ": rank " + std::to_string(call.rank) +
                              " is already waiting in this round: two workers have the same rank");
    }
    round->rank_arrived[call.rank] = true;
    if (call.rank == call.root) round->value = call.value;
  }

  if (++round->arrived == round->num_workers) {
    round->done = true;
    round->cv.notify_all();
    rounds.erase(call.key);
    *value = round->value;
    return grpc::Status::OK;
  }

  ++waiting;
  for (;;) {
    round->cv.wait_for(lock, kWaitSlice);
    if (round->done) {
      --waiting;
      *value = round->value;
      return grpc::Status::OK;
    }
    if (round->failed) {
      --waiting;
      return round->failure;
    }
    const bool cancelled = ctx->IsCancelled();
    if (cancelled || std::chrono::system_clock::now() >= ctx->deadline()) {
      // Withdraw from the round so that it still needs a full set of fresh arrivals.
      --waiting;
      --round->arrived;
      if (broadcast) round->rank_arrived[call.rank] = false;
      if (round->arrived == 0) {
        if (auto it = rounds.find(call.key); it != rounds.end() && it->second == round) {
          rounds.erase(it);
        }
      }
      LOG(kDebug, kControl) << scope << ": a waiting call "
                            << (cancelled ? "was cancelled" : "passed its deadline")
                            << " and left the round";
      return cancelled
                 ? grpc::Status(grpc::StatusCode::CANCELLED, scope + ": cancelled")
                 : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, scope + ": deadline passed");
    }
  }
}

void ControlServer::Impl::Shutdown() {
  std::lock_guard shutdown_lock(shutdown_mu);
  {
    std::lock_guard lock(mu);
    if (shutting_down) return;
    shutting_down = true;
    const grpc::Status failure(grpc::StatusCode::UNAVAILABLE,
                               "the switch control plane is shutting down");
    while (!rounds.empty()) FailRoundLocked(rounds.begin(), failure);
  }
  if (server) server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
}

ControlServer::ControlServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ControlServer::~ControlServer() { Shutdown(); }

uint16_t ControlServer::port() const { return impl_->port; }

void ControlServer::Shutdown() { impl_->Shutdown(); }

uint32_t ControlServer::waiting_sync_calls() const {
  std::lock_guard lock(impl_->mu);
  return impl_->waiting;
}

Result<std::unique_ptr<ControlServer>> ControlServer::Start(const ControlServerOptions& options,
                                                            dataplane::LockedSwitch* sw) {
  RETURN_IF_ERROR(options.Validate());
  if (sw == nullptr) return InvalidArgumentError("ControlServer::Start needs a switch");
  auto impl = std::make_unique<Impl>(options, sw);
  const std::string address = HostPort(options.bind_address, options.port);

  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &selected_port);
  // gRPC enables SO_REUSEPORT by default, which would let a second switch silently share the
  // port; a port in use must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota quota("switchml-control");
  quota.SetMaxThreads(kMaxServerThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(&impl->session_service);
  builder.RegisterService(&impl->sync_service);
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || selected_port == 0) {
    if (impl->server != nullptr) impl->server->Shutdown();
    impl->server.reset();
    return UnavailableError("cannot listen for the control plane on " + address +
                            " (is the port in use, e.g. by another `switchml switch`, or the "
                            "address not local?): pick another --control-port");
  }
  impl->port = static_cast<uint16_t>(selected_port);
  LOG(kInfo, kControl) << "control plane listening on "
                       << HostPort(options.bind_address, impl->port);
  return std::unique_ptr<ControlServer>(new ControlServer(std::move(impl)));
}

}  // namespace switchml::control
