#include "control/control_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "base/status_macros.h"
#include "control/duration_text.h"
#include "control/keepalive.h"
#include "control/reason_metadata.h"
#include "control/switchml.grpc.pb.h"
#include "control/switchml.pb.h"
#include "control/tls_files.h"

namespace switchml::control {
namespace {

// Reconnect quickly while waiting for a switch that starts after the worker.
constexpr int kReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 1000;

StatusCode FromGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return StatusCode::kOk;
    case grpc::StatusCode::CANCELLED:
      return StatusCode::kCancelled;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::OUT_OF_RANGE:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::NOT_FOUND:
      return StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS:
      return StatusCode::kAlreadyExists;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::ABORTED:
      return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::UNIMPLEMENTED:
      return StatusCode::kUnimplemented;
    case grpc::StatusCode::UNAVAILABLE:
      return StatusCode::kUnavailable;
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return StatusCode::kPermissionDenied;
    default:
      return StatusCode::kInternal;
  }
}

}  // namespace

struct ControlClient::Impl {
  std::string target;
  std::chrono::milliseconds timeout;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<switchml_proto::Session::Stub> session;
  std::unique_ptr<switchml_proto::Sync::Stub> sync;
  std::unique_ptr<switchml_proto::Monitor::Stub> monitor;
  std::atomic<bool> wait_for_ready{true};
  bool tls = false;  // the channel's credentials are TLS (set once, by Connect)
  // Barrier/Broadcast calls under way, and why they were cancelled (CancelCalls).
  std::mutex calls_mu;
  std::set<grpc::ClientContext*> calls;
  Status cancelled;

  // Registers a call under way; false (and *why set) when calls are cancelled.
  bool Begin(grpc::ClientContext* ctx, Status* why) {
    std::lock_guard lock(calls_mu);
    if (!cancelled.ok()) {
      *why = cancelled;
      return false;
    }
    calls.insert(ctx);
    return true;
  }
  // Unregisters it; its outcome, or the cancellation's status when that ended it (then with no
  // typed reason: *reason, when not null, is reset).
  Status End(grpc::ClientContext* ctx, Status outcome, ErrorReason* reason) {
    std::lock_guard lock(calls_mu);
    calls.erase(ctx);
    if (!outcome.ok() && !cancelled.ok()) {
      if (reason != nullptr) *reason = ErrorReason::kNone;
      return cancelled;
    }
    return outcome;
  }

  void Connect(std::string t, std::chrono::milliseconds to,
               std::shared_ptr<grpc::ChannelCredentials> credentials,
               const std::string& server_name, bool use_tls) {
    target = std::move(t);
    timeout = to;
    tls = use_tls;
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
    // Keepalive pings while a call (the Attach stream) is open, so that a switch host that
    // vanished is noticed in bounded time while a stalled one is not failed
    // (control/keepalive.h).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
    channel = grpc::CreateCustomChannel(target, credentials, args);
    session = switchml_proto::Session::NewStub(channel);
    sync = switchml_proto::Sync::NewStub(channel);
    monitor = switchml_proto::Monitor::NewStub(channel);
  }

  void Prepare(grpc::ClientContext* ctx,
               std::chrono::system_clock::time_point deadline = {}) const {
    ctx->set_wait_for_ready(wait_for_ready.load(std::memory_order_relaxed));
    auto end = std::chrono::system_clock::now() + timeout;
    if (deadline != std::chrono::system_clock::time_point{}) end = std::min(end, deadline);
    ctx->set_deadline(end);
  }

