// The worker library's public API, in one process: several Contexts against an in-process
// software switch over loopback UDP.
#include "switchml/context.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/affinity.h"
#include "base/logging.h"
#include "reference_control.h"
#include "runtime/switch_daemon.h"
#include "testing/forge.h"
#include "testing/pattern.h"
#include "transport/udp.h"

namespace switchml {
namespace {

// A switch on 127.0.0.1 with free data and control ports; the tests set the rest.
runtime::SwitchDaemonOptions LocalSwitch() {
  runtime::SwitchDaemonOptions o;
  o.bind_address = "127.0.0.1";
  o.data_port = 0;
  o.control_port = 0;
  return o;
}

class ContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime::SwitchDaemonOptions o = LocalSwitch();
    auto d = runtime::SwitchDaemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(d).value();
  }

  Config MakeConfig(uint32_t rank, uint32_t n, uint64_t session) const {
    Config c;
    c.rank = rank;
    c.num_workers = n;
    c.control_port = daemon_->control_port();
    c.session_id = session;
    c.setup_timeout = std::chrono::seconds(10);
    return c;
  }

  // Creates n contexts concurrently (setup blocks until all have joined).
  std::vector<std::unique_ptr<Context>> CreateAll(std::vector<Config> configs) {
    std::vector<std::unique_ptr<Context>> out(configs.size());
    std::vector<Status> st(configs.size());
    std::vector<std::thread> ts;
    for (size_t r = 0; r < configs.size(); ++r) {
      ts.emplace_back([&, r] {
        auto c = Context::Create(configs[r]);
        st[r] = c.status();
        if (c.ok()) out[r] = std::move(c).value();
      });
    }
    for (auto& t : ts) t.join();
    for (size_t r = 0; r < configs.size(); ++r) EXPECT_TRUE(st[r].ok()) << st[r].ToString();
    return out;
  }

  // Ranks 0 and 1 (ctx[0], ctx[1]) reduce the pattern's inputs in place, asynchronously on both;
  // each result is verified.
  static void AllReduceInPlaceOnBoth(const std::vector<std::unique_ptr<Context>>& ctx,
                                     const testing::Pattern& p, size_t count) {
    AllReduceInPlaceOnBoth(ctx[0].get(), ctx[1].get(), p, count);
  }
  static void AllReduceInPlaceOnBoth(Context* c0, Context* c1, const testing::Pattern& p,
                                     size_t count) {
    std::vector<std::vector<int32_t>> buf(2, std::vector<int32_t>(count));
    for (uint32_t r = 0; r < 2; ++r) testing::FillInput(p, r, buf[r].data(), count);
    auto h0 = c0->AllReduceAsync(buf[0].data(), buf[0].data(), count, p.dtype);
    auto h1 = c1->AllReduceAsync(buf[1].data(), buf[1].data(), count, p.dtype);
    ASSERT_TRUE(h0.ok() && h1.ok());
    ASSERT_TRUE(h0->Wait().ok());
    ASSERT_TRUE(h1->Wait().ok());
    EXPECT_TRUE(h0->Test());
    for (uint32_t r = 0; r < 2; ++r) {
      auto v = testing::Verify(p, buf[r].data(), count);
      EXPECT_TRUE(v.ok()) << "rank " << r << " " << DataTypeName(p.dtype) << ": " << v.ToString();
    }
  }

  std::unique_ptr<runtime::SwitchDaemon> daemon_;
};

TEST(ConfigTest, ValidateSaysWhatToFix) {
  Config c;
  EXPECT_TRUE(c.Validate().ok());
  c.rank = 3;
  c.num_workers = 2;
  EXPECT_NE(c.Validate().message().find("use ranks 0 to 1"), std::string::npos);
  c = Config();
  c.packet_numel = 100;
  EXPECT_NE(c.Validate().message().find("use 64 or 256"), std::string::npos);
  c = Config();
  c.num_worker_threads = 4;
  c.max_outstanding_packets = 2;
  EXPECT_NE(c.Validate().message().find("each thread needs a slot"), std::string::npos);
  c = Config();
  c.retransmit.peer_timeout = std::chrono::milliseconds(1);
  EXPECT_FALSE(c.Validate().ok());
  c = Config();
  c.link_gbps = 0;
  EXPECT_NE(c.Validate().message().find("link_gbps"), std::string::npos);
  c.max_outstanding_packets = 64;  // an explicit window needs no link rate
  EXPECT_TRUE(c.Validate().ok());
  c = Config();
  c.retransmit.max_timeout = std::chrono::milliseconds(1);
  EXPECT_NE(c.Validate().message().find("max_timeout"), std::string::npos);
}

