// The simulator at small scale: results verified, throughput near the link's ceiling, loss
// recovered, the same seed giving the same output bit for bit, forwarding through a switch of a
// two-level link graph, and the baselines' closed forms.
#include "sim/engine.h"

#include <gtest/gtest.h>

#include <cstring>

#include "sim/baselines.h"
#include "sim/test_config.h"

namespace switchml::sim {
namespace {

SimConfig StarConfig(uint32_t workers, uint64_t count, DataType dtype, double loss) {
  LinkParams lp;
  lp.gbps = 100;
  lp.propagation_ns = 500;
  lp.loss = loss;
  SimConfig c;
  c.topology = Topology::Star(workers, lp);
  JobConfig j;
  j.switch_node = workers;
  for (uint32_t i = 0; i < workers; ++i) j.hosts.push_back(i);
  j.window = 128;
  j.collectives = {{dtype, count}};
  c.jobs = {j};
  UseTestTiming(&c);
  c.seed = 7;
  return c;
}

TEST(SimEngineTest, LosslessStarIsVerifiedAndNearTheCeiling) {
  SimConfig c = StarConfig(8, 256 * 4000, DataType::kInt32, 0);
  auto r = Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->jobs.size(), 1u);
  const JobResult& j = r->jobs[0];
  ASSERT_TRUE(j.status.ok()) << j.status.ToString();
  EXPECT_TRUE(j.verified) << j.verify_error;
  EXPECT_EQ(j.retransmitted, 0u);
  const double ceiling = GoodputCeilingElementsPerSecond(100, proto::SizeCode::k1024B);
  EXPECT_GT(j.elements_per_second, 0.9 * ceiling);
  EXPECT_LE(j.elements_per_second, ceiling * 1.0001);
  EXPECT_EQ(j.stalls.rounds, 4000u);
}

TEST(SimEngineTest, FloatAndSeveralAllReducesAndThreads) {
  SimConfig c = StarConfig(5, 0, DataType::kFloat32, 0.01);
  c.jobs[0].threads = 2;
  c.jobs[0].collectives = {{DataType::kFloat32, 256 * 300 + 17},
                           {DataType::kInt32, 256 * 100 + 3},
                           {DataType::kFloat32, 100},
                           {DataType::kInt32, 0}};
  auto r = Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const JobResult& j = r->jobs[0];
  ASSERT_TRUE(j.status.ok()) << j.status.ToString();
  EXPECT_TRUE(j.verified) << j.verify_error;
  EXPECT_GT(j.retransmitted, 0u);
  EXPECT_EQ(j.collective_seconds.size(), 4u);
}

// Block-sparse all-reduces through the simulator (sessions, switch, links): verified results
// with loss and threads, in verified and shared payloads; the union the sessions counted is about
// the inputs' density, and the job sends a small fraction of a dense one's packets.
TEST(SimEngineTest, SparseAllReducesAreVerifiedAndSendOnlyTheUnion) {
  for (PayloadMode payload : {PayloadMode::kVerified, PayloadMode::kShared}) {
    for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
      SimConfig c = StarConfig(6, 0, dt, 0.005);
      c.payload = payload;
      c.jobs[0].threads = 2;
      c.jobs[0].sparse = true;
      c.jobs[0].density = 0.05;
      c.jobs[0].overlap = 0.3;
      c.jobs[0].collectives = {{dt, 256 * 1500 + 11}, {dt, 256 * 40}, {dt, 0}};
      auto r = Simulate(c);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      const JobResult& j = r->jobs[0];
      ASSERT_TRUE(j.status.ok()) << j.status.ToString();
      EXPECT_TRUE(j.verified) << j.verify_error;
      EXPECT_EQ(j.sparse_blocks, 6u * (1501 + 40));
      const double fraction =
          static_cast<double>(j.sparse_union_blocks) / static_cast<double>(j.sparse_blocks);
      EXPECT_GT(fraction, 0.03);
      EXPECT_LT(fraction, 0.07);
      // Dense: at least 1541 packets per worker; here the union (about 5 %), its float32
      // window, and one announcement packet per thread.
      EXPECT_LT(j.sent, 6u * 1541 / 4) << DataTypeName(dt);
    }
  }
}

TEST(SimEngineTest, SharedPayloadIsChecked) {
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    SimConfig c = StarConfig(16, 256 * 500 + 9, dt, 0.001);
    c.payload = PayloadMode::kShared;
    auto r = Simulate(c);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->ok()) << r->jobs[0].status.ToString() << " " << r->jobs[0].verify_error;
  }
}

// With a shared payload the workers read one input buffer; a rank may start the next all-reduce
// before rank 0 does (here rank 0 loses results on its downlink and waits for re-sent ones, so
// the others finish first). Each all-reduce's inputs must be in the buffer when the first rank
// starts it, whichever rank that is.
TEST(SimEngineTest, SharedPayloadWithRankZeroBehindIsChecked) {
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    SimConfig c = StarConfig(4, 256 * 200 + 5, dt, 0);
    c.topology.mutable_links()[1].params.loss = 0.05;  // switch -> host 0
    c.payload = PayloadMode::kShared;
    c.jobs[0].collectives.assign(3, Collective{dt, 256 * 200 + 5});
    auto r = Simulate(c);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(r->jobs[0].retransmitted, 0u);
    EXPECT_TRUE(r->ok()) << r->jobs[0].status.ToString() << " " << r->jobs[0].verify_error;
  }
}

