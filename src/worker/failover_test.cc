// PlanRepair on hand-made progress of three workers (failover.h). The whole procedure, with real
// sessions and switches, loss and a host killed at random moments, is tests/striping_test.cc.
#include "worker/failover.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "worker/striping.h"

namespace switchml::worker {
namespace {

constexpr uint32_t kW = 4, kNumel = 2, kN = 3;

// A slice of `blocks` blocks at packet id base 0 with per-slot blocks done.
LaneProgress InSlice(uint64_t blocks, std::vector<uint32_t> done, std::vector<int32_t>* in,
                     std::vector<int32_t>* out) {
  LaneProgress p;
  p.window = kW;
  p.numel = kNumel;
  p.slices_finished = 5;
  p.blocks_done.assign(kW, 100);  // earlier slices: 100 blocks per slot
  for (uint32_t l = 0; l < kW; ++l) p.blocks_done[l] += done[l];
  SliceLayout s;
  s.allreduce = 9;
  s.dtype = DataType::kInt32;
  s.count = blocks * kNumel - 1;  // the last block is short
  s.blocks = blocks;
  in->resize(s.count);
  out->assign(s.count, -1);
  std::iota(in->begin(), in->end(), 1000);
  s.in = in->data();
  s.out = out->data();
  p.current = s;
  p.current_done = std::move(done);
  return p;
}

std::vector<int32_t> Sum(const std::vector<LaneProgress>& ps) {
  std::vector<int32_t> sum(AgreementWords(kW), 0);
  for (uint32_t r = 0; r < ps.size(); ++r) {
    std::vector<int32_t> a = EncodeAgreement(ps[r]);
    EXPECT_EQ(a.size(), sum.size());
    for (size_t i = 0; i < a.size(); ++i) sum[i] += a[i];
  }
  return sum;
}

std::vector<uint64_t> Blocks(const RepairPlan& p) {
  std::vector<uint64_t> b;
  for (const RepairBlock& r : p.staged) b.push_back(r.block);
  return b;
}

// Given 10 blocks on 4 slots (slot l holds blocks l, l+4, l+8) and every worker at the same
// place (slot 0: 2 done, slot 1: 1, slot 2: 2 (all), slot 3: 0),
// Expect the blocks below the furthest slot's round (8) that are missing to be staged from the
// input and written, and blocks 8.. to be a tail in place.
TEST(PlanRepairTest, EqualProgressStagesTheGapsAndRunsTheTailInPlace) {
  std::vector<std::vector<int32_t>> in(kN), out(kN);
  std::vector<LaneProgress> ps;
  for (uint32_t r = 0; r < kN; ++r) ps.push_back(InSlice(10, {2, 1, 2, 0}, &in[r], &out[r]));
  const std::vector<int32_t> sum = Sum(ps);
  for (uint32_t r = 0; r < kN; ++r) {
    Result<RepairPlan> plan = PlanRepair(ps[r], sum, kN);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->slice, RepairPlan::Slice::kCurrent);
    EXPECT_EQ(Blocks(*plan), (std::vector<uint64_t>{3, 5, 7}));
    for (const RepairBlock& b : plan->staged) {
      EXPECT_EQ(b.source, RepairBlock::Source::kInput);
      EXPECT_TRUE(b.write);
    }
    EXPECT_EQ(plan->tail_start, 8u);
    EXPECT_TRUE(plan->current_completes);
  }
}

// Given worker 1 a round ahead on slot 1 (it has block 5's result, the others do not) and workers
// 1 and 2 a round ahead on slot 3 (block 3), in an out-of-place slice,
// Expect those blocks staged from every worker's input (the ahead ones' still in their buffers),
// written only by the workers that lack them.
TEST(PlanRepairTest, AWorkerARoundAheadContributesItsInputAndKeepsItsResult) {
  std::vector<std::vector<int32_t>> in(kN), out(kN);
  std::vector<LaneProgress> ps;
  ps.push_back(InSlice(10, {2, 1, 2, 0}, &in[0], &out[0]));
  ps.push_back(InSlice(10, {2, 2, 2, 1}, &in[1], &out[1]));
  ps.push_back(InSlice(10, {2, 1, 2, 1}, &in[2], &out[2]));
  const std::vector<int32_t> sum = Sum(ps);
  // Per rank, whether it writes blocks 3, 5, 7.
  const std::vector<std::vector<bool>> writes = {
      {true, true, true}, {false, false, true}, {false, true, true}};
  for (uint32_t r = 0; r < kN; ++r) {
    Result<RepairPlan> plan = PlanRepair(ps[r], sum, kN);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(Blocks(*plan), (std::vector<uint64_t>{3, 5, 7})) << "rank " << r;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(plan->staged[i].source, RepairBlock::Source::kInput) << "rank " << r;
      EXPECT_EQ(plan->staged[i].write, writes[r][i]) << "rank " << r << " block " << i;
    }
    EXPECT_EQ(plan->tail_start, 8u);
  }
}

