// Registry: the switch's control-plane state, without gRPC: jobs (who owns them, which ranks are
// registered, attached and closed), their leases, barrier and broadcast meetings, worker streams
// and the per-all-reduce tensor check. control::ControlServer is a thin gRPC adapter over it; the
// unit tests drive it directly (registry_test.cc).
//
// The registry is a coordinator: it holds the lock, mirrors its jobs into the data plane
// (dataplane::Switch) and runs the hooks; the state lives in rooms of its own, each used under
// the registry's lock: JobTable (the jobs by id, a pure core), Streams (the worker streams of
// Session.Attach and the fan-out of their ends and confirmations), CallLimits (who holds how many
// calls and streams), Meetings (the Barrier/Broadcast rendezvous), an AllReduceChecks per job
// (the per-all-reduce check) and FailureMarks (sessions marked failed). request_rules.h checks a
// request's fields before the lock is taken; RefusalLog logs refusals at a bounded rate.
//
// Waiting calls hold no thread: Barrier/Broadcast take a completion callback that runs exactly
// once, when the meeting completes, fails, or the call is cancelled (CancelWait) or the registry
// shuts down. Attach registers a worker's stream with callbacks for its end and its checks.
// Callbacks never run under the registry's lock (they may call back into the registry), but
// they may run inline, before the call that registered them returns.
//
// Security (docs/security.md): every field is validated before anything is allocated; a job
// created with a secret only accepts requests that carry the same secret (PERMISSION_DENIED
// otherwise, and nothing about the job changes); a refusal marks a job failed only when the
// caller proved it belongs to the job; outstanding waits and streams are limited per client
// address and in total; refusals are logged at a bounded rate.
//
// Ownership: the LockedSwitch is not owned and must outlive the registry; the registry locks its
// mutex around every switch call and never holds it while calling back. Thread-safety: all
// methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/call_limits.h"
#include "control/deferred.h"
#include "control/error_reason.h"
#include "control/failure_marks.h"
#include "control/job_table.h"
#include "control/meetings.h"
#include "control/refusal_log.h"
#include "control/streams.h"
#include "dataplane/switch.h"
#include "switchml/status.h"

