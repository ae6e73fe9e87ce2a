#include "runtime/uplink.h"

#include <atomic>
#include <string>

#include "base/logging.h"
#include "base/status_macros.h"
#include "control/switchml.pb.h"
#include "transport/address.h"

namespace switchml::runtime {
namespace {

// Sessions remembered by an Uplink; the oldest ids are forgotten beyond this.
constexpr size_t kMaxOpened = 4096;

std::string RankRange(uint32_t first, uint32_t n) {
  return std::to_string(first) + ".." + std::to_string(first + n - 1);
}

// Why a job's upstream ends when the rack's first rank registers again (the spine fails the
// earlier run of the job on every rack with this).
Status ReopenedError(const switchml_proto::UdpSessionRequest& request, const RackPlacement& rack) {
  return FailedPreconditionError(
      "session " + std::to_string(request.session_id()) + " failed: rank " +
      std::to_string(rack.first_rank) + " (the first of the rack with ranks " +
      RankRange(rack.first_rank, rack.num_workers) +
      ") registered again at its top-of-rack switch (a new run of the job, or a second worker "
      "started as that rank)");
}

}  // namespace

Status UplinkOptions::Validate() const {
  if (upstream.empty()) return InvalidArgumentError("the upstream switch's host:port is empty");
  if (racks < 1) return InvalidArgumentError("racks must be at least 1");
  if (rack_index >= racks) {
    return InvalidArgumentError("rack index " + std::to_string(rack_index) +
                                " is out of range for " + std::to_string(racks) + " racks (0.." +
                                std::to_string(racks - 1) + ")");
  }
  if (data_port == 0) return InvalidArgumentError("the ToR's data port is 0");
  if (num_data_ports < 1) return InvalidArgumentError("the ToR has no data port");
  if (timeout.count() <= 0 || sync_timeout.count() <= 0) {
    return InvalidArgumentError("uplink timeouts must be positive");
  }
  return Status::Ok();
}

Result<RackPlacement> PlaceRack(uint32_t num_workers, uint32_t racks, uint32_t rack_index) {
  if (racks == 0 || rack_index >= racks) {
    return InvalidArgumentError("rack " + std::to_string(rack_index) + " of " +
                                std::to_string(racks) + " racks does not exist");
  }
  if (num_workers < racks) {
    return InvalidArgumentError("a job of " + std::to_string(num_workers) +
                                " workers cannot span " + std::to_string(racks) +
                                " racks: every rack needs at least one worker");
  }
  const uint64_t n = num_workers;
  RackPlacement p;
  p.first_rank = static_cast<uint32_t>(n * rack_index / racks);
  p.num_workers = static_cast<uint32_t>(n * (rack_index + 1) / racks) - p.first_rank;
  return p;
}

Uplink::Uplink(const UplinkOptions& options, dataplane::LockedSwitch* sw)
    : options_(options),
      sw_(sw),
      setup_client_(options.upstream, options.timeout),
      sync_client_(options.upstream, options.sync_timeout) {
  tasks_thread_ = std::thread([this] { RunTasks(); });
}

Uplink::~Uplink() {
  Shutdown();
  {
    std::lock_guard lock(mu_);
    tasks_stop_ = true;
  }
  tasks_cv_.notify_all();
  if (tasks_thread_.joinable()) tasks_thread_.join();
}

void Uplink::Post(std::function<void()> task) {
  std::lock_guard lock(mu_);
  PostLocked(std::move(task));
}

void Uplink::PostLocked(std::function<void()> task) {
  tasks_.push_back(std::move(task));
  ++tasks_posted_;
  tasks_cv_.notify_all();
}

bool Uplink::WaitForPostedTasks(std::chrono::system_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  const uint64_t posted = tasks_posted_;
  const auto timeout = std::chrono::system_clock::now() + options_.timeout;
  const bool done = cv_.wait_until(lock, std::min(timeout, deadline),
                                   [&] { return tasks_stop_ || tasks_done_ >= posted; });
  return done || timeout < deadline;  // (after the timeout it goes on, as it always did)
}

void Uplink::RunTasks() {
  std::unique_lock lock(mu_);
  for (;;) {
    tasks_cv_.wait(lock, [&] { return tasks_stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and nothing left to do
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
    ++tasks_done_;
    cv_.notify_all();
  }
}

void Uplink::set_registry(control::Registry* registry) {
  std::lock_guard lock(mu_);
  registry_ = registry;
}

Status Uplink::BeforeUdpSession(switchml_proto::UdpSessionRequest* request,
                                std::chrono::system_clock::time_point deadline) {
  const uint32_t global_rank = request->rank();
  const uint32_t global_n = request->num_workers();
  if (global_rank >= global_n) return Status::Ok();  // the server's own checks refuse it
  const std::string session = "session " + std::to_string(request->session_id());
  ASSIGN_OR_RETURN(RackPlacement rack, PlaceRack(global_n, options_.racks, options_.rack_index));
  if (global_rank < rack.first_rank || global_rank >= rack.first_rank + rack.num_workers) {
    // Which rack it belongs to: the rack r with first(r) <= rank < first(r + 1).
    uint32_t r = 0;
    while (r + 1 < options_.racks && uint64_t{global_n} * (r + 1) / options_.racks <= global_rank) {
      ++r;
    }
    return InvalidArgumentError(
        session + ": rank " + std::to_string(global_rank) + " of " + std::to_string(global_n) +
        " belongs to rack " + std::to_string(r) + ", but this top-of-rack switch is rack " +
        std::to_string(options_.rack_index) + " of " + std::to_string(options_.racks) + " (ranks " +
        RankRange(rack.first_rank, rack.num_workers) + "): point the worker at its rack's switch");
  }
  const uint32_t local_rank = global_rank - rack.first_rank;
  request->set_rank(local_rank);
  request->set_num_workers(rack.num_workers);
  std::unique_lock lock(mu_);
  if (local_rank == 0) {
    // A job that opened its upstream is only re-created with its own secret (the registry
    // refuses the others too, but the rack's ranks need not wait for that: nothing here would
    // change either way).
    if (auto it = sessions_.find(request->session_id());
        it != sessions_.end() && it->second.upstream &&
        !control::SameSecret(it->second.secret, request->job_secret())) {
      return PermissionDeniedError(
          session + " belongs to another job on this top-of-rack switch: the request carries " +
          (request->job_secret().empty() ? "no job secret" : "another job secret") +
          " (every worker of a job must use the secret its rank 0 created the job with)");
    }
    // Nothing else changes until the registry accepted it (AfterUdpSession): a request it
    // refuses (a second worker started as rank 0, a stranger while the job is being set up)
    // leaves the live job and its upstream alone. Meanwhile the rack's other ranks wait for it.
    ++registering_[request->session_id()];
    return Status::Ok();
  }
  // The rack's local rank 0 creates the ToR's job and opens the upstream: wait for it.
  const bool done = cv_.wait_until(
      lock, std::min(std::chrono::system_clock::now() + options_.timeout, deadline), [&] {
        return shutting_down_ || (opened_.contains(request->session_id()) &&
                                  !registering_.contains(request->session_id()));
      });
  if (shutting_down_) return UnavailableError("the top-of-rack switch is shutting down");
  if (!done) {
    return DeadlineExceededError(session + ": rank " + std::to_string(rack.first_rank) +
                                 " (this rack's first) did not open the job on this top-of-rack "
                                 "switch within " +
                                 std::to_string(options_.timeout.count()) + " ms");
  }
  return opened_.at(request->session_id());
}

void Uplink::RegisteredLocked(uint64_t job_id) {
  auto it = registering_.find(job_id);
  if (it != registering_.end() && --it->second == 0) registering_.erase(it);
}

Status Uplink::AfterUdpSession(const switchml_proto::UdpSessionRequest& sent,
                               const switchml_proto::UdpSessionRequest& request,
                               std::chrono::system_clock::time_point deadline) {
  if (request.rank() != 0) return Status::Ok();
  const uint64_t id = request.session_id();
  {
    std::lock_guard lock(mu_);
    RegisteredLocked(id);
    opened_.erase(id);  // (re)opening: the rack's ranks wait for this registration's upstream
    Result<RackPlacement> rack = PlaceRack(sent.num_workers(), options_.racks, options_.rack_index);
    if (!rack.ok()) return rack.status();  // (BeforeUdpSession placed it already)
    // The job may have ended here already (a concurrent refusal failed it): it has no entry then,
    // and an entry made now would hold an upstream for a job that is gone.
    if (registry_ != nullptr && !registry_->HasJob(id)) {
      const Status ended = FailedPreconditionError(
          "session " + std::to_string(id) + " ended on this top-of-rack switch while it joined");
      if (opened_.size() >= kMaxOpened) opened_.erase(opened_.begin());
      opened_[id] = ended;
      cv_.notify_all();
      return ended;
    }
    if (sessions_.size() >= kMaxOpened && !sessions_.contains(id)) {
      // Forget a session whose upstream never came (its opening failed): the oldest such id.
      for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
        if (!it->second.upstream) {
          sessions_.erase(it);
          break;
        }
      }
    }
    Session& s = sessions_[id];
    // The registry accepted a new rank 0, which re-created the job: the old incarnation ends,
    // here and at the spine.
    DropUpstreamLocked(id, s, ReopenedError(request, *rack));
    s = Session{*rack, sent.num_workers(), request.job_secret(), nullptr, nullptr};
  }
  // An upstream dropped before (this session's earlier incarnation, another job's) is ended at
  // the spine first: its late close must not meet this registration, and its registration
  // holds this switch's data address at the spine until it ends. A slow spine makes that wait
  // long: it ends at the worker's deadline, after which nobody waits for this registration
  // (going on would leave a job at the spine for a worker that is gone).
  Status st;
  if (!WaitForPostedTasks(deadline)) {
    st = DeadlineExceededError(
        "session " + std::to_string(id) +
        ": the end of an earlier job at the upstream switch (this switch's data address is "
        "registered there until it ends) did not finish before the registering worker's "
        "deadline; the upstream switch is slow to answer");
  }
  if (st.ok()) st = OpenUpstream(request);
  if (st.ok()) st = AttachUpstream(request);
  if (!st.ok()) {
    st = Status(st.code(), "rack " + std::to_string(options_.rack_index) +
                               " cannot join the upstream switch " + options_.upstream + ": " +
                               st.message());
  }
  {
    std::lock_guard lock(mu_);
    if (opened_.size() >= kMaxOpened) opened_.erase(opened_.begin());
    opened_[request.session_id()] = st;
  }
  cv_.notify_all();
  return st;
}

Status Uplink::AttachUpstream(const switchml_proto::UdpSessionRequest& request) {
  const uint64_t id = request.session_id();
  const std::string secret = request.job_secret();
  // The job may end here meanwhile (e.g. the spine refused the stream, whose failure ended the
  // job before it had an upstream to end): then it ends at the spine too.
  const Status ended = FailedPreconditionError("session " + std::to_string(id) +
                                               " ended on this top-of-rack switch while it joined");
  RackPlacement rack;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      PostLocked([this, id, secret, ended] { EndUpstream(id, secret, nullptr, ended); });
      return ended;
    }
    rack = it->second.rack;
  }
  const std::string member = "rack " + std::to_string(options_.rack_index) + " (ranks " +
                             RankRange(rack.first_rank, rack.num_workers) + ")";
  // Cleared when this stream stops being the job's (the job ended or was re-created), so that
  // its late end cannot fail a job that is not its own.
  auto live = std::make_shared<std::atomic<bool>>(true);
  std::shared_ptr<control::Attachment> upstream = setup_client_.Attach(
      id, options_.rack_index, secret,
      [this, id, secret, live](const Status& why) {
        control::Registry* registry;
        {
          std::lock_guard lock(mu_);
          registry = registry_;
        }
        if (registry != nullptr && live->load()) registry->Fail(id, secret, why);
      },
      member);
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    live->store(false);
    PostLocked([this, id, secret, ended, upstream = std::move(upstream)]() mutable {
      EndUpstream(id, secret, std::move(upstream), ended);
    });
    return ended;
  }
  Session& s = it->second;
  DropUpstreamLocked(id, s, ReopenedError(request, s.rack));
  s.upstream = std::move(upstream);
  s.live = std::move(live);
  return Status::Ok();
}

