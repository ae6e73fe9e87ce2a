// The authenticated data plane end to end (docs/security.md 4.4; issue 7, Found 6): an in-process
// software switch and contexts over loopback UDP, a forger that sends with a registered worker's
// source address and port (a raw socket: needs root, as in CI), and the setup rules (all workers
// of a job agree; a switch may require it; a top-of-rack switch refuses it).
#include "transport/auth.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "runtime/switch_daemon.h"
#include "switchml/context.h"
#include "testing/forge.h"
#include "testing/pattern.h"

namespace switchml {
namespace {

using testing::FirstRoundPacket;
using testing::FreeUdpPort;
using testing::RawUdpSender;

class AuthDataTest : public ::testing::Test {
 protected:
  void StartSwitch(bool require_auth = false) {
    runtime::SwitchDaemonOptions o;
    o.bind_address = "127.0.0.1";
    o.data_port = 0;
    o.control_port = 0;
    o.control.registry.require_authenticated_data = require_auth;
    auto d = runtime::SwitchDaemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(d).value();
  }

  Config MakeConfig(uint32_t rank, uint32_t n, uint64_t session, bool auth) const {
    Config c;
    c.rank = rank;
    c.num_workers = n;
    c.control_port = daemon_->control_port();
    c.session_id = session;
    c.setup_timeout = std::chrono::seconds(10);
    c.job_secret = "s" + std::to_string(session);
    c.authenticate_data = auth;
    return c;
  }

  std::vector<Result<std::unique_ptr<Context>>> CreateAll(std::vector<Config> configs) {
    std::vector<Result<std::unique_ptr<Context>>> out;
    for (size_t r = 0; r < configs.size(); ++r) out.emplace_back(InternalError("not run"));
    std::vector<std::thread> ts;
    for (size_t r = 0; r < configs.size(); ++r) {
      ts.emplace_back([&, r] { out[r] = Context::Create(configs[r]); });
    }
    for (auto& t : ts) t.join();
    return out;
  }

  // Forges rank 1's contribution to every slot of the first all-reduce (values 42), from rank
  // 1's registered address and port, before the workers start; then both all-reduce. Returns
  // the number of wrong elements on each rank.
  std::pair<size_t, size_t> ForgeRankOne(bool auth) {
    constexpr uint32_t kWindow = 64;
    constexpr size_t kCount = kWindow * 256;  // one packet per slot: one round
    constexpr uint64_t kSession = 4242;
    const uint16_t port1 = FreeUdpPort();
    EXPECT_NE(port1, 0);
    std::vector<Config> configs = {MakeConfig(0, 2, kSession, auth),
                                   MakeConfig(1, 2, kSession, auth)};
    for (Config& c : configs) {
      c.max_outstanding_packets = kWindow;
      c.packet_numel = 256;
      c.retransmit.peer_timeout = std::chrono::seconds(5);
    }
    configs[1].udp_port = port1;
    auto ctx = CreateAll(configs);
    for (auto& c : ctx) EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!ctx[0].ok() || !ctx[1].ok()) return {SIZE_MAX, SIZE_MAX};

    RawUdpSender forger;
    const Endpoint rank1{kLoopbackIpv4, port1};
    const Endpoint switch_data{kLoopbackIpv4, daemon_->data_port()};
    for (uint32_t q = 0; q < kWindow; ++q) {
      std::vector<uint8_t> d = FirstRoundPacket(q, 42);
      // The reference format, and the same with a made-up tag.
      EXPECT_TRUE(forger.Send(rank1, switch_data, d));
      for (size_t i = 0; i < transport::kAuthTagBytes; ++i) {
        d.push_back(static_cast<uint8_t>(q + i));
      }
      EXPECT_TRUE(forger.Send(rank1, switch_data, d));
    }
    // Let the switch take them in before the workers start (its one data-plane thread then
    // handles the workers' packets after them). A generous limit: the wait ends when they came.
    EXPECT_TRUE(testing::WaitUntil(
        [&] {
          const auto c = daemon_->counters();
          return c.received + c.auth_dropped >= 2 * kWindow;
        },
        std::chrono::seconds(60)))
        << "the switch did not receive the forged packets";

