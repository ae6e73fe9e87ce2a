#include "dataplane/stages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace switchml::dataplane {
namespace {

using proto::SlotId;

PacketMetadata Md(SlotId slot, uint32_t rank, uint32_t num_workers) {
  PacketMetadata md{};
  md.header.slot = slot;
  md.rank = rank;
  md.num_workers = num_workers;
  return md;
}

TEST(RegisterIndexTest, InterleavesSets) {
  EXPECT_EQ(RegisterIndex(SlotId{0, 0}), 0u);
  EXPECT_EQ(RegisterIndex(SlotId{0, 1}), 1u);
  EXPECT_EQ(RegisterIndex(SlotId{5, 1}), 11u);
}

// ---- WorkerBitmapStage ----

TEST(WorkerBitmapStageTest, FirstThenOthersThenRetransmission) {
  WorkerBitmapStage stage(4);
  PacketMetadata a = Md({2, 0}, 0, 3);
  stage.Apply(a);
  EXPECT_TRUE(a.first);
  EXPECT_FALSE(a.seen);
  EXPECT_EQ(stage.bitmap({2, 0}), 0b1u);

  PacketMetadata b = Md({2, 0}, 2, 3);
  stage.Apply(b);
  EXPECT_FALSE(b.first);
  EXPECT_FALSE(b.seen);
  EXPECT_EQ(stage.bitmap({2, 0}), 0b101u);

  PacketMetadata again = Md({2, 0}, 0, 3);
  stage.Apply(again);
  EXPECT_FALSE(again.first);
  EXPECT_TRUE(again.seen);
  EXPECT_EQ(stage.bitmap({2, 0}), 0b101u);
  // Other slots untouched.
  EXPECT_EQ(stage.bitmap({2, 1}), 0u);
  EXPECT_EQ(stage.bitmap({1, 0}), 0u);
  EXPECT_EQ(stage.bitmap({3, 0}), 0u);
}

TEST(WorkerBitmapStageTest, PacketClearsSenderInOtherSet) {
  WorkerBitmapStage stage(1);
  for (uint32_t r = 0; r < 3; ++r) {
    PacketMetadata md = Md({0, 0}, r, 3);
    stage.Apply(md);
  }
  EXPECT_EQ(stage.bitmap({0, 0}), 0b111u);
  PacketMetadata md = Md({0, 1}, 1, 3);
  stage.Apply(md);
  EXPECT_TRUE(md.first);
  EXPECT_TRUE(md.other_had_bit);
  EXPECT_EQ(stage.bitmap({0, 0}), 0b101u);
  EXPECT_EQ(stage.bitmap({0, 1}), 0b010u);
}

TEST(WorkerBitmapStageTest, HighestRankOf64) {
  WorkerBitmapStage stage(1);
  PacketMetadata md = Md({0, 1}, 63, 64);
  stage.Apply(md);
  EXPECT_EQ(stage.bitmap({0, 1}), WorkerBitmap{1} << 63);
}

TEST(WorkerBitmapStageTest, HighestRankOf256AndWordBoundaries) {
  EXPECT_EQ((WorkerBitmap{1} << 64).word(1), 1u);
  EXPECT_EQ((WorkerBitmap{1} << 64).word(0), 0u);
  EXPECT_EQ((WorkerBitmap{0x8000000000000001ull} << 1).word(1), 1u);
  EXPECT_EQ((WorkerBitmap{0x8000000000000001ull} << 1).word(0), 2u);
  EXPECT_EQ((WorkerBitmap{1} << 255).word(3), uint64_t{1} << 63);
  for (uint32_t r : {0u, 1u, 63u, 64u, 127u, 128u, 191u, 192u, 255u}) {
    const WorkerBitmap b = WorkerBitmap::Bit(r);
    EXPECT_EQ(b, WorkerBitmap{1} << r) << r;
    EXPECT_TRUE(b.Test(r)) << r;
    EXPECT_FALSE(b.Test(r ^ 1)) << r;
    EXPECT_FALSE(b.Empty()) << r;
    WorkerBitmap c = ~WorkerBitmap{};
    c.Clear(r);
    EXPECT_EQ(c, ~b) << r;
    c.Set(r);
    EXPECT_EQ(c, ~WorkerBitmap{}) << r;
  }
  EXPECT_TRUE(WorkerBitmap{}.Empty());
  WorkerBitmapStage stage(1);
  for (uint32_t r : {255u, 64u, 63u}) {
    PacketMetadata md = Md({0, 1}, r, 256);
    stage.Apply(md);
    EXPECT_FALSE(md.seen);
  }
  EXPECT_EQ(stage.bitmap({0, 1}),
            (WorkerBitmap{1} << 255) | (WorkerBitmap{1} << 64) | (WorkerBitmap{1} << 63));
  PacketMetadata again = Md({0, 1}, 64, 256);
  stage.Apply(again);
  EXPECT_TRUE(again.seen);
  PacketMetadata other = Md({0, 0}, 255, 256);  // moving on clears rank 255 in set 1
  stage.Apply(other);
  EXPECT_EQ(stage.bitmap({0, 1}), (WorkerBitmap{1} << 64) | (WorkerBitmap{1} << 63));
}

TEST(WorkerBitmapStageTest, RestoreUndoesBothSets) {
  WorkerBitmapStage stage(1);
  PacketMetadata a = Md({0, 0}, 0, 2);
  stage.Apply(a);
  PacketMetadata b = Md({0, 1}, 1, 2);
  stage.Apply(b);
  PacketMetadata c = Md({0, 1}, 0, 2);  // clears rank 0 in set 0, sets it in set 1
  stage.Apply(c);
  EXPECT_EQ(stage.bitmap({0, 0}), 0u);
  EXPECT_EQ(stage.bitmap({0, 1}), 0b11u);
  stage.Restore(c);
  EXPECT_EQ(stage.bitmap({0, 0}), 0b01u);
  EXPECT_EQ(stage.bitmap({0, 1}), 0b10u);
}

TEST(WorkerBitmapStageTest, RestoreOfASenderInNeitherSet) {
  WorkerBitmapStage stage(1);
  PacketMetadata a = Md({0, 0}, 0, 2);
  stage.Apply(a);
  PacketMetadata b = Md({0, 0}, 1, 2);
  stage.Apply(b);
  EXPECT_FALSE(b.other_had_bit);
  EXPECT_EQ(stage.bitmap({0, 0}), 0b11u);
  stage.Restore(b);
  EXPECT_EQ(stage.bitmap({0, 0}), 0b01u);
  EXPECT_EQ(stage.bitmap({0, 1}), 0u);
}

// ---- WorkerCounterStage ----

// A packet as the counter stage sees it. Real workers send the same (job_number, tsi) for every
// contribution to one round of a slot and a new tsi for each later round; the tests that do not
// vary them model one round of one job.
PacketMetadata CounterMd(SlotId slot, uint32_t n, bool first, bool seen, uint32_t tsi = 0,
                         uint8_t job_number = 0) {
  PacketMetadata md = Md(slot, 0, n);
  md.header.tsi = tsi;
  md.header.job_number = job_number;
  md.first = first;
  md.seen = seen;
  return md;
}

// Runs a whole round of two workers (job_number, tsi) through slot 0 set 0 of `stage`.
void CompleteRound(WorkerCounterStage& stage, uint32_t tsi, uint8_t job_number) {
  PacketMetadata md = CounterMd({0, 0}, 2, true, false, tsi, job_number);
  stage.Apply(md);
  md = CounterMd({0, 0}, 2, false, false, tsi, job_number);
  stage.Apply(md);
  ASSERT_TRUE(md.complete);
}

TEST(WorkerCounterStageTest, CountsDownToComplete) {
  WorkerCounterStage stage(2);
  PacketMetadata md = CounterMd({1, 1}, 3, /*first=*/true, /*seen=*/false);
  stage.Apply(md);
  EXPECT_TRUE(md.contribute);
  EXPECT_FALSE(md.complete);
  EXPECT_EQ(stage.count({1, 1}), 2u);

  md = CounterMd({1, 1}, 3, false, false);
  stage.Apply(md);
  EXPECT_TRUE(md.contribute);
  EXPECT_FALSE(md.complete);
  EXPECT_EQ(stage.count({1, 1}), 1u);

  md = CounterMd({1, 1}, 3, false, false);
  stage.Apply(md);
  EXPECT_TRUE(md.contribute);
  EXPECT_TRUE(md.complete);
  EXPECT_FALSE(md.stale);
  EXPECT_EQ(stage.count({1, 1}), 0u);
  EXPECT_EQ(stage.count({1, 0}), 0u);
  EXPECT_EQ(stage.count({0, 1}), 0u);
}

TEST(WorkerCounterStageTest, SingleWorkerCompletesImmediately) {
  WorkerCounterStage stage(1);
  PacketMetadata md = CounterMd({0, 0}, 1, true, false);
  stage.Apply(md);
  EXPECT_TRUE(md.contribute);
  EXPECT_TRUE(md.complete);
}

TEST(WorkerCounterStageTest, RetransmissionOnlyReportsCompletion) {
  WorkerCounterStage stage(1);
  PacketMetadata md = CounterMd({0, 0}, 2, true, false);
  stage.Apply(md);
  md = CounterMd({0, 0}, 2, false, true);
  stage.Apply(md);
  EXPECT_FALSE(md.contribute);
  EXPECT_FALSE(md.complete);
  EXPECT_EQ(stage.count({0, 0}), 1u);
  md = CounterMd({0, 0}, 2, false, false);
  stage.Apply(md);
  EXPECT_TRUE(md.complete);
  md = CounterMd({0, 0}, 2, false, true);
  stage.Apply(md);
  EXPECT_FALSE(md.contribute);
  EXPECT_TRUE(md.complete);
  EXPECT_EQ(stage.count({0, 0}), 0u);
}

TEST(WorkerCounterStageTest, NewContributionToCompleteSetIsStale) {
  WorkerCounterStage stage(1);
  PacketMetadata md = CounterMd({0, 0}, 1, true, false);
  stage.Apply(md);
  ASSERT_TRUE(md.complete);
  md = CounterMd({0, 0}, 1, /*first=*/false, /*seen=*/false);
  stage.Apply(md);
  EXPECT_TRUE(md.stale);
  EXPECT_FALSE(md.contribute);
  EXPECT_TRUE(md.complete);
  EXPECT_EQ(stage.count({0, 0}), 0u);  // no wrap-around
}

// Given: round tsi 10 completes on set 0; then a first contribution of a later round (tsi 12)
// arrives. Expect: a fresh round: the count restarts at n - 1.
TEST(WorkerCounterStageTest, FreshRoundRestartsCount) {
  WorkerCounterStage stage(1);
  PacketMetadata md = CounterMd({0, 0}, 2, true, false, /*tsi=*/10);
  stage.Apply(md);
  md = CounterMd({0, 0}, 2, false, false, 10);
  stage.Apply(md);
  ASSERT_TRUE(md.complete);
  md = CounterMd({0, 0}, 2, true, false, 12);
  stage.Apply(md);
  EXPECT_TRUE(md.contribute);
  EXPECT_FALSE(md.stale);
  EXPECT_FALSE(md.complete);
  EXPECT_EQ(stage.count({0, 0}), 1u);
}

// ---- WorkerCounterStage: late duplicates, one test per branch of the round check ----

// Given: round (job 3, tsi 10) completes on set 0 and everyone moves on (the set's bitmap is
// empty again); a copy of that round's packet arrives as a would-be first contribution.
// Expect: stale, nothing contributed, the set stays complete; the real next round (tsi 12) still
// starts fresh afterwards.
TEST(WorkerCounterStageTest, FirstContributionOfLastCompletedRoundIsStale) {
  WorkerCounterStage stage(1);
  CompleteRound(stage, 10, 3);
  PacketMetadata md{};

  md = CounterMd({0, 0}, 2, /*first=*/true, /*seen=*/false, 10, 3);
  stage.Apply(md);
  EXPECT_TRUE(md.stale);
  EXPECT_FALSE(md.contribute);
  EXPECT_TRUE(md.complete);
  EXPECT_EQ(stage.count({0, 0}), 0u);

  md = CounterMd({0, 0}, 2, true, false, 12, 3);
  stage.Apply(md);
  EXPECT_FALSE(md.stale);
  EXPECT_TRUE(md.contribute);
  EXPECT_EQ(stage.count({0, 0}), 1u);
}

// Given: round (job 3, tsi 10) completes on set 0; the next job of the session reuses tsi 10
// with job_number 4 as the set's first contribution.
// Expect: a different round: it starts fresh (the round identity is the pair, not tsi alone).
TEST(WorkerCounterStageTest, FirstContributionWithOtherJobNumberStartsFresh) {
  WorkerCounterStage stage(1);
  CompleteRound(stage, 10, 3);
  PacketMetadata md{};
  md = CounterMd({0, 0}, 2, true, false, 10, 4);
  stage.Apply(md);
  EXPECT_FALSE(md.stale);
  EXPECT_TRUE(md.contribute);
  EXPECT_FALSE(md.complete);
  EXPECT_EQ(stage.count({0, 0}), 1u);
}

// Given: round (job 3, tsi 12) is in progress on set 0 (1 of 3 contributions); new contributions
// of another tsi (a late copy of an earlier round) and of the same tsi but another job_number
// arrive. Expect: both stale, the count unchanged; the round's own contributions still count down
// to complete.
TEST(WorkerCounterStageTest, ContributionOfAnotherRoundToSetInProgressIsStale) {
  WorkerCounterStage stage(1);
  PacketMetadata md = CounterMd({0, 0}, 3, true, false, 12, 3);
  stage.Apply(md);
  ASSERT_EQ(stage.count({0, 0}), 2u);

  md = CounterMd({0, 0}, 3, /*first=*/false, /*seen=*/false, /*tsi=*/10, 3);
  stage.Apply(md);
  EXPECT_TRUE(md.stale);
  EXPECT_FALSE(md.contribute);
  EXPECT_FALSE(md.complete);
  EXPECT_EQ(stage.count({0, 0}), 2u);

  md = CounterMd({0, 0}, 3, false, false, 12, /*job_number=*/2);
  stage.Apply(md);
  EXPECT_TRUE(md.stale);
  EXPECT_FALSE(md.contribute);
  EXPECT_EQ(stage.count({0, 0}), 2u);

  for (int i = 0; i < 2; ++i) {
    md = CounterMd({0, 0}, 3, false, false, 12, 3);
    stage.Apply(md);
    EXPECT_FALSE(md.stale);
    EXPECT_TRUE(md.contribute);
  }
  EXPECT_TRUE(md.complete);
}

// Given: round tsi 10 is complete on set 0 and still held by some workers (bitmap not empty); a
// new contribution arrives, once with the round's own identity and once with another.
// Expect: both stale (a sender's bit can be clear in a complete set only because it moved on):
// no wrap-around of the count, the set stays complete.
TEST(WorkerCounterStageTest, NewContributionToCompleteSetIsStaleWhateverItsRound) {
  WorkerCounterStage stage(1);
  PacketMetadata md = CounterMd({0, 0}, 2, true, false, 10);
  stage.Apply(md);
  md = CounterMd({0, 0}, 2, false, false, 10);
  stage.Apply(md);
  ASSERT_TRUE(md.complete);
  for (uint32_t tsi : {10u, 8u, 12u}) {
    md = CounterMd({0, 0}, 2, /*first=*/false, /*seen=*/false, tsi);
    stage.Apply(md);
    EXPECT_TRUE(md.stale) << tsi;
    EXPECT_FALSE(md.contribute) << tsi;
    EXPECT_TRUE(md.complete) << tsi;
    EXPECT_EQ(stage.count({0, 0}), 0u) << tsi;
  }
}

// Given: a retransmission (sender's bit already set) carrying a different round's identity.
// Expect: never stale (retransmissions are judged by the bitmap alone), nothing contributed.
TEST(WorkerCounterStageTest, RetransmissionIsNeverStale) {
  WorkerCounterStage stage(1);
  PacketMetadata md = CounterMd({0, 0}, 2, true, false, 10);
  stage.Apply(md);
  md = CounterMd({0, 0}, 2, /*first=*/false, /*seen=*/true, 99, 9);
  stage.Apply(md);
  EXPECT_FALSE(md.stale);
  EXPECT_FALSE(md.contribute);
  EXPECT_FALSE(md.complete);
  EXPECT_EQ(stage.count({0, 0}), 1u);
}

// Given: set 0 completes round tsi 10 and set 1 of the same slot and set 0 of another slot each
// run their own round. Expect: each (slot, set) keeps its own round identity: tsi 10 is stale
// only where round 10 completed.
TEST(WorkerCounterStageTest, RoundIdentityIsPerSlotAndSet) {
  WorkerCounterStage stage(2);
  for (bool first : {true, false}) {
    PacketMetadata md = CounterMd({0, 0}, 2, first, false, 10);
    stage.Apply(md);
  }
  ASSERT_EQ(stage.count({0, 0}), 0u);
  PacketMetadata md = CounterMd({0, 1}, 2, true, false, 10);
  stage.Apply(md);
  EXPECT_FALSE(md.stale);
  EXPECT_TRUE(md.contribute);
  md = CounterMd({1, 0}, 2, true, false, 10);
  stage.Apply(md);
  EXPECT_FALSE(md.stale);
  EXPECT_TRUE(md.contribute);
  md = CounterMd({0, 0}, 2, true, false, 10);
  stage.Apply(md);
  EXPECT_TRUE(md.stale);
}

// Given a job whose workers send a running tsi, and a set whose rounds had tsi 10 and 20,
// Expect a first contribution with tsi 10 (two rounds late) or 20 dropped as stale, and one with
// tsi 30 (also across the 2^32 wrap) opening a fresh round.
TEST(WorkerCounterStageTest, RunningTsiDropsCopiesHoweverLate) {
  WorkerCounterStage stage(1);
  auto run = [&](bool first, uint32_t tsi) {
    PacketMetadata md = CounterMd({0, 0}, 2, first, false, tsi);
    md.running_tsi = true;
    stage.Apply(md);
    return md;
  };
  ASSERT_TRUE(run(true, 10).contribute);
  ASSERT_TRUE(run(false, 10).complete);
  ASSERT_TRUE(run(true, 20).contribute);
  ASSERT_TRUE(run(false, 20).complete);
  EXPECT_TRUE(run(true, 10).stale);  // two rounds late: the weaker rule would open a round
  EXPECT_TRUE(run(true, 20).stale);
  PacketMetadata fresh = run(true, 30);
  EXPECT_TRUE(fresh.contribute);
  EXPECT_FALSE(fresh.complete);
  ASSERT_TRUE(run(false, 30).complete);
  // Serial order across the wrap of the 32-bit tsi.
  ASSERT_TRUE(run(true, 0xfffffff0u).stale);  // 0xfffffff0 is "before" 30 in serial order
  WorkerCounterStage wrap(1);
  auto run2 = [&](bool first, uint32_t tsi) {
    PacketMetadata md = CounterMd({0, 0}, 1, first, false, tsi);
    md.running_tsi = true;
    wrap.Apply(md);
    return md;
  };
  ASSERT_TRUE(run2(true, 0xfffffff0u).complete);
  EXPECT_TRUE(run2(true, 0x10).contribute);  // after the wrap: newer
  EXPECT_TRUE(run2(true, 0xfffffff0u).stale);
}

// Given the reference's tsi (running_tsi false) restarting every job, Expect a new job's round
// with a smaller tsi accepted: only an exact copy of the last round counts as stale.
TEST(WorkerCounterStageTest, ReferenceTsiMayRestart) {
  WorkerCounterStage stage(1);
  PacketMetadata md = CounterMd({0, 0}, 1, true, false, 40, 1);
  stage.Apply(md);
  ASSERT_TRUE(md.complete);
  md = CounterMd({0, 0}, 1, true, false, 0, 2);
  stage.Apply(md);
  EXPECT_TRUE(md.contribute);
  md = CounterMd({0, 0}, 1, true, false, 0, 2);
  stage.Apply(md);
  EXPECT_TRUE(md.stale);
}

// ---- ExponentMaxStage ----

PacketMetadata ExpMd(SlotId slot, int8_t e0, int8_t e1, bool first, bool contribute = true) {
  PacketMetadata md{};
  md.header.slot = slot;
  md.header.e0 = e0;
  md.header.e1 = e1;
  md.first = first;
  md.contribute = contribute;
  return md;
}

TEST(ExponentMaxStageTest, WritesThenTakesMaxOfEachExponent) {
  ExponentMaxStage stage(2);
  PacketMetadata md = ExpMd({1, 0}, -5, 7, true);
  stage.Apply(md);
  EXPECT_EQ(md.max_e0, -5);
  EXPECT_EQ(md.max_e1, 7);
  md = ExpMd({1, 0}, -3, -100, false);
  stage.Apply(md);
  EXPECT_EQ(md.max_e0, -3);
  EXPECT_EQ(md.max_e1, 7);
  md = ExpMd({1, 0}, -128, 127, false);
  stage.Apply(md);
  EXPECT_EQ(md.max_e0, -3);
  EXPECT_EQ(md.max_e1, 127);
  EXPECT_EQ(stage.e0({1, 1}), 0);
  EXPECT_EQ(stage.e0({0, 0}), 0);
}

TEST(ExponentMaxStageTest, FirstContributionOverwritesOldRound) {
  ExponentMaxStage stage(1);
  PacketMetadata md = ExpMd({0, 1}, 50, 60, true);
  stage.Apply(md);
  md = ExpMd({0, 1}, -20, -30, true);  // all negative: must not keep the old maxima
  stage.Apply(md);
  EXPECT_EQ(md.max_e0, -20);
  EXPECT_EQ(md.max_e1, -30);
}

TEST(ExponentMaxStageTest, NonContributionReadsStoredMaxima) {
  ExponentMaxStage stage(1);
  PacketMetadata md = ExpMd({0, 0}, 4, -4, true);
  stage.Apply(md);
  md = ExpMd({0, 0}, 100, 100, false, /*contribute=*/false);
  stage.Apply(md);
  EXPECT_EQ(md.max_e0, 4);
  EXPECT_EQ(md.max_e1, -4);
}

// ---- AggregateStage ----

class AggregateStageTest : public ::testing::Test {
 protected:
  static constexpr size_t kNumel = 64;
  PacketMetadata Contribution(SlotId slot, const std::vector<int32_t>& values, bool first,
                              bool contribute = true) {
    wires_.emplace_back(values.size() * 4);
    proto::StorePayload(values, wires_.back());
    PacketMetadata md{};
    md.header.slot = slot;
    md.payload = wires_.back();
    md.first = first;
    md.contribute = contribute;
    return md;
  }
  std::vector<std::vector<uint8_t>> wires_;
};

TEST_F(AggregateStageTest, WritesThenAdds) {
  AggregateStage stage(2, kNumel);
  std::vector<int32_t> a(kNumel), b(kNumel);
  for (size_t k = 0; k < kNumel; ++k) {
    a[k] = static_cast<int32_t>(k);
    b[k] = -2 * static_cast<int32_t>(k);
  }
  PacketMetadata md = Contribution({1, 1}, a, true);
  stage.Apply(md);
  ASSERT_EQ(md.result.size(), kNumel);
  EXPECT_EQ(md.result[5], 5);
  md = Contribution({1, 1}, b, false);
  stage.Apply(md);
  for (size_t k = 0; k < kNumel; ++k) EXPECT_EQ(md.result[k], -static_cast<int32_t>(k));
  EXPECT_EQ(stage.values({1, 1})[kNumel - 1], -63);
}

TEST_F(AggregateStageTest, AddsWithWrapAround) {
  AggregateStage stage(1, kNumel);
  std::vector<int32_t> max(kNumel, std::numeric_limits<int32_t>::max());
  std::vector<int32_t> one(kNumel, 1);
  std::vector<int32_t> min(kNumel, std::numeric_limits<int32_t>::min());
  PacketMetadata md = Contribution({0, 0}, max, true);
  stage.Apply(md);
  md = Contribution({0, 0}, one, false);
  stage.Apply(md);
  EXPECT_EQ(md.result[0], std::numeric_limits<int32_t>::min());
  md = Contribution({0, 0}, min, false);
  stage.Apply(md);
  EXPECT_EQ(md.result[0], 0);
}

TEST_F(AggregateStageTest, FirstContributionOverwritesAndNonContributionReads) {
  AggregateStage stage(1, kNumel);
  PacketMetadata md = Contribution({0, 0}, std::vector<int32_t>(kNumel, 9), true);
  stage.Apply(md);
  md = Contribution({0, 0}, std::vector<int32_t>(kNumel, 1), true);
  stage.Apply(md);
  EXPECT_EQ(md.result[0], 1);
  md = Contribution({0, 0}, std::vector<int32_t>(kNumel, 1000), false, /*contribute=*/false);
  stage.Apply(md);
  EXPECT_EQ(md.result[0], 1);
  EXPECT_EQ(md.result[kNumel - 1], 1);
}

TEST_F(AggregateStageTest, SetsAndSlotsAreSeparate) {
  AggregateStage stage(2, 256);
  PacketMetadata md = Contribution({0, 0}, std::vector<int32_t>(256, 1), true);
  stage.Apply(md);
  md = Contribution({0, 1}, std::vector<int32_t>(256, 2), true);
  stage.Apply(md);
  md = Contribution({1, 0}, std::vector<int32_t>(256, 3), true);
  stage.Apply(md);
  EXPECT_EQ(stage.values({0, 0})[255], 1);
  EXPECT_EQ(stage.values({0, 1})[255], 2);
  EXPECT_EQ(stage.values({1, 0})[0], 3);
}

// ---- NextStepStage ----

PacketMetadata StepMd(SlotId slot, uint8_t job, uint32_t tsi, bool contribute, bool seen,
                      bool complete, bool stale = false) {
  PacketMetadata md{};
  md.header.slot = slot;
  md.header.job_number = job;
  md.header.tsi = tsi;
  md.contribute = contribute;
  md.seen = seen;
  md.complete = complete;
  md.stale = stale;
  return md;
}

TEST(NextStepStageTest, Decisions) {
  NextStepStage stage(1);
  PacketMetadata md = StepMd({0, 0}, 1, 10, /*contribute=*/true, false, /*complete=*/false);
  stage.Apply(md);
  EXPECT_EQ(md.next, NextStep::kConsume);

  md = StepMd({0, 0}, 1, 11, false, /*seen=*/true, /*complete=*/false);
  stage.Apply(md);
  EXPECT_EQ(md.next, NextStep::kDropDuplicate);

  md = StepMd({0, 0}, 2, 12, /*contribute=*/true, false, /*complete=*/true);
  stage.Apply(md);
  EXPECT_EQ(md.next, NextStep::kMulticast);
  EXPECT_EQ(md.reply_job_number, 2);
  EXPECT_EQ(md.reply_tsi, 12u);

  // A retransmission into the complete set echoes the completing packet's fields.
  md = StepMd({0, 0}, 9, 99, false, /*seen=*/true, /*complete=*/true);
  stage.Apply(md);
  EXPECT_EQ(md.next, NextStep::kUnicast);
  EXPECT_EQ(md.reply_job_number, 2);
  EXPECT_EQ(md.reply_tsi, 12u);

  md = StepMd({0, 0}, 9, 99, false, false, /*complete=*/true, /*stale=*/true);
  stage.Apply(md);
  EXPECT_EQ(md.next, NextStep::kDropDuplicate);
}

TEST(NextStepStageTest, StoresPerSet) {
  NextStepStage stage(1);
  PacketMetadata md = StepMd({0, 0}, 1, 100, true, false, true);
  stage.Apply(md);
  md = StepMd({0, 1}, 1, 200, true, false, true);
  stage.Apply(md);
  md = StepMd({0, 0}, 0, 0, false, true, true);
  stage.Apply(md);
  EXPECT_EQ(md.reply_tsi, 100u);
  md = StepMd({0, 1}, 0, 0, false, true, true);
  stage.Apply(md);
  EXPECT_EQ(md.reply_tsi, 200u);
}

// ---- The pipeline as a whole ----

// The five stages of one job, run in Switch::Process's order (Restore for a stale packet).
struct Pipeline {
  explicit Pipeline(uint32_t slots, size_t numel)
      : bitmap(slots), counter(slots), exponents(slots), aggregate(slots, numel), next(slots) {}
  void Run(PacketMetadata& md) {
    bitmap.Apply(md);
    counter.Apply(md);
    if (md.stale) bitmap.Restore(md);
    exponents.Apply(md);
    aggregate.Apply(md);
    next.Apply(md);
  }
  WorkerBitmapStage bitmap;
  WorkerCounterStage counter;
  ExponentMaxStage exponents;
  AggregateStage aggregate;
  NextStepStage next;
};

// Switch::Process does not zero a packet's metadata: each stage must write every one of its
// outputs on every path. Given two pipelines fed the same packets (contributions, completions with
// and without a reply buffer, retransmissions into incomplete and complete sets, stale copies),
// one with zeroed metadata and one whose outputs are poisoned with 0x01 bytes before each packet
// (a read before the write would see true, kDropDuplicate, or a wild span), expect the same
// outputs, sums and reply payloads from both.
TEST(PipelineTest, EveryStageWritesAllItsOutputsOnEveryPath) {
  constexpr size_t kNumel = 64;
  constexpr uint32_t kWorkers = 3;
  Pipeline zeroed(2, kNumel), poisoned(2, kNumel);
  struct Step {
    uint32_t rank;
    SlotId slot;
    uint32_t tsi;
    bool reply_buffer;
  };
  const std::vector<Step> steps = {
      {0, {1, 0}, 10, true},  {0, {1, 0}, 10, true},   // first, then a retransmission
      {1, {1, 0}, 10, false}, {2, {1, 0}, 10, true},   // completes (fused)
      {1, {1, 0}, 10, true},  {0, {1, 1}, 11, false},  // unicast; next round on the other set
      {0, {1, 0}, 10, true},                           // stale: its sender moved on
      {1, {1, 1}, 11, true},  {2, {1, 1}, 11, false},  // completes (deparser writes)
      {0, {0, 0}, 12, true},  {0, {1, 0}, 10, true},   // another slot; a late copy again
  };
  int consumed = 0, duplicates = 0, stale = 0, fused = 0, deparsed = 0, unicast = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    SCOPED_TRACE(k);
    const Step& st = steps[k];
    std::vector<int32_t> values(kNumel);
    for (size_t i = 0; i < kNumel; ++i) {
      values[i] = static_cast<int32_t>(i * 1000003u + st.rank * 7919u + k) |
                  (i % 3 == 0 ? std::numeric_limits<int32_t>::min() : 0);
    }
    std::vector<uint8_t> wire(kNumel * 4);
    proto::StorePayload(values, wire);
    std::vector<uint8_t> reply_a(kNumel * 4, 0xcc), reply_b(kNumel * 4, 0xcc);
    PacketMetadata a{};
    PacketMetadata b;
    std::memset(static_cast<void*>(&b), 0x01, sizeof b);
    for (PacketMetadata* md : {&a, &b}) {
      md->header = proto::Header{proto::kMsgTypeData,
                                 proto::SizeCode::k256B,
                                 0,
                                 st.tsi,
                                 st.slot,
                                 static_cast<int8_t>(st.rank),
                                 -1};
      md->payload = wire;
      md->num_workers = kWorkers;
      md->rank = st.rank;
      md->running_tsi = true;
      md->reply_payload = {};
    }
    if (st.reply_buffer) {
      a.reply_payload = reply_a;
      b.reply_payload = reply_b;
    }
    zeroed.Run(a);
    poisoned.Run(b);
    EXPECT_EQ(a.first, b.first);
    EXPECT_EQ(a.seen, b.seen);
    EXPECT_EQ(a.other_had_bit, b.other_had_bit);
    EXPECT_EQ(a.contribute, b.contribute);
    EXPECT_EQ(a.stale, b.stale);
    EXPECT_EQ(a.complete, b.complete);
    EXPECT_EQ(a.max_e0, b.max_e0);
    EXPECT_EQ(a.max_e1, b.max_e1);
    ASSERT_EQ(a.result.size(), kNumel);
    ASSERT_EQ(b.result.size(), kNumel);
    EXPECT_TRUE(std::equal(a.result.begin(), a.result.end(), b.result.begin()));
    EXPECT_EQ(a.reply_payload_written, b.reply_payload_written);
    EXPECT_EQ(a.next, b.next);
    EXPECT_EQ(a.reply_job_number, b.reply_job_number);
    EXPECT_EQ(a.reply_tsi, b.reply_tsi);
    EXPECT_EQ(reply_a, reply_b);
    if (a.reply_payload_written) {
      std::vector<uint8_t> want(kNumel * 4);
      proto::StorePayload(a.result, want);
      EXPECT_EQ(reply_a, want);
    }
    consumed += a.next == NextStep::kConsume;
    duplicates += a.next == NextStep::kDropDuplicate && !a.stale;
    stale += a.stale;
    fused += a.next == NextStep::kMulticast && a.reply_payload_written;
    deparsed += a.next == NextStep::kMulticast && !a.reply_payload_written;
    unicast += a.next == NextStep::kUnicast;
  }
  // The steps reached every decision, with and without the fused reply payload.
  EXPECT_EQ(consumed, 5);
  EXPECT_EQ(duplicates, 1);
  EXPECT_EQ(stale, 2);
  EXPECT_EQ(fused, 1);
  EXPECT_EQ(deparsed, 1);
  EXPECT_EQ(unicast, 1);
}