// Given the same in place (the ahead workers' inputs overwritten by their results),
// Expect the ahead workers to contribute the inputs their sessions kept.
TEST(PlanRepairTest, InPlaceTheKeptInputIsContributed) {
  std::vector<std::vector<int32_t>> in(kN), out(kN);
  std::vector<LaneProgress> ps;
  ps.push_back(InSlice(10, {2, 1, 2, 0}, &in[0], &out[0]));
  ps.push_back(InSlice(10, {2, 2, 2, 1}, &in[1], &out[1]));
  ps.push_back(InSlice(10, {2, 1, 2, 1}, &in[2], &out[2]));
  for (LaneProgress& p : ps) p.current->out = const_cast<void*>(p.current->in);
  const std::vector<int32_t> sum = Sum(ps);
  using S = RepairBlock::Source;
  const std::vector<std::vector<S>> sources = {{S::kInput, S::kInput, S::kInput},
                                               {S::kLastInput, S::kLastInput, S::kInput},
                                               {S::kLastInput, S::kInput, S::kInput}};
  for (uint32_t r = 0; r < kN; ++r) {
    Result<RepairPlan> plan = PlanRepair(ps[r], sum, kN);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->staged.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(plan->staged[i].source, sources[r][i]) << "rank " << r << " block " << i;
    }
  }
}

// Given worker 0 finished the slice (and started the next, with no result of it) while workers
// 1 and 2 still lack the result of the slice's last block on slot 1 (block 9),
// Expect every worker to repair the finished slice's block 9: worker 0 contributing the input it
// kept, writing nothing; the others their inputs, writing it; and worker 0 to start its slice
// over.
TEST(PlanRepairTest, AWorkerASliceAheadContributesTheInputItKept) {
  std::vector<std::vector<int32_t>> in(kN), out(kN);
  std::vector<LaneProgress> ps;
  ps.push_back(InSlice(10, {3, 3, 2, 2}, &in[0], &out[0]));
  ps.push_back(InSlice(10, {3, 2, 2, 2}, &in[1], &out[1]));
  ps.push_back(InSlice(10, {3, 2, 2, 2}, &in[2], &out[2]));
  // Worker 0's slice is finished: it becomes `previous`, a new one runs with nothing done.
  ps[0].previous = ps[0].current;
  ps[0].previous->in = ps[0].previous->out = nullptr;
  ps[0].slices_finished += 1;
  ps[0].last_inputs.assign(kW * kNumel * 4, 0);
  const int32_t kept[kNumel] = {77, 0};  // (block 9 is the slice's short last block)
  std::memcpy(ps[0].last_inputs.data() + 1 * kNumel * 4, kept, sizeof(kept));  // slot 1
  ps[0].current->allreduce = 10;
  ps[0].current_done.assign(kW, 0);
  const std::vector<int32_t> sum = Sum(ps);
  for (uint32_t r = 0; r < kN; ++r) {
    Result<RepairPlan> plan = PlanRepair(ps[r], sum, kN);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(Blocks(*plan), (std::vector<uint64_t>{9})) << "rank " << r;
    EXPECT_EQ(plan->staged[0].write, r != 0);
    EXPECT_EQ(plan->slice, r == 0 ? RepairPlan::Slice::kPrevious : RepairPlan::Slice::kCurrent);
    EXPECT_EQ(plan->current_completes, r != 0);
    EXPECT_EQ(plan->tail_start, 10u);
    std::vector<uint8_t> staging(StagingBytes(*plan, ps[r]));
    FillStaging(*plan, ps[r], staging);
    std::vector<int32_t> values(staging.size() / 4);
    std::memcpy(values.data(), staging.data(), staging.size());
    // Block 9 is one element (1018, the iota's 19th), then padding.
    const std::vector<int32_t> want =
        r == 0 ? std::vector<int32_t>{77, 0} : std::vector<int32_t>{1018, 0};
    EXPECT_EQ(values, want);
  }
  // The aggregate goes to the workers that lacked it, only within the slice (block 9 is short).
  std::vector<uint8_t> staging(kNumel * 4);
  const int32_t agg[kNumel] = {77, 78};
  std::memcpy(staging.data(), agg, sizeof(agg));
  Result<RepairPlan> plan = PlanRepair(ps[1], sum, kN);
  ASSERT_TRUE(plan.ok());
  ScatterStaging(*plan, ps[1], staging);
  EXPECT_EQ(out[1][18], 77);
  EXPECT_EQ(out[1].size(), 19u);
}