void Uplink::UdpSessionRefused(const switchml_proto::UdpSessionRequest& sent,
                               const switchml_proto::UdpSessionRequest& request,
                               const Status& why) {
  // Only a request BeforeUdpSession rewrote to the rack's local rank 0 (it has num_workers >= 1
  // then).
  if (request.rank() != 0 || request.num_workers() == 0) return;
  const uint64_t id = request.session_id();
  {
    std::lock_guard lock(mu_);
    RegisteredLocked(id);
    // Not an outsider's (another secret: PERMISSION_DENIED), which must not fail the job's
    // waiting ranks; and a live job the refusal left alone (its upstream is open; a refusal
    // that failed the job ended it before this call, through OnJobEnded) stays as it is.
    auto it = sessions_.find(id);
    if (why.code() == StatusCode::kPermissionDenied ||
        (it != sessions_.end() &&
         (it->second.upstream || !control::SameSecret(it->second.secret, request.job_secret())))) {
      cv_.notify_all();  // (its rack's ranks waited for this registration)
      return;
    }
    if (opened_.size() >= kMaxOpened) opened_.erase(opened_.begin());
    // One text for both: the rack's ranks waiting here, and the other racks' at the spine.
    const std::string failure = "session " + std::to_string(id) + " failed at setup: rank " +
                                std::to_string(sent.rank()) + " (the first of rack " +
                                std::to_string(options_.rack_index) +
                                ") was refused by its top-of-rack switch: " + why.message();
    opened_[id] = FailedPreconditionError(failure);
    // The other racks' ranks may wait at the spine (in the setup barriers): the session fails
    // there too, with why, instead of at their deadlines.
    PostLocked([this, id, secret = request.job_secret(), failure] {
      Status st =
          setup_client_.Close(id, secret, std::nullopt, std::chrono::milliseconds(2000), failure);
      if (!st.ok()) {
        LOG(kWarning, kControl) << "session " << id << ": failing it at the upstream "
                                << options_.upstream << " failed: " << st.ToString();
      }
    });
  }
  cv_.notify_all();
}