// Given link rates and base round trips, Expect the automatic window of the documented rule
// (docs/architecture.md, 4.5): 2 x rate x RTT / 1100 wire bytes per 1 KiB packet, rounded up to
// a multiple of 32 and of the threads, within [64, 8192]; and an explicit window kept.
TEST(ConfigTest, AutomaticWindowFromBandwidthDelayProduct) {
  auto window = [](double gbps, int rtt_us, uint32_t threads = 1, uint32_t numel = 256) {
    Config c;
    c.link_gbps = gbps;
    c.base_rtt = std::chrono::microseconds(rtt_us);
    c.num_worker_threads = threads;
    c.packet_numel = numel;
    EXPECT_TRUE(c.Validate().ok());
    return c.OutstandingPackets();
  };
  EXPECT_EQ(window(10, 100), 256u);         // 227.3 -> 228 -> 256 (the default)
  EXPECT_EQ(window(1, 100), 64u);           // 22.7 -> 32, raised to the minimum
  EXPECT_EQ(window(1, 500), 128u);          // 113.6 -> 114 -> 128
  EXPECT_EQ(window(10, 500), 1152u);        // 1136.4 -> 1137 -> 1152
  EXPECT_EQ(window(10, 100, 3), 258u);      // 256, then a multiple of 3
  EXPECT_EQ(window(10, 100, 1, 64), 768u);  // 332 wire bytes a packet: 753.01 -> 754 -> 768
  EXPECT_EQ(window(400, 1000), 8192u);      // clamped to the pool
  Config c;
  c.max_outstanding_packets = 100;
  EXPECT_EQ(c.OutstandingPackets(), 100u);
}

// Given jumbo packets (docs/protocol.md 2.6), Expect the automatic window in packets of the
// job's size, 8268 wire bytes for 2048 elements, with its granule (32), floor (64, over shm 1024)
// and ceiling (8192) scaled by 256 / numel so that they stand for the same bytes: about as many
// bytes in flight as with 256-element packets.
TEST(ConfigTest, AutomaticWindowForJumboPacketsKeepsItsBytes) {
  auto window = [](double gbps, int rtt_us, uint32_t numel, const char* transport = "udp") {
    Config c;
    c.link_gbps = gbps;
    c.base_rtt = std::chrono::microseconds(rtt_us);
    c.packet_numel = numel;
    c.transport = transport;
    EXPECT_TRUE(c.Validate().ok()) << c.Validate().ToString();
    return c.OutstandingPackets();
  };
  EXPECT_EQ(window(10, 100, 2048), 32u);          // 30.24 -> 31 -> 32 (4s): 256 x 1100 B at 256
  EXPECT_EQ(window(1, 100, 2048), 8u);            // 3.02 -> 4, raised to the floor 64 / 8
  EXPECT_EQ(window(10, 500, 2048), 152u);         // 151.2 -> 152
  EXPECT_EQ(window(10, 100, 512), 128u);          // 2124 wire bytes: 117.7 -> 118 -> 128 (16s)
  EXPECT_EQ(window(400, 1000, 2048), 1024u);      // clamped to the pool of 8192 x 256 / 2048
  EXPECT_EQ(window(10, 100, 2048, "shm"), 128u);  // the shm floor 1024 / 8
  Config c;
  c.packet_numel = 4096;
  EXPECT_NE(c.Validate().message().find("packet_numel 4096 is not supported"), std::string::npos);
  c.packet_numel = 2048;
  EXPECT_TRUE(c.Validate().ok());
}

// Given the shared-memory transport, Expect the automatic window to be at least
// kMinShmAutoWindow (the rule's own figure where it is larger), and an explicit window kept.
TEST(ConfigTest, AutomaticWindowOverSharedMemoryHasItsOwnFloor) {
  auto window = [](const char* transport, double gbps, int rtt_us, uint32_t threads = 1) {
    Config c;
    c.transport = transport;
    c.link_gbps = gbps;
    c.base_rtt = std::chrono::microseconds(rtt_us);
    c.num_worker_threads = threads;
    EXPECT_TRUE(c.Validate().ok());
    return c.OutstandingPackets();
  };
  EXPECT_EQ(window("shm", 10, 100), Config::kMinShmAutoWindow);  // the rule says 256
  EXPECT_EQ(window("shm", 10, 100, 2), 1024u);
  EXPECT_EQ(window("shm", 1, 100), 1024u);    // the rule says 64
  EXPECT_EQ(window("shm", 10, 1000), 2304u);  // 2272.7 -> 2273 -> 2304: above the floor
  EXPECT_EQ(window("udp", 10, 100), 256u);    // the other transports keep the rule's
  EXPECT_EQ(window("udp-plain", 1, 100), 64u);
  Config c;
  c.transport = "shm";
  c.max_outstanding_packets = 100;
  EXPECT_EQ(c.OutstandingPackets(), 100u);
}

