// The software switch data plane: a pure state machine, many jobs, one slot pool per job.
//
// Process() takes one datagram and its source address and returns what the switch does with it:
// drop it (and why), multicast a completed slot's result to every worker of the job, or unicast
// a stored result to one worker that retransmitted into a completed slot. No sockets, threads,
// clocks or per-packet allocation. The stages (see stages.h) follow the reference P4 program:
// lookup -> worker bitmap -> worker counter -> exponent max -> aggregate -> next step.
//
// Jobs: each job (identified by the control plane's job id) has its own worker table and its
// own slot pool; a packet from an address not registered for a job never touches another job's
// state.
//
// Thread-safety: none. One owner calls Process(); the control plane's job changes must be
// serialized with it by the owner (the daemon holds one mutex; see LockedSwitch).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/endpoint.h"
#include "proto/wire.h"
#include "switchml/status.h"

namespace switchml::dataplane {

struct SwitchConfig {
  // Workers per job; the worker bitmap is 256 bits wide, so at most 256.
  uint32_t max_workers_per_job = 32;
  // Slots in each job's pool (two sets each) for packets of up to 256 elements. At most
  // proto::kMaxSlots. A job of larger packets gets the same memory in fewer, larger slots
  // (JobSlots).
  uint32_t slots_per_job = 8192;
  // Concurrent jobs. Nothing in the protocol ends a session (every run opens a new one), so the
  // table never refuses a new job for lack of room: creating one more than max_jobs evicts the
  // least recently active job (see Switch::CreateJob).
  uint32_t max_jobs = 64;
  // Where the data-plane transport can send to a multicast group (kernel UDP; docs/architecture.md,
  // "Multicast results"): within this host, on the loopback interface with TTL 0 (workers whose
  // address is a loopback one), and/or on the LAN interface the switch is bound to (other
  // workers). Jobs may then ask for a group (JobSpec::multicast_group); the control plane offers
  // a worker a group only in a scope that is on. Both off: such requests are ignored.
  bool loopback_multicast = false;
  bool lan_multicast = false;
  // The largest packet_numel a job may use: 256 (the reference's sizes only: the default), or
  // 512, 1024 or 2048 to accept our jumbo sizes too (docs/protocol.md 2.6). The data-plane
  // transport must carry such datagrams (the daemon sizes its buffers from this).
  uint32_t max_packet_numel = 256;
  Status Validate() const;
};

// The slots of a job whose packets have the given size: slots_per_job for the reference's sizes,
// and for a jumbo size the same memory in bytes (slots_per_job * 256 / numel; 1024 slots of 2048
// elements for the default 8192).
uint32_t JobSlots(const SwitchConfig& config, proto::SizeCode size);
// The largest datagram a switch with this config accepts (its buffers' size).
size_t MaxDatagramBytes(const SwitchConfig& config);
// " of N-element packets" for a jumbo size, else "": how refusals name a jumbo job's pool.
std::string JumboNote(proto::SizeCode size);
// Whether the switch accepts jobs of this size (a supported code within max_packet_numel).
bool AcceptsSize(const SwitchConfig& config, proto::SizeCode size);

// A job as rank 0 opens it. Every worker of the job must agree on all of these.
struct JobSpec {
  uint64_t job_id = 0;
  uint32_t num_workers = 0;
  proto::SizeCode size = proto::SizeCode::k1024B;
  // UDP ports (worker threads) per worker; the workers' base ports are per worker.
  uint32_t num_ports = 1;
  // The workers' total window; the slots they use are [0, max_outstanding_packets).
  uint32_t max_outstanding_packets = 256;
  // The workers' tsi is a running round number that grows by the same step on every round of a
  // slot (this project's workers, docs/protocol.md 2.2; not the reference client, whose tsi
  // restarts every job). It lets the switch drop a late network copy however many rounds late it
  // is (stages.h, WorkerCounterStage).
  bool running_tsi = false;
  // Multicast results (beyond the reference; docs/architecture.md, "Multicast results"): the
  // group and first port where the job's workers receive results (on this host's loopback
  // interface, or on a LAN where the network replicates the datagram): worker thread t of every
  // worker listens on (multicast_group.ipv4, multicast_group.port + t). Then a completed slot's
  // result leaves as one datagram to the group instead of one per worker. CreateJob keeps the
  // group only when the switch has a multicast scope on and no other job holds the same group
  // (else it clears it: see FindJob); results use it only when every worker registered with this
  // same group (AddWorker's multicast_group). A zero ipv4: none. A member whose retransmissions
  // show that the group does not reach it gets its results on its own from then on (see
  // JobCounters::group_demoted).
  Endpoint multicast_group;
};

// Hierarchical aggregation (docs/hierarchy.md): the upstream (spine) switch of a job on a
// top-of-rack switch. Such a job aggregates its rack's workers as usual, but a completed set is
// not multicast: its partial sum goes up to the spine as one worker's contribution (Action kind
// kUpstream), and the spine's result for it, when it comes down, is stored in the set (the shadow
// copy the rack's retransmissions are answered from) and multicast to the rack's workers. A
// worker's retransmission into a set that is complete here but has no result yet re-sends the
// partial sum up; so loss at both levels is recovered by the workers' timeouts alone.
struct UpstreamSpec {
  uint32_t ipv4 = 0;       // the spine's data-plane address
  uint16_t port = 0;       // its first data port
  uint32_t num_ports = 1;  // its data ports [port, port + num_ports) (one per spine thread)
  bool operator==(const UpstreamSpec&) const = default;
};

// One worker's address. port == 0 means any UDP port from that address (the reference's
// behaviour: then replies go to the source port of the packet that completed the slot).
// Otherwise the worker owns ports [port, port + num_ports) and a reply for a packet that came
// from the completer's port base_c + k goes to port base_w + k of every worker w.
struct WorkerSpec {
  uint32_t ipv4 = 0;
  uint16_t port = 0;
};

enum class DropReason : uint8_t {
  kNone = 0,
  kMalformed,       // failed proto::DecodeHeader (see decode counters for which check)
  kUnknownSource,   // source address not registered for any job
  kJobNotReady,     // not all of the job's workers have registered yet
  kWrongSize,       // size code differs from the job's
  kSlotOutOfRange,  // slot index >= the job's pool
  kDuplicate,       // retransmission into a slot whose set is not complete yet, or a stale
                    // copy of a contribution to a set its sender has already left (stages.h)
  kStaleResult,     // top-of-rack: a result from upstream for no round waiting for one (a
                    // duplicate, or a late copy of an earlier round's)
};
inline constexpr int kNumDropReasons = 8;
const char* DropReasonName(DropReason r);

// What the switch does with one datagram. kDrop with reason kNone means the packet was consumed:
// aggregated into a slot that is not complete yet, nothing to send.
struct Action {
  // kUpstream (top-of-rack jobs only): send the reply, a partial sum, to the one destination,
  // the upstream switch.
  enum class Kind : uint8_t { kDrop, kMulticast, kUnicast, kUpstream };
  Kind kind = Kind::kDrop;
  DropReason reason = DropReason::kNone;
  // Why decoding failed, for reason kMalformed.
  proto::DecodeError decode_error = proto::DecodeError::kOk;
  // The encoded reply; valid until the next call into the Switch.
  std::span<const uint8_t> reply;
  // One destination for kUnicast and kUpstream, num_workers for kMulticast (or one, the job's
  // multicast group: JobSpec::multicast_group); valid until the next call.
  std::span<const Endpoint> destinations;
};

struct JobCounters {
  uint64_t received = 0;           // datagrams attributed to this job
  uint64_t aggregated = 0;         // new contributions written or added into a slot
  uint64_t completed = 0;          // slot rounds completed (each multicast once)
  uint64_t multicast_packets = 0;  // completed * num_workers
  // Of the completed (and upstream) results, those sent once to the job's multicast group
  // (JobSpec::multicast_group) rather than once per worker.
  uint64_t group_sends = 0;
  // Members of the group whose results now go to them on their own, because the network did
  // not deliver the group to them: in Switch::kGroupCheckStrikes checks in a row, each over
  // Switch::GroupCheckContributions of the member's fresh contributions, at least three in four
  // of them were followed by its retransmission of the completed slot (answered by a unicast
  // reply). A member that receives the group asks again only for results lost on the way or
  // late (docs/architecture.md, "When the network drops multicast").
  uint64_t group_demoted = 0;
  uint64_t retransmitted = 0;  // unicast re-sends of a stored result
  // Top-of-rack jobs (see UpstreamSpec).
  uint64_t upstream_sent = 0;     // partial sums sent up, re-sends included
  uint64_t upstream_resent = 0;   // of those, re-sends on a worker's retransmission
  uint64_t upstream_results = 0;  // results from upstream stored and multicast to the rack
  // Worker retransmissions that did not re-send the partial sum: another worker's had, in the
  // same wave of timeouts (counted as dropped duplicates too).
  uint64_t upstream_coalesced = 0;
  uint64_t dropped[kNumDropReasons] = {};
};

struct SlotCounters {
  uint64_t received = 0;
  uint64_t completed = 0;
  uint64_t retransmitted = 0;
  uint64_t duplicates = 0;
};

struct SwitchCounters {
  uint64_t received = 0;
  uint64_t dropped_malformed[proto::kNumDecodeErrors] = {};
  uint64_t dropped_unknown_source = 0;
  uint64_t jobs_evicted = 0;  // dead jobs removed by CreateJob or AddWorker (see Switch)
  // Results from upstream multicast to racks (JobCounters::upstream_results), of every job
  // including those removed since: a closed job takes its own counters with it.
  uint64_t upstream_results = 0;
};

class Switch {
 public:
  // The group delivery check (JobCounters::group_demoted): how many fresh contributions of a
  // member one check looks at (two windows, at least kGroupCheckContributions), and how many
  // checks in a row must find three in four of them or more answered only on retransmission.
  static constexpr uint32_t kGroupCheckContributions = 512;
  static constexpr uint32_t kGroupCheckStrikes = 2;
  static constexpr uint32_t GroupCheckContributions(const JobSpec& spec) {
    return std::max(kGroupCheckContributions, 2 * spec.max_outstanding_packets);
  }
  explicit Switch(SwitchConfig config);  // config must be valid (CHECKed)
  ~Switch();
  Switch(const Switch&) = delete;
  Switch& operator=(const Switch&) = delete;

