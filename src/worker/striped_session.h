// StripedSession: one worker thread's side of a job striped over k switch hosts (striping.h),
// with failover when a host dies (failover.h). A pure state machine like the WorkerSession it
// wraps: bytes and a time in, bytes, a destination host and timer deadlines out.
//
// Normal operation is the WorkerSession's, with each datagram going to the host that serves its
// slot: NextTransmitHost() names it (an index into the job's list of hosts) before PollTransmit
// writes it. With one host this is exactly a WorkerSession.
//
// Failover(host) moves the thread's slots off a host that died: the running slice stops where it
// is, and a fresh WorkerSession on the next generation's slot range (the same range on every
// host, unused so far: the hosts alive still hold the old range's half-done rounds) runs, through
// the same driver loop, the agreement slice, the repair of the blocks not every worker has
// (staged, then a tail in place), and then either completes the interrupted slice or starts it
// over (failover.h). Every worker thread of the job does the same when it learns of the death, in
// any order: the agreement waits for all. The driver reports the slice when state() is kDone, as
// without failover. A failover while idle runs the agreement too (the others may need this
// worker's results); state() goes to kRunning and, when it is over, to kDone with no slice.
//
// Thread-compatible: one thread drives a session.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "switchml/status.h"
#include "worker/failover.h"
#include "worker/session.h"

namespace switchml::worker {

struct StripedSessionConfig {
  // The session of generation 0 (its slot_start); keep_last_results is set when failover is
  // possible.
  SessionConfig session;
  // The job's switch hosts (k); slot l of the window goes to live host StripeOfSlot(l, W, live).
  uint32_t num_hosts = 1;
  // Failover: the slot ranges available, one per generation (1: none), each `generation_stride`
  // slots after the previous one (the job's whole window, all threads).
  uint32_t generations = 1;
  uint32_t generation_stride = 0;
  Status Validate() const;
};

struct FailoverCounters {
  uint64_t failovers = 0;
  uint64_t blocks_staged = 0;  // blocks aggregated again through the staging buffer
  uint64_t blocks_tail = 0;    // blocks of tails run in place
  uint64_t slices_restarted = 0;
};

class StripedSession {
 public:
  enum class State { kIdle, kRunning, kDone };

  explicit StripedSession(const StripedSessionConfig& config);  // must Validate() (CHECKed)

  void Start(const Slice& slice, Nanos now);
  void HandleDatagram(std::span<const uint8_t> datagram, Nanos now);
  void HandleTimeout(Nanos now);
  void Abort(Status status);
  // The host (index into the job's list) the next PollTransmit's datagram goes to, if any.
  std::optional<uint32_t> NextTransmitHost();
  size_t PollTransmit(Nanos now, std::span<uint8_t> buf);
  std::optional<Nanos> PollTimeout() const { return inner_->PollTimeout(); }

  // Host `host` died. OK when the move started (or the host was already off this session's
  // list); else why it cannot be (no host left, no slot range left, a failover already under
  // way): then the running work has failed with that status too.
  Status Failover(uint32_t host, Nanos now);

  State state() const { return state_; }
  const Status& status() const { return status_; }
  // Hosts alive, in the job's order (indices into the job's list).
  const std::vector<uint32_t>& live_hosts() const { return live_; }
  uint32_t generation() const { return generation_; }
  // The window and the rest of the inner session's configuration (of this generation).
  const SessionConfig& config() const { return inner_->config(); }
  // Summed over generations; gauges from the current one.
  SessionCounters counters() const;
  const FailoverCounters& failover_counters() const { return failover_counters_; }
  size_t remaining() const { return inner_->remaining(); }
  // Whether failover work (agreement, repair) is under way.
  bool failing_over() const { return phase_ != Phase::kUser; }

 private:
  enum class Phase { kUser, kAgreement, kStaging, kTail };
  static constexpr uint64_t kAgreementAllReduce = 0xfa, kStagingAllReduce = 0xfb;

  // The inner session is done: the next phase, or this session's end.
  void Advance(Nanos now);
  void AfterStaging(Nanos now);
  void AfterRepair(Nanos now);
  void Fail(Status status);
  void MakeInner();
  void Run(const Slice& slice, Nanos now);

  StripedSessionConfig config_;
  std::unique_ptr<WorkerSession> inner_;
  std::vector<uint32_t> live_;
  uint32_t generation_ = 0;
  State state_ = State::kIdle;
  Status status_;
  Phase phase_ = Phase::kUser;
  bool user_active_ = false;  // a slice of the caller's is under way
  Slice user_slice_;
  bool non_finite_ = false;  // a phase of the slice saw non-finite values (float)
  std::string failed_host_;  // for messages
  // The failover under way.
  LaneProgress progress_;
  RepairPlan plan_;
  std::vector<int32_t> agreement_;
  std::vector<uint8_t> staging_;
  SessionCounters past_;  // counters of the earlier generations' sessions
  FailoverCounters failover_counters_;
};

}  // namespace switchml::worker