// Given a two-worker job whose rank 0 waits for rank 1's late contribution, and a stranger's
// plain UDP socket spraying well-formed results (the values 42, with the slot, set, tsi and
// job number rank 0 waits for) at rank 0's data port meanwhile, Expect rank 0 to drop and count
// them (foreign_source_dropped > 0) and both ranks to get the true sum. (Before the worker
// checked the source, rank 0 returned the stranger's 42s: issue 7, Found 1.)
TEST_F(ContextTest, ResultsFromAStrangerAreDroppedAndCounted) {
  constexpr uint32_t kWindow = 64;
  constexpr size_t kCount = kWindow * 256;  // one packet per slot: one round
  // A free port for rank 0, so the stranger knows where to send.
  const uint16_t port0 = testing::FreeUdpPort();
  ASSERT_NE(port0, 0);
  std::vector<Config> configs = {MakeConfig(0, 2, 11), MakeConfig(1, 2, 11)};
  for (Config& c : configs) {
    c.max_outstanding_packets = kWindow;
    c.packet_numel = 256;
  }
  configs[0].udp_port = port0;
  auto ctx = CreateAll(configs);
  ASSERT_TRUE(ctx[0] && ctx[1]);

  auto stranger = transport::OpenUdp(transport::TransportOptions{});
  ASSERT_TRUE(stranger.ok()) << stranger.status().ToString();
  std::vector<std::vector<uint8_t>> forged;
  std::vector<transport::TxDatagram> batch;
  for (uint32_t q = 0; q < kWindow; ++q) forged.push_back(testing::FirstRoundPacket(q, 42));
  for (const auto& d : forged) batch.push_back({Endpoint{kLoopbackIpv4, port0}, d});

  std::vector<std::vector<int32_t>> in(2, std::vector<int32_t>(kCount));
  std::vector<std::vector<int32_t>> out(2, std::vector<int32_t>(kCount, -1));
  for (size_t i = 0; i < kCount; ++i) {
    in[0][i] = static_cast<int32_t>(i);
    in[1][i] = static_cast<int32_t>(3 * i + 1);
  }
  Status st0, st1;
  std::thread rank0(
      [&] { st0 = ctx[0]->AllReduce(in[0].data(), out[0].data(), kCount, DataType::kInt32); });
  // Rank 1 comes late: rank 0's packets wait in the switch while the stranger sprays, from when
  // the switch holds all of them until rank 0 has read (and dropped) a whole spray round more.
  // States, not a fixed time that a loaded or sanitized rank 0 might not have sent in.
  constexpr auto kLimit = std::chrono::seconds(60);  // (a hang fails below, not here)
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        const auto c = daemon_->job_counters(11);
        return c.has_value() && c->aggregated >= kWindow;
      },
      kLimit))
      << "rank 0's packets did not reach the switch";
  const uint64_t foreign_before = ctx[0]->stats().foreign_source_dropped;
  {
    testing::Sprayer spray([&] { EXPECT_TRUE((*stranger)->Send(batch).ok()); },
                           std::chrono::milliseconds(5));
    EXPECT_TRUE(testing::WaitUntil(
        [&] { return ctx[0]->stats().foreign_source_dropped >= foreign_before + kWindow; },
        kLimit));
  }
  st1 = ctx[1]->AllReduce(in[1].data(), out[1].data(), kCount, DataType::kInt32);
  rank0.join();
  EXPECT_TRUE(st0.ok()) << st0.ToString();
  EXPECT_TRUE(st1.ok()) << st1.ToString();
  size_t wrong0 = 0, wrong1 = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const int32_t want = static_cast<int32_t>(4 * i + 1);
    wrong0 += out[0][i] != want;
    wrong1 += out[1][i] != want;
  }
  EXPECT_EQ(wrong0, 0u) << "rank 0's elements that differ from the true sum (the stranger's won)";
  EXPECT_EQ(wrong1, 0u);
  EXPECT_GE(ctx[0]->stats().foreign_source_dropped, foreign_before + kWindow);
  EXPECT_EQ(ctx[1]->stats().foreign_source_dropped, 0u);
}

// Given two contexts (ranks 0 and 1) in one process, Expect synchronous, asynchronous and
// in-place all-reduces of int32 and float32 to give verified results on both.
TEST_F(ContextTest, TwoContextsInOneProcess) {
  auto ctx = CreateAll({MakeConfig(0, 2, 7), MakeConfig(1, 2, 7)});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  EXPECT_EQ(ctx[0]->session_id(), 7u);
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    const size_t count = 100003;
    testing::Pattern p{3, dt == DataType::kInt32 ? 0u : 1u, 2, 256, dt};
    AllReduceInPlaceOnBoth(ctx, p, count);
  }
}

// Given a switch that takes 256 elements per packet at most (the default) and a worker asking for
// 2048, Expect setup refused with what to fix; given one started with max_packet_numel 2048,
// Expect 2048-element all-reduces of int32 (exact) and float32 (within the quantization bound)
// verified on both workers, next to a 256-element job on the same switch (docs/protocol.md 2.6).
TEST_F(ContextTest, JumboPacketsWhereTheSwitchEnablesThem) {
  Config lone = MakeConfig(0, 1, 8);
  lone.packet_numel = 2048;
  const auto refused = Context::Create(lone);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(
                "it takes at most 256 elements per packet; use packet_numel 256 or less, or "
                "start the switch with --max-packet-numel 2048"),
            std::string::npos)
      << refused.status().ToString();

  runtime::SwitchDaemonOptions o = LocalSwitch();
  o.switch_config.max_packet_numel = 2048;
  auto jumbo = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(jumbo.ok()) << jumbo.status().ToString();
  std::vector<Config> configs;
  for (uint32_t r = 0; r < 4; ++r) {
    Config c = MakeConfig(r % 2, 2, r < 2 ? 9 : 10);
    c.control_port = (*jumbo)->control_port();
    c.packet_numel = r < 2 ? 2048 : 256;
    configs.push_back(c);
  }
  auto ctx = CreateAll(configs);
  ASSERT_TRUE(ctx[0] && ctx[1] && ctx[2] && ctx[3]);
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    const size_t count = 100003;  // 49 packets of 2048, the last one partly filled
    testing::Pattern big{3, dt == DataType::kInt32 ? 0u : 1u, 2, 2048, dt};
    testing::Pattern small{4, dt == DataType::kInt32 ? 0u : 1u, 2, 256, dt};
    std::thread beside([&] { AllReduceInPlaceOnBoth(ctx[2].get(), ctx[3].get(), small, count); });
    AllReduceInPlaceOnBoth(ctx[0].get(), ctx[1].get(), big, count);
    beside.join();
  }
  const std::optional<dataplane::JobCounters> c = (*jumbo)->job_counters(9);
  ASSERT_TRUE(c.has_value());
  EXPECT_GE(c->completed, 2u * 49u);
  EXPECT_EQ(c->dropped[static_cast<int>(dataplane::DropReason::kWrongSize)], 0u);
}

