// The transport conformance suite: every backend the factory opens must pass these, over a path
// where it can run: kernel UDP ("udp", "udp-plain") on loopback; AF_XDP ("xdp") between the two
// ends of a veth pair in a network namespace of the test's own (made with unshare(CLONE_NEWNET);
// skipped, saying why, where that is refused or the build has no AF_XDP); DPDK ("dpdk") over
// memif inside the test process (skipped, saying why, where EAL cannot start or the build has no
// DPDK); shared memory ("shm") between transports of the test process. Tests say which side is
// the switch: a memif worker reaches one switch, and a switch answers only workers it heard
// from, so for such a backend the workers speak first.
// A backend joins by adding a Backend to Backends() below.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "transport/dpdk.h"
#include "transport/dpdk_test_util.h"
#include "transport/factory.h"
#include "transport/transport.h"
#include "transport/xdp.h"

namespace switchml::transport {
namespace {

using std::chrono::milliseconds;

struct Backend {
  std::string kind;
  uint32_t ip_a = kLoopbackIpv4;  // where the "a" transports bind
  uint32_t ip_b = kLoopbackIpv4;  // where the "b" transports bind
  // OK, or why the backend cannot run here (the tests are skipped with that message).
  std::function<Status()> prepare = [] { return Status(); };
  // The switch side sends only to workers that sent to it first (dpdk memif).
  bool workers_speak_first = false;
};

// DPDK: EAL starts and a memif server opens (once per process); not under ASan, where EAL in a
// process that also runs the other transports faults (dpdk_test_util.h).
Status DpdkReadyHere() { return DpdkReady({.refuse_under_asan = true}); }

// A network namespace of the test process's own with the veth pair xa (10.201.0.1/24) -- xb
// (10.201.0.2/24), made once; the main thread (and every thread it starts later) lives in it.
Status VethNamespace() {
  static const Status status = []() -> Status {
    if (!XdpAvailable()) return UnimplementedError("this build has no AF_XDP (libxdp-dev missing)");
    if (::geteuid() != 0) return FailedPreconditionError("AF_XDP on veth needs root");
    if (::unshare(CLONE_NEWNET) != 0) {
      return FailedPreconditionError(std::string("unshare(CLONE_NEWNET) refused: ") +
                                     std::strerror(errno));
    }
    const char* setup =
        "ip link set lo up && ip link add xa type veth peer name xb && "
        "ip addr add 10.201.0.1/24 dev xa && ip addr add 10.201.0.2/24 dev xb && "
        "ip link set xa up && ip link set xb up";
    if (std::system(setup) != 0) {
      return FailedPreconditionError("cannot make a veth pair in the test's namespace (iproute2?)");
    }
    return Status();
  }();
  return status;
}

std::vector<Backend> Backends() {
  std::vector<Backend> b;
  b.push_back({"udp"});
  b.push_back({"udp-plain"});
  b.push_back({"xdp", 0x0ac90001, 0x0ac90002, VethNamespace});
  b.push_back({"dpdk", kLoopbackIpv4, kLoopbackIpv4, DpdkReadyHere, true});
  b.push_back({"shm"});
  return b;
}

class TransportConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    const Status ready = GetParam().prepare();
    if (!ready.ok()) GTEST_SKIP() << GetParam().kind << ": " << ready.ToString();
  }

  // switch_side: these transports play the switch (see the top of the file).
  std::vector<std::unique_ptr<Transport>> Open(bool side_b, size_t count,
                                               size_t max_datagram = 2048,
                                               bool switch_side = false) {
    TransportOptions o;
    o.switch_side = switch_side;
    o.kind = GetParam().kind;
    o.bind_ipv4 = side_b ? GetParam().ip_b : GetParam().ip_a;
    o.max_datagram_bytes = max_datagram;
    auto ts = OpenTransports(o, count);
    EXPECT_TRUE(ts.ok()) << ts.status().ToString();
    if (!ts.ok()) return {};
    return std::move(ts).value();
  }

