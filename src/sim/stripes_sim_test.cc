// Striping in the simulator (issue 26, docs/simulator.md "Server aggregators"): one job's slots
// spread over K aggregators, each a plain dataplane::Switch on its own link behind a forwarding
// fabric, the workers' real StripedSessions naming each datagram's aggregator by its slot
// (worker::StripeOfSlot). Results exact (int32) or within the bound (float32) with loss; each
// aggregator sees only its own slots; one aggregator is one link's worth for the whole job.
#include <gtest/gtest.h>

#include "sim/engine.h"
#include "sim/test_config.h"
#include "worker/striping.h"

namespace switchml::sim {
namespace {

// n workers (nodes 0..n-1), the fabric (node n), K aggregators (nodes n+1..n+K).
SimConfig AggregatorConfig(uint32_t workers, uint32_t aggregators, const LinkParams& lp) {
  SimConfig c;
  c.topology = Topology::ServerAggregators(workers, aggregators, lp, lp);
  JobConfig j;
  for (uint32_t i = 0; i < workers; ++i) j.hosts.push_back(i);
  for (uint32_t a = 0; a < aggregators; ++a) j.stripes.push_back(workers + 1 + a);
  j.window = 64;
  c.jobs = {j};
  UseTestTiming(&c);
  c.seed = 5;
  return c;
}

TEST(SimStripesTest, LossyStripesAreExactAndEachAggregatorSeesOnlyItsSlots) {
  // Given 6 workers with 2 threads each (windows of 32 slots) striped over 3 aggregators
  // (uneven shares: 10, 11 and 11 slots of each window), 1 % loss on every link, float32 and
  // int32 all-reduces back to back, each worker's inputs its own,
  // Expect every result verified (int32 exact, float32 within the bound), and each aggregator
  // to have received datagrams for exactly the slots StripeOfSlot gives it, its rounds
  // completed with one fresh contribution per worker each, and all rounds answered once.
  constexpr uint32_t kWorkers = 6, kAggregators = 3, kThreads = 2;
  LinkParams lp;
  lp.loss = 0.01;
  SimConfig c = AggregatorConfig(kWorkers, kAggregators, lp);
  JobConfig& j = c.jobs[0];
  j.threads = kThreads;
  j.collectives = {{DataType::kFloat32, 256 * 200 + 17},
                   {DataType::kInt32, 256 * 150 + 3},
                   {DataType::kFloat32, 100}};
  auto r = Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const JobResult& res = r->jobs[0];
  ASSERT_TRUE(res.status.ok()) << res.status.ToString();
  EXPECT_TRUE(res.verified) << res.verify_error;
  EXPECT_GT(res.retransmitted, 0u);
  EXPECT_EQ(r->switch_unknown_source, 0u);
  ASSERT_EQ(res.stripes.size(), kAggregators);
  const uint32_t W = j.window / kThreads;
  uint64_t completed = 0;
  for (uint32_t s = 0; s < kAggregators; ++s) {
    const StripeResult& st = res.stripes[s];
    EXPECT_EQ(st.node, kWorkers + 1 + s);
    std::vector<uint32_t> want;
    for (uint32_t slot = 0; slot < j.window; ++slot) {
      if (worker::StripeOfSlot(slot % W, W, kAggregators) == s) want.push_back(slot);
    }
    EXPECT_EQ(st.slots, want) << "aggregator " << s;
    EXPECT_GT(st.completed, 0u);
    EXPECT_EQ(st.aggregated, st.completed * kWorkers) << "aggregator " << s;
    EXPECT_GE(st.received, st.aggregated);
    completed += st.completed;
  }
  // Each round completed at one aggregator gives each worker one accepted result.
  EXPECT_EQ(completed * kWorkers, res.results);
  uint64_t lost = 0;
  for (const LinkResult& l : r->links) lost += l.lost;
  EXPECT_GT(lost, 0u);
}

TEST(SimStripesTest, SharedPayloadOverStripesIsChecked) {
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    LinkParams lp;
    lp.loss = 0.002;
    SimConfig c = AggregatorConfig(16, 4, lp);
    c.payload = PayloadMode::kShared;
    c.jobs[0].collectives.assign(2, Collective{dt, 256 * 300 + 9});
    auto r = Simulate(c);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->ok()) << r->jobs[0].status.ToString() << " " << r->jobs[0].verify_error;
  }
}

TEST(SimStripesTest, OneAggregatorCarriesEveryTensorOnItsLinkAndKOfThemShareIt) {
  // Given 8 workers and lossless links of one rate, Expect one aggregator behind one link to
  // reach about 1/8 of the packet format's ceiling (its link carries all 8 tensors), and 8
  // aggregators (each a share of every tensor) near the ceiling.
  const double ceiling = GoodputCeilingElementsPerSecond(100, proto::SizeCode::k1024B);
  LinkParams lp;
  SimConfig one = AggregatorConfig(8, 1, lp);
  one.jobs[0].collectives = {{DataType::kInt32, 256 * 2000}};
  auto r1 = Simulate(one);
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  ASSERT_TRUE(r1->ok()) << r1->jobs[0].status.ToString() << r1->jobs[0].verify_error;
  EXPECT_EQ(r1->jobs[0].retransmitted, 0u);
  EXPECT_LT(r1->jobs[0].elements_per_second, ceiling / 8 * 1.0001);
  EXPECT_GT(r1->jobs[0].elements_per_second, ceiling / 8 * 0.85);

  SimConfig eight = AggregatorConfig(8, 8, lp);
  eight.jobs[0].collectives = {{DataType::kInt32, 256 * 2000}};
  auto r8 = Simulate(eight);
  ASSERT_TRUE(r8.ok()) << r8.status().ToString();
  ASSERT_TRUE(r8->ok()) << r8->jobs[0].status.ToString() << r8->jobs[0].verify_error;
  EXPECT_EQ(r8->jobs[0].retransmitted, 0u);
  EXPECT_GT(r8->jobs[0].elements_per_second, 0.85 * ceiling);
  EXPECT_LE(r8->jobs[0].elements_per_second, ceiling * 1.0001);
}

TEST(SimStripesTest, BadStripesAreRefusedSayingWhy) {
  auto refused = [](SimConfig c, const std::string& what) {
    c.jobs[0].collectives = {{DataType::kInt32, 256}};
    auto r = Simulate(std::move(c));
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
  };
  LinkParams lp;
  SimConfig c = AggregatorConfig(4, 3, lp);
  c.jobs[0].window = 4;
  c.jobs[0].threads = 2;  // windows of 2 slots: too few for 3 stripes
  refused(c, "3 stripes exceed the 2 slots");
  c = AggregatorConfig(4, 3, lp);
  c.jobs[0].stripes[2] = c.jobs[0].stripes[0];
  refused(c, "stripes must be distinct");
  c = AggregatorConfig(4, 3, lp);
  c.jobs[0].stripes[1] = 0;  // a worker's host
  refused(c, "stripe 1 (node 0) is not a switch");
  c = AggregatorConfig(4, 3, lp);
  c.jobs[0].tors = {4, 4, 4, 4};
  refused(c, "stripes and tors do not combine");
}

}  // namespace
}  // namespace switchml::sim