  // Control-plane side. Each returns a Status whose message says what to fix.
  //
  // Eviction: no message ends a session, so dead jobs are removed when they stand in the way of a
  // new one, by CreateJob (table full) and AddWorker (address taken over). An evicted job goes
  // exactly as with RemoveJob: its state, workers and counters are dropped and its workers'
  // packets become kUnknownSource. Each eviction counts in counters().jobs_evicted, and when
  // evicted is not null the evicted job ids are appended to *evicted, so the caller can
  // forget those sessions too. A call that fails evicts nothing.
  //
  // (Re)creates the job of spec.job_id: a job with that id is dropped with all its state and
  // workers (not an eviction); other jobs are untouched, except that when max_jobs other jobs
  // exist the least recently active one is evicted (activity: the last datagram Process()
  // attributed to the job, or the job's creation if none). Fails when the spec is invalid
  // (num_workers 0 or over the limit, unsupported size, window over the pool).
  Status CreateJob(const JobSpec& spec, std::vector<uint64_t>* evicted = nullptr);
  // Registers a worker of an existing job. Fails on unknown session, rank out of range, rank
  // already registered, a port range past 65535, or an address conflict that cannot be resolved:
  // the range overlaps another worker of the same session, or either side is a port-0 ("any
  // port") registration. When the worker's explicit port range overlaps only explicit port
  // ranges of other sessions, those sessions are dead (the new registrant now binds their ports):
  // their jobs are evicted and the worker is registered. multicast_group: the loopback multicast
  // group the worker listens on (JobSpec::multicast_group), or zero.
  Status AddWorker(uint64_t job_id, uint32_t rank, const WorkerSpec& worker,
                   std::vector<uint64_t>* evicted = nullptr, const Endpoint& multicast_group = {});
  // Makes an existing job a top-of-rack job with the given upstream switch (see UpstreamSpec):
  // the upstream's data ports become a source of results for this job. Another job that had the
  // same upstream endpoints loses them (one hierarchical job per upstream at a time: the spine's
  // results carry no job id). Fails on an unknown session, an invalid spec, or upstream
  // endpoints that are a worker's.
  Status SetUpstream(uint64_t job_id, const UpstreamSpec& upstream);
  // The job's upstream, or nullptr when it has none (or does not exist).
  const UpstreamSpec* FindUpstream(uint64_t job_id) const;
  Status RemoveJob(uint64_t job_id);
  bool HasJob(uint64_t job_id) const;
  // The spec of an existing job, or nullptr.
  const JobSpec* FindJob(uint64_t job_id) const;