// Given two switches on this host, each running a one-worker job of the same job id (as the
// racks of a hierarchy do), with loopback multicast (the default), Expect each worker to get
// its own switch's results only: exact sums, and no datagram from the other switch (a shared
// group would deliver each switch's results to both workers, which drop the foreign ones).
TEST_F(ContextTest, SameSessionOnTwoSwitchesOfOneHostUsesTwoLoopbackGroups) {
  runtime::SwitchDaemonOptions o = LocalSwitch();
  auto other = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  Config c0 = MakeConfig(0, 1, 9), c1 = MakeConfig(0, 1, 9);
  c1.control_port = (*other)->control_port();
  ASSERT_TRUE(c0.loopback_multicast && c1.loopback_multicast);
  auto ctx = CreateAll({c0, c1});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  const size_t count = 64 * 256;
  for (uint32_t k = 0; k < 2; ++k) {  // one after the other: the idle one still listens
    std::vector<int32_t> in(count), out(count, 0);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(i * (k + 2));
    ASSERT_TRUE(ctx[k]->AllReduce(in.data(), out.data(), count, DataType::kInt32).ok());
    EXPECT_EQ(out, in);
  }
  // Context 1's own results came on its group after any of context 0's (one socket, in order);
  // context 0 reads late ones while idle.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(ctx[0]->stats().foreign_source_dropped, 0u);
  EXPECT_EQ(ctx[1]->stats().foreign_source_dropped, 0u);
}

// Transport "auto" (Config::transport): the kind the switch serves, as Context::config() names.

// Given a kernel UDP switch, Expect workers with transport "auto" to open udp (config says
// udp, with udp's window) and their all-reduce exact.
TEST_F(ContextTest, TransportAutoPicksUdpFromAKernelUdpSwitch) {
  Config c0 = MakeConfig(0, 2, 21), c1 = MakeConfig(1, 2, 21);
  c0.transport = c1.transport = "auto";
  ASSERT_TRUE(c0.Validate().ok());
  auto ctx = CreateAll({c0, c1});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  for (const auto& c : ctx) {
    EXPECT_EQ(c->config().transport, "udp");
    EXPECT_EQ(c->config().OutstandingPackets(), Config().OutstandingPackets());
  }
  AllReduceInPlaceOnBoth(ctx, testing::Pattern{3, 0, 2, 256, DataType::kInt32}, 20011);
}

// Given a switch on shared-memory rings in this process's shm directory (SWITCHML_SHM_DIR),
// Expect workers with transport "auto" to open shm (config says shm, with shm's window floor),
// their all-reduce exact and carried by the switch's rings; and Expect a name that is neither a
// kind nor auto refused, naming auto.
TEST_F(ContextTest, TransportAutoPicksShmFromAShmSwitchOnThisHost) {
  char tmpl[] = "/dev/shm/switchml-ctx-auto-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ::setenv("SWITCHML_SHM_DIR", dir.c_str(), 1);
  {
    runtime::SwitchDaemonOptions o = LocalSwitch();
    o.transport = "shm";
    auto shm_switch = runtime::SwitchDaemon::Start(o);
    ASSERT_TRUE(shm_switch.ok()) << shm_switch.status().ToString();
    Config c0 = MakeConfig(0, 2, 22), c1 = MakeConfig(1, 2, 22);
    c0.control_port = c1.control_port = (*shm_switch)->control_port();
    c0.transport = c1.transport = "auto";
    auto ctx = CreateAll({c0, c1});
    ASSERT_TRUE(ctx[0] && ctx[1]);
    for (const auto& c : ctx) {
      EXPECT_EQ(c->config().transport, "shm");
      EXPECT_EQ(c->config().OutstandingPackets(), Config::kMinShmAutoWindow);
    }
    const size_t count = 20011;
    AllReduceInPlaceOnBoth(ctx, testing::Pattern{4, 0, 2, 256, DataType::kInt32}, count);
    // Both workers' packets came through the shm switch's rings.
    EXPECT_GE((*shm_switch)->counters().received, 2 * ((count + 255) / 256));
  }
  ::unsetenv("SWITCHML_SHM_DIR");
  std::filesystem::remove_all(dir);
  Config bad = MakeConfig(0, 1, 23);
  bad.transport = "tcp";
  EXPECT_NE(bad.Validate().message().find("or auto"), std::string::npos)
      << bad.Validate().message();
}

