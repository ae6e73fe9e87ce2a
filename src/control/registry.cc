#include "control/registry.h"

#include <sodium.h>

#include <utility>

#include "base/check.h"
#include "base/endpoint.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "control/duration_text.h"
#include "control/request_rules.h"
#include "proto/wire.h"

namespace switchml::control {
namespace {

// How Close and Diagnose answer for a session without a job, or with the job of another secret.
constexpr const char* kNotOpenForThisSecret =
    " is not open on the switch for this job secret (closed, expired, never opened, or opened "
    "with another secret)";
// Longest failure text a worker may hand the switch (Close, ReportFailure).
constexpr size_t kMaxReason = 1024;

Status ShuttingDown() { return UnavailableError("the switch control plane is shutting down"); }

bool ValidJobId(uint64_t id) { return id != 0 && id != UINT64_MAX; }

std::string ClientKey(const Caller& c) {
  if (c.has_ipv4) return Ipv4ToString(c.ipv4);
  const size_t colon = c.peer.rfind(':');
  return colon == std::string::npos ? c.peer : c.peer.substr(0, colon);
}

// A fresh 16-byte key for a job's authenticated data plane (the kernel's CSPRNG, by libsodium).
std::string NewDataKey() {
  static const int init = sodium_init();
  CHECK(init >= 0) << "libsodium failed to initialise";
  std::string key(16, '\0');
  randombytes_buf(key.data(), key.size());
  return key;
}

// The registry made room first, so the switch never evicts (it would, were it out of room).
void LogUnexpectedEvictions(const std::vector<uint64_t>& evicted) {
  for (uint64_t gone : evicted) {
    LOG(kError, kControl) << "the switch evicted " << SessionName(gone)
                          << " unexpectedly (the registry's job table disagrees with it)";
  }
}

// The data plane's spec of the job a registration makes (or must match): the request's values
// with the defaults for 0. A worker is offered a multicast group only in the scope the switch
// sends groups to: a loopback group reaches only this host's workers (TTL 0), a LAN group only
// workers beyond the loopback interface (and not with the authenticated data plane either: the
// group's datagrams carry no tag).
dataplane::JobSpec SpecOf(const RegisterRequest& r, uint32_t ipv4,
                          const dataplane::SwitchConfig& config) {
  dataplane::JobSpec spec;
  spec.job_id = r.job_id;
  spec.num_workers = r.num_workers;
  spec.size = static_cast<proto::SizeCode>(r.packet_size);
  spec.num_ports = r.num_udp_ports == 0 ? 1 : r.num_udp_ports;
  spec.max_outstanding_packets =
      r.max_outstanding_packets == 0 ? kDefaultWindow : r.max_outstanding_packets;
  spec.running_tsi = r.running_tsi;
  constexpr uint32_t kLoopbackNet = 0x7f000000, kLoopbackMask = 0xff000000;
  const bool local = (ipv4 & kLoopbackMask) == kLoopbackNet;
  if (r.multicast_group_ipv4 != 0 && !r.authenticate_data &&
      (local ? config.loopback_multicast : config.lan_multicast)) {
    spec.multicast_group =
        Endpoint{r.multicast_group_ipv4, static_cast<uint16_t>(r.multicast_group_port)};
  }
  return spec;
}

}  // namespace

namespace {
// The member a request with `secret` for `job_id` is (the job exists and has that secret), else
// a stranger (job 0).
CallLimits::Member MemberOf(const JobTable& jobs, uint64_t job_id, const std::string& secret) {
  if (job_id == 0) return {};
  const Job* job = jobs.Find(job_id);
  if (job == nullptr || !SameSecret(job->secret, secret)) return {};
  return {job_id, job->spec.num_workers};
}
}  // namespace

bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Status RegistryOptions::Validate() const {
  if (lease.count() <= 0) return InvalidArgumentError("the job lease must be positive");
  if (max_calls_per_client == 0 || max_calls_total == 0) {
    return InvalidArgumentError("the limits on outstanding calls must be at least 1");
  }
  if (idle_reclaim.count() <= 0 || first_message_timeout.count() <= 0) {
    return InvalidArgumentError(
        "the idle reclaim time and the first-message timeout must be "
        "positive");
  }
  return Status::Ok();
}

Registry::Registry(const RegistryOptions& options, dataplane::LockedSwitch* sw, Clock clock,
                   RegistryHooks hooks)
    : options_(options),
      sw_(sw),
      clock_(std::move(clock)),
      hooks_(std::move(hooks)),
      jobs_(options),
      failures_(options.failure_memory),
      limits_(options),
      streams_(&limits_),
      meetings_(&limits_) {}

Registry::~Registry() { Shutdown(); }

std::chrono::steady_clock::time_point Registry::Now() const {
  return clock_ ? clock_() : std::chrono::steady_clock::now();
}

uint64_t Registry::NewTicket() {
  std::lock_guard lock(mu_);
  return next_ticket_++;
}

RegistryCounts Registry::counts(uint64_t job_id) const {
  std::lock_guard lock(mu_);
  RegistryCounts c;
  c.jobs = static_cast<uint32_t>(jobs_.size());
  c.waiting_calls = static_cast<uint32_t>(meetings_.waiting());
  c.attached_streams = static_cast<uint32_t>(streams_.attached());
  c.pending_streams = static_cast<uint32_t>(streams_.opened());
  c.forwarded_calls = limits_.forwarded_calls();
  c.stranger_calls = limits_.stranger_calls();
  c.member_calls = limits_.member_calls(job_id);
  return c;
}

bool Registry::HasJob(uint64_t job_id) const {
  std::lock_guard lock(mu_);
  return jobs_.Find(job_id) != nullptr;
}

std::vector<JobSummary> Registry::JobSummaries(const std::string* secret, uint32_t* hidden) const {
  std::lock_guard lock(mu_);
  return jobs_.Summaries(secret, hidden, Now());
}

// ---------------------------------------------------------------------------------------------
// Jobs entering and leaving the switch.

Status Registry::CreateJobLocked(const dataplane::JobSpec& spec, const std::string& secret) {
  std::vector<uint64_t> evicted;
  {
    std::lock_guard lock(sw_->mu);
    Status st = sw_->sw.CreateJob(spec, &evicted);
    if (!st.ok()) return st;
  }
  LogUnexpectedEvictions(evicted);
  jobs_.Add(spec, secret, Now());
  if (hooks_.job_created) hooks_.job_created(spec.job_id);
  return Status::Ok();
}

void Registry::RemoveJobLocked(uint64_t job_id, const Status& why, Deferred& deferred,
                               Ending ending) {
  const Job* job = jobs_.Find(job_id);
  if (job == nullptr) return;
  if (hooks_.job_ended && ending != Ending::kReplaced) {
    deferred.push_back([f = hooks_.job_ended, job_id,
                        st = ending == Ending::kClean ? Status::Ok() : why] { f(job_id, st); });
  }
  {
    std::lock_guard lock(sw_->mu);
    sw_->sw.RemoveJob(job_id).IgnoreError();
  }
  if (hooks_.job_removed) hooks_.job_removed(job_id);
  streams_.EndAttached(job->Streams(), why, deferred);
  jobs_.Erase(job_id);
}

void Registry::RemoveExpiredLocked(const std::vector<uint64_t>& ids, const std::string& how,
                                   Deferred& deferred) {
  for (uint64_t id : ids) {
    LOG(kInfo, kControl) << SessionName(id) << how;
    RemoveJobLocked(id, FailedPreconditionError(SessionName(id) + " expired"), deferred,
                    Ending::kClean);
  }
}

Status Registry::MakeRoomLocked(uint64_t job_id, Deferred& deferred) {
  const uint32_t max_jobs = sw_->sw.config().max_jobs;
  if (jobs_.size() < max_jobs || jobs_.Find(job_id) != nullptr) return Status::Ok();
  RemoveExpiredLocked(jobs_.Expired(Now()),
                      " expired (no worker attached, no activity for " +
                          std::to_string(options_.lease.count() / 1000) +
                          " s): removed to make room",
                      deferred);
  if (jobs_.size() < max_jobs) return Status::Ok();
  // Still full: the job idle the longest, if it has been idle for idle_reclaim (its workers may
  // be attached: they fail, told why). One is enough.
  if (const Job* idlest = jobs_.Idlest(Now())) {
    const uint64_t id = idlest->spec.job_id;
    const std::string secret = idlest->secret;
    const std::string why = SessionName(id) +
                            " was removed to make room for a new job: no activity (all-reduces, " +
                            "barriers, tensor checks) for " + FormatTimeout(options_.idle_reclaim) +
                            " while the switch's job table was full (its --max-jobs of " +
                            std::to_string(max_jobs) + ")";
    LOG(kWarning, kControl) << why;
    FailSessionLocked(id, secret, FailedPreconditionError(why), deferred);
    return Status::Ok();
  }
  return ResourceExhaustedError(
      "the switch already runs its maximum of " + std::to_string(max_jobs) +
      " jobs, all of them live (a worker attached or active within the last " +
      std::to_string(options_.lease.count() / 1000) + " s, and active within the last " +
      FormatTimeout(options_.idle_reclaim) +
      "): retry when jobs finish (workers close their jobs when their context ends), or start "
      "the switch with a larger --max-jobs");
}

Status Registry::ClearAddressLocked(const dataplane::JobSpec& spec, uint32_t ipv4, uint32_t port,
                                    Deferred& deferred) {
  std::vector<uint64_t> in_the_way;
  RETURN_IF_ERROR(jobs_.CheckAddress(spec.job_id, ipv4, port, spec.num_ports, Now(), &in_the_way));
  RemoveExpiredLocked(in_the_way, " expired; removed: its address is taken over", deferred);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Registration.

Status Registry::Register(const RegisterRequest& r, const Caller& caller, std::string* data_key,
                          bool* multicast_group_kept) {
  uint32_t worker_ipv4 = 0;
  Status st = ValidateRegistration(options_, sw_->sw.config(), r, caller, &worker_ipv4);
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) {
      st = ShuttingDown();
    } else if (st.ok()) {
      st = RegisterLocked(r, worker_ipv4, deferred);
      if (st.ok() && data_key != nullptr) *data_key = jobs_.Find(r.job_id)->data_key;
      if (st.ok() && multicast_group_kept != nullptr) {
        // The switch's spec: it clears a group it cannot keep (dataplane::Switch::CreateJob).
        std::lock_guard sw_lock(sw_->mu);
        const dataplane::JobSpec* spec = sw_->sw.FindJob(r.job_id);
        *multicast_group_kept = spec != nullptr && spec->multicast_group.ipv4 != 0 &&
                                spec->multicast_group.ipv4 == r.multicast_group_ipv4 &&
                                spec->multicast_group.port == r.multicast_group_port;
      }
    }
    // A refusal marks the session failed, so the job fails fast on every worker, unless the
    // caller does not own the job (an outsider cannot fail someone else's job), or the session
    // id itself is bad.
    // (A caller with another secret than the job's marks only its own calls failed: the job is
    // not its to fail; FailSessionLocked.)
    if (!st.ok() && ValidJobId(r.job_id) && st.code() != StatusCode::kPermissionDenied &&
        st.code() != StatusCode::kUnavailable && r.secret.size() <= kMaxSecretBytes) {
      FailSessionLocked(
          r.job_id, r.secret,
          FailedPreconditionError(SessionName(r.job_id) + " failed at setup: rank " +
                                  std::to_string(r.rank) + " was refused: " + st.message()),
          deferred);
    }
  }
  RunAll(deferred);
  if (!st.ok())
    refusals_.Log(Now(), "UdpSession of rank " + std::to_string(r.rank), caller.peer, st);
  return st;
}