namespace switchml::control {

struct RegistryOptions {
  // Refuse requests without a job secret (jobs and sync calls alike).
  bool require_secret = false;
  // Let a registration claim an IPv4 other than the one its control connection comes from.
  bool allow_foreign_address = false;
  // How long a failed job keeps failing its sync calls (4.5 in docs/protocol.md).
  std::chrono::milliseconds failure_memory{10000};
  // A job with no attached worker stream and no activity (control calls of the job, data-plane
  // packets) for this long has expired: it is removed, and its room and ports are free.
  std::chrono::milliseconds lease{60000};
  // A rank registered with a secret (or by our workers: running_tsi) counts as alive for this
  // long before its stream is attached.
  std::chrono::milliseconds attach_grace{5000};
  // Calls are counted by who makes them (docs/security.md 2, "Limits"):
  //   - a job's members (the request carries the secret of a job on the switch, or the job has
  //     none) against their job's own allowance, kMemberCallsPerWorker per worker of the job
  //     (waiting Barrier/Broadcast calls, attached streams, forwarded calls): strangers can
  //     never use it up;
  //   - everyone else (unscoped calls, calls of sessions without a job or with another secret,
  //     streams before their first message) as strangers: at most max_calls_per_client per
  //     client IPv4 and max_calls_total in all. When the total is full, a stranger's new call
  //     evicts the oldest waiting call or unattached stream of the client that holds the most
  //     (RESOURCE_EXHAUSTED), if that client would still hold more; else it is refused.
  uint32_t max_calls_per_client = 256;
  uint32_t max_calls_total = 4096;
  // Of the strangers' calls, those a top-of-rack switch passes on to its upstream switch (each
  // holds a thread here and counts against this switch's address upstream, where it is one
  // client with that switch's max_calls_per_client): at most this many per client and in all.
  uint32_t max_forwarded_stranger_calls_per_client = 32;
  uint32_t max_forwarded_stranger_calls = 128;
  // When the job table is full, a job with workers attached but without any activity (control
  // calls of the job, tensor checks, data-plane packets) for this long is removed to make room
  // for a new one; its workers fail, told why. (Jobs without attached workers expire after the
  // lease, full table or not.)
  std::chrono::milliseconds idle_reclaim{std::chrono::minutes(10)};
  // A stream (Session.Attach) that sends no first message within this long is ended.
  std::chrono::milliseconds first_message_timeout{10000};
  // All-reduce checks a job may have open (announced by some ranks, not by all yet).
  uint32_t max_open_checks = 4096;
  // The authenticated data plane (docs/security.md 4.4): refuse jobs that do not ask for it; and,
  // when not empty, why this switch cannot give it (jobs asking for it are refused with that).
  bool require_authenticated_data = false;
  std::string authenticated_data_unsupported;
  Status Validate() const;
};

// Who makes a request: the gRPC peer string and its IPv4 when it has one.
struct Caller {
  std::string peer;
  uint32_t ipv4 = 0;
  bool has_ipv4 = false;
};

// UdpSessionRequest, as plain values (0 means the default, as on the wire).
struct RegisterRequest {
  uint64_t job_id = 0;
  uint32_t rank = 0;
  uint32_t num_workers = 0;
  uint32_t ipv4 = 0;
  int packet_size = 0;  // the wire's PacketSize value
  uint32_t udp_port = 0;
  uint32_t num_udp_ports = 0;
  uint32_t max_outstanding_packets = 0;
  bool running_tsi = false;
  std::string secret;
  bool authenticate_data = false;
  // The worker's loopback multicast group (UdpSessionRequest.multicast_group_*); ipv4 0: none.
  uint32_t multicast_group_ipv4 = 0;
  uint32_t multicast_group_port = 0;
  // UdpSessionRequest.switch_list: a striped job's switch hosts; every rank must send rank 0's.
  std::string switch_list;
  // UdpSessionRequest.sparse: the job may run block-sparse all-reduces (part of the job spec).
  bool sparse = false;
  // UdpSessionRequest.sparse_auto: with sparse, shares above the auto rule's union run dense
  // (part of the job spec).
  bool sparse_auto = false;
};

// A Barrier (broadcast = false) or Broadcast call.
struct SyncRequest {
  bool broadcast = false;
  uint64_t job_id = 0;  // 0: unscoped
  uint32_t num_workers = 0;
  bool has_rank = false;  // Barrier: whether the caller sent its rank; Broadcast: always
  uint32_t rank = 0;
  uint32_t root = 0;
  uint64_t value = 0;
  std::string secret;
};

struct CloseRequest {
  uint64_t job_id = 0;
  std::string secret;
  bool has_rank = false;  // false: the whole job
  uint32_t rank = 0;
  // Not empty: the session failed on the caller's side (CloseRequest.failure): fail it with
  // this text (cut to 1 KiB) instead of closing a rank. Needs the job's secret, or no job.
  std::string failure;
};

struct AttachRequest {
  uint64_t job_id = 0;
  uint32_t rank = 0;
  std::string secret;
  // How errors name this stream's worker (a top-of-rack switch: "rack 1 (ranks 2..3)"; a
  // top-of-rack switch's worker: its global rank); empty: "rank R".
  std::string label;
  // The stream was announced with OpenStream: refused if it ended since (evicted, timed out).
  bool opened = false;
};

// Called when a job is created in (removed from) the switch: the one place where jobs come and
// go, for per-job resources kept elsewhere (e.g. data-plane keys). Run under the registry's lock:
// must not call into the registry.
struct RegistryHooks {
  std::function<void(uint64_t job_id)> job_created;
  std::function<void(uint64_t job_id)> job_removed;
  // Rank `rank` of a job with an authenticated data plane was registered: its UDP ports
  // [port, port + num_ports) at ipv4 now speak with the job's key (16 bytes; docs/security.md
  // 4.4). Removed with the job (job_removed).
  std::function<void(uint64_t job_id, const std::string& data_key, uint32_t rank, uint32_t ipv4,
                     uint32_t port, uint32_t num_ports)>
      data_key_added;
  // The hooks below run outside the registry's lock (they may call into it), from the thread of
  // the call that caused them.
  // A job left the switch: `why` is OK when it ended cleanly (every rank closed, or it expired),
  // else why it failed. Not called when a new rank 0 re-creates the job.
  std::function<void(uint64_t job_id, const Status& why)> job_ended;
  // When set, an all-reduce check that every rank agreed on is handed here instead of being
  // confirmed to the streams at once; ConfirmCheck confirms it later (a top-of-rack switch first
  // has the upstream switch compare it with the other racks').
  std::function<void(uint64_t job_id, uint64_t allreduce, uint64_t count, uint32_t dtype)>
      check_agreed;
  // Packets the data plane received for a job so far (its activity, which keeps its lease
  // alive); asked by Tick. May be empty.
  std::function<uint64_t(uint64_t job_id)> activity;
};

// What a registry holds at one moment (Registry::counts), for tests, status pages and metrics.
struct RegistryCounts {
  uint32_t jobs = 0;
  uint32_t waiting_calls = 0;     // Barrier/Broadcast calls waiting for their meeting
  uint32_t attached_streams = 0;  // Session.Attach streams attached to a job
  uint32_t pending_streams = 0;   // streams opened and not attached yet
  uint32_t forwarded_calls = 0;   // calls passed on (AdmitForwarded) under way
  // Calls counted against strangers (see RegistryOptions), and against the allowance of the job
  // counts() was asked about.
  uint32_t stranger_calls = 0;
  uint32_t member_calls = 0;
};

class Registry {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // Completion of a wait: the status, the reason beside it (kRoundExpired when ExpireWait ended
  // it, else kNone), and a Broadcast's value.
  using SyncDone = Meetings::Done;
  // The end of an attached stream (always an error status: why the job ended for this worker).
  using StreamEnd = Streams::End;
  // A confirmed all-reduce check.
  using Checked = Streams::Checked;

