// Seeded simulation on the simulator's engine (src/sim): N worker sessions and the switch core on
// simulated links that drop, duplicate and reorder datagrams (some by many rounds), in virtual
// time. Many seeds; every result of every worker checked (int32 exact, float32 within the
// quantization bound); the failing seed is printed.
#include <gtest/gtest.h>

#include <string>

#include "sim/engine.h"

namespace switchml {
namespace {

struct SimParams {
  uint32_t workers;
  uint32_t window;
  proto::SizeCode size;
  double loss, duplicate, reorder;
  double late = 0;       // copies delayed by up to 2 ms: many rounds (and RTOs) late
  uint32_t threads = 1;  // sessions (worker threads, UDP ports, slot ranges) per worker
};

// Runs five all-reduces (int32 and float32 of sizes around and below the window, and an empty
// one) back to back on the same sessions, so set alternation across jobs is exercised too.
void RunSimulation(const SimParams& sp, uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with this seed to reproduce)");
  sim::LinkParams lp;
  lp.gbps = 10;
  lp.propagation_ns = 20000;
  lp.loss = sp.loss;
  lp.duplicate = sp.duplicate;
  // Reordering: a copy delayed by up to 100 us (a few packets to a few rounds); the late fault:
  // a copy delayed by up to 2 ms, many rounds and several RTOs.
  lp.reorder = sp.reorder + sp.late;
  lp.reorder_ns = sp.late > 0 ? 2e6 : 1e5;
  sim::SimConfig c;
  c.topology = sim::Topology::Star(sp.workers, lp);
  sim::JobConfig job;
  job.job_id = 42;
  job.switch_node = sp.workers;
  for (uint32_t r = 0; r < sp.workers; ++r) job.hosts.push_back(r);
  job.size = sp.size;
  job.threads = sp.threads;
  job.window = sp.window * sp.threads;
  const uint64_t numel = proto::NumelOf(sp.size);
  job.collectives = {{DataType::kInt32, numel * sp.window * sp.threads * 12 + 17},
                     {DataType::kFloat32, numel * sp.window * sp.threads * 9 + numel / 2},
                     {DataType::kFloat32, numel / 2 + 1},
                     {DataType::kInt32, numel * 2 + 1},
                     {DataType::kInt32, 0}};
  c.jobs = {job};
  c.switch_config.slots_per_job = 64;
  // An RTO floor below the reordering delays: timeouts fire while results are still in flight
  // (Karn's rule and the back-off get exercised).
  c.session.retransmit.timeout = std::chrono::microseconds(200);
  c.session.retransmit.min_timeout = std::chrono::microseconds(60);
  c.session.retransmit.clock_granularity = std::chrono::microseconds(10);
  c.session.retransmit.peer_timeout = std::chrono::seconds(5);
  c.payload = sim::PayloadMode::kVerified;
  c.seed = seed;
  c.max_sim_seconds = 60;
  auto r = sim::Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const sim::JobResult& j = r->jobs[0];
  ASSERT_TRUE(j.status.ok()) << j.status.ToString();
  ASSERT_TRUE(j.verified) << j.verify_error;
  // The faults did happen, and were recovered from.
  uint64_t lost = 0, duplicated = 0, reordered = 0;
  for (const sim::LinkResult& l : r->links) {
    lost += l.lost;
    duplicated += l.duplicated;
    reordered += l.reordered;
  }
  if (sp.loss > 0) {
    EXPECT_GT(lost, 0u);
    EXPECT_GT(j.retransmitted, 0u);
  }
  if (sp.duplicate > 0) {
    EXPECT_GT(duplicated, 0u);
  }
  if (sp.reorder + sp.late > 0) {
    EXPECT_GT(reordered, 0u);
  }
  // Every reply reached the thread that owns its slot (multicast port offsets are right).
  EXPECT_EQ(j.foreign_slot, 0u);
  // Invariants: nothing was ever misaddressed, oversized or out of the pool.
  EXPECT_EQ(j.switch_wrong_size, 0u);
  EXPECT_EQ(j.switch_slot_out_of_range, 0u);
  EXPECT_EQ(r->switch_unknown_source, 0u);
}

class SimulationTest : public ::testing::TestWithParam<SimParams> {};

TEST_P(SimulationTest, LossyDuplicatingReorderingLinksManySeeds) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    RunSimulation(GetParam(), seed);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, SimulationTest,
    ::testing::Values(SimParams{2, 4, proto::SizeCode::k256B, 0.05, 0.05, 0.3},
                      SimParams{3, 8, proto::SizeCode::k256B, 0.10, 0.10, 0.5},
                      SimParams{8, 4, proto::SizeCode::k1024B, 0.02, 0.02, 0.2},
                      SimParams{5, 1, proto::SizeCode::k256B, 0.05, 0.0, 0.0},
                      SimParams{4, 16, proto::SizeCode::k256B, 0.0, 0.0, 0.0},
                      // Copies that arrive many rounds late (delayed originals and duplicates).
                      SimParams{2, 4, proto::SizeCode::k256B, 0.02, 0.05, 0.2, 0.03},
                      SimParams{3, 8, proto::SizeCode::k256B, 0.0, 0.10, 0.0, 0.05},
                      SimParams{8, 2, proto::SizeCode::k1024B, 0.01, 0.02, 0.1, 0.02},
                      // Several threads (ports, slot ranges) per worker: replies routed by port
                      // offset from each worker's base port.
                      SimParams{3, 4, proto::SizeCode::k256B, 0.05, 0.05, 0.3, 0.02, 3},
                      SimParams{2, 2, proto::SizeCode::k1024B, 0.0, 0.0, 0.0, 0.0, 4}));

// The same matrix's fault mix with early retransmission on (docs/simulator.md): still exact.
TEST(SimulationEarlyRetransmitTest, LossyDuplicatingReorderingLinks) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    // (RunSimulation's sessions take early_retransmit_after from the config below.)
    SCOPED_TRACE("seed " + std::to_string(seed));
    sim::LinkParams lp;
    lp.gbps = 10;
    lp.propagation_ns = 20000;
    lp.loss = 0.05;
    lp.duplicate = 0.05;
    lp.reorder = 0.2;
    lp.reorder_ns = 2e5;
    sim::SimConfig c;
    c.topology = sim::Topology::Star(4, lp);
    sim::JobConfig job;
    job.switch_node = 4;
    job.hosts = {0, 1, 2, 3};
    job.size = proto::SizeCode::k256B;
    job.window = 8;
    job.collectives = {{DataType::kInt32, 64 * 8 * 10 + 5}, {DataType::kFloat32, 64 * 8 * 7 + 3}};
    c.jobs = {job};
    c.switch_config.slots_per_job = 64;
    c.session.retransmit.timeout = std::chrono::microseconds(200);
    c.session.retransmit.min_timeout = std::chrono::microseconds(60);
    c.session.retransmit.clock_granularity = std::chrono::microseconds(10);
    c.session.retransmit.early_retransmit_after = 1;
    c.payload = sim::PayloadMode::kVerified;
    c.seed = seed;
    auto r = sim::Simulate(c);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->jobs[0].status.ok()) << r->jobs[0].status.ToString();
    ASSERT_TRUE(r->jobs[0].verified) << r->jobs[0].verify_error;
    EXPECT_GT(r->jobs[0].early_retransmits, 0u);
  }
}

}  // namespace
}  // namespace switchml