  // Why a call got no answer in time, as far as the channel tells: a switch that took the
  // connection but not the call (a top-of-rack switch answers a registration only once its
  // upstream switch has answered it) is not one that nobody runs; and a TLS handshake that
  // fails (no client certificate for a switch that wants one, a wrong CA or server name) looks
  // like a switch that never answers, since gRPC keeps retrying it until the deadline.
  std::string Unreachable() const {
    const std::string head = "switch control plane at " + target;
    if (channel->GetState(false) == GRPC_CHANNEL_READY) {
      return head + " accepted the connection but did not answer within " + FormatTimeout(timeout) +
             ": if it is a top-of-rack switch (--upstream), its upstream switch did not answer "
             "it (see its log)";
    }
    return head + " did not answer within " + FormatTimeout(timeout) +
           ": is `switchml switch` running there, and is --control-port right?" +
           (tls ? " Over TLS a failed handshake looks the same: does --tls-ca hold the CA of "
                  "the switch's certificate, does --tls-server-name match it, and does the "
                  "switch require a client certificate (--tls-cert, --tls-key)?"
                : "");
  }

  // Maps a finished call's gRPC status to ours, with the typed reason the switch sent beside it
  // (*reason, when not null; kNone without one). `sync_what` names a Barrier/Broadcast
  // ("barrier of session 77 (4 workers)") whose deadline means a missing peer when the switch
  // itself was reachable.
  Status Convert(const grpc::ClientContext& ctx, const grpc::Status& s,
                 const std::string& sync_what, ErrorReason* reason = nullptr) const {
    const ErrorReason why = s.ok() ? ErrorReason::kNone : ReasonOf(ctx);
    if (reason != nullptr) *reason = why;
    if (s.ok()) return Status::Ok();
    switch (s.error_code()) {
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        if (!sync_what.empty() && why == ErrorReason::kRoundExpired) {
          // The switch ended the wait just before the deadline, naming who did not arrive.
          return DeadlineExceededError(s.error_message());
        }
        // No reason: this client's own deadline passed first, or the switch is a reference one
        // (or ours from before the reason), whose message is not known to name anyone.
        if (!sync_what.empty() && channel->GetState(false) == GRPC_CHANNEL_READY) {
          return DeadlineExceededError(
              sync_what + " timed out after " + FormatTimeout(timeout) +
              ": a peer worker did not arrive (did it fail or start with other arguments?)");
        }
        return DeadlineExceededError(Unreachable());
      case grpc::StatusCode::UNAVAILABLE:
        return UnavailableError("switch control plane at " + target +
                                " is unavailable: " + s.error_message());
      default:
        return Status(FromGrpcCode(s.error_code()), s.error_message());
    }
  }
};

ControlClient::ControlClient(std::string target, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->Connect(std::move(target), timeout, grpc::InsecureChannelCredentials(), "",
                 /*use_tls=*/false);
}

Result<std::unique_ptr<ControlClient>> ControlClient::Create(std::string target,
                                                             std::chrono::milliseconds timeout,
                                                             const ControlTlsOptions& tls) {
  if (tls.ca_file.empty()) {
    if (!tls.cert_file.empty() || !tls.key_file.empty()) {
      return InvalidArgumentError("a TLS client certificate needs the CA file too (--tls-ca)");
    }
    return std::make_unique<ControlClient>(std::move(target), timeout);
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return InvalidArgumentError("a TLS client certificate needs its key (--tls-cert, --tls-key)");
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadTlsPem(tls.ca_file, "CA file"));
  if (!tls.cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadTlsPem(tls.cert_file, "certificate"));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadTlsPem(tls.key_file, "key"));
  }
  std::unique_ptr<ControlClient> client(new ControlClient());
  client->impl_->Connect(std::move(target), timeout, grpc::SslCredentials(ssl), tls.server_name,
                         /*use_tls=*/true);
  return client;
}

ControlClient::ControlClient() : impl_(std::make_unique<Impl>()) {}

ControlClient::~ControlClient() = default;
ControlClient::ControlClient(ControlClient&&) noexcept = default;
ControlClient& ControlClient::operator=(ControlClient&&) noexcept = default;

const std::string& ControlClient::target() const { return impl_->target; }