  // clock: empty = steady_clock::now.
  Registry(const RegistryOptions& options, dataplane::LockedSwitch* sw, Clock clock = {},
           RegistryHooks hooks = {});
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Session.UdpSession: rank 0 creates (or re-creates) the job, the others join it. A job that
  // asks for the authenticated data plane gets a random 16-byte key when created; every
  // registration returns it in *data_key (empty for other jobs). *multicast_group_kept: whether
  // the job holds the loopback multicast group the request named (dataplane::JobSpec).
  Status Register(const RegisterRequest& request, const Caller& caller,
                  std::string* data_key = nullptr, bool* multicast_group_kept = nullptr);

  // A ticket names a wait or a stream for CancelWait / Report / Detach; 0 is never used.
  uint64_t NewTicket();
  // Sync.Barrier / Sync.Broadcast under `ticket` (from NewTicket). `done` runs exactly once.
  void Sync(uint64_t ticket, const SyncRequest& request, const Caller& caller, SyncDone done);
  // The call's client went away (cancelled, deadline): it leaves its meeting, and `done` runs with
  // `why`. No effect when the wait already ended.
  void CancelWait(uint64_t ticket, const Status& why);
  // The call's deadline is about to pass (the control server calls this shortly before it): the
  // call leaves its meeting, and `done` runs with kDeadlineExceeded naming the ranks that did not
  // arrive, and ErrorReason::kRoundExpired, so that the worker's error can say which peer is
  // missing (a client whose own deadline passes first can only say that one is). No effect when
  // the wait already ended.
  void ExpireWait(uint64_t ticket);

  // Session.Close.
  Status Close(const CloseRequest& request, const Caller& caller);

  // Session.Diagnose: one sentence on why all-reduce `allreduce` of a session may be stuck: the
  // ranks that have not announced it on their streams (not started it), or that every rank has
  // (then its packets are being lost). Fails as Sync does for a wrong secret or a failed session,
  // and with NOT_FOUND when the switch has no such job.
  Result<std::string> DescribeAllReduce(uint64_t job_id, const std::string& secret,
                                        uint64_t allreduce);

  // Session.Attach opened, before its first message: counted as a stranger's call from then on
  // (until Attach makes it a member's, or it ends). `end` runs at most once, if the stream is
  // evicted (the strangers' total is full), sends no first message within
  // first_message_timeout, or the registry shuts down; not after Attach or Detach for the ticket.
  // RESOURCE_EXHAUSTED when it cannot be admitted (`end` does not run).
  Status OpenStream(uint64_t ticket, const Caller& caller, StreamEnd end);
  // Session.Attach's first message. On success the stream is attached under `ticket`: `end`
  // runs at most once, when the job fails, is closed or removed, or the registry shuts down;
  // `checked` runs for each confirmed all-reduce check. Neither runs after Detach returned.
  // A refused stream (and its OpenStream's count) is dropped.
  Status Attach(uint64_t ticket, const AttachRequest& request, const Caller& caller, StreamEnd end,
                Checked checked);
  // A later message: all-reduce `allreduce` of `count` elements of `dtype`. A disagreement with
  // another rank fails the job (every stream ends with the reason).
  void Report(uint64_t ticket, uint64_t allreduce, uint64_t count, uint32_t dtype);
  // The stream ended on the worker's side (it closed it, or the connection broke). Unless the
  // rank closed its session first, that is a dead worker: the job fails, naming the rank.
  void Detach(uint64_t ticket);
  // The stream's worker reports that the job failed on its side (a top-of-rack switch whose
  // rack lost a worker): the job fails with `why` (cut to 1 KiB) on every worker.
  void ReportFailure(uint64_t ticket, const std::string& why);
  // Confirms all-reduce `allreduce` of a session to its streams (after
  // RegistryHooks::check_agreed).
  void ConfirmCheck(uint64_t job_id, uint64_t allreduce);

  // Fails a session from outside (e.g. a hierarchy hook refused a worker), as a refusal of one of
  // its own does: only when `secret` is the job's (or there is no job yet).
  void Fail(uint64_t job_id, const std::string& secret, const Status& why);