Status Uplink::OpenUpstream(const switchml_proto::UdpSessionRequest& request) {
  control::UdpSessionArgs args;
  args.job_id = request.session_id();
  args.rank = options_.rack_index;
  args.num_workers = options_.racks;
  args.ipv4 = options_.data_ipv4;
  args.udp_port = options_.data_port;
  args.num_udp_ports = options_.num_data_ports;
  args.max_outstanding_packets = request.max_outstanding_packets();
  args.running_tsi = request.running_tsi();
  args.size = static_cast<proto::SizeCode>(request.packet_size());
  args.job_secret = request.job_secret();
  args.sparse = request.sparse();  // the spine checks that every rack asks the same
  args.sparse_auto = request.sparse_auto();
  ASSIGN_OR_RETURN(control::UdpSessionReply reply, setup_client_.UdpSession(args));
  dataplane::UpstreamSpec up;
  up.ipv4 = reply.switch_ipv4;
  if (up.ipv4 == 0) {
    // The upstream's data plane is where its control plane is.
    const std::string& target = options_.upstream;
    const size_t colon = target.rfind(':');
    ASSIGN_OR_RETURN(up.ipv4, transport::ResolveIpv4(target.substr(0, colon)));
  }
  up.port = reply.data_port;
  up.num_ports = reply.num_data_ports == 0 ? 1 : reply.num_data_ports;
  {
    std::lock_guard lock(sw_->mu);
    RETURN_IF_ERROR(sw_->sw.SetUpstream(request.session_id(), up));
  }
  LOG(kInfo, kControl) << "session " << request.session_id() << ": rack " << options_.rack_index
                       << " of " << options_.racks << " joined the upstream switch "
                       << options_.upstream << " (data plane "
                       << Endpoint{up.ipv4, up.port}.ToString() << ")";
  return Status::Ok();
}

