// AllReduceChecks without a registry: agreement, disagreement, a rank too far ahead, and what a
// stuck all-reduce's description names.
#include "control/allreduce_checks.h"

#include <gtest/gtest.h>

#include "switchml/types.h"

namespace switchml::control {
namespace {

constexpr uint32_t kFloat32 = static_cast<uint32_t>(DataType::kFloat32);

TEST(AllReduceChecksTest, AgreedOnceEveryRankAnnouncedAlike) {
  AllReduceChecks checks("session 7", 3, 16);
  EXPECT_EQ(checks.Announce(1, 100, kFloat32, 0, "rank 0").kind,
            AllReduceChecks::Verdict::Kind::kPending);
  EXPECT_EQ(checks.Announce(1, 100, kFloat32, 2, "rank 2").kind,
            AllReduceChecks::Verdict::Kind::kPending);
  const AllReduceChecks::Verdict v = checks.Announce(1, 100, kFloat32, 1, "rank 1");
  EXPECT_EQ(v.kind, AllReduceChecks::Verdict::Kind::kAgreed);
  EXPECT_EQ(v.count, 100u);
  EXPECT_EQ(v.dtype, kFloat32);
  EXPECT_EQ(checks.newest_agreed_allreduce(), 1u);
}

TEST(AllReduceChecksTest, DisagreementFailsNamingBothRanks) {
  AllReduceChecks checks("session 7", 2, 16);
  checks.Announce(4, 100, kFloat32, 1, "rank 1");
  const AllReduceChecks::Verdict v = checks.Announce(4, 99, kFloat32, 0, "rank 0");
  EXPECT_EQ(v.kind, AllReduceChecks::Verdict::Kind::kFailed);
  EXPECT_NE(v.failure.find("rank 1 passed 100 float32 elements, rank 0 99 float32"),
            std::string::npos)
      << v.failure;
  EXPECT_EQ(checks.newest_agreed_allreduce(), 0u);
}

TEST(AllReduceChecksTest, ARankTooFarAheadFails) {
  AllReduceChecks checks("session 7", 2, 2);
  checks.Announce(1, 1, kFloat32, 0, "rank 0");
  checks.Announce(2, 1, kFloat32, 0, "rank 0");
  const AllReduceChecks::Verdict v = checks.Announce(3, 1, kFloat32, 0, "rank 0");
  EXPECT_EQ(v.kind, AllReduceChecks::Verdict::Kind::kFailed);
  EXPECT_EQ(v.failure, "session 7 failed: rank 0 is 2 all-reduces ahead of another rank");
}

TEST(AllReduceChecksTest, DescribeNamesWhoHasNotStarted) {
  AllReduceChecks checks("session 7", 4, 16);
  checks.Announce(5, 8, kFloat32, 0, "rank 0");
  const auto closed = [](uint32_t r) { return r == 3; };
  EXPECT_EQ(checks.Describe(5, closed),
            "all-reduce 5 of session 7: ranks 1 and 2 have not started it; rank 3 closed the "
            "session without starting it (rank 0 has)");
  EXPECT_NE(checks.Describe(6, closed).find("no rank announced all-reduce 6"), std::string::npos);
  for (uint32_t r = 1; r < 4; ++r) checks.Announce(5, 8, kFloat32, r, "rank " + std::to_string(r));
  EXPECT_NE(checks.Describe(5, closed).find("every rank started all-reduce 5"), std::string::npos);
}

}  // namespace
}  // namespace switchml::control