// ---- EncodeReply ----

TEST(EncodeReplyTest, EncodesResultFields) {
  std::vector<int32_t> sums(64);
  for (int k = 0; k < 64; ++k) sums[k] = k * 1000 - 5;
  PacketMetadata md{};
  md.header = proto::Header{1, proto::SizeCode::k256B, 7, 0xdeadbeef, SlotId{0x1abc, 1}, 3, 4};
  md.reply_job_number = 42;
  md.reply_tsi = 0x01020304;
  md.max_e0 = -7;
  md.max_e1 = 12;
  md.result = sums;
  std::vector<uint8_t> out(proto::DatagramBytes(proto::SizeCode::k256B));
  ASSERT_EQ(EncodeReply(md, out), out.size());
  proto::Packet p;
  ASSERT_EQ(proto::Decode(out, &p), proto::DecodeError::kOk);
  EXPECT_EQ(p.header.msg_type, proto::kMsgTypeData);
  EXPECT_EQ(p.header.size, proto::SizeCode::k256B);
  EXPECT_EQ(p.header.job_number, 42);
  EXPECT_EQ(p.header.tsi, 0x01020304u);
  EXPECT_EQ(p.header.slot, (SlotId{0x1abc, 1}));
  EXPECT_EQ(p.header.e0, -7);
  EXPECT_EQ(p.header.e1, 12);
  for (int k = 0; k < 64; ++k) EXPECT_EQ(p.values[k], k * 1000 - 5);
}

}  // namespace
}  // namespace switchml::dataplane