// Automatic threads (Config::num_worker_threads 0): as many as the switch's data-plane threads.

// Given a switch with 2 data-plane threads, Expect workers with num_worker_threads 0 to choose 2
// (Context::config() says so; one transport per thread, each sending to its own switch thread)
// and their all-reduces exact; and Expect a fixed window too small for the choice refused at
// setup, naming both numbers.
TEST_F(ContextTest, AutomaticThreadsFollowTheSwitchsDataPlaneThreads) {
  runtime::SwitchDaemonOptions o = LocalSwitch();
  o.threads = 2;
  auto two = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  Config c0 = MakeConfig(0, 2, 25), c1 = MakeConfig(1, 2, 25);
  c0.control_port = c1.control_port = (*two)->control_port();
  c0.num_worker_threads = c1.num_worker_threads = 0;
  ASSERT_TRUE(c0.Validate().ok()) << c0.Validate().ToString();
  auto ctx = CreateAll({c0, c1});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  for (const auto& c : ctx) EXPECT_EQ(c->config().num_worker_threads, 2u);
  const size_t count = 64 * 256 + 17;
  AllReduceInPlaceOnBoth(ctx, testing::Pattern{5, 0, 2, 256, DataType::kInt32}, count);
  const std::vector<runtime::DaemonCounters> shards = (*two)->shard_counters();
  ASSERT_EQ(shards.size(), 2u);
  for (const auto& s : shards) EXPECT_GT(s.received, 0u);  // both switch threads carried data

  Config lone = MakeConfig(0, 1, 26);
  lone.control_port = (*two)->control_port();
  lone.num_worker_threads = 0;
  lone.max_outstanding_packets = 1;
  ASSERT_TRUE(lone.Validate().ok());
  const auto refused = Context::Create(lone);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("must be at least num_worker_threads (2)"),
            std::string::npos)
      << refused.status().ToString();
}

// Given a switch whose control plane does not answer Monitor.Status (a reference switch: the
// call is UNIMPLEMENTED), Expect transport "auto" to fall back to udp, the reference's, and to
// say why in one log line, packet_numel auto to take the reference's 256 and automatic threads
// to choose 1; setup goes on as with a reference switch, registering once (no data plane here:
// the job is not run).
TEST(ContextFallbackTest, AutomaticChoicesFallBackToTheReferencesWhenTheSwitchDoesNotSay) {
  std::unique_ptr<testing::ReferenceLikeControl> reference = testing::ReferenceLikeControl::Start();
  ASSERT_NE(reference, nullptr);
  // One worker meets no one: a rendezvous of its own instead of the switch's Sync service.
  class Alone final : public Rendezvous {
   public:
    Status Barrier() override { return Status(); }
    Result<uint64_t> Broadcast(uint64_t value) override { return value; }
  };
  std::mutex mu;
  std::vector<std::string> lines;
  SetLogSink([&](LogLevel, LogSubsystem, const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(m);
  });
  const LogLevel level = GetLogLevel();
  SetLogLevel(LogLevel::kInfo);
  Config c;
  c.control_port = reference->port();
  c.session_id = 24;
  c.setup_timeout = std::chrono::seconds(10);
  c.transport = "auto";
  c.num_worker_threads = 0;
  c.packet_numel = Config::kAutoPacketNumel;
  auto ctx = Context::Create(c, std::make_shared<Alone>());
  SetLogLevel(level);
  SetLogSink(nullptr);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  EXPECT_EQ((*ctx)->config().transport, "udp");
  EXPECT_EQ((*ctx)->config().num_worker_threads, 1u);
  EXPECT_EQ((*ctx)->config().packet_numel, 256u);
  EXPECT_EQ(reference->udp_sessions(), 1);
  int chose = 0;
  for (const std::string& m : lines) {
    if (m.find("transport auto chose udp") == std::string::npos) continue;
    ++chose;
    EXPECT_NE(m.find("did not say which transport it serves"), std::string::npos) << m;
  }
  EXPECT_EQ(chose, 1);
}

// packet_numel auto (Config::packet_numel 0): the largest size the switch takes (its
// Monitor.Status), the transport carries and the path holds; Context::config() names it.