    std::vector<std::vector<int32_t>> in(2, std::vector<int32_t>(kCount));
    std::vector<std::vector<int32_t>> out(2, std::vector<int32_t>(kCount, -1));
    for (size_t i = 0; i < kCount; ++i) {
      in[0][i] = static_cast<int32_t>(i);
      in[1][i] = static_cast<int32_t>(3 * i + 1);
    }
    Status st[2];
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r) {
      ts.emplace_back([&, r] {
        st[r] = (*ctx[r])->AllReduce(in[r].data(), out[r].data(), kCount, DataType::kInt32);
      });
    }
    for (auto& t : ts) t.join();
    EXPECT_TRUE(st[0].ok()) << st[0].ToString();
    EXPECT_TRUE(st[1].ok()) << st[1].ToString();
    size_t wrong[2] = {0, 0};
    for (size_t i = 0; i < kCount; ++i) {
      const int32_t want = static_cast<int32_t>(4 * i + 1);
      for (int r = 0; r < 2; ++r) wrong[r] += out[r][i] != want;
    }
    stats_[0] = (*ctx[0])->stats();
    stats_[1] = (*ctx[1])->stats();
    return {wrong[0], wrong[1]};
  }

  // Sprays results forged with the switch's address and port (values 42, untagged and with a
  // made-up tag) at rank 0 while it waits for rank 1; returns the wrong elements of both ranks
  // (of rank 1 alone in *wrong1). float32: the forged results carry block exponent 30 (the
  // first round's results are the exponents of the data the next round carries).
  size_t ForgeResultsAtRankZero(bool auth, ContextStats* stats0, DataType dtype = DataType::kInt32,
                                size_t* wrong1 = nullptr);

  std::unique_ptr<runtime::SwitchDaemon> daemon_;
  ContextStats stats_[2];
};

// Given the reference format (auth off), Expect a forged contribution with rank 1's address and
// port to replace rank 1's: both ranks get a wrong sum, silently (issue 7, Found 6). This is what
// the authenticated data plane stops (next test).
TEST_F(AuthDataTest, WithoutAuthAForgedContributionCorruptsTheSum) {
  if (!RawUdpSender().ok()) GTEST_SKIP() << "raw sockets need root (CAP_NET_RAW)";
  StartSwitch();
  auto [wrong0, wrong1] = ForgeRankOne(/*auth=*/false);
  // Every element: rank 1's 3i + 1 became 42 in every slot (i + 42 != 4i + 1 for any integer i).
  EXPECT_EQ(wrong0, 64u * 256) << "the forge did not reach the sum: the next test proves nothing";
  EXPECT_EQ(wrong1, 64u * 256);
  EXPECT_EQ(daemon_->counters().auth_dropped, 0u);
}

// Given the authenticated data plane, Expect the same forged packets (untagged, or with a made-up
// tag) to be dropped and counted by the switch, and both sums right.
TEST_F(AuthDataTest, WithAuthForgedContributionsAreDroppedAndCounted) {
  if (!RawUdpSender().ok()) GTEST_SKIP() << "raw sockets need root (CAP_NET_RAW)";
  StartSwitch();
  auto [wrong0, wrong1] = ForgeRankOne(/*auth=*/true);
  EXPECT_EQ(wrong0, 0u) << "elements of rank 0 that differ from the true sum";
  EXPECT_EQ(wrong1, 0u);
  EXPECT_EQ(daemon_->counters().auth_dropped, 2u * 64);
  EXPECT_EQ(stats_[0].auth_dropped, 0u);
  EXPECT_EQ(stats_[1].auth_dropped, 0u);
}

// Given a forger that sends results to rank 0 with the switch's address and port, Expect rank 0
// without auth to write them into its output (the source check cannot tell them apart).
TEST_F(AuthDataTest, WithoutAuthForgedResultsReachTheOutput) {
  if (!RawUdpSender().ok()) GTEST_SKIP() << "raw sockets need root (CAP_NET_RAW)";
  StartSwitch();
  ContextStats s0;
  // Every element of rank 0 (its all-reduce ended on forged results alone), none of rank 1.
  EXPECT_EQ(ForgeResultsAtRankZero(false, &s0), 64u * 256) << "the forge did not reach the output";
}

// ... and with auth, Expect rank 0 to drop them (its tag check) and count them, and the sums to
// stay right.
TEST_F(AuthDataTest, WithAuthForgedResultsAreDroppedByTheWorker) {
  if (!RawUdpSender().ok()) GTEST_SKIP() << "raw sockets need root (CAP_NET_RAW)";
  StartSwitch();
  ContextStats s0;
  EXPECT_EQ(ForgeResultsAtRankZero(true, &s0), 0u);
  EXPECT_GT(s0.auth_dropped, 0u);
  ContextStats f0;
  EXPECT_EQ(ForgeResultsAtRankZero(true, &f0, DataType::kFloat32), 0u);
  EXPECT_GT(f0.auth_dropped, 0u);
}