Status Uplink::BeforeAttach(switchml_proto::AttachRequest* request) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(request->session_id());
  const std::string session = "session " + std::to_string(request->session_id());
  // Another secret's job is answered as no job (issue 28, found 8), as the registry does.
  if (it == sessions_.end() || !control::SameSecret(it->second.secret, request->job_secret())) {
    return FailedPreconditionError(session +
                                   " is not open on this top-of-rack switch for this job secret: "
                                   "attach after registering (UdpSession)");
  }
  const RackPlacement& rack = it->second.rack;
  const uint32_t global_rank = request->rank();
  if (global_rank < rack.first_rank || global_rank - rack.first_rank >= rack.num_workers) {
    return InvalidArgumentError(session + ": rank " + std::to_string(global_rank) +
                                " is not in this top-of-rack switch's rack (ranks " +
                                RankRange(rack.first_rank, rack.num_workers) + ")");
  }
  request->set_rank(global_rank - rack.first_rank);
  request->set_member("rank " + std::to_string(global_rank));
  return Status::Ok();
}

Status Uplink::BeforeClose(switchml_proto::CloseRequest* request) {
  if (!request->has_rank()) return Status::Ok();
  std::lock_guard lock(mu_);
  auto it = sessions_.find(request->session_id());
  if (it == sessions_.end() || !control::SameSecret(it->second.secret, request->job_secret())) {
    return Status::Ok();  // the registry says it is not open (for this secret)
  }
  const RackPlacement& rack = it->second.rack;
  const uint32_t global_rank = request->rank();
  if (global_rank < rack.first_rank || global_rank - rack.first_rank >= rack.num_workers) {
    return InvalidArgumentError("session " + std::to_string(request->session_id()) + ": rank " +
                                std::to_string(global_rank) +
                                " is not in this top-of-rack switch's rack (ranks " +
                                RankRange(rack.first_rank, rack.num_workers) + ")");
  }
  request->set_rank(global_rank - rack.first_rank);
  return Status::Ok();
}