// Given a switch started with max_packet_numel 2048 on this host (kernel UDP over the loopback
// interface, whose MTU holds 8230-byte packets), Expect workers with packet_numel 0 to open
// 2048-element packets (config says so; the window in packets of that size) and their int32
// all-reduce exact; given the fixture's switch (the library's default, 256), Expect 256.
TEST_F(ContextTest, PacketNumelAutoTakesTheLargestTheSwitchTakes) {
  runtime::SwitchDaemonOptions o = LocalSwitch();
  o.switch_config.max_packet_numel = 2048;
  auto jumbo = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(jumbo.ok()) << jumbo.status().ToString();
  for (const uint32_t expected : {2048u, 256u}) {
    const uint64_t session = expected == 2048 ? 31 : 32;
    Config c0 = MakeConfig(0, 2, session), c1 = MakeConfig(1, 2, session);
    if (expected == 2048) c0.control_port = c1.control_port = (*jumbo)->control_port();
    c0.packet_numel = c1.packet_numel = Config::kAutoPacketNumel;
    ASSERT_TRUE(c0.Validate().ok()) << c0.Validate().ToString();
    auto ctx = CreateAll({c0, c1});
    ASSERT_TRUE(ctx[0] && ctx[1]);
    for (const auto& c : ctx) {
      EXPECT_EQ(c->config().packet_numel, expected);
      Config same = MakeConfig(0, 2, session);
      same.packet_numel = expected;
      EXPECT_EQ(c->config().OutstandingPackets(), same.OutstandingPackets());
    }
    AllReduceInPlaceOnBoth(ctx, testing::Pattern{5, 0, 2, expected, DataType::kInt32}, 20011);
  }
  const std::optional<dataplane::JobCounters> c = (*jumbo)->job_counters(31);
  ASSERT_TRUE(c.has_value());
  EXPECT_GE(c->completed, (20011u + 2047u) / 2048u);
  EXPECT_EQ(c->dropped[static_cast<int>(dataplane::DropReason::kWrongSize)], 0u);
}

// A rendezvous for one worker of a job whose other workers are not here: barriers pass at once,
// and a broadcast returns `first` (rank 0's value) whatever this worker passes.
class RankZeroSays final : public Rendezvous {
 public:
  explicit RankZeroSays(uint64_t first) : first_(first) {}
  Status Barrier() override { return Status(); }
  Result<uint64_t> Broadcast(uint64_t) override { return first_; }

 private:
  const uint64_t first_;
};

// Given packet_numel auto on a worker whose own choice is 256 (the fixture's switch takes no
// more) while rank 0 chose 2048 (its path allows more), Expect setup refused before anything
// is registered, saying what each chose and what to do.
TEST_F(ContextTest, PacketNumelAutoRefusesRankZerosLargerChoice) {
  Config c = MakeConfig(1, 2, 33);
  c.packet_numel = Config::kAutoPacketNumel;
  const auto refused = Context::Create(c, std::make_shared<RankZeroSays>(2048));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(
                "packet_numel auto: rank 0 chose 2048 elements per packet, but this worker can "
                "use at most 256 (the switch takes at most 256)"),
            std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("set packet_numel 256 on every worker"),
            std::string::npos)
      << refused.status().ToString();
}

// Given a switch that coalesces receives (SwitchDaemonOptions::nap), Expect exact int32 sums and
// float32 within the bound, as without, and the naps counted; Expect a nap out of range, or with
// busy polling, refused at setup.
TEST_F(ContextTest, ReceiveCoalescingAtTheSwitchKeepsResultsExact) {
  runtime::SwitchDaemonOptions o = LocalSwitch();
  o.nap = std::chrono::microseconds(300);
  auto coalescing = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(coalescing.ok()) << coalescing.status().ToString();
  Config c0 = MakeConfig(0, 2, 11), c1 = MakeConfig(1, 2, 11);
  c0.control_port = c1.control_port = (*coalescing)->control_port();
  auto ctx = CreateAll({c0, c1});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    const size_t count = 300007;
    testing::Pattern p{5, 0, 2, 256, dt};
    AllReduceInPlaceOnBoth(ctx, p, count);
  }
  EXPECT_GT((*coalescing)->counters().naps, 0u);
  EXPECT_NE((*coalescing)->FormatCounters(false).find("coalescing naps"), std::string::npos);
  EXPECT_EQ(daemon_->counters().naps, 0u);  // off by default

  o.nap = std::chrono::microseconds(20000);
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.nap = std::chrono::microseconds(300);
  o.busy_poll = true;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.busy_poll = false;
  EXPECT_TRUE(o.Validate().ok());
}

// The threads of this process whose CPU list (/proc/self/task/*/status, Cpus_allowed_list) is
// `cpu` alone.
int ThreadsPinnedTo(int cpu) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream status(task.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Cpus_allowed_list:", 0) != 0) continue;
      std::istringstream fields(line.substr(line.find(':') + 1));
      std::string list;
      fields >> list;
      if (list == std::to_string(cpu)) ++n;
    }
  }
  return n;
}

// Given a switch with two pinned data-plane threads and two workers with two pinned threads
// each (Config::pin_threads), Expect exact sums, and thread t of each (three threads) pinned to
// the t-th CPU of this process's, where it may use two or more (with one, all run there anyway).
TEST_F(ContextTest, PinnedThreadsRunOnTheirCpus) {
  Result<std::vector<int>> cpus = AllowedCpus();
  ASSERT_TRUE(cpus.ok()) << cpus.status().ToString();
  runtime::SwitchDaemonOptions o = LocalSwitch();
  o.threads = 2;
  o.pin_threads = true;
  auto pinned = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  Config c0 = MakeConfig(0, 2, 13), c1 = MakeConfig(1, 2, 13);
  for (Config* c : {&c0, &c1}) {
    c->control_port = (*pinned)->control_port();
    c->num_worker_threads = 2;
    c->pin_threads = true;
  }
  auto ctx = CreateAll({c0, c1});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  testing::Pattern p{7, 0, 2, 256, DataType::kInt32};
  AllReduceInPlaceOnBoth(ctx, p, 200003);
  if (cpus->size() >= 2) {
    EXPECT_EQ(ThreadsPinnedTo((*cpus)[0]), 3);
    EXPECT_EQ(ThreadsPinnedTo((*cpus)[1]), 3);
  }
}

