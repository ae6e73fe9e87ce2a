#include "control/registry.h"

#include <sodium.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "base/check.h"
#include "base/endpoint.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "control/duration_text.h"
#include "control/op_checks.h"
#include "control/rank_set.h"
#include "control/request_rules.h"
#include "proto/wire.h"
#include "switchml/types.h"

namespace switchml::control {
namespace {

// How Close and Diagnose answer for a session without a job, or with the job of another secret.
constexpr const char* kNotOpenForThisSecret =
    " is not open on the switch for this job secret (closed, expired, never opened, or opened "
    "with another secret)";

std::string ClientKey(const Caller& c) {
  if (c.has_ipv4) return Ipv4ToString(c.ipv4);
  const size_t colon = c.peer.rfind(':');
  return colon == std::string::npos ? c.peer : c.peer.substr(0, colon);
}

// Whether registrations of two sessions on one address overlap: "any port" (0) only overlaps
// "any port" (the switch looks up exact ports first, so an explicit range of another session is
// never ambiguous: a port-0 registration cannot squat the address; dataplane::Switch::AddWorker).
bool Overlaps(uint32_t port_a, uint32_t n_a, uint32_t port_b, uint32_t n_b) {
  if (port_a == 0 || port_b == 0) return port_a == port_b;
  return port_a < port_b + n_b && port_b < port_a + n_a;
}

std::string PortsText(uint32_t ipv4, uint32_t port, uint32_t n) {
  if (port == 0) return Ipv4ToString(ipv4) + " (any port)";
  return Ipv4ToString(ipv4) + ":" + std::to_string(port) +
         (n > 1 ? "-" + std::to_string(port + n - 1) : "");
}

// A fresh 16-byte key for a job's authenticated data plane (the kernel's CSPRNG, by libsodium).
std::string NewDataKey() {
  static const int init = sodium_init();
  CHECK(init >= 0) << "libsodium failed to initialise";
  std::string key(16, '\0');
  randombytes_buf(key.data(), key.size());
  return key;
}

}  // namespace

bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

struct Registry::Job {
  dataplane::JobSpec spec;
  std::string secret;
  std::string data_key;  // the authenticated data plane's key; empty: the reference format
  // A striped job's switch hosts as rank 0 listed them (RegisterRequest::switch_list).
  std::string switch_list;
  bool sparse = false;  // block-sparse all-reduces allowed (RegisterRequest::sparse)
  bool sparse_auto = false;  // and the auto rule (RegisterRequest::sparse_auto)
  struct Rank {
    bool registered = false;
    uint32_t ipv4 = 0;
    uint32_t port = 0;
    std::chrono::steady_clock::time_point registered_at{};
    uint64_t stream = 0;  // the attached stream's ticket, 0 when none
    bool closed = false;
  };
  std::vector<Rank> ranks;
  std::chrono::steady_clock::time_point last_activity{};
  uint64_t packets = 0;            // the data plane's count when last looked at
  std::optional<OpChecks> checks;  // the per-all-reduce check (set when the job is created)
  // When the job was created (JobSummaries: its age).
  std::chrono::steady_clock::time_point created{};
};

struct Registry::Stream {
  uint64_t session_id = 0;
  uint32_t rank = 0;
  std::string name;  // how errors name its worker
  Charge charge;
  StreamEnd end;
  Checked checked;
};

struct Registry::PendingStream {
  Charge charge;
  StreamEnd end;
  std::chrono::steady_clock::time_point since;
};

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
      failures_(options.failure_memory),
      limits_(options),
      rounds_(&limits_) {}

Registry::~Registry() { Shutdown(); }

void Registry::set_activity(Activity activity) {
  std::lock_guard lock(mu_);
  activity_ = std::move(activity);
}

std::chrono::steady_clock::time_point Registry::Now() const {
  return clock_ ? clock_() : std::chrono::steady_clock::now();
}

uint64_t Registry::NewTicket() {
  std::lock_guard lock(mu_);
  return next_ticket_++;
}

uint32_t Registry::waiting_calls() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(rounds_.waiting());
}

uint32_t Registry::attached_streams() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(streams_.size());
}

std::vector<Registry::JobSummary> Registry::JobSummaries(const std::string* secret,
                                                         uint32_t* hidden) const {
  std::lock_guard lock(mu_);
  const auto now = Now();
  std::vector<JobSummary> out;
  if (hidden != nullptr) *hidden = 0;
  for (const auto& [id, job] : jobs_) {
    if (secret != nullptr && !job->secret.empty() && !SameSecret(job->secret, *secret)) {
      if (hidden != nullptr) ++*hidden;
      continue;
    }
    JobSummary& s = out.emplace_back();
    s.session_id = id;
    s.num_workers = job->spec.num_workers;
    for (const Job::Rank& r : job->ranks) {
      s.registered += r.registered;
      s.attached += r.stream != 0;
      s.closed += r.closed;
    }
    s.age = now - job->created;
    s.allreduces = job->checks->newest_agreed_op();
    s.has_secret = !job->secret.empty();
    s.authenticated_data = !job->data_key.empty();
  }
  std::sort(out.begin(), out.end(),
            [](const JobSummary& a, const JobSummary& b) { return a.session_id < b.session_id; });
  return out;
}

