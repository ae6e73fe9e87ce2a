// WorkerSession: the worker side of the SwitchML protocol for one worker thread, as a pure state
// machine (no sockets, threads or clocks: time is passed in).
//
// One session owns a fixed range of the job's slots [slot_start, slot_start + window) and runs
// one slice at a time: the thread's contiguous share of an all-reduce. It cuts the slice into
// packets of k elements, keeps at most `window` packets outstanding (one per slot), sends the next
// packet on a slot only when the result for the previous one on that slot came back
// (self-clocking), and re-sends a packet unchanged when its result is late.
//
// Packet ids and pool indices (reference notes, section 4): packet q of a slice uses
// i = (q + shift) mod 2W, slot = slot_start + (i mod W), set = (i >= W), where shift is the id
// span of all earlier slices, so set alternation continues across slices. The tsi field carries a
// running round number of the slot rather than q: local slot l's k-th round (k = 0, 1, ...,
// counted over all slices) has tsi (l + k W) mod 2^32, which is the running id shift + q while
// slices use every slot. Every worker of the job sends the same tsi for the same round, and each
// round's tsi is W after the slot's previous round's, however many slices left the slot unused,
// which lets the switch recognise late network duplicates by serial order (docs/protocol.md).
//
// int32 slices: packet q carries block q. float32 slices: exponents travel one window ahead of
// their data (section 5): packet q carries the exponent of block q (q < B) and the quantized data
// of block q - W (q >= W), scaled with the max exponent the switch returned for packet q - W. So
// the packets of a float slice are q in [0, B) u [W, W + B).
//
// Use:  Start(slice, now); then loop { PollTransmit -> send; receive -> HandleDatagram;
//       at PollTimeout() -> HandleTimeout } until state() != kRunning.
// Thread-compatible: one thread drives a session. The slice's buffers must stay valid and
// untouched by others until the slice ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "proto/wire.h"
#include "switchml/retransmit.h"
#include "switchml/status.h"
#include "switchml/types.h"
#include "worker/failover.h"

namespace switchml::worker {

using Nanos = std::chrono::nanoseconds;

struct SessionConfig {
  uint32_t num_workers = 1;
  uint32_t slot_start = 0;
  uint32_t window = 64;  // W: outstanding packets = slots owned
  proto::SizeCode size = proto::SizeCode::k1024B;
  // When to re-send a late packet and when to give up (RTO, back-off, early retransmission,
  // peer timeout): the context hands on Config::retransmit whole.
  RetransmitOptions retransmit;
  // The switch hosts the window is striped over (striping.h; 1: one switch). Early retransmission
  // compares a result only with the packets sent to the same host: results of different hosts
  // come back in no particular order relative to each other.
  uint32_t stripes = 1;
  // Keep a copy of the input of each slot's last block with a result (W blocks), for a failover
  // of a striped job (failover.h: another worker may still lack the result, and the block is
  // aggregated again): at each result of an in-place slice, and when an out-of-place slice
  // finishes. Off by default.
  bool keep_last_inputs = false;
  Status Validate() const;
};

// One slice of an all-reduce. `in` and `out` may be the same buffer.
struct Slice {
  uint64_t allreduce = 0;  // the all-reduce number; its low 8 bits travel as job_number
  DataType dtype = DataType::kFloat32;
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;           // elements in this slice
  size_t element_offset = 0;  // where the slice starts in the whole tensor (for messages)
  // A block-sparse all-reduce (docs/protocol.md 2.5; sparse_session.h): the slice is then the
  // whole tensor [in, in + count), of which this thread takes the blocks b (of the session's
  // packet size) with b mod lanes == lane. SparseSession runs it as two slices of its own; a
  // WorkerSession never sees one (CHECKed).
  bool sparse = false;
  // With sparse: the auto rule (docs/protocol.md 2.5): a share whose union holds more than 7/8 of
  // its blocks runs dense.
  bool sparse_auto = false;
  uint32_t lane = 0;
  uint32_t lanes = 1;
};

struct SessionCounters {
  uint64_t sent = 0;           // first transmissions
  uint64_t retransmitted = 0;  // re-sends after a timeout
  uint64_t timeouts = 0;
  uint64_t results = 0;            // results accepted
  uint64_t duplicates = 0;         // results for a packet not outstanding or not yet sent (dropped)
  uint64_t stale = 0;              // results of another all-reduce (job_number differs; dropped)
  uint64_t foreign_slot = 0;       // results for a slot outside this session's range (dropped)
  uint64_t malformed = 0;          // datagrams that failed decoding (dropped)
  uint64_t rtt_samples = 0;        // round-trip times measured (results of packets sent once)
  uint64_t backoffs = 0;           // times the RTO doubled
  uint64_t early_retransmits = 0;  // re-sends by early retransmission (also in retransmitted)
  // Results of packets sent once, not sampled: a packet sent later was answered first (the slot
  // was held up, usually by a peer's loss).
  uint64_t rtt_out_of_order = 0;
  // Gauges (not sums): the round-trip estimate and the RTO now (back-off included). srtt and
  // rttvar are 0 before the first sample.
  Nanos srtt{0};
  Nanos rttvar{0};
  Nanos rto{0};
};

class WorkerSession {
 public:
  enum class State { kIdle, kRunning, kDone };