// Given several all-reduces queued back to back, Expect them carried out in order and
// WaitForAll to report success.
TEST_F(ContextTest, QueuedOperationsAndWaitForAll) {
  Config c0 = MakeConfig(0, 2, 8), c1 = MakeConfig(1, 2, 8);
  c0.num_worker_threads = c1.num_worker_threads = 2;
  c0.packet_numel = c1.packet_numel = 64;
  auto ctx = CreateAll({c0, c1});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  constexpr int kOps = 6;
  std::vector<std::vector<std::vector<float>>> in(2), out(2);
  std::vector<size_t> sizes = {1, 64, 65, 5000, 0, 77777};
  for (uint32_t r = 0; r < 2; ++r) {
    for (int i = 0; i < kOps; ++i) {
      testing::Pattern p{5, static_cast<uint32_t>(i), 2, 64, DataType::kFloat32};
      in[r].emplace_back(sizes[i]);
      out[r].emplace_back(sizes[i]);
      testing::FillInput(p, r, in[r][i].data(), sizes[i]);
      ASSERT_TRUE(
          ctx[r]
              ->AllReduceAsync(in[r][i].data(), out[r][i].data(), sizes[i], DataType::kFloat32)
              .ok());
    }
  }
  for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(ctx[r]->WaitForAll().ok());
  for (uint32_t r = 0; r < 2; ++r) {
    for (int i = 0; i < kOps; ++i) {
      testing::Pattern p{5, static_cast<uint32_t>(i), 2, 64, DataType::kFloat32};
      EXPECT_TRUE(testing::Verify(p, out[r][i].data(), sizes[i]).ok()) << r << " " << i;
    }
  }
  const ContextStats stats = ctx[0]->stats();
  EXPECT_GT(stats.packets_sent, 0u);
  // The round trip was measured and the timeout derived from it (at least its floor).
  EXPECT_GT(stats.rtt_samples, 0u);
  EXPECT_GT(stats.srtt_us, 0.0);
  EXPECT_GE(stats.rto_us, stats.srtt_us);
}

// Given inputs with an infinity, Expect a clear error on every worker, NaN in the affected
// block, and the context still usable afterwards.
TEST_F(ContextTest, NonFiniteInputGivesClearErrorOnEveryWorker) {
  auto ctx = CreateAll({MakeConfig(0, 2, 9), MakeConfig(1, 2, 9)});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  std::vector<std::vector<float>> buf(2, std::vector<float>(1000, 1.0f));
  buf[1][300] = INFINITY;
  std::vector<Status> st(2);
  std::thread t(
      [&] { st[1] = ctx[1]->AllReduce(buf[1].data(), buf[1].data(), 1000, DataType::kFloat32); });
  st[0] = ctx[0]->AllReduce(buf[0].data(), buf[0].data(), 1000, DataType::kFloat32);
  t.join();
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kInvalidArgument) << st[r].ToString();
    EXPECT_NE(st[r].message().find("inf or NaN"), std::string::npos);
    EXPECT_TRUE(std::isnan(buf[r][300]));
    EXPECT_EQ(buf[r][0], 2.0f);
  }
  // Still usable.
  std::vector<std::vector<int32_t>> ints(2, std::vector<int32_t>(10, 21));
  std::thread t2(
      [&] { st[1] = ctx[1]->AllReduce(ints[1].data(), ints[1].data(), 10, DataType::kInt32); });
  st[0] = ctx[0]->AllReduce(ints[0].data(), ints[0].data(), 10, DataType::kInt32);
  t2.join();
  EXPECT_TRUE(st[0].ok() && st[1].ok());
  EXPECT_EQ(ints[0], std::vector<int32_t>(10, 42));
}

// Given out = in + 1 element (buffers that overlap without being the same), Expect the
// all-reduce refused with INVALID_ARGUMENT before anything is sent and the memory untouched (with
// a window of one packet, block 1 used to be read after block 0's result had overwritten its
// first element: a silently wrong sum), and in == out still summed in place, exactly.
TEST_F(ContextTest, PartlyOverlappingBuffersAreRefused) {
  Config c = MakeConfig(0, 1, 12);
  c.max_outstanding_packets = 1;
  c.packet_numel = 64;
  auto ctx = CreateAll({c});
  ASSERT_TRUE(ctx[0]);
  std::vector<int32_t> buf(257);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int32_t>(i * 7 + 1);
  const std::vector<int32_t> before = buf;
  for (auto [in, out] : {std::pair{0, 1}, std::pair{1, 0}}) {
    const Status st = ctx[0]->AllReduce(buf.data() + in, buf.data() + out, 256, DataType::kInt32);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.ToString();
    EXPECT_EQ(buf, before);
  }
  ASSERT_TRUE(ctx[0]->AllReduce(buf.data(), buf.data(), 257, DataType::kInt32).ok());
  EXPECT_EQ(buf, before);  // one worker: the sum is the input
  EXPECT_TRUE(ctx[0]->AllReduce(buf.data(), buf.data() + 129, 128, DataType::kInt32).ok());
}