  // Data-plane side.
  // Runs one datagram from source through the pipeline. The returned Action (and the spans in
  // it) stays valid until the next call into the Switch. A reply is encoded into a buffer of the
  // Switch.
  const Action& Process(const Endpoint& source, std::span<const uint8_t> datagram);
  // The same, encoding a reply straight into reply_out (at least MaxDatagramBytes(config())
  // bytes; CHECKed), e.g. a transport's transmit buffer: Action::reply then points into reply_out,
  // and nothing is copied. reply_out is not touched when the packet produces no reply. reply_out
  // may be the datagram's own memory (the same start: a reply built over the datagram it answers,
  // as the daemon does with a transport that allows it) but must not otherwise overlap it. This is
  // the data path's form: no allocation, copy or virtual call per packet; a packet that completes
  // its set is added (or, as a round's first contribution, loaded) and its reply's payload written
  // into reply_out in the same pass, so the deparser writes only the header.
  const Action& Process(const Endpoint& source, std::span<const uint8_t> datagram,
                        std::span<uint8_t> reply_out);

  const SwitchConfig& config() const { return config_; }
  const SwitchCounters& counters() const { return counters_; }
  // nullptr when the job does not exist.
  const JobCounters* job_counters(uint64_t job_id) const;
  // Per-slot counters of a job (size = JobSlots(config(), its size)), empty when the job does not
  // exist.
  std::span<const SlotCounters> slot_counters(uint64_t job_id) const;
  std::vector<uint64_t> job_ids() const;