// Given counts two rounds apart on a slot (or a worker missing from the sum),
// Expect an INTERNAL error rather than a plan: the invariants the repair relies on do not hold.
TEST(PlanRepairTest, CountsFurtherApartThanOneRoundAreRefused) {
  std::vector<std::vector<int32_t>> in(kN), out(kN);
  std::vector<LaneProgress> ps;
  ps.push_back(InSlice(10, {0, 1, 2, 0}, &in[0], &out[0]));
  ps.push_back(InSlice(10, {1, 1, 2, 0}, &in[1], &out[1]));
  ps.push_back(InSlice(10, {2, 1, 2, 0}, &in[2], &out[2]));
  std::vector<int32_t> sum = Sum(ps);
  Result<RepairPlan> plan = PlanRepair(ps[0], sum, kN);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInternal);
  EXPECT_NE(plan.status().message().find("more than one round apart"), std::string::npos);

  ps[2] = ps[1];
  sum = Sum({ps[0], ps[1]});  // worker 2's contribution lost
  EXPECT_EQ(PlanRepair(ps[0], sum, kN).status().code(), StatusCode::kInternal);
}

// Given every worker idle with equal counts, Expect nothing to repair.
TEST(PlanRepairTest, IdleWorkersRepairNothing) {
  std::vector<LaneProgress> ps(kN);
  for (LaneProgress& p : ps) {
    p.window = kW;
    p.numel = kNumel;
    p.slices_finished = 3;
    p.blocks_done.assign(kW, 7);
  }
  const std::vector<int32_t> sum = Sum(ps);
  Result<RepairPlan> plan = PlanRepair(ps[1], sum, kN);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->slice, RepairPlan::Slice::kNone);
  EXPECT_TRUE(plan->staged.empty());
}

TEST(StripingTest, SlotsSplitIntoContiguousNearlyEqualRanges) {
  for (uint32_t w : {4u, 7u, 64u, 256u}) {
    for (uint32_t k = 1; k <= std::min(w, 9u); ++k) {
      std::vector<uint32_t> per(k, 0);
      uint32_t prev = 0;
      for (uint32_t l = 0; l < w; ++l) {
        const uint32_t s = StripeOfSlot(l, w, k);
        ASSERT_LT(s, k);
        ASSERT_GE(s, prev) << "not contiguous";
        prev = s;
        ++per[s];
      }
      for (uint32_t c : per) {
        EXPECT_GE(c, w / k);
        EXPECT_LE(c, (w + k - 1) / k);
      }
    }
  }
}

}  // namespace
}  // namespace switchml::worker