  // Sends all of batch (retrying while the transport takes fewer).
  static void SendAll(Transport& t, std::span<const TxDatagram> batch) {
    size_t sent = 0;
    for (int attempt = 0; sent < batch.size() && attempt < 10000; ++attempt) {
      auto r = t.Send(batch.subspan(sent));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      sent += *r;
      if (sent < batch.size()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ASSERT_EQ(sent, batch.size());
  }

  // Receives `count` datagrams (copied out), waiting up to 10 s in all.
  static std::vector<std::pair<Endpoint, std::vector<uint8_t>>> ReceiveN(Transport& t,
                                                                         size_t count) {
    std::vector<std::pair<Endpoint, std::vector<uint8_t>>> out;
    std::vector<RxDatagram> rx(64);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
      auto n = t.Receive(rx, milliseconds(200));
      EXPECT_TRUE(n.ok()) << n.status().ToString();
      if (!n.ok()) break;
      for (size_t i = 0; i < *n; ++i) {
        out.emplace_back(rx[i].source, std::vector<uint8_t>(rx[i].data.begin(), rx[i].data.end()));
      }
    }
    return out;
  }
};

TEST_P(TransportConformanceTest, CarriesDatagramsBothWaysFromItsLocalEndpoint) {
  auto a = Open(false, 1), b = Open(true, 1, 2048, true);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  const std::vector<uint8_t> ping = {1, 2, 3, 4, 5};
  TxDatagram tx{b[0]->local_endpoint(), ping};
  SendAll(*a[0], {&tx, 1});
  auto got = ReceiveN(*b[0], 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second, ping);
  EXPECT_EQ(got[0].first, a[0]->local_endpoint());
  // And back, to the source it saw.
  const std::vector<uint8_t> pong(1000, 0xab);
  TxDatagram back{got[0].first, pong};
  SendAll(*b[0], {&back, 1});
  auto reply = ReceiveN(*a[0], 1);
  ASSERT_EQ(reply.size(), 1u);
  EXPECT_EQ(reply[0].second, pong);
  EXPECT_EQ(reply[0].first, b[0]->local_endpoint());
  EXPECT_EQ(a[0]->counters().datagrams_sent, 1u);
  EXPECT_EQ(a[0]->counters().datagrams_received, 1u);
  EXPECT_FALSE(a[0]->name().empty());
}

TEST_P(TransportConformanceTest, OpensConsecutivePorts) {
  auto ts = Open(true, 3, 2048, true);
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(ts[1]->local_endpoint().port, ts[0]->local_endpoint().port + 1);
  EXPECT_EQ(ts[2]->local_endpoint().port, ts[0]->local_endpoint().port + 2);
}

TEST_P(TransportConformanceTest, ManyTxBuffersInOneSendArriveIntactAndInOrder) {
  auto a = Open(false, 1), b = Open(true, 1, 2048, true);
  ASSERT_FALSE(a.empty() || b.empty());
  constexpr size_t kCount = 600;
  constexpr size_t kLen = 1034;
  std::vector<TxDatagram> tx(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    std::span<uint8_t> buf = a[0]->TxBuffer(i).first(kLen);
    for (size_t k = 0; k < kLen; ++k) buf[k] = static_cast<uint8_t>(i * 7 + k);
    tx[i] = {b[0]->local_endpoint(), buf};
  }
  SendAll(*a[0], tx);
  auto got = ReceiveN(*b[0], kCount);
  ASSERT_EQ(got.size(), kCount);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(got[i].second.size(), kLen);
    EXPECT_EQ(got[i].second[0], static_cast<uint8_t>(i * 7)) << i;
    EXPECT_EQ(got[i].second[kLen - 1], static_cast<uint8_t>(i * 7 + kLen - 1)) << i;
  }
}

