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
// span of all earlier slices, so set alternation continues across jobs. The tsi field carries
// the running id (shift + q) mod 2^32 rather than q: every worker of the job sends the same tsi
// for the same round, and a round's tsi differs from every recent round's on the same slot, which
// lets the switch recognise late network duplicates (docs/protocol.md).
//
// int32 slices: packet q carries block q. float32 slices: exponents travel one window ahead of
// their data (section 5): packet q carries the exponent of block q (q < B) and the quantized data
// of block q - W (q >= W), scaled with the max exponent the switch returned for packet q - W. So
// the packets of a float slice are q in [0, B) u [W, W + B).
//
// Use:  Start(job, now); then loop { PollTransmit -> send; receive -> HandleDatagram;
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
#include "switchml/status.h"
#include "switchml/types.h"

namespace switchml::worker {

using Nanos = std::chrono::nanoseconds;

struct SessionConfig {
  uint32_t num_workers = 1;
  uint32_t slot_start = 0;
  uint32_t window = 64;  // W: outstanding packets = slots owned
  proto::SizeCode size = proto::SizeCode::k1024B;
  // First retransmission timeout of each slice. The reference's back-off, counted differently:
  // after `timeout_threshold` timeouts with no result in between, the timeout doubles (at most
  // once per timeout period, up to progress_timeout) and the threshold grows by
  // `timeout_threshold_increment`, for the rest of the slice. (The reference counts all
  // timeouts, so random loss alone inflates the timeout; one window timing out at once would
  // double it several times.)
  Nanos timeout = std::chrono::milliseconds(10);
  uint32_t timeout_threshold = 100;
  uint32_t timeout_threshold_increment = 100;
  // A slice fails with kDeadlineExceeded when no result at all arrives for this long.
  Nanos progress_timeout = std::chrono::seconds(10);
  Status Validate() const;
};

// One slice of an all-reduce. `in` and `out` may be the same buffer.
struct SliceJob {
  uint64_t job_id = 0;  // its low 8 bits travel as job_number
  DataType dtype = DataType::kFloat32;
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;           // elements in this slice
  size_t element_offset = 0;  // where the slice starts in the whole tensor (for messages)
};

struct SessionCounters {
  uint64_t sent = 0;           // first transmissions
  uint64_t retransmitted = 0;  // re-sends after a timeout
  uint64_t timeouts = 0;
  uint64_t results = 0;       // results accepted
  uint64_t duplicates = 0;    // results for a packet no longer outstanding (dropped)
  uint64_t stale = 0;         // results of another job (job_number differs; dropped)
  uint64_t foreign_slot = 0;  // results for a slot outside this session's range (dropped)
  uint64_t malformed = 0;     // datagrams that failed decoding (dropped)
};

class WorkerSession {
 public:
  enum class State { kIdle, kRunning, kDone };

  explicit WorkerSession(const SessionConfig& config);  // config must Validate() (CHECKed)

  // Starts a slice; the session must not be running. A slice of 0 elements is done at once.
  void Start(const SliceJob& job, Nanos now);

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
  // When HandleTimeout should next be called, if the slice is running.
  std::optional<Nanos> PollTimeout() const;

  State state() const { return state_; }
  // The outcome of the last slice once kDone: OK, or why it failed (timeout, non-finite input).
  const Status& status() const { return status_; }
  const SessionCounters& counters() const { return counters_; }
  const SessionConfig& config() const { return config_; }
  // Packets of the current slice still missing their result.
  size_t remaining() const { return total_packets_ - completed_packets_; }

 private:
  struct Slot {
    uint32_t packet = 0;  // id of the packet outstanding on this slot
    bool outstanding = false;
    bool queued = false;       // waiting in the send queue
    int8_t data_exponent = 0;  // float: max exponent of the data block carried by `packet`
    bool data_non_finite = false;
    uint32_t transmissions = 0;
  };
  struct Timer {
    Nanos deadline;
    uint32_t packet;
  };

  static bool LaterDeadline(const Timer& a, const Timer& b);
  bool PacketExists(uint64_t q) const;
  uint32_t LocalSlot(uint64_t q) const;  // 0 .. W-1
  proto::SlotId SlotOf(uint64_t q) const;
  uint32_t Tsi(uint64_t q) const;
  void Enqueue(uint32_t local_slot);
  size_t Encode(uint32_t packet, const Slot& slot, std::span<uint8_t> buf);
  void Complete(uint32_t local_slot, const proto::Header& h, std::span<const uint8_t> payload);
  void Finish(Status status);

  SessionConfig config_;
  size_t numel_;
  std::vector<Slot> slots_;
  // Send queue of local slot indices whose current packet is to be (re)sent; each slot has at
  // most one entry, so capacity W.
  std::vector<uint32_t> send_queue_;
  size_t send_head_ = 0, send_size_ = 0;
  // Retransmission timers, a min-heap on deadline. An entry whose packet was answered stays
  // until it comes to the top and is discarded then.
  std::vector<Timer> timers_;

  State state_ = State::kIdle;
  Status status_;
  SliceJob job_;
  uint64_t blocks_ = 0;
  uint64_t total_packets_ = 0;
  uint64_t completed_packets_ = 0;
  uint64_t span_ = 0;  // id span of the slice
  // Packet ids of all slices so far: packet q of this slice is virtual packet base_ + q, which
  // gives its slot and set and, mod 2^32, its tsi. Persists across slices.
  uint64_t base_ = 0;
  Nanos current_timeout_{};
  uint64_t timeouts_since_result_ = 0;
  uint64_t next_threshold_ = 0;
  Nanos last_backoff_{};
  Nanos last_progress_{};
  // First block whose result was non-finite (float), or UINT64_MAX.
  uint64_t first_non_finite_block_ = UINT64_MAX;
  SessionCounters counters_;
  // Scratch for one packet's host-order values.
  std::vector<int32_t> scratch_;
};

}  // namespace switchml::worker