  explicit WorkerSession(const SessionConfig& config);  // config must Validate() (CHECKed)

  // Starts a slice; the session must not be running. A slice of 0 elements is done at once.
  void Start(const Slice& slice, Nanos now);

  // Feeds one received datagram. Anything malformed, stale or duplicate is counted and dropped.
  void HandleDatagram(std::span<const uint8_t> datagram, Nanos now);
  // Re-sends packets whose timeout passed; fails the slice when no progress for too long.
  void HandleTimeout(Nanos now);
  // Ends the running slice at once with `status` (the driver gave up on it: transport failure,
  // shutdown, or a failure elsewhere in the job). The slice's buffers are not touched afterwards.
  void Abort(Status status);
  // Writes the next datagram to send into buf (at least proto::DatagramBytes(size) bytes);
  // returns its length, or 0 when nothing is to be sent now.
  size_t PollTransmit(Nanos now, std::span<uint8_t> buf);
  // The local slot (0 .. W-1) of the datagram the next PollTransmit will write, if any: where a
  // striped job's driver sends it (striping.h) and so which buffer it lends.
  std::optional<uint32_t> NextTransmitSlot();
  // When HandleTimeout should next be called, if the slice is running.
  std::optional<Nanos> PollTimeout() const;

  State state() const { return state_; }
  // The outcome of the last slice once kDone: OK, or why it failed (timeout, non-finite input).
  const Status& status() const { return status_; }
  const SessionCounters& counters() const { return counters_; }
  const SessionConfig& config() const { return config_; }
  // Packets of the current slice still missing their result.
  size_t remaining() const { return total_packets_ - completed_packets_; }
  // Retransmission timers held, answered ones not yet dropped included (tests, diagnostics).
  size_t timers_held() const { return timer_fifo_size_ + timers_.size(); }
  // This session's progress for a failover (failover.h): the running slice's blocks with a
  // result, per slot, and what is kept of the last finished slice. The buffers of a running
  // slice stay valid as long as the caller keeps them.
  LaneProgress Progress() const;

 private:
  struct Slot {
    uint32_t packet = 0;  // id of the packet outstanding on this slot
    uint32_t tsi = 0;     // its tsi (NextTsi when the packet was assigned)
    // SlotOf(packet), kept up to date instead of computed per packet (two 64-bit divisions):
    // the slot's next packet, packet + W, has the same index and the other set.
    proto::SlotId id;
    bool outstanding = false;
    bool queued = false;       // waiting in the send queue
    int8_t data_exponent = 0;  // float: max exponent of the data block carried by `packet`
    bool data_non_finite = false;
    uint32_t transmissions = 0;
    Nanos first_sent{};      // when `packet` was first sent: its round trip, if it is not re-sent
    uint64_t first_seq = 0;  // the order of that first transmission among the session's
    uint32_t later_results = 0;  // results of packets first sent after it (early retransmission)
    bool early = false;          // re-sent early already
    // `packet` has a retransmission timer armed (one per slot: an early re-send keeps the
    // timer of the transmission before it instead of arming its own).
    bool timer_armed = false;
    uint32_t blocks_done = 0;  // blocks of the running slice whose result was written
  };
  struct Timer {
    Nanos deadline;
    uint32_t packet;
    uint32_t local_slot;  // LocalSlot(packet)
  };

  static bool LaterDeadline(const Timer& a, const Timer& b);
  // Arms a retransmission timer; the earliest armed deadline; the timer with the earliest
  // deadline, removed (the timers must not be empty).
  void ArmTimer(const Timer& t);
  // Whether t's packet still waits for its result (else HandleTimeout skips t when it is due).
  bool TimerLive(const Timer& t) const;
  // Drops the FIFO's front entries whose packet was answered.
  void TrimAnsweredTimers();
  // Data block `block` of the slice, on local slot `local`, is about to get its result: counted,
  // and its input kept when it is about to be overwritten (keep_last_inputs, in place).
  void OnBlockDone(uint32_t local, uint64_t block);
  // Copies the input of block `block` to local slot l's kept input.
  void KeepInput(uint32_t local, uint64_t block);
  // A slice completed (its outputs are final): counts it and keeps what a failover needs.
  void KeepFinishedSlice();
  SliceLayout Layout() const;
  bool HaveTimers() const { return timer_fifo_size_ > 0 || !timers_.empty(); }
  Nanos EarliestDeadline() const;
  Timer PopEarliestTimer();
  void ClearTimers();
  bool PacketExists(uint64_t q) const;
  uint32_t LocalSlot(uint64_t q) const;  // 0 .. W-1
  proto::SlotId SlotOf(uint64_t q) const;
  // The tsi of local slot l's next round, advancing the slot's round counter.
  uint32_t NextTsi(uint32_t local_slot);
  void Enqueue(uint32_t local_slot);
  size_t Encode(uint32_t packet, const Slot& slot, std::span<uint8_t> buf);
  // Prefetches block `block` of the slice's input (kWrite false) or output (true), if it exists.
  template <bool kWrite>
  void PrefetchBlock(const void* base, uint64_t block) const;
  void Complete(uint32_t local_slot, const proto::Header& h, std::span<const uint8_t> payload);
  void Finish(Status status);
  // The RTO estimate: an accepted result of a packet sent once is a round-trip sample; it
  // updates SRTT and RTTVAR and ends any back-off. OnTimeout counts a timeout and backs off.
  void OnResult(const Slot& slot, Nanos now);
  void OnTimeout(Nanos now);
  Nanos ClampRto(Nanos rto) const;
  // Early retransmission: a result of the packet first sent as number `seq` arrived; counts it
  // for the packets first sent before it that are still waiting, and re-sends those that reach
  // the threshold.
  void CountLaterResult(uint64_t seq, uint32_t stripe);