Status Registry::RegisterLocked(const RegisterRequest& r, uint32_t ipv4, Deferred& deferred) {
  const dataplane::JobSpec spec = SpecOf(r, ipv4, sw_->sw.config());
  Job* job = nullptr;
  if (r.rank == 0) {
    ASSIGN_OR_RETURN(job, OpenJobLocked(r, spec, ipv4, deferred));
  } else {
    if (const Status* failure = failures_.Find(r.job_id, r.secret, Now())) return *failure;
    // Another secret's job is answered as no job (issue 28, found 8: whether a job id is in
    // use is not told to a stranger; Register of rank 0 and Sync still refuse a live job's
    // job id with PERMISSION_DENIED, docs/security.md 2).
    job = jobs_.FindFor(r.job_id, r.secret);
    if (job == nullptr) {
      return FailedPreconditionError(
          SessionName(r.job_id) +
          " does not exist on the switch for this job secret: rank 0 must open it before the "
          "other ranks, with the secret every worker of the job uses (was rank 0 started, with "
          "the same session id and job secret?)");
    }
    RETURN_IF_ERROR(CheckSameJob(*job, spec, r));
    RETURN_IF_ERROR(ClearAddressLocked(spec, ipv4, r.udp_port, deferred));
  }
  return AddWorkerLocked(r, spec, ipv4, *job, deferred);
}