void ControlClient::CancelCalls(const Status& why) {
  std::lock_guard lock(impl_->calls_mu);
  if (!impl_->cancelled.ok()) return;
  impl_->cancelled = why.ok() ? CancelledError("cancelled") : why;
  for (grpc::ClientContext* ctx : impl_->calls) ctx->TryCancel();
}

void ControlClient::set_wait_for_ready(bool wait) {
  impl_->wait_for_ready.store(wait, std::memory_order_relaxed);
}

Result<UdpSessionReply> ControlClient::UdpSession(const UdpSessionArgs& args) {
  switchml_proto::UdpSessionRequest req;
  req.set_session_id(args.job_id);
  req.set_rank(args.rank);
  req.set_num_workers(args.num_workers);
  req.set_ipv4(args.ipv4);
  req.set_packet_size(static_cast<switchml_proto::PacketSize>(args.size));
  req.set_udp_port(args.udp_port);
  req.set_num_udp_ports(args.num_udp_ports);
  req.set_max_outstanding_packets(args.max_outstanding_packets);
  req.set_running_tsi(args.running_tsi);
  req.set_job_secret(args.job_secret);
  req.set_authenticate_data(args.authenticate_data);
  req.set_multicast_group_ipv4(args.multicast_group.ipv4);
  req.set_multicast_group_port(args.multicast_group.port);
  req.set_switch_list(args.switch_list);
  req.set_sparse(args.sparse);
  req.set_sparse_auto(args.sparse_auto);
  switchml_proto::UdpSessionResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  const grpc::Status answer = impl_->session->UdpSession(&ctx, req, &resp);
  RETURN_IF_ERROR(impl_->Convert(ctx, answer, ""));
  UdpSessionReply reply;
  reply.job_id = resp.session_id();
  reply.switch_ipv4 = resp.ipv4();
  // A reference controller does not send the extension fields: its data port is the default.
  reply.data_port =
      resp.udp_port() == 0 ? proto::kDefaultDataPort : static_cast<uint16_t>(resp.udp_port());
  reply.max_workers = resp.max_workers();
  reply.num_slots = resp.num_slots();
  reply.num_data_ports = std::max<uint32_t>(1, resp.num_data_ports());
  reply.multicast_group_kept = args.multicast_group.ipv4 != 0 && resp.multicast_group_kept();
  if (resp.udp_port() > 65535 || uint64_t{reply.data_port} + reply.num_data_ports - 1 > 65535) {
    return InternalError("switch control plane at " + impl_->target +
                         " answered with invalid data ports " + std::to_string(resp.udp_port()) +
                         " (" + std::to_string(reply.num_data_ports) + " of them)");
  }
  reply.data_key = resp.data_key();
  if (args.authenticate_data && reply.data_key.size() != 16) {
    return FailedPreconditionError(
        "the switch at " + impl_->target +
        (reply.data_key.empty()
             ? std::string(" does not support the authenticated data plane (it returned no "
                           "data-plane key): update the switch, or run without --auth-data")
             : " returned a data-plane key of " + std::to_string(reply.data_key.size()) +
                   " bytes, not 16"));
  }
  if (!args.authenticate_data && !reply.data_key.empty()) {
    return InternalError("the switch at " + impl_->target +
                         " returned a data-plane key the worker did not ask for");
  }
  reply.sparse = args.sparse && resp.sparse();
  reply.sparse_auto = reply.sparse && args.sparse_auto;
  if (args.sparse && !resp.sparse() && !args.sparse_auto) {
    // Nobody else would check that every worker runs the same kind of all-reduce. (With
    // sparse_auto the job runs dense: every worker of it asks the same switch, and is told the
    // same.)
    return FailedPreconditionError("the switch at " + impl_->target +
                                   " does not support block-sparse jobs (it did not confirm "
                                   "the request's sparse): update the switch, or run without "
                                   "--sparse");
  }
  if (reply.sparse_auto && !resp.sparse_auto()) {
    // A switch of a build before the auto rule: it would not check that every worker follows it.
    return FailedPreconditionError("the switch at " + impl_->target +
                                   " does not support --sparse auto (it did not confirm the "
                                   "request's sparse_auto): update the switch, or run with "
                                   "--sparse on");
  }
  return reply;
}