  // Replication for a multi-threaded data plane: the control plane changes one Switch (the
  // master), and each data-plane thread keeps a replica whose jobs and workers mirror it.
  //
  // Counts the changes to the job table (job created, removed or evicted, worker added). Safe to
  // read from any thread without the owner's lock: a replica compares it with the value it last
  // mirrored and takes the lock only when it moved.
  uint64_t mutations() const { return mutations_.load(std::memory_order_acquire); }
  // Makes this Switch's jobs and workers those of master (which the caller must keep from
  // changing meanwhile). A job that is unchanged in master (same creation, same workers) keeps
  // its slots, registers and counters here; a changed or new one starts empty; a job gone from
  // master goes here too. Config must match master's.
  void MirrorJobs(const Switch& master);
  // Human-readable counter table: switch totals and one block per job; with per_slot, one line
  // per slot that saw traffic.
  std::string FormatCounters(bool per_slot) const;

 private:
  struct Job;
  const Action& DropForJob(Job& job, DropReason reason);
  // A datagram from a top-of-rack job's upstream switch: a result for one of its sets.
  const Action& ProcessResult(Job& job, const proto::Header& header,
                              std::span<const uint8_t> datagram, std::span<uint8_t> reply_out);
  // Makes the action a kUpstream send of the reply (to the upstream's port for offset).
  void SendUp(Job& job, uint16_t offset);
  // Fails when the upstream's endpoints are a worker's (of any job).
  Status CheckUpstream(const Job& job, const UpstreamSpec& upstream) const;
  // Enters (removes) the job's upstream endpoints in the lookup table; an endpoint that another
  // job's upstream holds is taken over (and left alone on removal).
  void AddUpstreamToLookup(Job& job);
  void RemoveUpstreamFromLookup(const Job& job);
  // Enters (removes) a registered worker's addresses (all of the job's) in the lookup tables.
  void AddToLookup(Job& job, uint32_t rank);
  void RemoveFromLookup(const Job& job);
  // Removes the job of job_id (which must exist) as an eviction: counted and reported.
  void Evict(uint64_t job_id, std::vector<uint64_t>* evicted);
  // Keeps the counters of a job about to be removed (one that saw traffic) for FormatCounters.
  void Retire(const Job& job);

  SwitchConfig config_;
  SwitchCounters counters_;
  std::unordered_map<uint64_t, std::unique_ptr<Job>> jobs_;
  // The last kMaxClosedJobs jobs removed after they saw traffic (closed, expired, evicted or
  // re-created; on a mirror, gone from its master), oldest first: FormatCounters still shows
  // them, so that the counters printed at exit do not depend on whether a datagram came after
  // the job's workers closed it. (Not their per-slot counters.)
  struct ClosedJob;
  static constexpr size_t kMaxClosedJobs = 8;
  std::vector<ClosedJob> closed_;
  // Lookup tables (the "receive/lookup" stage): exact (ip, port) and any-port (ip) entries.
  std::unordered_map<Endpoint, std::pair<Job*, uint32_t>> by_endpoint_;
  std::unordered_map<uint32_t, std::pair<Job*, uint32_t>> by_address_;
  // The entry of the last source looked up (null: none; reset whenever the lookup maps change).
  const std::pair<Job*, uint32_t>* last_lookup_ = nullptr;
  Endpoint last_lookup_source_{};
  // The activity clock: incremented by each job creation and each datagram attributed to a job,
  // and copied into that job, so the smallest copy marks the least recently active job.
  uint64_t activity_clock_ = 0;
  std::atomic<uint64_t> mutations_{0};
  uint64_t next_generation_ = 1;  // identifies each CreateJob, so a mirror can tell re-creations
  Action action_;
  // The 2-argument Process's reply buffer.
  std::array<uint8_t, proto::kMaxDatagramBytes> reply_{};
};

// The daemon's pairing of a Switch with the mutex that serializes the data-plane thread and the
// control-plane threads.
struct LockedSwitch {
  explicit LockedSwitch(SwitchConfig config) : sw(config) {}
  std::mutex mu;
  Switch sw;
};

}  // namespace switchml::dataplane