std::string Fingerprint(const SimResult& r) {
  std::string s = std::to_string(r.events) + "/" + std::to_string(r.packets_delivered);
  for (const JobResult& j : r.jobs) {
    uint64_t bits;
    std::memcpy(&bits, &j.seconds, 8);
    s += "/" + std::to_string(bits) + "," + std::to_string(j.retransmitted) + "," +
         std::to_string(j.timeouts) + "," + std::to_string(j.stalls.stalled);
  }
  for (const LinkResult& l : r.links)
    s += "/" + std::to_string(l.bytes) + "," + std::to_string(l.lost);
  return s;
}

TEST(SimEngineTest, SameSeedSameOutputBitForBit) {
  SimConfig c = StarConfig(6, 256 * 2000, DataType::kFloat32, 0.005);
  c.topology.mutable_links()[0].params.duplicate = 0.01;
  c.topology.mutable_links()[1].params.reorder = 0.05;
  c.topology.mutable_links()[1].params.reorder_ns = 20000;
  auto a = Simulate(c);
  auto b = Simulate(c);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(Fingerprint(*a), Fingerprint(*b));
  c.seed = 8;
  auto d = Simulate(c);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->ok());
  EXPECT_NE(Fingerprint(*a), Fingerprint(*d));  // the seed does drive the faults
}

TEST(SimEngineTest, TwoLevelLinkGraphForwardsThroughASwitch) {
  // Hosts 0-3 on switch A, hosts 4-7 on switch B, A and B joined: the job runs on B, so the
  // packets of hosts 0-3 cross A (forwarded) and the A-B link in both directions.
  Topology t;
  for (int i = 0; i < 8; ++i) t.AddHost("h" + std::to_string(i));
  const uint32_t a = t.AddSwitch("A"), b = t.AddSwitch("B");
  LinkParams lp;
  lp.gbps = 100;
  for (uint32_t i = 0; i < 8; ++i) t.Connect(i, i < 4 ? a : b, lp);
  const uint32_t ab = t.Connect(a, b, lp);
  SimConfig c = StarConfig(1, 256 * 1000, DataType::kInt32, 0);
  c.topology = t;
  c.jobs[0].switch_node = b;
  c.jobs[0].hosts = {0, 1, 2, 3, 4, 5, 6, 7};
  auto r = Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->ok()) << r->jobs[0].status.ToString() << r->jobs[0].verify_error;
  // A -> B carries 4 workers' packets; B -> A 4 copies of each result.
  EXPECT_EQ(r->jobs[0].retransmitted, 0u);
  EXPECT_EQ(r->links[ab].packets, 4u * 1000);
  EXPECT_EQ(r->links[ab + 1].packets, 4u * 1000);
}

TEST(SimEngineTest, BadConfigurationsSayWhatIsWrong) {
  SimConfig c = StarConfig(4, 1000, DataType::kInt32, 0);
  c.jobs[0].window = 4096;
  auto r = Simulate(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("slots per job"), std::string::npos);
  c = StarConfig(4, 1000, DataType::kInt32, 0);
  c.jobs[0].switch_node = 0;
  EXPECT_FALSE(Simulate(c).ok());
  c = StarConfig(4, 1000, DataType::kInt32, 2.0);
  EXPECT_FALSE(Simulate(c).ok());
}

TEST(SimEngineTest, TopologiesBeyondTheRouteTableAreRefused) {
  // Given more nodes than the route table (nodes x nodes entries) may hold, expect a refusal
  // naming the bound (819201 nodes ended in std::bad_alloc, reported as a tensor too large).
  SimConfig c = StarConfig(kMaxNodes, 1000, DataType::kInt32, 0);
  auto r = Simulate(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("32769 nodes; at most 32768"), std::string::npos)
      << r.status().ToString();
}

