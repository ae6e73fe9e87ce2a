// Failover of a striped job (docs/protocol.md, "Striping and failover"; ours): when one of the
// job's switch hosts dies, every worker thread moves its slots off it, and the workers agree on
// which blocks of the interrupted all-reduce still need their result, with no help from the
// switches. Pure functions on a worker thread's progress; no I/O.
//
// Why the progress of workers can differ, and by how much. A slot carries one packet at a time;
// a worker sends the slot's next packet only after the result of the previous one came back, and
// that result exists only once every worker sent its packet. So on every slot any two workers are
// at most one round apart: a worker may have the result of the slot's last round while another is
// still waiting for it (the switch died between the two deliveries). Across all-reduces the same
// holds, since a worker starts a slice only after finishing the previous one.
//
// The recovery, run by every worker thread on a fresh slot range of the hosts still alive:
//   1. agreement: an int32 all-reduce of EncodeAgreement(progress): per local slot, three words,
//      word (c mod 3) holding 1, where c counts the data blocks of the slot whose result this
//      worker has written over the session's life; and the same for the number of slices
//      finished (of those with blocks). The sum tells how many workers are at each count modulo
//      3; with counts at most one apart, that tells each worker whether it is a round ahead of
//      the others (the lower count's residue is the one whose successor is also taken).
//   2. PlanRepair: the blocks of the oldest slice that some worker has not finished and that not
//      every worker has: each is aggregated again from every worker's input, so the result is
//      the one the first aggregation gave (the same inputs, quantized alike). A worker a round
//      ahead on a slot has its last block there in its output already, and in-place (or in a
//      slice it finished) no longer in its input: the session keeps a copy of the input of each
//      slot's last block for that (SessionConfig::keep_last_inputs), and the worker discards the
//      aggregate. The scattered blocks go through a staging buffer; a tail of the slice that no
//      one has any block of runs in place.
//   3. the slice completes (or, for a worker that had finished it already, the next one starts
//      over), and the job goes on with the remaining hosts.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "switchml/status.h"
#include "switchml/types.h"

namespace switchml::worker {

// One slice as far as failover cares: its all-reduce and where its blocks sit in the slots.
struct SliceLayout {
  uint64_t allreduce = 0;
  DataType dtype = DataType::kInt32;
  const void* in = nullptr;  // valid only for a slice still running (SliceProgress::current)
  void* out = nullptr;
  size_t count = 0;           // elements
  size_t element_offset = 0;  // where the slice starts in the whole tensor
  uint64_t base = 0;          // the session's packet id base: block b sits on local slot
                              // (base + b) mod W, as the (b / W)-th block of that slot
  uint64_t blocks = 0;        // ceil(count / numel)
};

// A worker thread's progress, as its WorkerSession knows it (WorkerSession::Progress()).
struct LaneProgress {
  uint32_t window = 0;           // W
  uint32_t numel = 0;            // elements per block
  uint64_t slices_finished = 0;  // of those with at least one block
  // Per local slot: data blocks whose result this session wrote, over its life.
  std::vector<uint64_t> blocks_done;
  // The slice running when progress was taken, and per local slot how many of its blocks have
  // their result (a prefix of the slot's blocks in the slice).
  std::optional<SliceLayout> current;
  std::vector<uint32_t> current_done;
  bool current_non_finite = false;  // float: a result of the slice was not finite
  // The last finished slice with blocks.
  std::optional<SliceLayout> previous;
  // (SessionConfig::keep_last_inputs) Per local slot, the input of the slot's last block with a
  // result (of the current slice, else of the previous one): numel elements (4 bytes each) per
  // slot, zero padded. Kept for in-place slices and finished ones; the input of an out-of-place
  // slice still running is its input buffer.
  std::vector<uint8_t> last_inputs;
};

// The agreement vector: 3 * (W + 1) int32 words (see the file comment).
size_t AgreementWords(uint32_t window);
std::vector<int32_t> EncodeAgreement(const LaneProgress& progress);

struct RepairBlock {
  enum class Source : uint8_t {
    kInput,      // the block of the slice's input buffer
    kLastInput,  // the copy of the block's input kept for its slot (LaneProgress::last_inputs)
  };
  uint64_t block = 0;  // in the repaired slice
  Source source = Source::kInput;
  bool write = false;  // the aggregate is this worker's result for the block (it has none yet)
};

struct RepairPlan {
  // Which slice the blocks belong to: this worker's running one (kCurrent) or the one it
  // finished last (kPrevious, while some other worker has not finished it).
  enum class Slice : uint8_t { kNone, kCurrent, kPrevious } slice = Slice::kNone;
  // Blocks aggregated through a staging buffer (each a whole block, zero padded), in order.
  std::vector<RepairBlock> staged;
  // Blocks [tail_start, blocks) of the current slice: no worker has any of them; aggregated in
  // place as a slice of their own. tail_start == blocks: none.
  uint64_t tail_start = 0;
  // After the staged blocks and the tail, the current slice is complete (else, when there is a
  // current slice, it starts over from its first block).
  bool current_completes = false;
};

// The plan from the agreement's sum (EncodeAgreement of every worker, added), the same blocks on
// every worker, each with its own sources and writes. Fails (INTERNAL) when the sum contradicts
// the protocol's invariants (counts further apart than one round, not num_workers in all).
Result<RepairPlan> PlanRepair(const LaneProgress& progress, std::span<const int32_t> agreement,
                              uint32_t num_workers);

// The staging buffer of plan.staged (numel elements of 4 bytes per block, in order): filled with
// this worker's contributions, and, once aggregated, its results copied to the blocks this worker
// writes (those of a current slice).
size_t StagingBytes(const RepairPlan& plan, const LaneProgress& progress);
void FillStaging(const RepairPlan& plan, const LaneProgress& progress, std::span<uint8_t> staging);
void ScatterStaging(const RepairPlan& plan, const LaneProgress& progress,
                    std::span<const uint8_t> staging);

}  // namespace switchml::worker