  // A call this switch runs on a thread of its own instead of answering it itself (a top-of-rack
  // switch's UdpSession, which may wait for its upstream switch, and its Barrier/Broadcast,
  // which it passes on there: `upstream`), under `ticket`: counted as a member's of
  // `job_id` when `secret` is its job's, else as a stranger's (never evicted: it holds a
  // thread, not a wait; passed upstream, also within the max_forwarded_stranger_calls limits),
  // until ReleaseForwarded.
  Status AdmitForwarded(uint64_t ticket, const Caller& caller, uint64_t job_id,
                        const std::string& secret, bool upstream);
  void ReleaseForwarded(uint64_t ticket);

  // Removes expired jobs (lease) and ends streams without a first message. Call about once a
  // second.
  void Tick();
  // Fails every wait and stream with UNAVAILABLE; later calls fail the same way. Idempotent.
  void Shutdown();

  // A job as `switchml status` and the metrics show it (Monitor.Status).
  using JobSummary = control::JobSummary;
  // Every job (secret null), by job id; or only those a caller holding `secret` may see in
  // full: the jobs created without a secret and those created with this one. *hidden (when not
  // null) counts the others.
  std::vector<JobSummary> JobSummaries(const std::string* secret = nullptr,
                                       uint32_t* hidden = nullptr) const;
  const RegistryOptions& options() const { return options_; }

  // What the registry holds now; member_calls: those of job `job_id`.
  RegistryCounts counts(uint64_t job_id = 0) const;
  bool HasJob(uint64_t job_id) const;

 private:
  using Charge = CallLimits::Charge;
  // How a job ends, for RegistryHooks::job_ended.
  enum class Ending { kClean, kFailed, kReplaced };

  std::chrono::steady_clock::time_point Now() const;
  // Registration: a job rank 0 creates (or re-creates), and a rank joining it.
  Status RegisterLocked(const RegisterRequest& r, uint32_t worker_ipv4, Deferred& deferred);
  Result<Job*> OpenJobLocked(const RegisterRequest& r, const dataplane::JobSpec& spec,
                             uint32_t ipv4, Deferred& deferred);
  Status AddWorkerLocked(const RegisterRequest& r, const dataplane::JobSpec& spec, uint32_t ipv4,
                         Job& job, Deferred& deferred);
  // Frees whatever blocks a new job or worker: expired jobs in the way. Refuses otherwise.
  Status MakeRoomLocked(uint64_t job_id, Deferred& deferred);
  Status ClearAddressLocked(const dataplane::JobSpec& spec, uint32_t ipv4, uint32_t port,
                            Deferred& deferred);
  // The single places where jobs enter and leave the switch (and the table).
  Status CreateJobLocked(const dataplane::JobSpec& spec, const std::string& secret);
  void RemoveJobLocked(uint64_t job_id, const Status& why, Deferred& deferred, Ending ending);
  // Removes expired jobs `ids`, logging "<session name><how>".
  void RemoveExpiredLocked(const std::vector<uint64_t>& ids, const std::string& how,
                           Deferred& deferred);
  // Marks the session failed (its sync calls fail for failure_memory), fails its meetings, ends its
  // streams and removes its job.
  void FailSessionLocked(uint64_t job_id, const std::string& secret, const Status& why,
                         Deferred& deferred);
  // Whether the stream's rank may attach: *job, its job.
  Status AttachableLocked(const AttachRequest& q, Job** job);
  // Admits the call or stream `ticket` (CallLimits::Admit): a member's of `member` (session 0: a
  // stranger's). May evict another (its callback goes to `deferred`).
  Status AdmitLocked(const Caller& caller, const CallLimits::Member& member, uint64_t ticket,
                     bool evictable, Deferred& deferred, Charge* charge);
  // Ends a stranger's wait or unattached stream to make room (RESOURCE_EXHAUSTED, `why`), its
  // callback going to `deferred`.
  CallLimits::Evict EvictorLocked(Deferred& deferred);

  const RegistryOptions options_;
  dataplane::LockedSwitch* const sw_;
  const Clock clock_;
  const RegistryHooks hooks_;

  mutable std::mutex mu_;
  bool shut_down_ = false;
  uint64_t next_ticket_ = 1;
  JobTable jobs_;
  // Sessions marked failed (failure_marks.h).
  FailureMarks failures_;
  // Who holds how many calls and streams (call_limits.h).
  CallLimits limits_;
  // The worker streams (streams.h); they hold charges of limits_.
  Streams streams_;
  // Barrier and Broadcast meetings (meetings.h); their waits hold charges of limits_.
  Meetings meetings_;
  RefusalLog refusals_;  // (its own lock: logged outside mu_)
};

// Compares job secrets in time that does not depend on where they differ (the registry's checks,
// and a top-of-rack switch's Uplink before the registry sees a request).
bool SameSecret(const std::string& a, const std::string& b);

}  // namespace switchml::control
