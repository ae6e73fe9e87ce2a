// Two levels in the simulator (docs/hierarchy.md): workers on top-of-rack switches under a spine,
// the real ToR and spine Switches and WorkerSessions, every result verified; loss, duplication
// and reordering on every link; throughput near the packet format's ceiling without loss.
#include <gtest/gtest.h>

#include "sim/engine.h"
#include "sim/test_config.h"

namespace switchml::sim {
namespace {

SimConfig TwoLevelConfig(uint32_t racks, uint32_t per_rack, const LinkParams& lp) {
  SimConfig c;
  c.topology = Topology::TwoLevel(racks, per_rack, lp, lp);
  JobConfig j;
  j.switch_node = racks * per_rack + racks;  // the spine
  for (uint32_t i = 0; i < racks * per_rack; ++i) {
    j.hosts.push_back(i);
    j.tors.push_back(racks * per_rack + i / per_rack);
  }
  j.window = 128;
  c.jobs = {j};
  UseTestTiming(&c);
  c.seed = 11;
  return c;
}

TEST(SimHierarchyTest, LosslessTwoLevelsAreVerifiedAndNearTheCeiling) {
  LinkParams lp;
  SimConfig c = TwoLevelConfig(4, 4, lp);
  c.jobs[0].collectives = {{DataType::kInt32, 256 * 3000}};
  auto r = Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const JobResult& j = r->jobs[0];
  ASSERT_TRUE(j.status.ok()) << j.status.ToString();
  EXPECT_TRUE(j.verified) << j.verify_error;
  EXPECT_EQ(j.retransmitted, 0u);
  EXPECT_EQ(r->switch_unknown_source, 0u);
  const double ceiling = GoodputCeilingElementsPerSecond(100, proto::SizeCode::k1024B);
  EXPECT_GT(j.elements_per_second, 0.9 * ceiling);
  EXPECT_LE(j.elements_per_second, ceiling * 1.0001);
}

TEST(SimHierarchyTest, FaultsOnEveryLinkAreRecovered) {
  LinkParams lp;
  lp.loss = 0.01;
  lp.duplicate = 0.01;
  lp.reorder = 0.02;
  lp.reorder_ns = 5000;
  // Racks of unequal size: ranks 0-2 on ToR 0, 3-4 on ToR 1, 5-8 on ToR 2.
  SimConfig c = TwoLevelConfig(3, 4, lp);
  JobConfig& j = c.jobs[0];
  j.hosts = {0, 1, 2, 4, 5, 8, 9, 10, 11};
  j.tors = {12, 12, 12, 13, 13, 14, 14, 14, 14};
  j.threads = 2;
  j.collectives = {{DataType::kFloat32, 256 * 300 + 17},
                   {DataType::kInt32, 256 * 200 + 3},
                   {DataType::kFloat32, 100}};
  auto r = Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const JobResult& res = r->jobs[0];
  ASSERT_TRUE(res.status.ok()) << res.status.ToString();
  EXPECT_TRUE(res.verified) << res.verify_error;
  EXPECT_GT(res.retransmitted, 0u);
  EXPECT_GT(res.switch_unicasts, 0u);  // the spine answered ToRs' re-sent partial sums
  uint64_t lost = 0, duplicated = 0;
  for (const LinkResult& l : r->links) {
    lost += l.lost;
    duplicated += l.duplicated;
  }
  EXPECT_GT(lost, 0u);
  EXPECT_GT(duplicated, 0u);
}

TEST(SimHierarchyTest, RefusesBadTors) {
  LinkParams lp;
  SimConfig c = TwoLevelConfig(2, 2, lp);
  c.jobs[0].collectives = {{DataType::kInt32, 256}};
  c.jobs[0].tors.pop_back();
  EXPECT_FALSE(Simulate(c).ok());
  c = TwoLevelConfig(2, 2, lp);
  c.jobs[0].collectives = {{DataType::kInt32, 256}};
  c.jobs[0].tors[0] = c.jobs[0].switch_node;  // the spine is no ToR
  EXPECT_FALSE(Simulate(c).ok());
}

}  // namespace
}  // namespace switchml::sim