// Given a peer that never shows up, Expect setup to fail with DEADLINE_EXCEEDED naming the
// barrier, not to hang.
TEST_F(ContextTest, MissingPeerTimesOutAtSetup) {
  Config c = MakeConfig(0, 2, 10);
  c.setup_timeout = std::chrono::milliseconds(800);
  const auto t0 = std::chrono::steady_clock::now();
  auto ctx = Context::Create(c);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), StatusCode::kDeadlineExceeded) << ctx.status().ToString();
  EXPECT_NE(ctx.status().message().find("barrier"), std::string::npos) << ctx.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// Given ranks 0 and 2 of 3 and no rank 1, Expect both setups to fail naming rank 1: rank 0 from
// the switch's answer to its barrier, rank 2 (whose barrier would end later) from the reason
// rank 0 gave when it abandoned the session, not from rank 0's connection ending.
TEST_F(ContextTest, MissingPeerIsNamedToEveryWorkerAtSetup) {
  Config zero = MakeConfig(0, 3, 11), two = MakeConfig(2, 3, 11);
  zero.setup_timeout = std::chrono::milliseconds(1500);
  two.setup_timeout = std::chrono::seconds(10);
  Status st_two;
  std::thread t([&] { st_two = Context::Create(two).status(); });
  const Status st_zero = Context::Create(zero).status();
  t.join();
  EXPECT_EQ(st_zero.code(), StatusCode::kDeadlineExceeded) << st_zero.ToString();
  EXPECT_NE(st_zero.message().find("rank 1 did not arrive"), std::string::npos)
      << st_zero.ToString();
  EXPECT_EQ(st_two.code(), StatusCode::kFailedPrecondition) << st_two.ToString();
  EXPECT_NE(st_two.message().find("rank 0 gave up joining it"), std::string::npos)
      << st_two.ToString();
  EXPECT_NE(st_two.message().find("rank 1 did not arrive"), std::string::npos) << st_two.ToString();
}

}  // namespace
}  // namespace switchml

namespace switchml {
namespace {

// Given a peer that disappears after setup and six all-reduces queued on the remaining worker,
// Expect the first to fail with DEADLINE_EXCEEDED after the peer timeout and all the queued
// ones at once after it (not one peer timeout each), and later calls to fail immediately.
TEST_F(ContextTest, QueuedOperationsFailTogetherAfterAPeerTimeout) {
  Config c0 = MakeConfig(0, 2, 11), c1 = MakeConfig(1, 2, 11);
  c0.retransmit.peer_timeout = c1.retransmit.peer_timeout = std::chrono::milliseconds(300);
  c0.num_worker_threads = c1.num_worker_threads = 2;
  auto ctx = CreateAll({c0, c1});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  ctx[1].reset();  // the peer is gone
  std::vector<std::vector<int32_t>> bufs(6, std::vector<int32_t>(100000, 1));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<AllReduceHandle> hs;
  for (auto& b : bufs) {
    auto h = ctx[0]->AllReduceAsync(b.data(), b.data(), b.size(), DataType::kInt32);
    ASSERT_TRUE(h.ok());
    hs.push_back(*h);
  }
  EXPECT_EQ(hs[0].Wait().code(), StatusCode::kDeadlineExceeded);
  for (auto& h : hs) EXPECT_FALSE(h.Wait().ok());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 1.5) << "queued operations each waited for their own timeout";
  Status later = ctx[0]->AllReduce(bufs[0].data(), bufs[0].data(), 10, DataType::kInt32);
  EXPECT_NE(later.message().find("failed earlier"), std::string::npos) << later.ToString();
  // The switch saw rank 1 close without announcing the all-reduce.
  EXPECT_NE(hs[0].Wait().message().find("rank 1 closed the session without starting it"),
            std::string::npos)
      << hs[0].Wait().ToString();
}

// Given a peer that is alive but never calls the all-reduce, Expect the all-reduce to fail after
// the peer timeout naming that rank, from the switch's tensor checks.
TEST_F(ContextTest, PeerThatNeverStartsTheAllReduceIsNamed) {
  Config c0 = MakeConfig(0, 2, 13), c1 = MakeConfig(1, 2, 13);
  c0.retransmit.peer_timeout = c1.retransmit.peer_timeout = std::chrono::milliseconds(300);
  auto ctx = CreateAll({c0, c1});
  ASSERT_TRUE(ctx[0] && ctx[1]);
  std::vector<int32_t> buf(1000, 1);
  Status st = ctx[0]->AllReduce(buf.data(), buf.data(), buf.size(), DataType::kInt32);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("the switch says: all-reduce 1 of session 13: rank 1 has not "
                              "started it (rank 0 has)"),
            std::string::npos)
      << st.ToString();
}

}  // namespace
}  // namespace switchml