uint32_t Registry::pending_streams() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(pending_.size());
}

uint32_t Registry::forwarded_calls() const {
  std::lock_guard lock(mu_);
  return limits_.forwarded_calls();
}

uint32_t Registry::stranger_calls() const {
  std::lock_guard lock(mu_);
  return limits_.stranger_calls();
}

uint32_t Registry::member_calls(uint64_t session_id) const {
  std::lock_guard lock(mu_);
  return limits_.member_calls(session_id);
}

bool Registry::HasJob(uint64_t session_id) const {
  std::lock_guard lock(mu_);
  return jobs_.count(session_id) != 0;
}

void Registry::LogRefusal(const std::string& what, const Caller& caller, const Status& why) {
  refusals_.Log(Now(), what, caller.peer, why);
}

// ---------------------------------------------------------------------------------------------
// Jobs.

Status Registry::CheckSecretLocked(const Job& job, const std::string& secret,
                                   uint64_t session_id) const {
  if (SameSecret(job.secret, secret)) return Status::Ok();
  return PermissionDeniedError(SessionName(session_id) + " belongs to another job: the request " +
                               (secret.empty() ? "carries no job secret"
                                               : "carries another job "
                                                 "secret") +
                               " (every worker of a job must use the secret its rank 0 created "
                               "the job with)");
}

bool Registry::OwnsLocked(uint64_t session_id, const std::string& secret) const {
  auto it = jobs_.find(session_id);
  return it == jobs_.end() || SameSecret(it->second->secret, secret);
}

void Registry::Touch(Job& job) { job.last_activity = Now(); }

bool Registry::RankAliveLocked(const Job& job, uint32_t rank) const {
  const Job::Rank& r = job.ranks[rank];
  if (!r.registered || r.closed) return false;
  if (r.stream != 0) return true;
  const bool ours = !job.secret.empty() || job.spec.running_tsi;
  return ours && Now() - r.registered_at < options_.attach_grace;
}

bool Registry::ExpiredLocked(const Job& job) const {
  for (uint32_t r = 0; r < job.ranks.size(); ++r) {
    if (RankAliveLocked(job, r)) return false;
  }
  return Now() - job.last_activity >= options_.lease;
}

Status Registry::CreateJobLocked(const dataplane::JobSpec& spec, const std::string& secret) {
  std::vector<uint64_t> evicted;
  {
    std::lock_guard lock(sw_->mu);
    Status st = sw_->sw.CreateJob(spec, &evicted);
    if (!st.ok()) return st;
  }
  // The registry made room first, so the switch never evicts (it would, were it out of room).
  for (uint64_t gone : evicted) {
    LOG(kError, kControl) << "the switch evicted " << SessionName(gone)
                          << " unexpectedly (the registry's job table disagrees with it)";
  }
  auto job = std::make_unique<Job>();
  job->spec = spec;
  job->secret = secret;
  job->ranks.resize(spec.num_workers);
  job->checks.emplace(SessionName(spec.session_id), spec.num_workers, options_.max_open_checks);
  job->last_activity = job->created = Now();
  jobs_[spec.session_id] = std::move(job);
  if (hooks_.job_created) hooks_.job_created(spec.session_id);
  return Status::Ok();
}

void Registry::RemoveJobLocked(uint64_t session_id, const Status& why, Deferred& deferred,
                               Ending ending) {
  auto it = jobs_.find(session_id);
  if (it == jobs_.end()) return;
  if (hooks_.job_ended && ending != Ending::kReplaced) {
    deferred.push_back([f = hooks_.job_ended, session_id,
                        st = ending == Ending::kClean ? Status::Ok() : why] { f(session_id, st); });
  }
  {
    std::lock_guard lock(sw_->mu);
    sw_->sw.RemoveJob(session_id).IgnoreError();
  }
  if (hooks_.job_removed) hooks_.job_removed(session_id);
  for (const Job::Rank& r : it->second->ranks) {
    if (r.stream == 0) continue;
    auto s = streams_.find(r.stream);
    if (s == streams_.end()) continue;
    limits_.Release(s->second->charge, s->first);
    deferred.push_back([end = std::move(s->second->end), why] { end(why); });
    streams_.erase(s);
  }
  jobs_.erase(it);
}