size_t AuthDataTest::ForgeResultsAtRankZero(bool auth, ContextStats* stats0, DataType dtype,
                                            size_t* wrong1) {
  constexpr size_t kCount = 64 * 256;
  const uint16_t port0 = FreeUdpPort();
  EXPECT_NE(port0, 0);
  const bool floats = dtype == DataType::kFloat32;
  const uint64_t session = (auth ? 77 : 78) + (floats ? 10 : 0);
  std::vector<Config> configs = {MakeConfig(0, 2, session, auth), MakeConfig(1, 2, session, auth)};
  for (Config& c : configs) c.max_outstanding_packets = 64;
  configs[0].udp_port = port0;
  auto ctx = CreateAll(configs);
  EXPECT_TRUE(ctx[0].ok() && ctx[1].ok());
  if (!ctx[0].ok() || !ctx[1].ok()) return SIZE_MAX;
  // Results of the first round, untagged and with a made-up tag, from the switch's address.
  std::vector<std::vector<uint8_t>> forged;
  for (uint32_t q = 0; q < 64; ++q) {
    forged.push_back(FirstRoundPacket(q, 42));
    if (floats) {  // block exponent 30 (e0, bytes 10 and 11 of the header: e0 then e1)
      proto::Header h;
      EXPECT_EQ(proto::DecodeHeader(forged.back(), &h), proto::DecodeError::kOk);
      h.e0 = 30;
      const std::vector<int32_t> zeros(256, 0);
      proto::Encode(h, zeros, forged.back());
    }
    forged.push_back(forged.back());
    forged.back().resize(forged.back().size() + transport::kAuthTagBytes, 7);
  }
  RawUdpSender forger;
  const Endpoint from{kLoopbackIpv4, daemon_->data_port()}, to{kLoopbackIpv4, port0};
  // int32 1s, or float32 1.0s (the same bits through the buffers).
  const int32_t one = floats ? 0x3f800000 : 1, two = floats ? 0x40000000 : 2;
  std::vector<std::vector<int32_t>> in(2, std::vector<int32_t>(kCount, one));
  std::vector<std::vector<int32_t>> out(2, std::vector<int32_t>(kCount, -1));
  Status st0;
  std::thread rank0(
      [&] { st0 = (*ctx[0])->AllReduce(in[0].data(), out[0].data(), kCount, dtype); });
  // Spray once the switch holds all of rank 0's packets (a result for a packet not sent yet is
  // not taken, so a spray before would prove nothing), until the forged results did what they
  // can: without auth, completed rank 0's 64 packets (its counters are published when its slice
  // ends; rank 1 has sent nothing, so no true result exists; the call itself returns only once
  // rank 1's tensor check came); with auth, came (and were dropped) a whole spray round after
  // that. States, not times: a fixed spray of 300 ms could end before a loaded or sanitized
  // rank 0 sent.
  constexpr auto kLimit = std::chrono::seconds(60);  // (a hang fails below, not here)
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        const auto c = daemon_->job_counters(session);
        return c.has_value() && c->aggregated >= 64;
      },
      kLimit))
      << "rank 0's packets did not reach the switch";
  const uint64_t dropped_before = (*ctx[0])->stats().auth_dropped;
  {
    testing::Sprayer spray(
        [&] {
          for (const auto& d : forged) forger.Send(from, to, d);
        },
        std::chrono::milliseconds(5));
    EXPECT_TRUE(testing::WaitUntil(
        [&] {
          return auth ? (*ctx[0])->stats().auth_dropped >= dropped_before + forged.size()
                      : (*ctx[0])->stats().results >= 64;
        },
        kLimit));
  }
  Status st1 = (*ctx[1])->AllReduce(in[1].data(), out[1].data(), kCount, dtype);
  rank0.join();
  EXPECT_TRUE(st0.ok()) << st0.ToString();
  EXPECT_TRUE(st1.ok()) << st1.ToString();
  size_t wrong = 0, wrong_at_1 = 0;
  for (size_t i = 0; i < kCount; ++i) {
    wrong += (out[0][i] != two) + (out[1][i] != two);
    wrong_at_1 += out[1][i] != two;
  }
  if (wrong1 != nullptr) *wrong1 = wrong_at_1;
  *stats0 = (*ctx[0])->stats();
  EXPECT_EQ((*ctx[1])->stats().auth_dropped, 0u);
  return wrong;
}