void Uplink::OnJobEnded(uint64_t job_id, const Status& why) {
  Session s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(job_id);
    if (it == sessions_.end()) return;
    s = std::move(it->second);
    sessions_.erase(it);
    if (s.live) s.live->store(false);
  }
  if (!s.upstream) return;
  // Off this thread (an RPC's): the upstream calls may block for a moment.
  Post([this, job_id, why, secret = std::move(s.secret),
        upstream = std::move(s.upstream)]() mutable {
    EndUpstream(job_id, secret, std::move(upstream), why);
  });
}

void Uplink::EndUpstream(uint64_t job_id, const std::string& secret,
                         std::shared_ptr<control::Attachment> upstream, const Status& why) {
  auto close = [&] {
    // The spine frees the job's slots once every rack closed. NOT_FOUND: the job is gone
    // already (the failure below removed it); FAILED_PRECONDITION: this rack's rank is not
    // registered in the spine's job (another incarnation of the session).
    Status st = setup_client_.Close(job_id, secret, options_.rack_index,
                                    std::chrono::milliseconds(2000));
    if (!st.ok() && st.code() != StatusCode::kNotFound &&
        st.code() != StatusCode::kFailedPrecondition) {
      LOG(kWarning, kControl) << "session " << job_id << ": closing it at the upstream "
                              << options_.upstream << " failed: " << st.ToString();
    }
  };
  if (why.ok()) {
    // The rack closed the job: so does this ToR at the spine, and then its stream ends cleanly.
    close();
    upstream.reset();
    return;
  }
  // The rack's job failed (e.g. a worker died) or was dropped: the spine fails it on every rack,
  // with why. The failure follows the stream's first message, so it also reaches a spine that
  // has not attached the stream yet, unless the spine refuses the stream.
  if (upstream) upstream->Fail(why);
  upstream.reset();  // waits (at most 2 s) for the spine to end the stream
  // When the failure did not reach the spine, the ToR's registration there would keep the job
  // (and this switch's data address) until the spine's lease: close it.
  close();
}