Status Registry::MakeRoomLocked(uint64_t session_id, Deferred& deferred) {
  const uint32_t max_jobs = sw_->sw.config().max_jobs;
  if (jobs_.size() < max_jobs || jobs_.count(session_id) != 0) return Status::Ok();
  std::vector<uint64_t> expired;
  for (const auto& [id, job] : jobs_) {
    if (ExpiredLocked(*job)) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    LOG(kInfo, kControl) << SessionName(id) << " expired (no worker attached, no activity for "
                         << options_.lease.count() / 1000 << " s): removed to make room";
    RemoveJobLocked(id, FailedPreconditionError(SessionName(id) + " expired"), deferred,
                    Ending::kClean);
  }
  if (jobs_.size() < max_jobs) return Status::Ok();
  // Still full: the job idle the longest, if it has been idle for idle_reclaim (its workers may
  // be attached: they fail, told why). One is enough.
  const auto now = Now();
  const Job* idlest = nullptr;
  for (const auto& [id, job] : jobs_) {
    if (now - job->last_activity >= options_.idle_reclaim &&
        (idlest == nullptr || job->last_activity < idlest->last_activity)) {
      idlest = job.get();
    }
  }
  if (idlest != nullptr) {
    const uint64_t id = idlest->spec.session_id;
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

Status Registry::ClearAddressLocked(uint64_t session_id, uint32_t ipv4, uint32_t port,
                                    uint32_t num_ports, Deferred& deferred) {
  std::vector<uint64_t> expired;
  for (const auto& [id, job] : jobs_) {
    if (id == session_id) continue;
    for (uint32_t r = 0; r < job->ranks.size(); ++r) {
      const Job::Rank& other = job->ranks[r];
      if (!other.registered || other.ipv4 != ipv4 ||
          !Overlaps(port, num_ports, other.port, job->spec.num_ports)) {
        continue;
      }
      if (!ExpiredLocked(*job)) {
        return AlreadyExistsError(
            "address " + PortsText(ipv4, port, num_ports) + " is registered to rank " +
            std::to_string(r) + " of " + SessionName(id) + " (" +
            PortsText(other.ipv4, other.port, job->spec.num_ports) +
            "), a live job: use other UDP ports, or wait until that job closes or expires");
      }
      expired.push_back(id);
      break;
    }
  }
  for (uint64_t id : expired) {
    LOG(kInfo, kControl) << SessionName(id) << " expired; removed: its address is taken over";
    RemoveJobLocked(id, FailedPreconditionError(SessionName(id) + " expired"), deferred,
                    Ending::kClean);
  }
  return Status::Ok();
}

Status Registry::Register(const RegisterRequest& r, const Caller& caller, std::string* data_key,
                          bool* multicast_group_kept) {
  uint32_t worker_ipv4 = 0;
  Status st = ValidateRegistration(options_, sw_->sw.config(), r, caller, &worker_ipv4);
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) {
      st = UnavailableError("the switch control plane is shutting down");
    } else if (st.ok()) {
      st = RegisterLocked(r, worker_ipv4, deferred);
      if (st.ok() && data_key != nullptr) *data_key = jobs_.at(r.session_id)->data_key;
      if (st.ok() && multicast_group_kept != nullptr) {
        // The switch's spec: it clears a group it cannot keep (dataplane::Switch::CreateJob).
        std::lock_guard sw_lock(sw_->mu);
        const dataplane::JobSpec* spec = sw_->sw.FindJob(r.session_id);
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
    const bool bad_id = r.session_id == 0 || r.session_id == UINT64_MAX;
    if (!st.ok() && !bad_id && st.code() != StatusCode::kPermissionDenied &&
        st.code() != StatusCode::kUnavailable && r.secret.size() <= kMaxSecretBytes) {
      FailSessionLocked(
          r.session_id, r.secret,
          FailedPreconditionError(SessionName(r.session_id) + " failed at setup: rank " +
                                  std::to_string(r.rank) + " was refused: " + st.message()),
          deferred);
    }
  }
  for (auto& f : deferred) f();
  if (!st.ok()) LogRefusal("UdpSession of rank " + std::to_string(r.rank), caller, st);
  return st;
}

Status Registry::RegisterLocked(const RegisterRequest& r, uint32_t ipv4, Deferred& deferred) {
  const std::string name = SessionName(r.session_id);
  const uint32_t num_ports = r.num_udp_ports == 0 ? 1 : r.num_udp_ports;
  dataplane::JobSpec spec;
  spec.session_id = r.session_id;
  spec.num_workers = r.num_workers;
  spec.size = static_cast<proto::SizeCode>(r.packet_size);
  spec.num_ports = num_ports;
  spec.max_outstanding_packets =
      r.max_outstanding_packets == 0 ? kDefaultWindow : r.max_outstanding_packets;
  spec.running_tsi = r.running_tsi;
  dataplane::WorkerSpec worker{ipv4, static_cast<uint16_t>(r.udp_port)};
  Endpoint group;
  // A worker is offered a group only in the scope the switch sends groups to: a loopback group
  // reaches only this host's workers (TTL 0), a LAN group only workers beyond the loopback
  // interface. (Not with the authenticated data plane either: the group's datagrams carry no
  // tag.)
  constexpr uint32_t kLoopbackNet = 0x7f000000, kLoopbackMask = 0xff000000;
  const dataplane::SwitchConfig& sc = sw_->sw.config();
  const bool local = (ipv4 & kLoopbackMask) == kLoopbackNet;
  if (r.multicast_group_ipv4 != 0 && !r.authenticate_data &&
      (local ? sc.loopback_multicast : sc.lan_multicast)) {
    group = Endpoint{r.multicast_group_ipv4, static_cast<uint16_t>(r.multicast_group_port)};
    spec.multicast_group = group;
  }

  auto it = jobs_.find(r.session_id);
  Job* job = it == jobs_.end() ? nullptr : it->second.get();
  if (r.rank == 0) {
    if (job != nullptr) {
      RETURN_IF_ERROR(CheckSecretLocked(*job, r.secret, r.session_id));
      if (RankAliveLocked(*job, 0)) {
        const Job::Rank& first = job->ranks[0];
        return AlreadyExistsError(
            "rank 0 of " + name + " is already registered by a live worker (at " +
            PortsText(first.ipv4, first.port, job->spec.num_ports) +
            "): two workers were started as rank 0, or two jobs use one session id");
      }
      RemoveJobLocked(r.session_id,
                      FailedPreconditionError(name + " was re-created by a new rank 0"), deferred,
                      Ending::kReplaced);
      job = nullptr;
    }
    failures_.Forget(r.session_id);
    RETURN_IF_ERROR(MakeRoomLocked(r.session_id, deferred));
    RETURN_IF_ERROR(ClearAddressLocked(r.session_id, ipv4, r.udp_port, num_ports, deferred));
    RETURN_IF_ERROR(CreateJobLocked(spec, r.secret));
    job = jobs_[r.session_id].get();
    if (r.authenticate_data) job->data_key = NewDataKey();
    job->switch_list = r.switch_list;
    job->sparse = r.sparse;
    job->sparse_auto = r.sparse_auto;
  } else {
    if (const Status* failure = FailureLocked(r.session_id, r.secret)) return *failure;
    // Another secret's job is answered as no job (issue 28, found 8: whether a session id is in
    // use is not told to a stranger; Register of rank 0 and Sync still refuse a live job's
    // session id with PERMISSION_DENIED, docs/security.md 2).
    if (job == nullptr || !SameSecret(job->secret, r.secret)) {
      return FailedPreconditionError(
          name +
          " does not exist on the switch for this job secret: rank 0 must open it before the "
          "other ranks, with the secret every worker of the job uses (was rank 0 started, with "
          "the same session id and job secret?)");
    }
    auto mismatch = [&](const std::string& field, const std::string& mine,
                        const std::string& theirs, const std::string& fix) {
      return InvalidArgumentError(field + " " + mine + " does not match " + name + "'s " + theirs +
                                  " (set by rank 0): " + fix);
    };
    const dataplane::JobSpec& j = job->spec;
    if (j.num_workers != spec.num_workers) {
      return mismatch("num_workers", std::to_string(spec.num_workers),
                      std::to_string(j.num_workers), "start every worker with the same --workers");
    }
    if (j.size != spec.size) {
      return mismatch("packet size", PacketSizeName(r.packet_size),
                      PacketSizeName(static_cast<int>(j.size)),
                      "start every worker with the same elements per packet");
    }
    if (j.num_ports != spec.num_ports) {
      return mismatch("num_udp_ports", std::to_string(spec.num_ports), std::to_string(j.num_ports),
                      "start every worker with the same number of worker threads");
    }
    if (j.max_outstanding_packets != spec.max_outstanding_packets) {
      return mismatch("max_outstanding_packets", std::to_string(spec.max_outstanding_packets),
                      std::to_string(j.max_outstanding_packets),
                      "start every worker with the same window (max outstanding packets)");
    }
    if (j.running_tsi != spec.running_tsi) {
      return mismatch("running_tsi", spec.running_tsi ? "true" : "false",
                      j.running_tsi ? "true" : "false",
                      "do not mix this project's workers with other clients in one job");
    }
    if (job->switch_list != r.switch_list) {
      auto list = [](const std::string& l) { return l.empty() ? "one switch" : "[" + l + "]"; };
      return mismatch("switch hosts", list(r.switch_list), list(job->switch_list),
                      "start every worker with the same --switch list, in the same order");
    }
    if (job->data_key.empty() == r.authenticate_data) {
      return mismatch("authenticate_data", r.authenticate_data ? "true" : "false",
                      r.authenticate_data ? "false" : "true",
                      "start every worker of the job with --auth-data, or none");
    }
    if (job->sparse != r.sparse) {
      return mismatch("sparse", r.sparse ? "true" : "false", job->sparse ? "true" : "false",
                      "start every worker of the job with --sparse, or none");
    }
    if (job->sparse_auto != r.sparse_auto) {
      return mismatch("sparse_auto", r.sparse_auto ? "true" : "false",
                      job->sparse_auto ? "true" : "false",
                      "start every worker of the job with the same --sparse mode (on or auto)");
    }
    RETURN_IF_ERROR(ClearAddressLocked(r.session_id, ipv4, r.udp_port, num_ports, deferred));
  }

  std::vector<uint64_t> evicted;
  Status added;
  {
    std::lock_guard lock(sw_->mu);
    added = sw_->sw.AddWorker(r.session_id, r.rank, worker, &evicted, group);
  }
  for (uint64_t gone : evicted) {
    LOG(kError, kControl) << "the switch evicted " << SessionName(gone)
                          << " unexpectedly (the registry's job table disagrees with it)";
  }
  if (!added.ok()) {
    // Without rank 0 the job can never run: do not leave it holding a job entry.
    if (r.rank == 0) RemoveJobLocked(r.session_id, added, deferred, Ending::kFailed);
    return added;
  }
  if (!job->data_key.empty() && hooks_.data_key_added) {
    hooks_.data_key_added(r.session_id, job->data_key, r.rank, ipv4, r.udp_port, num_ports);
  }
  Job::Rank& rank = job->ranks[r.rank];
  rank.registered = true;
  rank.ipv4 = ipv4;
  rank.port = r.udp_port;
  rank.registered_at = Now();
  Touch(*job);
  LOG(kInfo, kControl) << name << ": rank " << r.rank << " of " << r.num_workers
                       << " registered at " << PortsText(ipv4, r.udp_port, num_ports)
                       << (r.rank == 0 ? " (job created" : "")
                       << (r.rank == 0 ? (r.secret.empty() ? ", no secret" : ", with a secret")
                                       : "")
                       << (r.rank == 0 ? (job->data_key.empty() ? ")" : ", authenticated data)")
                                       : "");
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Failures.

const Status* Registry::FailureLocked(uint64_t session_id, const std::string& secret) {
  return failures_.Find(session_id, secret, Now());
}

void Registry::FailSessionLocked(uint64_t session_id, const std::string& secret, const Status& why,
                                 Deferred& deferred) {
  if (session_id == 0) return;  // 0 is the unscoped sync group, never a failed session
  const bool has_job = jobs_.count(session_id) != 0;
  const bool owner = OwnsLocked(session_id, secret);
  failures_.Mark(session_id, secret, why, has_job && owner, Now());
  rounds_.FailSession(session_id, secret, why, deferred);
  if (has_job && owner) {
    LOG(kInfo, kControl) << why.message();
    RemoveJobLocked(session_id, FailedPreconditionError(why.message()), deferred, Ending::kFailed);
  }
}

// ---------------------------------------------------------------------------------------------
// Limits.

bool Registry::MemberLocked(uint64_t session_id, const std::string& secret) const {
  if (session_id == 0) return false;
  auto it = jobs_.find(session_id);
  return it != jobs_.end() && SameSecret(it->second->secret, secret);
}

CallLimits::Evict Registry::EvictorLocked(Deferred& deferred) {
  return [this, &deferred](uint64_t ticket, const std::string& why) {
    EvictLocked(ticket, why, deferred);
  };
}

Status Registry::AdmitLocked(const Caller& caller, uint64_t member_session, uint64_t ticket,
                             bool evictable, Deferred& deferred, Charge* charge) {
  return limits_.Admit(ClientKey(caller), AllowanceLocked(member_session), ticket, evictable,
                       EvictorLocked(deferred), charge);
}

CallLimits::Member Registry::AllowanceLocked(uint64_t member_session) const {
  if (member_session == 0) return {};
  return {member_session, jobs_.at(member_session)->spec.num_workers};
}

void Registry::EvictLocked(uint64_t ticket, const std::string& why, Deferred& deferred) {
  const Status status = ResourceExhaustedError(why);
  if (SyncDone done = rounds_.Leave(ticket)) {
    deferred.push_back([done = std::move(done), status] { done(status, ErrorReason::kNone, 0); });
    return;
  }
  if (auto p = pending_.find(ticket); p != pending_.end()) {
    limits_.Release(p->second->charge, ticket);
    deferred.push_back([end = std::move(p->second->end), status] { end(status); });
    pending_.erase(p);
  }
}

// ---------------------------------------------------------------------------------------------
// Barrier and Broadcast.

void Registry::Sync(uint64_t ticket, const SyncRequest& q, const Caller& caller, SyncDone done) {
  const std::string scope = SyncScope(q);
  Status st = ValidateSync(options_, sw_->sw.config(), q, scope);
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (st.ok() && shut_down_) st = UnavailableError("the switch control plane is shutting down");
    Job* job = nullptr;
    if (st.ok() && q.session_id != 0) {
      if (auto it = jobs_.find(q.session_id); it != jobs_.end()) job = it->second.get();
      if (job != nullptr) st = CheckSecretLocked(*job, q.secret, q.session_id);
      if (st.ok()) {
        if (const Status* failure = FailureLocked(q.session_id, q.secret)) st = *failure;
      }
    }
    Charge charge;
    if (st.ok()) {
      st = AdmitLocked(caller, job != nullptr ? q.session_id : 0, ticket, /*evictable=*/true,
                       deferred, &charge);
    }
    if (st.ok()) {
      if (job != nullptr) Touch(*job);
      bool whole_round = false;
      st = rounds_.Join(ticket, q, scope, charge, done, Now(), deferred, &whole_round);
      if (!st.ok() && whole_round) {
        if (q.session_id != 0) FailSessionLocked(q.session_id, q.secret, st, deferred);
        rounds_.FailRoundOf(q, st, deferred);
      }
    }
  }
  for (auto& f : deferred) f();
  if (!st.ok()) {
    LogRefusal(scope, caller, st);
    if (done) done(st, ErrorReason::kNone, 0);
  }
}

void Registry::CancelWait(uint64_t ticket, const Status& why) {
  SyncDone done;
  {
    std::lock_guard lock(mu_);
    done = rounds_.Leave(ticket);
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
    done = rounds_.Expire(ticket, Now(), &why);
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
    const std::string name = SessionName(q.session_id);
    auto it = jobs_.find(q.session_id);
    if (q.secret.size() > kMaxSecretBytes) {
      st = InvalidArgumentError("job secret too long");
    } else if (!q.failure.empty()) {
      // A member's side failed: the session fails here too, also before it has a job (its
      // waiting barriers and broadcasts end), as a refusal of one of its ranks fails it.
      constexpr size_t kMaxReason = 1024;
      if (q.session_id == 0 || q.session_id == UINT64_MAX) {
        st = InvalidArgumentError("a failure needs a session id");
      } else {
        // (A stranger's report, with another secret than the job's, fails only its own calls.)
        FailSessionLocked(q.session_id, q.secret,
                          FailedPreconditionError(q.failure.substr(0, kMaxReason)), deferred);
      }
    } else if (it == jobs_.end() || !SameSecret(it->second->secret, q.secret)) {
      // Another secret's job is answered as no job (issue 28, found 8).
      st = NotFoundError(name + kNotOpenForThisSecret);
    } else {
      Job& job = *it->second;
      if (st.ok() && q.has_rank && q.rank >= job.ranks.size()) {
        st = InvalidArgumentError("rank " + std::to_string(q.rank) + " is out of range for " +
                                  name + "'s " + std::to_string(job.ranks.size()) + " workers");
      }
      // Only a registered rank can have finished with the job. A Close for one that is not (a
      // late one from an earlier attempt of the session id, whose rank 0 re-created the job
      // since) must not mark it closed: its new worker's Attach would be refused.
      if (st.ok() && q.has_rank && !job.ranks[q.rank].registered) {
        st = FailedPreconditionError("rank " + std::to_string(q.rank) + " is not registered in " +
                                     name + ": nothing of it to close");
      }
      if (st.ok()) {
        bool all_closed = !q.has_rank;
        if (q.has_rank) {
          job.ranks[q.rank].closed = true;
          Touch(job);
          all_closed = std::all_of(job.ranks.begin(), job.ranks.end(),
                                   [](const Job::Rank& r) { return !r.registered || r.closed; });
        }
        if (all_closed) {
          LOG(kInfo, kControl) << name << " closed" << (q.has_rank ? " by all its ranks" : "");
          RemoveJobLocked(
              q.session_id,
              FailedPreconditionError(name + " was closed by a Close request from " + caller.peer),
              deferred, Ending::kClean);
        }
      }
    }
  }
  for (auto& f : deferred) f();
  if (!st.ok() && st.code() != StatusCode::kNotFound) LogRefusal("Close", caller, st);
  return st;
}

Status Registry::OpenStream(uint64_t ticket, const Caller& caller, StreamEnd end) {
  Status st;
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    Charge charge;
    if (shut_down_) {
      st = UnavailableError("the switch control plane is shutting down");
    } else {
      st = AdmitLocked(caller, 0, ticket, /*evictable=*/true, deferred, &charge);
    }
    if (st.ok()) {
      auto p = std::make_unique<PendingStream>();
      p->charge = std::move(charge);
      p->end = std::move(end);
      p->since = Now();
      pending_[ticket] = std::move(p);
    }
  }
  for (auto& f : deferred) f();
  if (!st.ok()) LogRefusal("Attach stream", caller, st);
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
    bool ended = q.opened;
    if (auto p = pending_.find(ticket); p != pending_.end()) {
      limits_.Release(p->second->charge, ticket);
      pending_.erase(p);
      ended = false;
    }
    const std::string name = SessionName(q.session_id);
    auto it = jobs_.find(q.session_id);
    if (shut_down_) {
      st = UnavailableError("the switch control plane is shutting down");
    } else if (ended) {
      st = CancelledError("the stream ended before its first message was read");
    } else if (q.secret.size() > kMaxSecretBytes) {
      st = InvalidArgumentError("job secret too long");
    } else if (it == jobs_.end() || !SameSecret(it->second->secret, q.secret)) {
      // A session that failed at setup (another rank was refused) is gone from the table: its
      // worker hears why, not that it never registered. Another secret's job is answered as no
      // job (issue 28, found 8).
      const Status* failed = FailureLocked(q.session_id, q.secret);
      st = failed != nullptr ? *failed
                             : FailedPreconditionError(name +
                                                       " does not exist on the switch for this "
                                                       "job secret: attach after registering "
                                                       "(UdpSession)");
    } else {
      Job& job = *it->second;
      if (st.ok() && (q.rank >= job.ranks.size() || !job.ranks[q.rank].registered)) {
        st = FailedPreconditionError("rank " + std::to_string(q.rank) + " is not registered in " +
                                     name + ": attach after registering (UdpSession)");
      }
      if (st.ok() && job.ranks[q.rank].closed) {
        st = FailedPreconditionError("rank " + std::to_string(q.rank) + " of " + name +
                                     " has closed its session");
      }
      if (st.ok() && job.ranks[q.rank].stream != 0) {
        st = AlreadyExistsError("rank " + std::to_string(q.rank) + " of " + name +
                                " already has a stream attached");
      }
      Charge charge;
      if (st.ok()) {
        st = AdmitLocked(caller, q.session_id, ticket, /*evictable=*/false, deferred, &charge);
      }
      if (st.ok()) {
        auto s = std::make_unique<Stream>();
        s->session_id = q.session_id;
        s->rank = q.rank;
        s->name = q.label.empty() ? "rank " + std::to_string(q.rank) : q.label.substr(0, 128);
        s->charge = charge;
        s->end = std::move(end);
        s->checked = std::move(checked);
        streams_[ticket] = std::move(s);
        job.ranks[q.rank].stream = ticket;
        Touch(job);
      }
    }
  }
  for (auto& f : deferred) f();
  if (!st.ok()) LogRefusal("Attach", caller, st);
  return st;
}