  SessionConfig config_;
  size_t numel_;
  std::vector<Slot> slots_;
  // Send queue of local slot indices whose current packet is to be (re)sent; each slot has at
  // most one entry, so capacity W.
  std::vector<uint32_t> send_queue_;
  size_t send_head_ = 0, send_size_ = 0;
  // Retransmission timers. Every transmission arms one for now + the RTO, so deadlines nearly
  // always come in increasing order: those go to a FIFO (a ring, O(1) each way); a deadline
  // earlier than the FIFO's last (the RTO fell) goes to a min-heap instead. The earliest timer
  // is the earlier of the two fronts. An answered entry at the FIFO's front is dropped with the
  // result that answers it (TrimAnsweredTimers), so the FIFO holds about the packets in flight
  // rather than RTO x rate entries (which at 10 ms and a million packets a second was a
  // quarter of a MiB written and read back cold), and the earliest deadline is a live one; an
  // answered entry behind a live one stays until it comes to the front.
  std::vector<Timer> timer_fifo_;
  size_t timer_fifo_head_ = 0, timer_fifo_size_ = 0;
  std::vector<Timer> timers_;  // the heap

  State state_ = State::kIdle;
  Status status_;
  Slice slice_;
  uint64_t blocks_ = 0;
  uint64_t total_packets_ = 0;
  uint64_t completed_packets_ = 0;
  uint64_t span_ = 0;  // id span of the slice
  // Packet ids of all slices so far: packet q of this slice is virtual packet base_ + q, which
  // gives its slot and set. Persists across slices.
  uint64_t base_ = 0;
  // Per local slot: the tsi of its next round (l, then + W per round). Persists across slices.
  // Not derived from base_: a float32 slice shorter than the window leaves slots unused while
  // base_ advances by 2W, and a slot unused for 2^31 ids would look older than its last round.
  std::vector<uint32_t> next_tsi_;
  // The retransmission timeout given to each transmission: the estimate's RTO, doubled while
  // backing off. It, the estimate and the back-off state persist across slices.
  Nanos current_timeout_{};
  bool have_rtt_ = false;
  double srtt_ns_ = 0;
  double rttvar_ns_ = 0;
  double round_max_deviation_ns_ = 0;  // the largest |SRTT - R| of the last round_samples_
  uint32_t round_samples_ = 0;
  Nanos newest_answered_{};  // the latest first transmission of a packet answered so far
  uint64_t timeouts_since_sample_ = 0;
  uint64_t next_threshold_ = 0;
  Nanos last_backoff_{};
  Nanos last_progress_{};
  // First block whose result was non-finite (float), or UINT64_MAX.
  uint64_t first_non_finite_block_ = UINT64_MAX;
  SessionCounters counters_;
  // Early retransmission: per stripe (SessionConfig::stripes), the packets sent once and not yet
  // answered or re-sent early, in the order of their first transmission (a ring; answered ones
  // leave lazily from the front); and each local slot's stripe.
  struct FirstOrder {
    std::vector<uint32_t> ring;
    size_t head = 0, size = 0;
  };
  std::vector<FirstOrder> first_order_;
  std::vector<uint32_t> stripe_of_slot_;
  uint64_t next_send_seq_ = 0;
  // Scratch for one packet's host-order values.
  std::vector<int32_t> scratch_;
  // Failover (failover.h): per local slot, data blocks with a result over the session's life;
  // slices finished; the packet id base of the running slice; the last finished slice and (with
  // keep_last_inputs) the input of each slot's last block with a result.
  std::vector<uint64_t> blocks_done_;
  uint64_t slices_finished_ = 0;
  uint64_t slice_base_ = 0;
  std::optional<SliceLayout> previous_;
  std::vector<uint8_t> last_inputs_;
};

}  // namespace switchml::worker
