#include "worker/failover.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/status_macros.h"

namespace switchml::worker {
namespace {

constexpr uint32_t kRanksPerWord = 32;
constexpr uint32_t kResidues = 3;

uint32_t WordsPerMask(uint32_t num_workers) {
  return (num_workers + kRanksPerWord - 1) / kRanksPerWord;
}

// Words of one counter's three bitmaps.
uint32_t WordsPerCounter(uint32_t num_workers) { return kResidues * WordsPerMask(num_workers); }

void SetRankBit(std::span<int32_t> mask, uint32_t rank) {
  mask[rank / kRanksPerWord] = static_cast<int32_t>(static_cast<uint32_t>(mask[rank / kRanksPerWord]) |
                                                    (1u << (rank % kRanksPerWord)));
}

bool RankBit(std::span<const int32_t> mask, uint32_t rank) {
  return (static_cast<uint32_t>(mask[rank / kRanksPerWord]) >> (rank % kRanksPerWord)) & 1u;
}

// What the agreement says of one counter (a slot's blocks, or the slices finished): whether
// some workers are a round ahead of the others, whether this worker is, and the lowest rank
// that is.
struct Ahead {
  bool any = false;
  bool me = false;
  uint32_t first = 0;
};

Result<Ahead> DecodeCounter(std::span<const int32_t> words, uint32_t rank, uint32_t num_workers,
                            uint64_t own_count, const char* what) {
  const uint32_t m = WordsPerMask(num_workers);
  auto mask = [&](uint32_t residue) { return words.subspan(size_t{residue} * m, m); };
  // Every rank in exactly one residue; no bits beyond the ranks.
  bool populated[kResidues] = {false, false, false};
  for (uint32_t r = 0; r < num_workers; ++r) {
    int in = 0;
    for (uint32_t c = 0; c < kResidues; ++c) {
      if (RankBit(mask(c), r)) {
        ++in;
        populated[c] = true;
      }
    }
    if (in != 1) {
      return InternalError(std::string("failover agreement: rank ") + std::to_string(r) +
                           " appears " + std::to_string(in) + " times in the " + what +
                           " counts (a worker of another job or a corrupted aggregate)");
    }
  }
  for (uint32_t c = 0; c < kResidues; ++c) {
    for (uint32_t r = num_workers; r < m * kRanksPerWord; ++r) {
      if (RankBit(mask(c), r)) {
        return InternalError(std::string("failover agreement: a bit beyond the ") +
                             std::to_string(num_workers) + " ranks in the " + what + " counts");
      }
    }
  }
  const uint32_t own = static_cast<uint32_t>(own_count % kResidues);
  if (!RankBit(mask(own), rank)) {
    return InternalError(std::string("failover agreement: this rank's own ") + what +
                         " count is not where it put it");
  }
  const int count = populated[0] + populated[1] + populated[2];
  Ahead a;
  if (count == 1) return a;
  if (count == 3) {
    return InternalError(std::string("failover agreement: the workers' ") + what +
                         " counts are more than one round apart");
  }
  // Two residues: the one whose predecessor (mod 3) is populated is a round ahead.
  uint32_t ahead = 0;
  for (uint32_t c = 0; c < kResidues; ++c) {
    if (populated[c] && populated[(c + kResidues - 1) % kResidues]) ahead = c;
  }
  a.any = true;
  a.me = own == ahead;
  for (uint32_t r = 0; r < num_workers; ++r) {
    if (RankBit(mask(ahead), r)) {
      a.first = r;
      break;
    }
  }
  return a;
}

// Blocks of `slice` on local slot l: blocks b with (base + b) mod W == l.
uint64_t BlocksOnSlot(const SliceLayout& slice, uint32_t window, uint32_t l) {
  const uint64_t first = (l + window - slice.base % window) % window;
  return first < slice.blocks ? (slice.blocks - 1 - first) / window + 1 : 0;
}

}  // namespace

size_t AgreementWords(uint32_t window, uint32_t num_workers) {
  return size_t{WordsPerCounter(num_workers)} * (size_t{window} + 1);
}

std::vector<int32_t> EncodeAgreement(const LaneProgress& progress, uint32_t rank,
                                     uint32_t num_workers) {
  const uint32_t per = WordsPerCounter(num_workers), m = WordsPerMask(num_workers);
  std::vector<int32_t> words(AgreementWords(progress.window, num_workers), 0);
  auto put = [&](size_t counter, uint64_t count) {
    SetRankBit(std::span(words).subspan(counter * per + (count % kResidues) * m, m), rank);
  };
  for (uint32_t l = 0; l < progress.window; ++l) put(l, progress.blocks_done[l]);
  put(progress.window, progress.slices_finished);
  return words;
}

Result<RepairPlan> PlanRepair(const LaneProgress& progress, std::span<const int32_t> agreement,
                              uint32_t rank, uint32_t num_workers) {
  const uint32_t w = progress.window, per = WordsPerCounter(num_workers);
  if (agreement.size() != AgreementWords(w, num_workers) || progress.blocks_done.size() != w) {
    return InternalError("failover agreement: " + std::to_string(agreement.size()) +
                         " words where " + std::to_string(AgreementWords(w, num_workers)) +
                         " were expected");
  }
  ASSIGN_OR_RETURN(Ahead slices, DecodeCounter(agreement.subspan(size_t{w} * per, per), rank,
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
    if (progress.current && std::any_of(progress.current_done.begin(),
                                        progress.current_done.end(),
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
    ASSIGN_OR_RETURN(ahead[l], DecodeCounter(agreement.subspan(size_t{l} * per, per), rank,
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
    if (j == all_done[l] && ahead[l].any) {
      // Some workers have its result, the others not: the lowest of them contributes it.
      if (ahead[l].first == rank) {
        r.source = plan.slice == RepairPlan::Slice::kCurrent ? RepairBlock::Source::kOutput
                                                              : RepairBlock::Source::kLastResult;
      } else {
        r.source = RepairBlock::Source::kZero;
      }
      r.write = !ahead[l].me;
    } else {
      if (plan.slice == RepairPlan::Slice::kPrevious) {
        return InternalError("failover agreement: a block of a finished slice that no worker has");
      }
      r.source = RepairBlock::Source::kInput;
      r.write = true;
    }
    plan.staged.push_back(r);
  }
  plan.current_completes = plan.slice == RepairPlan::Slice::kCurrent;
  return plan;
}

size_t StagingBytes(const RepairPlan& plan, const LaneProgress& progress) {
  return plan.staged.size() * size_t{progress.numel} * 4;
}

void FillStaging(const RepairPlan& plan, const LaneProgress& progress,
                 std::span<uint8_t> staging) {
  const SliceLayout& s =
      plan.slice == RepairPlan::Slice::kCurrent ? *progress.current : *progress.previous;
  const size_t block_bytes = size_t{progress.numel} * 4;
  std::fill(staging.begin(), staging.end(), 0);
  for (size_t i = 0; i < plan.staged.size(); ++i) {
    const RepairBlock& r = plan.staged[i];
    uint8_t* dst = staging.data() + i * block_bytes;
    const size_t first = r.block * progress.numel;
    const size_t bytes = 4 * std::min<size_t>(progress.numel, s.count - first);
    switch (r.source) {
      case RepairBlock::Source::kInput:
        std::memcpy(dst, static_cast<const uint8_t*>(s.in) + 4 * first, bytes);
        break;
      case RepairBlock::Source::kOutput:
        std::memcpy(dst, static_cast<const uint8_t*>(s.out) + 4 * first, bytes);
        break;
      case RepairBlock::Source::kLastResult: {
        const size_t l = (s.base + r.block) % progress.window;
        std::memcpy(dst, progress.last_results.data() + l * block_bytes, bytes);
        break;
      }
      case RepairBlock::Source::kZero:
        break;
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
