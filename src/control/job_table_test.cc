// JobTable, the registry's pure job table: ownership by secret, liveness and expiry, the idlest
// job, address conflicts, closing ranks, a later rank's match with rank 0's job, the summaries.
#include "control/job_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/registry.h"

namespace switchml::control {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kLocal = 0x7f000001;  // 127.0.0.1

class JobTableTest : public ::testing::Test {
 protected:
  JobTableTest() : table_(Options()) {}

  static RegistryOptions Options() {
    RegistryOptions o;
    o.lease = 10s;
    o.attach_grace = 2s;
    o.idle_reclaim = 60s;
    return o;
  }

  // A job of `n` workers created at t0 + `at`.
  Job& Add(uint64_t id, uint32_t n, const std::string& secret = "", std::chrono::seconds at = 0s) {
    dataplane::JobSpec spec;
    spec.job_id = id;
    spec.num_workers = n;
    spec.num_ports = 2;
    return table_.Add(spec, secret, t0_ + at);
  }

  static void Register(Job& job, uint32_t rank, uint32_t ipv4, uint32_t port, Job::TimePoint at) {
    job.ranks[rank].registered = true;
    job.ranks[rank].ipv4 = ipv4;
    job.ranks[rank].port = port;
    job.ranks[rank].registered_at = at;
  }

  const Job::TimePoint t0_{std::chrono::hours(1)};
  JobTable table_;
};

TEST_F(JobTableTest, AnotherSecretsJobIsNoJobToItsCaller) {
  Add(7, 2, "a");
  EXPECT_NE(table_.FindFor(7, "a"), nullptr);
  EXPECT_EQ(table_.FindFor(7, "b"), nullptr);
  EXPECT_NE(table_.Find(7), nullptr);
  EXPECT_TRUE(table_.Owns(7, "a"));
  EXPECT_FALSE(table_.Owns(7, "b"));
  EXPECT_TRUE(table_.Owns(8, "b"));  // no job: anyone's
  EXPECT_EQ(CheckSecret(*table_.Find(7), "b", 7).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(CheckSecret(*table_.Find(7), "a", 7).ok());
}

TEST_F(JobTableTest, AJobExpiresOnceNoRankIsAliveAndTheLeaseHasPassed) {
  // Given a job with a secret whose rank 0 registered and never attached.
  Job& job = Add(7, 2, "s");
  Register(job, 0, kLocal, 5000, t0_);
  // Expect it alive within the attach grace, then without a live rank but within its lease.
  EXPECT_TRUE(table_.RankAlive(job, 0, t0_ + 1s));
  EXPECT_FALSE(table_.RankAlive(job, 1, t0_ + 1s));
  EXPECT_TRUE(table_.Expired(t0_ + 1s).empty());
  EXPECT_FALSE(table_.RankAlive(job, 0, t0_ + 3s));
  EXPECT_TRUE(table_.Expired(t0_ + 9s).empty());
  EXPECT_EQ(table_.Expired(t0_ + 10s), std::vector<uint64_t>{7});
  // An attached stream keeps it alive however long it is idle; packets count as activity.
  job.ranks[0].stream = 42;
  EXPECT_TRUE(table_.Expired(t0_ + 100s).empty());
  job.ranks[0].stream = 0;
  table_.NotePackets(7, 5, t0_ + 95s);
  EXPECT_TRUE(table_.Expired(t0_ + 100s).empty());
  table_.NotePackets(7, 5, t0_ + 105s);  // no new packets: no activity
  EXPECT_EQ(table_.Expired(t0_ + 105s), std::vector<uint64_t>{7});
}

TEST_F(JobTableTest, TheIdlestJobIsOneIdleForTheReclaimTime) {
  Add(1, 1, "", 0s);
  Add(2, 1, "", 5s);
  EXPECT_EQ(table_.Idlest(t0_ + 59s), nullptr);
  ASSERT_NE(table_.Idlest(t0_ + 70s), nullptr);
  EXPECT_EQ(table_.Idlest(t0_ + 70s)->spec.job_id, 1u);
  table_.Find(1)->Touch(t0_ + 30s);
  EXPECT_EQ(table_.Idlest(t0_ + 70s)->spec.job_id, 2u);
}

TEST_F(JobTableTest, AnAddressHeldByALiveJobIsRefusedAndByAnExpiredOneListed) {
  // Given job 1's rank 0 on ports 5000-5001 (its job has 2 ports per worker), attached.
  Job& job = Add(1, 1);
  Register(job, 0, kLocal, 5000, t0_);
  job.ranks[0].stream = 9;
  std::vector<uint64_t> in_the_way;
  // Expect an overlapping range refused, naming the job; a range beside it free.
  const Status st = table_.CheckAddress(2, kLocal, 5001, 4, t0_, &in_the_way);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find("session 1"), std::string::npos) << st.message();
  EXPECT_TRUE(table_.CheckAddress(2, kLocal, 5002, 4, t0_, &in_the_way).ok());
  EXPECT_TRUE(table_.CheckAddress(2, kLocal, 0, 1, t0_, &in_the_way).ok());     // any port
  EXPECT_TRUE(table_.CheckAddress(1, kLocal, 5000, 2, t0_, &in_the_way).ok());  // its own
  EXPECT_TRUE(in_the_way.empty());
  // Once it has expired, it is in the way instead.
  job.ranks[0].stream = 0;
  EXPECT_TRUE(table_.CheckAddress(2, kLocal, 5001, 4, t0_ + 11s, &in_the_way).ok());
  EXPECT_EQ(in_the_way, std::vector<uint64_t>{1});
}

TEST_F(JobTableTest, ClosingRanksSaysWhenEveryRegisteredRankHasClosed) {
  Job& job = Add(7, 3);
  Register(job, 0, kLocal, 5000, t0_);
  Register(job, 1, kLocal, 5002, t0_);
  EXPECT_EQ(table_.CloseRank(job, 3, t0_).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(table_.CloseRank(job, 2, t0_).status().code(), StatusCode::kFailedPrecondition);
  Result<bool> first = table_.CloseRank(job, 0, t0_);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(*first);
  Result<bool> second = table_.CloseRank(job, 1, t0_);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(*second);  // rank 2 never registered
}

TEST_F(JobTableTest, ALaterRankMustMatchTheJobRankZeroCreated) {
  Job& job = Add(7, 2);
  job.sparse = true;
  RegisterRequest r;
  r.job_id = 7;
  r.sparse = true;
  dataplane::JobSpec spec = job.spec;
  EXPECT_TRUE(CheckSameJob(job, spec, r).ok());
  spec.num_workers = 3;
  const Status st = CheckSameJob(job, spec, r);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--workers"), std::string::npos) << st.message();
  spec = job.spec;
  r.sparse = false;
  EXPECT_NE(CheckSameJob(job, spec, r).message().find("--sparse"), std::string::npos);
}

TEST_F(JobTableTest, SummariesShowOnlyTheJobsASecretMaySee) {
  Add(2, 2, "a");
  Add(1, 1, "");
  Add(3, 1, "b");
  uint32_t hidden = 0;
  const std::string secret = "a";
  std::vector<JobSummary> seen = table_.Summaries(&secret, &hidden, t0_ + 4s);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].job_id, 1u);
  EXPECT_EQ(seen[1].job_id, 2u);
  EXPECT_TRUE(seen[1].has_secret);
  EXPECT_EQ(seen[1].age, 4s);
  EXPECT_EQ(hidden, 1u);
  EXPECT_EQ(table_.Summaries(nullptr, nullptr, t0_).size(), 3u);
}

}  // namespace
}  // namespace switchml::control