Status ControlClient::Barrier(uint64_t job_id, uint32_t num_workers, const std::string& job_secret,
                              std::optional<uint32_t> rank,
                              std::chrono::system_clock::time_point deadline, ErrorReason* reason) {
  switchml_proto::BarrierRequest req;
  req.set_session_id(job_id);
  req.set_num_workers(num_workers);
  req.set_job_secret(job_secret);
  if (rank) req.set_rank(*rank);
  switchml_proto::BarrierResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, deadline);
  const std::string what = (job_id == 0 ? std::string("unscoped barrier")
                                        : "barrier of session " + std::to_string(job_id)) +
                           " (" + std::to_string(num_workers) + " workers)";
  Status why;
  if (reason != nullptr) *reason = ErrorReason::kNone;
  if (!impl_->Begin(&ctx, &why)) return why;
  const grpc::Status answer = impl_->sync->Barrier(&ctx, req, &resp);
  return impl_->End(&ctx, impl_->Convert(ctx, answer, what, reason), reason);
}

Result<uint64_t> ControlClient::Broadcast(uint64_t job_id, uint64_t value, uint32_t rank,
                                          uint32_t num_workers, uint32_t root,
                                          const std::string& job_secret,
                                          std::chrono::system_clock::time_point deadline,
                                          ErrorReason* reason) {
  switchml_proto::BroadcastRequest req;
  req.set_job_secret(job_secret);
  req.set_session_id(job_id);
  req.set_value(value);
  req.set_rank(rank);
  req.set_num_workers(num_workers);
  req.set_root(root);
  switchml_proto::BroadcastResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, deadline);
  const std::string what = (job_id == 0 ? std::string("unscoped broadcast")
                                        : "broadcast of session " + std::to_string(job_id)) +
                           " (" + std::to_string(num_workers) + " workers, root " +
                           std::to_string(root) + ")";
  Status why;
  if (reason != nullptr) *reason = ErrorReason::kNone;
  if (!impl_->Begin(&ctx, &why)) return why;
  const grpc::Status answer = impl_->sync->Broadcast(&ctx, req, &resp);
  RETURN_IF_ERROR(impl_->End(&ctx, impl_->Convert(ctx, answer, what, reason), reason));
  return resp.value();
}

Status ControlClient::Close(uint64_t job_id, const std::string& job_secret,
                            std::optional<uint32_t> rank, std::chrono::milliseconds timeout,
                            const std::string& failure) {
  switchml_proto::CloseRequest req;
  req.set_session_id(job_id);
  req.set_job_secret(job_secret);
  if (rank) req.set_rank(*rank);
  req.set_failure(failure);
  switchml_proto::CloseResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  const grpc::Status answer = impl_->session->Close(&ctx, req, &resp);
  return impl_->Convert(ctx, answer, "");
}

Result<std::string> ControlClient::Diagnose(uint64_t job_id, const std::string& job_secret,
                                            uint64_t allreduce, std::chrono::milliseconds timeout) {
  switchml_proto::DiagnoseRequest req;
  req.set_session_id(job_id);
  req.set_job_secret(job_secret);
  req.set_op(allreduce);
  switchml_proto::DiagnoseResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  const grpc::Status answer = impl_->session->Diagnose(&ctx, req, &resp);
  RETURN_IF_ERROR(impl_->Convert(ctx, answer, ""));
  return resp.text();
}