Result<Job*> Registry::OpenJobLocked(const RegisterRequest& r, const dataplane::JobSpec& spec,
                                     uint32_t ipv4, Deferred& deferred) {
  if (const Job* old = jobs_.Find(r.job_id)) {
    RETURN_IF_ERROR(CheckSecret(*old, r.secret, r.job_id));
    if (jobs_.RankAlive(*old, 0, Now())) {
      const Job::Rank& first = old->ranks[0];
      return AlreadyExistsError(
          "rank 0 of " + SessionName(r.job_id) + " is already registered by a live worker (at " +
          PortsText(first.ipv4, first.port, old->spec.num_ports) +
          "): two workers were started as rank 0, or two jobs use one session id");
    }
    RemoveJobLocked(
        r.job_id,
        FailedPreconditionError(SessionName(r.job_id) + " was re-created by a new rank 0"),
        deferred, Ending::kReplaced);
  }
  failures_.Forget(r.job_id);
  RETURN_IF_ERROR(MakeRoomLocked(r.job_id, deferred));
  RETURN_IF_ERROR(ClearAddressLocked(spec, ipv4, r.udp_port, deferred));
  RETURN_IF_ERROR(CreateJobLocked(spec, r.secret));
  Job* job = jobs_.Find(r.job_id);
  if (r.authenticate_data) job->data_key = NewDataKey();
  job->switch_list = r.switch_list;
  job->sparse = r.sparse;
  job->sparse_auto = r.sparse_auto;
  return job;
}