// TxBufferTo: memory that a backend may lend in the destination itself (shm) or else as
// TxBuffer; batches with abandoned buffers left out, many of them (a ring's end is crossed).
TEST_P(TransportConformanceTest, DatagramsBuiltInTxBufferToArriveIntactWithAbandonedOnesLeftOut) {
  auto a = Open(false, 1), b = Open(true, 1, 2048, true);
  ASSERT_FALSE(a.empty() || b.empty());
  constexpr size_t kBatches = 40, kPerBatch = 63, kLen = 1034;
  const Endpoint to = b[0]->local_endpoint();
  uint32_t seq = 0, expect = 0;
  for (size_t batch = 0; batch < kBatches; ++batch) {
    std::vector<TxDatagram> tx;
    for (size_t i = 0; i < kPerBatch; ++i) {
      std::span<uint8_t> buf = a[0]->TxBufferTo(i, to);
      ASSERT_GE(buf.size(), kLen);
      if ((i + batch) % 5 == 4) continue;  // lent, never written nor sent
      std::memset(buf.data(), static_cast<int>(seq), kLen);
      std::memcpy(buf.data(), &seq, 4);
      tx.push_back({to, buf.first(kLen)});
      ++seq;
    }
    SendAll(*a[0], tx);
    auto got = ReceiveN(*b[0], tx.size());
    ASSERT_EQ(got.size(), tx.size());
    for (const auto& [from, data] : got) {
      ASSERT_EQ(data.size(), kLen);
      uint32_t s;
      std::memcpy(&s, data.data(), 4);
      ASSERT_EQ(s, expect) << "batch " << batch;
      EXPECT_EQ(data[kLen - 1], static_cast<uint8_t>(expect));
      ++expect;
    }
  }
}

TEST_P(TransportConformanceTest, TxBufferRewrittenRightAfterSendDoesNotChangeWhatWasSent) {
  auto a = Open(false, 1), b = Open(true, 1, 2048, true);
  ASSERT_FALSE(a.empty() || b.empty());
  constexpr size_t kBatches = 20, kPerBatch = 32, kLen = 500;
  for (size_t batch = 0; batch < kBatches; ++batch) {
    std::vector<TxDatagram> tx(kPerBatch);
    for (size_t i = 0; i < kPerBatch; ++i) {
      std::span<uint8_t> buf = a[0]->TxBuffer(i).first(kLen);
      std::memset(buf.data(), static_cast<int>(batch), kLen);
      tx[i] = {b[0]->local_endpoint(), buf};
    }
    SendAll(*a[0], tx);
  }
  auto got = ReceiveN(*b[0], kBatches * kPerBatch);
  ASSERT_EQ(got.size(), kBatches * kPerBatch);
  for (size_t i = 0; i < got.size(); ++i) {
    const uint8_t want = static_cast<uint8_t>(i / kPerBatch);
    ASSERT_EQ(got[i].second, std::vector<uint8_t>(kLen, want)) << "datagram " << i;
  }
}

TEST_P(TransportConformanceTest, OneBufferToSeveralDestinationsReachesEach) {
  auto a = Open(false, 1, 2048, true), b = Open(true, 2);
  ASSERT_EQ(b.size(), 2u);
  ASSERT_FALSE(a.empty());
  if (GetParam().workers_speak_first) {
    const uint8_t hello = 1;
    for (auto& w : b) {
      const TxDatagram h{a[0]->local_endpoint(), {&hello, 1}};
      SendAll(*w, {&h, 1});
    }
    ASSERT_EQ(ReceiveN(*a[0], 2).size(), 2u);
  }
  std::span<uint8_t> buf = a[0]->TxBuffer(0).first(300);
  for (size_t k = 0; k < buf.size(); ++k) buf[k] = static_cast<uint8_t>(k);
  // As the switch multicasts: the same reply to each worker, grouped by destination.
  const TxDatagram tx[3] = {
      {b[1]->local_endpoint(), buf}, {b[0]->local_endpoint(), buf}, {b[1]->local_endpoint(), buf}};
  SendAll(*a[0], tx);
  const std::vector<uint8_t> want(buf.begin(), buf.end());
  auto got0 = ReceiveN(*b[0], 1);
  auto got1 = ReceiveN(*b[1], 2);
  ASSERT_EQ(got0.size(), 1u);
  ASSERT_EQ(got1.size(), 2u);
  EXPECT_EQ(got0[0].second, want);
  EXPECT_EQ(got1[0].second, want);
  EXPECT_EQ(got1[1].second, want);
}