void Registry::Report(uint64_t ticket, uint64_t op, uint64_t count, uint32_t dtype) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    auto s = streams_.find(ticket);
    if (s == streams_.end() || op == 0) return;
    const uint64_t session_id = s->second->session_id;
    auto j = jobs_.find(session_id);
    if (j == jobs_.end()) return;
    Job& job = *j->second;
    Touch(job);
    OpChecks::Verdict v = job.checks->Announce(op, count, dtype, s->second->rank, s->second->name);
    switch (v.kind) {
      case OpChecks::Verdict::Kind::kPending:
        break;
      case OpChecks::Verdict::Kind::kFailed:
        // (This removes the job.)
        FailSessionLocked(session_id, job.secret, FailedPreconditionError(std::move(v.failure)),
                          deferred);
        break;
      case OpChecks::Verdict::Kind::kAgreed:
        if (hooks_.check_agreed) {
          deferred.push_back([f = hooks_.check_agreed, session_id, op, v] {
            f(session_id, op, v.count, v.dtype);
          });
        } else {
          ConfirmLocked(job, op, deferred);
        }
        break;
    }
  }
  for (auto& f : deferred) f();
}

void Registry::ConfirmLocked(const Job& job, uint64_t op, Deferred& deferred) {
  for (const Job::Rank& r : job.ranks) {
    auto peer = streams_.find(r.stream);
    if (r.stream == 0 || peer == streams_.end() || !peer->second->checked) continue;
    deferred.push_back([f = peer->second->checked, op] { f(op); });
  }
}