Status Registry::AddWorkerLocked(const RegisterRequest& r, const dataplane::JobSpec& spec,
                                 uint32_t ipv4, Job& job, Deferred& deferred) {
  std::vector<uint64_t> evicted;
  Status added;
  {
    std::lock_guard lock(sw_->mu);
    added = sw_->sw.AddWorker(r.job_id, r.rank,
                              dataplane::WorkerSpec{ipv4, static_cast<uint16_t>(r.udp_port)},
                              &evicted, spec.multicast_group);
  }
  LogUnexpectedEvictions(evicted);
  if (!added.ok()) {
    // Without rank 0 the job can never run: do not leave it holding a job entry.
    if (r.rank == 0) RemoveJobLocked(r.job_id, added, deferred, Ending::kFailed);
    return added;
  }
  if (!job.data_key.empty() && hooks_.data_key_added) {
    hooks_.data_key_added(r.job_id, job.data_key, r.rank, ipv4, r.udp_port, spec.num_ports);
  }
  Job::Rank& rank = job.ranks[r.rank];
  rank.registered = true;
  rank.ipv4 = ipv4;
  rank.port = r.udp_port;
  rank.registered_at = Now();
  job.Touch(Now());
  LOG(kInfo, kControl) << SessionName(r.job_id) << ": rank " << r.rank << " of " << r.num_workers
                       << " registered at " << PortsText(ipv4, r.udp_port, spec.num_ports)
                       << (r.rank == 0 ? " (job created" : "")
                       << (r.rank == 0 ? (r.secret.empty() ? ", no secret" : ", with a secret")
                                       : "")
                       << (r.rank == 0 ? (job.data_key.empty() ? ")" : ", authenticated data)")
                                       : "");
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Failures.

void Registry::FailSessionLocked(uint64_t job_id, const std::string& secret, const Status& why,
                                 Deferred& deferred) {
  if (job_id == 0) return;  // 0 is the unscoped sync group, never a failed session
  const bool has_job = jobs_.Find(job_id) != nullptr;
  const bool owner = jobs_.Owns(job_id, secret);
  failures_.Mark(job_id, secret, why, has_job && owner, Now());
  meetings_.FailSession(job_id, secret, why, deferred);
  if (has_job && owner) {
    LOG(kInfo, kControl) << why.message();
    RemoveJobLocked(job_id, FailedPreconditionError(why.message()), deferred, Ending::kFailed);
  }
}

// ---------------------------------------------------------------------------------------------
// Limits.

CallLimits::Evict Registry::EvictorLocked(Deferred& deferred) {
  return [this, &deferred](uint64_t ticket, const std::string& why) {
    const Status status = ResourceExhaustedError(why);
    if (SyncDone done = meetings_.Leave(ticket)) {
      deferred.push_back([done = std::move(done), status] { done(status, ErrorReason::kNone, 0); });
      return;
    }
    streams_.EndOpened(ticket, status, deferred);
  };
}

Status Registry::AdmitLocked(const Caller& caller, const CallLimits::Member& member,
                             uint64_t ticket, bool evictable, Deferred& deferred, Charge* charge) {
  return limits_.Admit(ClientKey(caller), member, ticket, evictable, EvictorLocked(deferred),
                       charge);
}

Status Registry::AdmitForwarded(uint64_t ticket, const Caller& caller, uint64_t job_id,
                                const std::string& secret, bool upstream) {
  Status st;
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) {
      st = ShuttingDown();
    } else {
      st = limits_.AdmitForwarded(ClientKey(caller), MemberOf(jobs_, job_id, secret), ticket,
                                  upstream, EvictorLocked(deferred));
    }
  }
  RunAll(deferred);
  if (!st.ok()) refusals_.Log(Now(), upstream ? "forwarded call" : "call", caller.peer, st);
  return st;
}