// Given two transports that joined a multicast group of this host (a backend without groups is
// skipped), Expect one send to the group to reach both, from the sender's endpoint, counted as
// received through the group (a unicast datagram is not), and a transport that left the group
// to receive no more of it.
TEST_P(TransportConformanceTest, GroupOfThisHostReachesEveryMemberOnce) {
  auto a = Open(false, 1, 2048, true), b = Open(true, 2);
  ASSERT_FALSE(a.empty() || b.size() < 2);
  const Endpoint group{0xefc00000u | (static_cast<uint32_t>(::getpid()) & 0x3ffff),
                       static_cast<uint16_t>(12000 + ::getpid() % 8000)};
  const Status joined = b[0]->JoinGroup(group, 0);
  if (joined.code() == StatusCode::kUnimplemented) GTEST_SKIP() << joined.ToString();
  ASSERT_TRUE(joined.ok()) << joined.ToString();
  ASSERT_TRUE(b[1]->JoinGroup(group, 0).ok());
  std::vector<std::vector<uint8_t>> payloads = {{1, 2, 3}, {4, 5, 6, 7}, {8}};
  std::vector<TxDatagram> tx;
  for (auto& p : payloads) tx.push_back({group, p});
  const std::vector<uint8_t> unicast = {9, 9};
  tx.push_back({b[0]->local_endpoint(), unicast});
  SendAll(*a[0], tx);
  EXPECT_EQ(a[0]->counters().datagrams_sent, 4u);
  for (int k = 0; k < 2; ++k) {
    auto got = ReceiveN(*b[k], k == 0 ? 4 : 3);
    ASSERT_EQ(got.size(), k == 0 ? 4u : 3u);
    size_t from_group = 0;
    for (auto& [source, bytes] : got) {
      EXPECT_EQ(source, a[0]->local_endpoint());
      if (bytes != unicast) {
        EXPECT_EQ(bytes, payloads[from_group]);
        ++from_group;
      }
    }
    EXPECT_EQ(from_group, 3u);
    EXPECT_EQ(b[k]->counters().group_datagrams_received, 3u);
  }
  b[1]->LeaveGroup();
  const TxDatagram more{group, payloads[0]};
  SendAll(*a[0], {&more, 1});
  EXPECT_EQ(ReceiveN(*b[0], 1).size(), 1u);
  std::vector<RxDatagram> rx(4);
  EXPECT_EQ(*b[1]->Receive(rx, milliseconds(100)), 0u);
}

TEST_P(TransportConformanceTest, OversizedDatagramIsCutAndFlagged) {
  auto a = Open(false, 1), b = Open(true, 1, /*max_datagram=*/100, true);
  ASSERT_FALSE(a.empty() || b.empty());
  EXPECT_EQ(b[0]->max_datagram_bytes(), 100u);
  const std::vector<uint8_t> big(300, 9), small(50, 8);
  const TxDatagram tx[2] = {{b[0]->local_endpoint(), big}, {b[0]->local_endpoint(), small}};
  SendAll(*a[0], tx);
  std::vector<RxDatagram> rx(2);
  size_t n = 0;
  bool saw_truncated = false, saw_small = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (n < 2 && std::chrono::steady_clock::now() < deadline) {
    auto r = b[0]->Receive(rx, milliseconds(200));
    ASSERT_TRUE(r.ok());
    for (size_t i = 0; i < *r; ++i, ++n) {
      if (rx[i].truncated) {
        saw_truncated = true;
        EXPECT_EQ(rx[i].data.size(), 100u);
      } else {
        saw_small = true;
        EXPECT_EQ(rx[i].data.size(), 50u);
      }
    }
  }
  EXPECT_TRUE(saw_truncated);
  EXPECT_TRUE(saw_small);
  EXPECT_EQ(b[0]->counters().truncated, 1u);
}