void Registry::ConfirmCheck(uint64_t session_id, uint64_t op) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    auto j = jobs_.find(session_id);
    if (j == jobs_.end()) return;
    ConfirmLocked(*j->second, op, deferred);
  }
  for (auto& f : deferred) f();
}

void Registry::Detach(uint64_t ticket) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (auto p = pending_.find(ticket); p != pending_.end()) {
      limits_.Release(p->second->charge, ticket);
      pending_.erase(p);
      return;
    }
    auto s = streams_.find(ticket);
    if (s == streams_.end()) return;
    const uint64_t session_id = s->second->session_id;
    const uint32_t rank = s->second->rank;
    const std::string name = s->second->name;
    limits_.Release(s->second->charge, ticket);
    streams_.erase(s);
    auto j = jobs_.find(session_id);
    if (j == jobs_.end()) return;
    Job& job = *j->second;
    Job::Rank& r = job.ranks[rank];
    if (r.stream != ticket) return;
    r.stream = 0;
    if (r.closed) return;
    FailSessionLocked(
        session_id, job.secret,
        FailedPreconditionError(SessionName(session_id) + " failed: " + name +
                                " lost its control connection to the switch (its process ended "
                                "without closing the session, or its host or network failed)"),
        deferred);
  }
  for (auto& f : deferred) f();
}