void Uplink::OnCheckAgreed(uint64_t job_id, uint64_t op, uint64_t count, uint32_t dtype) {
  std::shared_ptr<control::Attachment> upstream;
  control::Registry* registry;
  {
    std::lock_guard lock(mu_);
    registry = registry_;
    auto it = sessions_.find(job_id);
    if (it != sessions_.end()) upstream = it->second.upstream;
  }
  if (registry == nullptr) return;
  if (!upstream) {
    registry->ConfirmCheck(job_id, op);  // (no upstream job: nothing to compare with)
    return;
  }
  // Confirmed to the rack once every rack agreed; a disagreement fails the job at the spine,
  // which ends our stream and so fails the rack's job (on_failure).
  upstream->Announce(op, count, dtype, [this, job_id, op](const Status& st) {
    if (!st.ok()) return;
    control::Registry* registry;
    {
      std::lock_guard lock(mu_);
      registry = registry_;
    }
    if (registry != nullptr) registry->ConfirmCheck(job_id, op);
  });
}

void Uplink::DropUpstreamLocked(uint64_t job_id, Session& s, const Status& why) {
  if (s.live) s.live->store(false);
  if (s.upstream) {
    PostLocked([this, job_id, why, secret = s.secret, old = std::move(s.upstream)]() mutable {
      EndUpstream(job_id, secret, std::move(old), why);
    });
  }
  s.upstream.reset();
  s.live.reset();
}

void Uplink::Shutdown() {
  std::vector<std::shared_ptr<control::Attachment>> streams;
  {
    std::lock_guard lock(mu_);
    shutting_down_ = true;
    for (auto& [id, s] : sessions_) {
      if (s.live) s.live->store(false);
      if (s.upstream) streams.push_back(std::move(s.upstream));
    }
    sessions_.clear();
  }
  cv_.notify_all();
  sync_client_.CancelCalls(UnavailableError("the top-of-rack switch is shutting down"));
  streams.clear();  // each waits until its stream has ended
}

Status Uplink::Barrier(const switchml_proto::BarrierRequest& request,
                       std::chrono::system_clock::time_point deadline,
                       control::ErrorReason* reason) {
  std::optional<uint32_t> rank;
  if (request.has_rank()) rank = request.rank();
  return sync_client_.Barrier(request.session_id(), request.num_workers(), request.job_secret(),
                              rank, deadline, reason);
}

Result<uint64_t> Uplink::Broadcast(const switchml_proto::BroadcastRequest& request,
                                   std::chrono::system_clock::time_point deadline,
                                   control::ErrorReason* reason) {
  return sync_client_.Broadcast(request.session_id(), request.value(), request.rank(),
                                request.num_workers(), request.root(), request.job_secret(),
                                deadline, reason);
}

}  // namespace switchml::runtime