// Given int32 and float32 all-reduces with several worker threads and switch threads, Expect
// verified results and no tag failures.
TEST_F(AuthDataTest, VerifiedWithSeveralThreads) {
  runtime::SwitchDaemonOptions o;
  o.bind_address = "127.0.0.1";
  o.data_port = 0;
  o.control_port = 0;
  o.threads = 2;
  auto d = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  daemon_ = std::move(d).value();
  std::vector<Config> configs;
  for (uint32_t r = 0; r < 3; ++r) {
    configs.push_back(MakeConfig(r, 3, 9, true));
    configs.back().num_worker_threads = 2;
  }
  auto ctx = CreateAll(configs);
  for (auto& c : ctx) ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    const size_t count = 100003;
    testing::Pattern p{3, dt == DataType::kInt32 ? 0u : 1u, 3, 256, dt};
    std::vector<std::vector<int32_t>> buf(3, std::vector<int32_t>(count));
    for (uint32_t r = 0; r < 3; ++r) testing::FillInput(p, r, buf[r].data(), count);
    std::vector<std::thread> ts;
    Status st[3];
    for (uint32_t r = 0; r < 3; ++r) {
      ts.emplace_back(
          [&, r] { st[r] = (*ctx[r])->AllReduce(buf[r].data(), buf[r].data(), count, dt); });
    }
    for (auto& t : ts) t.join();
    for (uint32_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].ToString();
      auto v = testing::Verify(p, buf[r].data(), count);
      EXPECT_TRUE(v.ok()) << "rank " << r << ": " << v.ToString();
      EXPECT_EQ((*ctx[r])->stats().auth_dropped, 0u);
    }
  }
  EXPECT_EQ(daemon_->counters().auth_dropped, 0u);
}

// Given a job whose rank 0 asked for the authenticated data plane and a rank 1 that did not (and
// the reverse), Expect rank 1 to be refused at setup with the mismatch named, and rank 0 to fail
// fast too.
TEST_F(AuthDataTest, WorkersThatDisagreeAreRefusedAtSetup) {
  StartSwitch();
  for (bool auth0 : {true, false}) {
    const uint64_t session = auth0 ? 21 : 22;
    auto ctx = CreateAll({MakeConfig(0, 2, session, auth0), MakeConfig(1, 2, session, !auth0)});
    ASSERT_FALSE(ctx[1].ok());
    EXPECT_NE(ctx[1].status().message().find("authenticate_data"), std::string::npos)
        << ctx[1].status().ToString();
    EXPECT_NE(ctx[1].status().message().find("--auth-data"), std::string::npos);
    EXPECT_FALSE(ctx[0].ok());
  }
}

// Given a switch that requires the authenticated data plane, Expect a job without it to be
// refused, saying so, and a job with it to run.
TEST_F(AuthDataTest, ASwitchCanRequireIt) {
  StartSwitch(/*require_auth=*/true);
  auto refused = CreateAll({MakeConfig(0, 1, 31, false)});
  ASSERT_FALSE(refused[0].ok());
  EXPECT_NE(refused[0].status().message().find("--require-auth-data"), std::string::npos)
      << refused[0].status().ToString();
  auto ok = CreateAll({MakeConfig(0, 1, 32, true)});
  ASSERT_TRUE(ok[0].ok()) << ok[0].status().ToString();
  std::vector<int32_t> v(1000, 5);
  ASSERT_TRUE((*ok[0])->AllReduce(v.data(), v.data(), v.size(), DataType::kInt32).ok());
  EXPECT_EQ(v[999], 5);
}

// Given a top-of-rack switch (with an upstream), Expect a job asking for the authenticated data
// plane to be refused at setup, naming the reason.
TEST_F(AuthDataTest, ATopOfRackSwitchRefusesIt) {
  StartSwitch();  // the spine
  runtime::SwitchDaemonOptions o;
  o.bind_address = "127.0.0.1";
  o.data_port = 0;
  o.control_port = 0;
  o.upstream = "127.0.0.1:" + std::to_string(daemon_->control_port());
  o.racks = 1;
  o.rack_index = 0;
  auto tor = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(tor.ok()) << tor.status().ToString();
  Config c = MakeConfig(0, 1, 41, true);
  c.control_port = (*tor)->control_port();
  auto ctx = Context::Create(c);
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(ctx.status().message().find("top-of-rack"), std::string::npos)
      << ctx.status().ToString();
}

}  // namespace
}  // namespace switchml