Result<std::string> Registry::DescribeOp(uint64_t session_id, const std::string& secret,
                                         uint64_t op) {
  std::lock_guard lock(mu_);
  const std::string name = SessionName(session_id);
  if (secret.size() > kMaxSecretBytes) return InvalidArgumentError("job secret too long");
  auto j = jobs_.find(session_id);
  // Another secret's job is answered as no job (issue 28, found 8).
  if (j != jobs_.end() && !SameSecret(j->second->secret, secret)) j = jobs_.end();
  if (const Status* failure = FailureLocked(session_id, secret)) return *failure;
  if (j == jobs_.end()) return NotFoundError(name + kNotOpenForThisSecret);
  const Job& job = *j->second;
  return job.checks->Describe(
      op, [&job](uint32_t r) { return r < job.ranks.size() && job.ranks[r].closed; });
}

void Registry::ReportFailure(uint64_t ticket, const std::string& why) {
  constexpr size_t kMaxReason = 1024;
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    auto s = streams_.find(ticket);
    if (s == streams_.end()) return;
    const uint64_t session_id = s->second->session_id;
    auto j = jobs_.find(session_id);
    if (j == jobs_.end()) return;
    std::string reason = why.substr(0, kMaxReason);
    if (reason.empty()) {
      reason = SessionName(session_id) + " failed: " + s->second->name + " reported a failure";
    }
    FailSessionLocked(session_id, j->second->secret, FailedPreconditionError(reason), deferred);
  }
  for (auto& f : deferred) f();
}