Result<ServedDataPlane> ControlClient::DataPlane(const std::string& job_secret) {
  switchml_proto::StatusRequest req;
  req.set_job_secret(job_secret);
  switchml_proto::StatusResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  const grpc::Status answer = impl_->monitor->Status(&ctx, req, &resp);
  RETURN_IF_ERROR(impl_->Convert(ctx, answer, ""));
  ServedDataPlane served;
  served.transport = resp.transport();
  served.data_port = static_cast<uint16_t>(resp.data_port());
  served.max_packet_numel = resp.max_packet_numel();
  served.threads = static_cast<uint32_t>(resp.threads_size());
  return served;
}

namespace {

// The client side of an Attach stream, on gRPC's callback API: no thread of its own.
class AttachStream final
    : public Attachment,
      public grpc::ClientBidiReactor<switchml_proto::AttachRequest, switchml_proto::AttachEvent> {
 public:
  AttachStream(switchml_proto::Session::Stub* stub, std::string target, uint64_t job_id,
               uint32_t rank, const std::string& secret,
               std::function<void(const Status&)> on_failure, const std::string& member)
      : target_(std::move(target)), on_failure_(std::move(on_failure)) {
    stub->async()->Attach(&ctx_, this);
    switchml_proto::AttachRequest first;
    first.set_session_id(job_id);
    first.set_rank(rank);
    first.set_job_secret(secret);
    first.set_member(member);
    const switchml_proto::AttachRequest* write;
    {
      std::lock_guard lock(mu_);
      write = Enqueue(std::move(first));
    }
    if (write != nullptr) StartWrite(write);
    StartRead(&event_);
    // Announce and Fail start writes from outside the reactions: the hold keeps the stream from
    // finishing (and gRPC from destroying it) while one may still be started. It is removed once
    // the read has failed (the stream is ending) and no such write is being started.
    AddHold();
    StartCall();
  }

  ~AttachStream() override {
    {
      std::unique_lock lock(mu_);
      closing_ = true;
      // After Fail: give the switch a moment to read the failure (it then ends the stream)
      // before cancelling, which could drop it.
      if (failure_sent_) cv_.wait_for(lock, std::chrono::seconds(2), [&] { return done_; });
    }
    ctx_.TryCancel();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  void Announce(uint64_t allreduce, uint64_t count, uint32_t dtype,
                std::function<void(const Status&)> checked) override {
    Status immediate;
    bool now = false;
    const switchml_proto::AttachRequest* write = nullptr;
    {
      std::lock_guard lock(mu_);
      if (ended_) {
        now = true;
        immediate = unsupported_ ? Status::Ok() : final_;
      } else {
        checks_[allreduce] = std::move(checked);  // (OnDone answers it if the stream is ending)
        if (!read_ended_) {
          switchml_proto::AttachRequest m;
          m.set_op(allreduce);
          m.set_count(count);
          m.set_dtype(dtype);
          write = Enqueue(std::move(m));
          if (write != nullptr) ++outside_writes_;
        }
      }
    }
    if (write != nullptr) StartOutsideWrite(write);
    if (now) checked(immediate);
  }

  void Fail(const Status& why) override {
    const switchml_proto::AttachRequest* write = nullptr;
    {
      std::lock_guard lock(mu_);
      if (ended_ || closing_ || read_ended_) return;
      closing_ = true;  // the job ends because of this side: on_failure is not called
      failure_sent_ = true;
      switchml_proto::AttachRequest m;
      m.set_failure(why.message().empty() ? "a member reported a failure" : why.message());
      write = Enqueue(std::move(m));
      if (write != nullptr) ++outside_writes_;
    }
    if (write != nullptr) StartOutsideWrite(write);
  }

  void OnWriteDone(bool ok) override {
    const switchml_proto::AttachRequest* next = nullptr;
    {
      std::lock_guard lock(mu_);
      queue_.pop_front();
      if (ok && !queue_.empty()) {
        next = &queue_.front();
      } else {
        writing_ = false;
      }
    }
    if (next != nullptr) StartWrite(next);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream is ending: no more outside writes; OnDone follows the hold
      bool release;
      {
        std::lock_guard lock(mu_);
        read_ended_ = true;
        release = TakeHoldLocked();
      }
      if (release) RemoveHold();
      return;
    }
    std::function<void(const Status&)> checked;
    {
      std::lock_guard lock(mu_);
      auto it = checks_.find(event_.op());
      if (it != checks_.end()) {
        checked = std::move(it->second);
        checks_.erase(it);
      }
    }
    if (checked) checked(Status::Ok());
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& s) override {
    std::map<uint64_t, std::function<void(const Status&)>> checks;
    std::function<void(const Status&)> notify;
    Status failure;
    {
      std::lock_guard lock(mu_);
      unsupported_ = s.error_code() == grpc::StatusCode::UNIMPLEMENTED;
      if (unsupported_) {
        failure = Status::Ok();
      } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                 s.error_code() == grpc::StatusCode::CANCELLED || s.ok()) {
        failure = UnavailableError(
            "lost the control connection to the switch at " + target_ +
            " (the switch stopped, or its host or the network failed): " + s.error_message());
      } else {
        failure = Status(FromGrpcCode(s.error_code()), s.error_message());
      }
      final_ = failure;
      // gRPC has already destroyed the stream: from here no Start* may be called, also not by
      // the callbacks below (on_failure fails the job, whose hooks may call Fail or Announce).
      ended_ = true;
      checks.swap(checks_);
      if (!closing_ && !unsupported_) notify = std::move(on_failure_);
    }
    if (notify) notify(failure);
    for (auto& [allreduce, checked] : checks) checked(failure);
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

 private:
  // Starts a write from outside the reactions (counted in outside_writes_ under mu_), then lets
  // the hold go if the stream ended meanwhile.
  void StartOutsideWrite(const switchml_proto::AttachRequest* write) {
    StartWrite(write);
    bool release;
    {
      std::lock_guard lock(mu_);
      --outside_writes_;
      release = TakeHoldLocked();
    }
    if (release) RemoveHold();
  }

  // Under mu_: whether the caller is to remove the hold (once: the read ended, no outside write
  // being started).
  bool TakeHoldLocked() {
    if (!held_ || !read_ended_ || outside_writes_ > 0) return false;
    held_ = false;
    return true;
  }

  // Under mu_. Returns the message to start writing (outside mu_), if no write is under way.
  const switchml_proto::AttachRequest* Enqueue(switchml_proto::AttachRequest m) {
    queue_.push_back(std::move(m));
    if (writing_) return nullptr;
    writing_ = true;
    return &queue_.front();
  }

  const std::string target_;
  std::function<void(const Status&)> on_failure_;
  grpc::ClientContext ctx_;
  switchml_proto::AttachEvent event_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<switchml_proto::AttachRequest> queue_;  // front: being written
  bool writing_ = false;
  std::map<uint64_t, std::function<void(const Status&)>> checks_;
  bool closing_ = false;
  bool failure_sent_ = false;
  bool ended_ = false;  // OnDone has begun: the stream is gone (Announce and Fail must not write)
  bool done_ = false;
  bool unsupported_ = false;
  bool read_ended_ = false;  // the read failed: the stream is ending (no outside writes)
  bool held_ = true;         // the hold of the constructor is still in place
  int outside_writes_ = 0;   // writes being started by Announce or Fail
  Status final_;
};

}  // namespace

std::unique_ptr<Attachment> ControlClient::Attach(uint64_t job_id, uint32_t rank,
                                                  const std::string& job_secret,
                                                  std::function<void(const Status&)> on_failure,
                                                  const std::string& member) {
  return std::make_unique<AttachStream>(impl_->session.get(), impl_->target, job_id, rank,
                                        job_secret, std::move(on_failure), member);
}

}  // namespace switchml::control