void Registry::ReleaseForwarded(uint64_t ticket) {
  std::lock_guard lock(mu_);
  limits_.ReleaseForwarded(ticket);
}

// ---------------------------------------------------------------------------------------------
// Barrier and Broadcast.

void Registry::Sync(uint64_t ticket, const SyncRequest& q, const Caller& caller, SyncDone done) {
  const std::string scope = SyncScope(q);
  Status st = ValidateSync(options_, sw_->sw.config(), q, scope);
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (st.ok() && shut_down_) st = ShuttingDown();
    Job* job = nullptr;
    if (st.ok() && q.job_id != 0) {
      job = jobs_.Find(q.job_id);
      if (job != nullptr) st = CheckSecret(*job, q.secret, q.job_id);
      if (st.ok()) {
        if (const Status* failure = failures_.Find(q.job_id, q.secret, Now())) st = *failure;
      }
    }
    Charge charge;
    if (st.ok()) {
      const CallLimits::Member member = job != nullptr
                                            ? CallLimits::Member{q.job_id, job->spec.num_workers}
                                            : CallLimits::Member{};
      st = AdmitLocked(caller, member, ticket, /*evictable=*/true, deferred, &charge);
    }
    if (st.ok()) {
      if (job != nullptr) job->Touch(Now());
      bool whole_meeting = false;
      st = meetings_.Join(ticket, q, scope, charge, done, Now(), deferred, &whole_meeting);
      if (!st.ok() && whole_meeting) {
        if (q.job_id != 0) FailSessionLocked(q.job_id, q.secret, st, deferred);
        meetings_.FailMeetingOf(q, st, deferred);
      }
    }
  }
  RunAll(deferred);
  if (!st.ok()) {
    refusals_.Log(Now(), scope, caller.peer, st);
    if (done) done(st, ErrorReason::kNone, 0);
  }
}

