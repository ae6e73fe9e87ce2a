#include "worker/failover.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/status_macros.h"

namespace switchml::worker {
namespace {

constexpr uint32_t kResidues = 3;

// What the agreement says of one counter (a slot's blocks, or the slices finished): whether
// some workers are a round ahead of the others, and whether this worker is.
struct Ahead {
  bool any = false;
  bool me = false;
};

Result<Ahead> DecodeCounter(std::span<const int32_t> counts, uint32_t num_workers,
                            uint64_t own_count, const char* what) {
  int64_t total = 0;
  bool populated[kResidues];
  for (uint32_t c = 0; c < kResidues; ++c) {
    if (counts[c] < 0) {
      return InternalError(std::string("failover agreement: a negative ") + what + " count");
    }
    total += counts[c];
    populated[c] = counts[c] > 0;
  }
  if (total != num_workers) {
    return InternalError(std::string("failover agreement: ") + std::to_string(total) + " " + what +
                         " counts from " + std::to_string(num_workers) +
                         " workers (a worker of another job, or a corrupted aggregate)");
  }
  const uint32_t own = static_cast<uint32_t>(own_count % kResidues);
  if (!populated[own]) {
    return InternalError(std::string("failover agreement: this worker's own ") + what +
                         " count is missing");
  }
  const int taken = populated[0] + populated[1] + populated[2];
  Ahead a;
  if (taken == 1) return a;
  if (taken == 3) {
    return InternalError(std::string("failover agreement: the workers' ") + what +
                         " counts are more than one round apart");
  }
  // Two residues: the one whose predecessor (mod 3) is taken is a round ahead.
  for (uint32_t c = 0; c < kResidues; ++c) {
    if (populated[c] && populated[(c + kResidues - 1) % kResidues]) a.me = own == c;
  }
  a.any = true;
  return a;
}

// Blocks of `slice` on local slot l: blocks b with (base + b) mod W == l.
uint64_t BlocksOnSlot(const SliceLayout& slice, uint32_t window, uint32_t l) {
  const uint64_t first = (l + window - slice.base % window) % window;
  return first < slice.blocks ? (slice.blocks - 1 - first) / window + 1 : 0;
}

}  // namespace

size_t AgreementWords(uint32_t window) { return size_t{kResidues} * (size_t{window} + 1); }

std::vector<int32_t> EncodeAgreement(const LaneProgress& progress) {
  std::vector<int32_t> words(AgreementWords(progress.window), 0);
  for (uint32_t l = 0; l < progress.window; ++l) {
    words[size_t{l} * kResidues + progress.blocks_done[l] % kResidues] = 1;
  }
  words[size_t{progress.window} * kResidues + progress.slices_finished % kResidues] = 1;
  return words;
}

Result<RepairPlan> PlanRepair(const LaneProgress& progress, std::span<const int32_t> agreement,
                              uint32_t num_workers) {
  const uint32_t w = progress.window;
  if (agreement.size() != AgreementWords(w) || progress.blocks_done.size() != w) {
    return InternalError("failover agreement: " + std::to_string(agreement.size()) +
                         " words where " + std::to_string(AgreementWords(w)) + " were expected");
  }
  ASSIGN_OR_RETURN(Ahead slices, DecodeCounter(agreement.subspan(size_t{w} * kResidues, kResidues),
                                               num_workers, progress.slices_finished, "slice"));
  RepairPlan plan;
  const SliceLayout* slice = nullptr;
  std::vector<uint64_t> done(w, 0);  // this worker's blocks with a result, per slot, in `slice`
  if (slices.me) {
    // This worker finished a slice that another has not: the blocks to repair are that slice's,
    // and this worker cannot have any result of the next one.
    if (!progress.previous) {
      return InternalError("failover agreement: this worker is a slice ahead but kept none");
    }
    if (progress.current && std::any_of(progress.current_done.begin(), progress.current_done.end(),
                                        [](uint32_t d) { return d > 0; })) {
      return InternalError(
          "failover agreement: this worker has results of a slice that another worker has not "
          "started");
    }
    slice = &*progress.previous;
    plan.slice = RepairPlan::Slice::kPrevious;
    for (uint32_t l = 0; l < w; ++l) done[l] = BlocksOnSlot(*slice, w, l);
  } else if (progress.current) {
    slice = &*progress.current;
    plan.slice = RepairPlan::Slice::kCurrent;
    for (uint32_t l = 0; l < w; ++l) done[l] = progress.current_done[l];
  } else if (slices.any) {
    return InternalError(
        "failover agreement: another worker finished a slice this worker has not started");
  }

  std::vector<uint64_t> all_done(w, 0);  // blocks every worker has, per slot
  std::vector<Ahead> ahead(w);
  uint64_t reach = 0;  // slot rounds below which some worker has a block
  for (uint32_t l = 0; l < w; ++l) {
    ASSIGN_OR_RETURN(ahead[l], DecodeCounter(agreement.subspan(size_t{l} * kResidues, kResidues),
                                             num_workers, progress.blocks_done[l], "block"));
    if (slice == nullptr) {
      if (ahead[l].any) {
        return InternalError("failover agreement: workers differ on slot " + std::to_string(l) +
                             " with no slice under way");
      }
      continue;
    }
    if (ahead[l].me && done[l] == 0) {
      return InternalError("failover agreement: this worker is a round ahead on slot " +
                           std::to_string(l) + " without a result in the slice");
    }
    all_done[l] = done[l] - (ahead[l].me ? 1 : 0);
    reach = std::max(reach, all_done[l] + (ahead[l].any ? 1 : 0));
  }
  if (slice == nullptr) return plan;

  plan.tail_start = std::min<uint64_t>(slice->blocks, reach * w);
  if (plan.slice == RepairPlan::Slice::kPrevious && plan.tail_start < slice->blocks) {
    return InternalError("failover agreement: blocks of a finished slice that no worker has");
  }
  for (uint64_t b = 0; b < plan.tail_start; ++b) {
    const uint32_t l = static_cast<uint32_t>((slice->base + b) % w);
    const uint64_t j = b / w;
    if (j < all_done[l]) continue;  // every worker has it
    RepairBlock r;
    r.block = b;
    // This worker's own last block on the slot, when it is a round ahead there: its input is
    // in the buffer only while an out-of-place slice runs.
    const bool mine = j == all_done[l] && ahead[l].me;
    if (!mine && plan.slice == RepairPlan::Slice::kPrevious) {
      return InternalError(
          "failover agreement: a block of a finished slice that this worker has "
          "no result of");
    }
    const bool in_buffer = plan.slice == RepairPlan::Slice::kCurrent && slice->in != slice->out;
    r.source = mine && !in_buffer ? RepairBlock::Source::kLastInput : RepairBlock::Source::kInput;
    r.write = !mine;
    plan.staged.push_back(r);
  }
  plan.current_completes = plan.slice == RepairPlan::Slice::kCurrent;
  return plan;
}

size_t StagingBytes(const RepairPlan& plan, const LaneProgress& progress) {
  return plan.staged.size() * size_t{progress.numel} * 4;
}

void FillStaging(const RepairPlan& plan, const LaneProgress& progress, std::span<uint8_t> staging) {
  const SliceLayout& s =
      plan.slice == RepairPlan::Slice::kCurrent ? *progress.current : *progress.previous;
  const size_t block_bytes = size_t{progress.numel} * 4;
  std::fill(staging.begin(), staging.end(), 0);
  for (size_t i = 0; i < plan.staged.size(); ++i) {
    const RepairBlock& r = plan.staged[i];
    uint8_t* dst = staging.data() + i * block_bytes;
    const size_t first = r.block * progress.numel;
    const size_t bytes = 4 * std::min<size_t>(progress.numel, s.count - first);
    if (r.source == RepairBlock::Source::kInput) {
      std::memcpy(dst, static_cast<const uint8_t*>(s.in) + 4 * first, bytes);
    } else {
      const size_t l = (s.base + r.block) % progress.window;
      std::memcpy(dst, progress.last_inputs.data() + l * block_bytes, bytes);
    }
  }
}

void ScatterStaging(const RepairPlan& plan, const LaneProgress& progress,
                    std::span<const uint8_t> staging) {
  if (plan.slice != RepairPlan::Slice::kCurrent) return;  // a finished slice's output is the user's
  const SliceLayout& s = *progress.current;
  const size_t block_bytes = size_t{progress.numel} * 4;
  for (size_t i = 0; i < plan.staged.size(); ++i) {
    const RepairBlock& r = plan.staged[i];
    if (!r.write) continue;
    const size_t first = r.block * progress.numel;
    const size_t bytes = 4 * std::min<size_t>(progress.numel, s.count - first);
    std::memcpy(static_cast<uint8_t*>(s.out) + 4 * first, staging.data() + i * block_bytes, bytes);
  }
}

}  // namespace switchml::worker