TEST(SimEngineTest, TimingBeyondThePicosecondClockIsRefused) {
  // Given values whose picosecond times overflowed int64_t (they wrapped to negative times),
  // Expect each refused at setup, saying which.
  auto refused = [](SimConfig c, const std::string& what) {
    auto r = Simulate(std::move(c));
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
  };
  SimConfig c = StarConfig(2, 1000, DataType::kInt32, 0);
  c.topology.mutable_links()[0].params.propagation_ns = 1e17;
  refused(c, "propagation delay");
  c = StarConfig(2, 1000, DataType::kInt32, 0);
  c.topology.mutable_links()[0].params.gbps = 1e-9;
  refused(c, "link rate");
  c = StarConfig(2, 1000, DataType::kInt32, 0);
  c.topology.mutable_links()[0].params.buffer_bytes = uint64_t{1} << 53;
  refused(c, "link buffer");
  c = StarConfig(2, 1000, DataType::kInt32, 0);
  c.host_latency_ns = 1e20;
  refused(c, "latencies");
  c = StarConfig(2, 1000, DataType::kInt32, 0);
  c.switch_pps = 1e-300;
  refused(c, "packet rate");
  c = StarConfig(2, 1000, DataType::kInt32, 0);
  c.max_sim_seconds = 1e12;
  refused(c, "time limit");
  c = StarConfig(2, 1000, DataType::kInt32, 0);
  c.session.retransmit.max_timeout = std::chrono::hours(24 * 365);
  refused(c, "timeouts");
  // And the largest accepted values of all of them at once run to the end.
  c = StarConfig(2, 1000, DataType::kInt32, 0);
  for (Link& l : c.topology.mutable_links()) {
    l.params.gbps = kMinGbps;
    l.params.propagation_ns = kMaxDelayNs;
    l.params.buffer_bytes = kMaxBufferBytes;
  }
  c.switch_latency_ns = c.host_latency_ns = c.timer_granularity_ns = kMaxDelayNs;
  c.session.retransmit.timeout = c.session.retransmit.min_timeout =
      c.session.retransmit.max_timeout =
          std::chrono::nanoseconds(static_cast<int64_t>(kMaxDelayNs));
  c.session.retransmit.peer_timeout = std::chrono::seconds(static_cast<int64_t>(kMaxSimSeconds));
  c.max_sim_seconds = kMaxSimSeconds;
  auto r = Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->jobs[0].status.ok()) << r->jobs[0].status.ToString();
  EXPECT_TRUE(r->jobs[0].verified);
  EXPECT_GT(r->sim_seconds, 0);
  EXPECT_LE(r->sim_seconds, kMaxSimSeconds);
}

TEST(SimEngineTest, AnEndlessQueueOfSlowPacketsStopsAtTheTimeLimit) {
  // Given a switch that serves one packet per 1000 s (the slowest rate accepted), workers that
  // re-send their window every 10 ms, and links that delay half the packets by up to 1000 s (the
  // longest delay accepted): each packet queued adds 1e15 ps to the switch's busy time, which
  // nears int64_t's 9.2e18 ps after about 9200 packets; a delay added after it then wrapped to
  // a negative event time (and the run ended "at -9223020 s").
  // Expect the simulation to end at its time limit with the job failed, never at a negative
  // time.
  SimConfig c = StarConfig(2, 256 * 64, DataType::kInt32, 0);
  for (Link& l : c.topology.mutable_links()) {
    l.params.reorder = 0.5;
    l.params.reorder_ns = kMaxDelayNs;
  }
  c.jobs[0].window = 64;
  c.switch_pps = 1e9 / kMaxDelayNs;
  c.session.retransmit.timeout = c.session.retransmit.min_timeout =
      c.session.retransmit.max_timeout = std::chrono::milliseconds(10);
  c.session.retransmit.timeout_threshold = 1000000;  // no back-off: a window every 10 ms
  c.session.retransmit.peer_timeout = std::chrono::seconds(100);
  c.max_sim_seconds = 50;
  auto r = Simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->jobs[0].status.ok());
  EXPECT_GT(r->jobs[0].retransmitted, 10000u);  // the busy time went past 2^63 ps
  EXPECT_GE(r->sim_seconds, 0);
  EXPECT_LE(r->sim_seconds, c.max_sim_seconds);
}

TEST(SimBaselinesTest, RingAndHalvingDoublingFollowTheirLaws) {
  LinkParams lp;
  lp.gbps = 100;
  lp.propagation_ns = 0;
  for (uint32_t n : {4u, 16u, 24u}) {
    Topology t = Topology::Star(n, lp);
    ASSERT_TRUE(t.Finalize().ok());
    BaselineConfig bc;
    for (uint32_t i = 0; i < n; ++i) bc.hosts.push_back(i);
    bc.bytes = uint64_t{1} << 30;
    bc.switch_latency_ns = 0;
    const double wire = (4096.0 + 78) / 4096;  // framing overhead
    const double law = 2.0 * (n - 1) / n * static_cast<double>(bc.bytes) * wire * 8 / 100e9;
    auto ring = SimulateBaseline(Baseline::kRing, t, bc);
    ASSERT_TRUE(ring.ok());
    EXPECT_NEAR(ring->seconds / law, 1.0, 0.001) << n;
    EXPECT_EQ(ring->steps, 2 * (n - 1));
    auto hd = SimulateBaseline(Baseline::kHalvingDoubling, t, bc);
    ASSERT_TRUE(hd.ok());
    if ((n & (n - 1)) == 0) {
      EXPECT_NEAR(hd->seconds / law, 1.0, 0.001) << n;
    } else {
      EXPECT_GT(hd->seconds, law);  // the extra ranks' fold costs two full-tensor steps
    }
  }
}

}  // namespace
}  // namespace switchml::sim