void Registry::CancelWait(uint64_t ticket, const Status& why) {
  SyncDone done;
  {
    std::lock_guard lock(mu_);
    done = meetings_.Leave(ticket);
  }
  if (!done) return;
  LOG(kDebug, kControl) << "a waiting call left its round: " << why.ToString();
  done(why, ErrorReason::kNone, 0);
}

void Registry::ExpireWait(uint64_t ticket) {
  SyncDone done;
  Status why;
  {
    std::lock_guard lock(mu_);
    done = meetings_.Expire(ticket, Now(), &why);
  }
  if (!done) return;
  LOG(kInfo, kControl) << why.message();
  done(why, ErrorReason::kRoundExpired, 0);
}

// ---------------------------------------------------------------------------------------------
// Close, streams, checks.

Status Registry::Close(const CloseRequest& q, const Caller& caller) {
  Status st;
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    const std::string name = SessionName(q.job_id);
    Job* job = jobs_.FindFor(q.job_id, q.secret);
    if (q.secret.size() > kMaxSecretBytes) {
      st = InvalidArgumentError("job secret too long");
    } else if (!q.failure.empty()) {
      // A member's side failed: the session fails here too, also before it has a job (its
      // waiting barriers and broadcasts end), as a refusal of one of its ranks fails it.
      // (A stranger's report, with another secret than the job's, fails only its own calls.)
      if (!ValidJobId(q.job_id)) {
        st = InvalidArgumentError("a failure needs a session id");
      } else {
        FailSessionLocked(q.job_id, q.secret,
                          FailedPreconditionError(q.failure.substr(0, kMaxReason)), deferred);
      }
    } else if (job == nullptr) {
      // Another secret's job is answered as no job (issue 28, found 8).
      st = NotFoundError(name + kNotOpenForThisSecret);
    } else {
      Result<bool> all_closed = q.has_rank ? jobs_.CloseRank(*job, q.rank, Now()) : true;
      if (!all_closed.ok()) {
        st = all_closed.status();
      } else if (*all_closed) {
        LOG(kInfo, kControl) << name << " closed" << (q.has_rank ? " by all its ranks" : "");
        RemoveJobLocked(
            q.job_id,
            FailedPreconditionError(name + " was closed by a Close request from " + caller.peer),
            deferred, Ending::kClean);
      }
    }
  }
  RunAll(deferred);
  if (!st.ok() && st.code() != StatusCode::kNotFound)
    refusals_.Log(Now(), "Close", caller.peer, st);
  return st;
}

Status Registry::OpenStream(uint64_t ticket, const Caller& caller, StreamEnd end) {
  Status st;
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    Charge charge;
    if (shut_down_) {
      st = ShuttingDown();
    } else {
      st = AdmitLocked(caller, {}, ticket, /*evictable=*/true, deferred, &charge);
    }
    if (st.ok()) streams_.Open(ticket, charge, std::move(end), Now());
  }
  RunAll(deferred);
  if (!st.ok()) refusals_.Log(Now(), "Attach stream", caller.peer, st);
  return st;
}