void Registry::Fail(uint64_t session_id, const std::string& secret, const Status& why) {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (session_id != 0 && session_id != UINT64_MAX && secret.size() <= kMaxSecretBytes &&
        OwnsLocked(session_id, secret)) {
      FailSessionLocked(session_id, secret, why, deferred);
    }
  }
  for (auto& f : deferred) f();
}

Status Registry::AdmitForwarded(uint64_t ticket, const Caller& caller, uint64_t session_id,
                                const std::string& secret, bool upstream) {
  Status st;
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) {
      st = UnavailableError("the switch control plane is shutting down");
    } else {
      const uint64_t member_session = MemberLocked(session_id, secret) ? session_id : 0;
      st = limits_.AdmitForwarded(ClientKey(caller), AllowanceLocked(member_session), ticket,
                                  upstream, EvictorLocked(deferred));
    }
  }
  for (auto& f : deferred) f();
  if (!st.ok()) LogRefusal(upstream ? "forwarded call" : "call", caller, st);
  return st;
}

void Registry::ReleaseForwarded(uint64_t ticket) {
  std::lock_guard lock(mu_);
  limits_.ReleaseForwarded(ticket);
}

void Registry::Tick() {
  std::vector<uint64_t> ids;
  Activity activity;
  {
    std::lock_guard lock(mu_);
    activity = activity_;
    if (activity) {
      for (const auto& [id, job] : jobs_) ids.push_back(id);
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> packets;
  for (uint64_t id : ids) packets.emplace_back(id, activity(id));
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, n] : packets) {
      auto j = jobs_.find(id);
      if (j == jobs_.end()) continue;
      if (n != j->second->packets) {
        j->second->packets = n;
        Touch(*j->second);
      }
    }
    std::vector<uint64_t> expired;
    for (const auto& [id, job] : jobs_) {
      if (ExpiredLocked(*job)) expired.push_back(id);
    }
    for (uint64_t id : expired) {
      LOG(kInfo, kControl) << SessionName(id) << " expired: no worker attached and no activity for "
                           << options_.lease.count() << " ms; removed";
      RemoveJobLocked(id, FailedPreconditionError(SessionName(id) + " expired"), deferred,
                      Ending::kClean);
    }
    // Streams that never sent their first message.
    const auto now = Now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (now - it->second->since < options_.first_message_timeout) {
        ++it;
        continue;
      }
      limits_.Release(it->second->charge, it->first);
      deferred.push_back(
          [end = std::move(it->second->end),
           why = DeadlineExceededError("no first message (AttachRequest) within " +
                                       FormatTimeout(options_.first_message_timeout) +
                                       " of opening the stream")] { end(why); });
      it = pending_.erase(it);
    }
  }
  for (auto& f : deferred) f();
}

void Registry::Shutdown() {
  Deferred deferred;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    const Status why = UnavailableError("the switch control plane is shutting down");
    rounds_.FailAll(why, deferred);
    for (auto& [ticket, s] : streams_) {
      deferred.push_back([end = std::move(s->end), why] { end(why); });
    }
    streams_.clear();
    for (auto& [id, job] : jobs_) {
      for (auto& r : job->ranks) r.stream = 0;
    }
    for (auto& [ticket, p] : pending_) {
      deferred.push_back([end = std::move(p->end), why] { end(why); });
    }
    pending_.clear();
    limits_.Clear();
  }
  for (auto& f : deferred) f();
}

}  // namespace switchml::control
