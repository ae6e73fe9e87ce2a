// SparseSession: one worker thread's side of a job whose all-reduces may be block-sparse
// (docs/protocol.md 2.5; ours, beyond the reference). A pure state machine like the
// StripedSession it wraps, with the same interface: bytes and a time in, bytes, a destination
// host and timer deadlines out.
//
// A dense slice (Slice::sparse false) goes to the StripedSession unchanged. A sparse one is
// the whole tensor and this thread's lane of it (sparse.h): Start reads the thread's blocks and
// writes the announcement of those that are non-zero here, then runs two slices of its own on
// the StripedSession, back to back, through the same driver loop:
//   1. the announcement, an int32 slice in place (exact sums: per block, how many workers hold
//      it);
//   2. the union, a slice of the tensor's type over the blocks some worker holds, gathered into a
//      compact buffer and all-reduced in place; its results are then copied back to their blocks
//      of the output, and (out of place) the share's other blocks are zeroed.
//      Or the whole share dense: when it is the whole tensor (one lane) and every block is in the
//      union, or the auto rule chose dense (more than 7/8 of the blocks in the union), the slice
//      runs on the tensor itself, in to out, as a dense all-reduce would (with several lanes
//      a dense share is gathered whole: its blocks are strided).
// The driver sees one slice: state() stays kRunning until the second ends. Everything else
// (retransmission, striping, failover with its repair of an interrupted slice) is the
// StripedSession's, to which both slices are ordinary ones. The announcement and compact
// buffers live here (reused, grown as needed), so they outlast any repair.
//
// Thread-compatible: one thread drives a session. A sparse slice's buffers must stay valid and
// untouched by others until the slice ends.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "switchml/status.h"
#include "worker/sparse.h"
#include "worker/striped_session.h"

namespace switchml::worker {

struct SparseCounters {
  uint64_t allreduces = 0;    // sparse slices run
  uint64_t blocks = 0;        // blocks of their shares (announced)
  uint64_t own_blocks = 0;    // of those, non-zero on this worker
  uint64_t union_blocks = 0;  // of those, non-zero on some worker
  // Shares aggregated whole (dense), without a compact buffer: every block in the union, or the
  // auto rule's choice (Slice::sparse_auto); their blocks all count as aggregated.
  uint64_t dense_shares = 0;
  uint64_t aggregated_blocks = 0;  // blocks of union and dense slices that crossed the network
  uint64_t announce_words = 0;     // int32 words of the announcements
};

class SparseSession {
 public:
  using State = StripedSession::State;

  explicit SparseSession(const StripedSessionConfig& config);  // must Validate() (CHECKed)

  // Starts a slice, dense or sparse; the session must not be running.
  void Start(const Slice& slice, Nanos now);
  void HandleDatagram(std::span<const uint8_t> datagram, Nanos now);
  void HandleTimeout(Nanos now);
  void Abort(Status status);
  std::optional<uint32_t> NextTransmitHost() { return inner_.NextTransmitHost(); }
  size_t PollTransmit(Nanos now, std::span<uint8_t> buf) { return inner_.PollTransmit(now, buf); }
  std::optional<Nanos> PollTimeout() const { return inner_.PollTimeout(); }
  // StripedSession::Failover; a failover while idle runs the agreement as there (state()
  // kRunning, then kDone with no slice).
  Status Failover(uint32_t host, Nanos now);

  State state() const { return own_result_ ? state_ : inner_.state(); }
  const Status& status() const { return own_result_ ? status_ : inner_.status(); }
  const std::vector<uint32_t>& live_hosts() const { return inner_.live_hosts(); }
  uint32_t generation() const { return inner_.generation(); }
  const SessionConfig& config() const { return inner_.config(); }
  SessionCounters counters() const { return inner_.counters(); }
  const FailoverCounters& failover_counters() const { return inner_.failover_counters(); }
  const SparseCounters& sparse_counters() const { return sparse_counters_; }
  // Packets of the slice under way still missing their result (of the phase under way).
  size_t remaining() const { return inner_.remaining(); }
  bool failing_over() const { return inner_.failing_over(); }

 private:
  enum class Phase { kNone, kAnnounce, kUnion };
  // After a call into the inner session: moves a sparse slice on when its phase ended.
  void Advance(Nanos now);
  void StartUnion(Nanos now);
  // The auto rule (docs/protocol.md 2.5): a share of `blocks` blocks whose union holds `u` runs
  // dense. The same on every worker (the sums are).
  static bool AutoChoosesDense(uint64_t u, uint64_t blocks) { return 8 * u > 7 * blocks; }
  void FinishUnion();
  void Finish(Status status);

  StripedSession inner_;
  uint32_t num_workers_;
  size_t numel_;
  // The sparse slice under way (phase_ != kNone), or its outcome (own_result_: state() and
  // status() are then state_ and status_, not the inner session's).
  Phase phase_ = Phase::kNone;
  bool own_result_ = false;
  State state_ = State::kIdle;
  Status status_;
  Slice slice_;
  BlockShare share_;
  std::vector<int32_t> announce_;  // this worker's announcement, then the sums
  std::vector<uint64_t> union_;    // share-local blocks of the union, ascending
  std::vector<uint8_t> compact_;   // the union's blocks, in union order
  bool direct_ = false;            // the second slice runs on the tensor itself (no compact_)
  SparseCounters sparse_counters_;
};

}  // namespace switchml::worker