Status Registry::Attach(uint64_t ticket, const AttachRequest& q, const Caller& caller,
                        StreamEnd end, Checked checked) {
  Status st;
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    // The stream is a stranger's until it is attached (OpenStream), and no longer pending either
    // way: attached (a member's now), or refused (dropped).
    const bool ended = !streams_.DropOpened(ticket) && q.opened;
    Job* job = nullptr;
    if (shut_down_) {
      st = ShuttingDown();
    } else if (ended) {
      st = CancelledError("the stream ended before its first message was read");
    } else {
      st = AttachableLocked(q, &job);
    }
    Charge charge;
    if (st.ok()) {
      st = AdmitLocked(caller, {q.job_id, job->spec.num_workers}, ticket,
                       /*evictable=*/false, deferred, &charge);
    }
    if (st.ok()) {
      streams_.Attach(ticket, Streams::Attached{q.job_id, q.rank,
                                                q.label.empty() ? "rank " + std::to_string(q.rank)
                                                                : q.label.substr(0, 128),
                                                charge, std::move(end), std::move(checked)});
      job->ranks[q.rank].stream = ticket;
      job->Touch(Now());
    }
  }
  RunAll(deferred);
  if (!st.ok()) refusals_.Log(Now(), "Attach", caller.peer, st);
  return st;
}

Status Registry::AttachableLocked(const AttachRequest& q, Job** job) {
  const std::string name = SessionName(q.job_id);
  if (q.secret.size() > kMaxSecretBytes) return InvalidArgumentError("job secret too long");
  *job = jobs_.FindFor(q.job_id, q.secret);
  if (*job == nullptr) {
    // A session that failed at setup (another rank was refused) is gone from the table: its
    // worker hears why, not that it never registered. Another secret's job is answered as no
    // job (issue 28, found 8).
    if (const Status* failed = failures_.Find(q.job_id, q.secret, Now())) return *failed;
    return FailedPreconditionError(name +
                                   " does not exist on the switch for this job secret: attach "
                                   "after registering (UdpSession)");
  }
  const std::vector<Job::Rank>& ranks = (*job)->ranks;
  if (q.rank >= ranks.size() || !ranks[q.rank].registered) {
    return FailedPreconditionError("rank " + std::to_string(q.rank) + " is not registered in " +
                                   name + ": attach after registering (UdpSession)");
  }
  if (ranks[q.rank].closed) {
    return FailedPreconditionError("rank " + std::to_string(q.rank) + " of " + name +
                                   " has closed its session");
  }
  if (ranks[q.rank].stream != 0) {
    return AlreadyExistsError("rank " + std::to_string(q.rank) + " of " + name +
                              " already has a stream attached");
  }
  return Status::Ok();
}

void Registry::Report(uint64_t ticket, uint64_t allreduce, uint64_t count, uint32_t dtype) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    const Streams::Attached* s = streams_.Find(ticket);
    if (s == nullptr || allreduce == 0) return;
    const uint64_t job_id = s->job_id;
    Job* job = jobs_.Find(job_id);
    if (job == nullptr) return;
    job->Touch(Now());
    AllReduceChecks::Verdict v = job->checks->Announce(allreduce, count, dtype, s->rank, s->name);
    switch (v.kind) {
      case AllReduceChecks::Verdict::Kind::kPending:
        break;
      case AllReduceChecks::Verdict::Kind::kFailed:
        // (This removes the job.)
        FailSessionLocked(job_id, job->secret, FailedPreconditionError(std::move(v.failure)),
                          deferred);
        break;
      case AllReduceChecks::Verdict::Kind::kAgreed:
        if (hooks_.check_agreed) {
          deferred.push_back([f = hooks_.check_agreed, job_id, allreduce, v] {
            f(job_id, allreduce, v.count, v.dtype);
          });
        } else {
          streams_.Confirm(job->Streams(), allreduce, deferred);
        }
        break;
    }
  }
  RunAll(deferred);
}