// Given a stream several times longer than a backend's receive memory (AF_XDP: 4096 UMEM frames;
// DPDK: the mbuf pool), received in batches smaller than what is waiting, of changing sizes (a
// receive ring left partly full between calls, every lent buffer given back on the next call),
// Expect every datagram intact and in order, and the receiver still able to receive after it:
// a receive buffer lost or given back twice starves the receiver or breaks the backend's own
// accounting (the AF_XDP fill ring; issue 9).
TEST_P(TransportConformanceTest, LongStreamReceivedInPartialBatchesLosesNoReceiveBuffers) {
  auto a = Open(false, 1), b = Open(true, 1, 2048, true);
  ASSERT_FALSE(a.empty() || b.empty());
  constexpr size_t kRounds = 200, kPerRound = 64, kLen = 1034;
  const size_t sizes[] = {1, 7, 64, 3, 30, 64, 2};
  std::vector<RxDatagram> rx(64);
  uint32_t next_sent = 0, next_received = 0;
  size_t calls = 0;
  for (size_t round = 0; round < kRounds; ++round) {
    std::vector<TxDatagram> tx(kPerRound);
    for (size_t i = 0; i < kPerRound; ++i, ++next_sent) {
      std::span<uint8_t> buf = a[0]->TxBuffer(i).first(kLen);
      std::memcpy(buf.data(), &next_sent, sizeof next_sent);
      buf[kLen - 1] = static_cast<uint8_t>(next_sent);
      tx[i] = {b[0]->local_endpoint(), buf};
    }
    SendAll(*a[0], tx);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (next_received < next_sent && std::chrono::steady_clock::now() < deadline) {
      const size_t want = sizes[calls++ % std::size(sizes)];
      auto n = b[0]->Receive(std::span(rx).first(want), milliseconds(100));
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      ASSERT_LE(*n, want);
      for (size_t i = 0; i < *n; ++i, ++next_received) {
        ASSERT_EQ(rx[i].data.size(), kLen);
        uint32_t seq;
        std::memcpy(&seq, rx[i].data.data(), sizeof seq);
        ASSERT_EQ(seq, next_received) << "round " << round;
        ASSERT_EQ(rx[i].data[kLen - 1], static_cast<uint8_t>(seq));
      }
    }
    ASSERT_EQ(next_received, next_sent) << "round " << round << ": datagrams lost";
  }
  // And the way back still works.
  const std::vector<uint8_t> pong(100, 0x5a);
  const TxDatagram back{a[0]->local_endpoint(), pong};
  SendAll(*b[0], {&back, 1});
  auto reply = ReceiveN(*a[0], 1);
  ASSERT_EQ(reply.size(), 1u);
  EXPECT_EQ(reply[0].second, pong);
}

TEST_P(TransportConformanceTest, ReceiveWaitsForItsTimeoutAndWakeEndsAWaitEarly) {
  auto b = Open(true, 1, 2048, true);
  ASSERT_FALSE(b.empty());
  std::vector<RxDatagram> rx(4);
  auto start = std::chrono::steady_clock::now();
  auto r = b[0]->Receive(rx, milliseconds(60));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(50));
  EXPECT_EQ(*b[0]->Receive(rx, milliseconds(0)), 0u);
  std::thread waker([&] {
    std::this_thread::sleep_for(milliseconds(50));
    b[0]->Wake();
  });
  start = std::chrono::steady_clock::now();
  r = b[0]->Receive(rx, std::chrono::hours(48));  // "until data or Wake()"
  waker.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportConformanceTest, ::testing::ValuesIn(Backends()),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           std::string n = info.param.kind;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace switchml::transport