void Registry::ConfirmCheck(uint64_t job_id, uint64_t allreduce) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (const Job* job = jobs_.Find(job_id)) streams_.Confirm(job->Streams(), allreduce, deferred);
  }
  RunAll(deferred);
}

void Registry::Detach(uint64_t ticket) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (streams_.DropOpened(ticket)) return;
    std::optional<Streams::Attached> s = streams_.Detach(ticket);
    if (!s) return;
    Job* job = jobs_.Find(s->job_id);
    if (job == nullptr) return;
    Job::Rank& r = job->ranks[s->rank];
    if (r.stream != ticket) return;
    r.stream = 0;
    if (r.closed) return;
    FailSessionLocked(
        s->job_id, job->secret,
        FailedPreconditionError(SessionName(s->job_id) + " failed: " + s->name +
                                " lost its control connection to the switch (its process ended "
                                "without closing the session, or its host or network failed)"),
        deferred);
  }
  RunAll(deferred);
}

Result<std::string> Registry::DescribeAllReduce(uint64_t job_id, const std::string& secret,
                                                uint64_t allreduce) {
  std::lock_guard lock(mu_);
  if (secret.size() > kMaxSecretBytes) return InvalidArgumentError("job secret too long");
  // Another secret's job is answered as no job (issue 28, found 8).
  const Job* job = jobs_.FindFor(job_id, secret);
  if (const Status* failure = failures_.Find(job_id, secret, Now())) return *failure;
  if (job == nullptr) return NotFoundError(SessionName(job_id) + kNotOpenForThisSecret);
  return job->checks->Describe(
      allreduce, [job](uint32_t r) { return r < job->ranks.size() && job->ranks[r].closed; });
}

void Registry::ReportFailure(uint64_t ticket, const std::string& why) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    const Streams::Attached* s = streams_.Find(ticket);
    if (s == nullptr) return;
    const Job* job = jobs_.Find(s->job_id);
    if (job == nullptr) return;
    std::string reason = why.substr(0, kMaxReason);
    if (reason.empty()) {
      reason = SessionName(s->job_id) + " failed: " + s->name + " reported a failure";
    }
    FailSessionLocked(s->job_id, job->secret, FailedPreconditionError(reason), deferred);
  }
  RunAll(deferred);
}

void Registry::Fail(uint64_t job_id, const std::string& secret, const Status& why) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (ValidJobId(job_id) && secret.size() <= kMaxSecretBytes && jobs_.Owns(job_id, secret)) {
      FailSessionLocked(job_id, secret, why, deferred);
    }
  }
  RunAll(deferred);
}

// ---------------------------------------------------------------------------------------------
// Time and shutdown.

void Registry::Tick() {
  std::vector<uint64_t> ids;
  if (hooks_.activity) {
    std::lock_guard lock(mu_);
    ids = jobs_.ids();
  }
  std::vector<std::pair<uint64_t, uint64_t>> packets;
  for (uint64_t id : ids) packets.emplace_back(id, hooks_.activity(id));
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, n] : packets) jobs_.NotePackets(id, n, Now());
    RemoveExpiredLocked(jobs_.Expired(Now()),
                        " expired: no worker attached and no activity for " +
                            std::to_string(options_.lease.count()) + " ms; removed",
                        deferred);
    streams_.EndSilent(Now(), options_.first_message_timeout, deferred);
  }
  RunAll(deferred);
}

void Registry::Shutdown() {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    const Status why = ShuttingDown();
    meetings_.FailAll(why, deferred);
    streams_.EndAll(why, deferred);
    for (uint64_t id : jobs_.ids()) {
      for (Job::Rank& r : jobs_.Find(id)->ranks) r.stream = 0;
    }
    limits_.Clear();
  }
  RunAll(deferred);
}

}  // namespace switchml::control
