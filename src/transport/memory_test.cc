#include "transport/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace switchml::transport {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr Endpoint kA{0x0a000001, 1000};
constexpr Endpoint kB{0x0a000002, 2000};

std::vector<uint8_t> Encode(uint32_t v) {
  std::vector<uint8_t> p(4);
  std::memcpy(p.data(), &v, 4);
  return p;
}

uint32_t Decode(const RxDatagram& d) {
  uint32_t v = 0;
  std::memcpy(&v, d.data.data(), 4);
  return v;
}

// Sends `count` numbered datagrams a -> b, one Send per datagram.
void SendNumbered(Transport& a, Endpoint to, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    std::vector<uint8_t> p = Encode(i);
    TxDatagram tx{to, p};
    auto taken = a.Send({&tx, 1});
    ASSERT_TRUE(taken.ok());
    ASSERT_EQ(*taken, 1u);
  }
}

// Receives until the queue is empty; returns the numbers in arrival order.
std::vector<uint32_t> DrainNumbers(Transport& b, Endpoint expected_source) {
  std::vector<uint32_t> got;
  std::vector<RxDatagram> rx(64);
  for (;;) {
    auto n = b.Receive(rx, milliseconds(0));
    EXPECT_TRUE(n.ok());
    if (!n.ok() || *n == 0) return got;
    for (size_t i = 0; i < *n; ++i) {
      EXPECT_EQ(rx[i].data.size(), 4u);
      EXPECT_EQ(rx[i].source, expected_source);
      got.push_back(Decode(rx[i]));
    }
  }
}

TEST(MemoryNetworkTest, WithoutFaultsDeliversEverythingInOrder) {
  MemoryNetwork network{FaultOptions{}};
  auto a = network.Attach(kA);
  auto b = network.Attach(kB);
  EXPECT_EQ(a->local_endpoint(), kA);

  // One batched Send as well as single ones.
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < 500; ++i) payloads.push_back(Encode(i));
  std::vector<TxDatagram> tx;
  for (const auto& p : payloads) tx.push_back({kB, p});
  ASSERT_EQ(*a->Send(tx), 500u);
  std::vector<uint32_t> got = DrainNumbers(*b, kA);
  ASSERT_EQ(got.size(), 500u);
  for (uint32_t i = 0; i < 500; ++i) EXPECT_EQ(got[i], i);

  SendNumbered(*a, kB, 100);
  got = DrainNumbers(*b, kA);
  ASSERT_EQ(got.size(), 100u);
  for (uint32_t i = 0; i < 100; ++i) EXPECT_EQ(got[i], i);

  MemoryNetworkCounters c = network.counters();
  EXPECT_EQ(c.delivered, 600u);
  EXPECT_EQ(c.dropped, 0u);
  EXPECT_EQ(c.duplicated, 0u);
  EXPECT_EQ(c.reordered, 0u);
}

TEST(MemoryNetworkTest, FaultRatesMatchTheConfiguration) {
  FaultOptions faults;
  faults.loss = 0.1;
  faults.duplicate = 0.05;
  faults.reorder = 0.2;
  faults.seed = 42;
  MemoryNetwork network(faults);
  auto a = network.Attach(kA);
  auto b = network.Attach(kB);
  constexpr uint32_t kCount = 10000;
  SendNumbered(*a, kB, kCount);
  const MemoryNetworkCounters c = network.counters();
  // Expected: 1000 dropped, 450 duplicated, about 1890 reordered; bounds are ~5 sigma.
  EXPECT_NEAR(static_cast<double>(c.dropped), 1000, 150);
  EXPECT_NEAR(static_cast<double>(c.duplicated), 450, 110);
  EXPECT_NEAR(static_cast<double>(c.reordered), 0.2 * static_cast<double>(c.delivered), 200);
  EXPECT_EQ(c.delivered, kCount - c.dropped + c.duplicated);

  std::vector<uint32_t> got = DrainNumbers(*b, kA);
  ASSERT_EQ(got.size(), c.delivered);
  std::vector<int> copies(kCount, 0);
  size_t inversions = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LT(got[i], kCount);
    ++copies[got[i]];
    if (i > 0 && got[i] < got[i - 1]) ++inversions;
  }
  size_t missing = 0, doubled = 0;
  for (int n : copies) {
    ASSERT_LE(n, 2);
    missing += n == 0;
    doubled += n == 2;
  }
  EXPECT_EQ(missing, c.dropped);
  EXPECT_EQ(doubled, c.duplicated);
  EXPECT_GT(inversions, c.reordered / 2);
}

std::vector<uint32_t> RunScenario(uint64_t seed) {
  FaultOptions faults{0.2, 0.1, 0.3, seed};
  MemoryNetwork network(faults);
  auto a = network.Attach(kA);
  auto b = network.Attach(kB);
  std::vector<uint32_t> all;
  // Send and drain in rounds so that the order of receives interleaves with the faults.
  for (uint32_t round = 0; round < 20; ++round) {
    SendNumbered(*a, kB, 50 + round);
    std::vector<uint32_t> got = DrainNumbers(*b, kA);
    all.insert(all.end(), got.begin(), got.end());
  }
  return all;
}

TEST(MemoryNetworkTest, SameSeedGivesTheSameDeliveredSequence) {
  const std::vector<uint32_t> first = RunScenario(7);
  EXPECT_EQ(RunScenario(7), first);
  EXPECT_NE(RunScenario(8), first);
}

TEST(MemoryNetworkTest, UnattachedDestinationsAndDetachedTransportsCountAsDropped) {
  MemoryNetwork network{FaultOptions{}};
  auto a = network.Attach(kA);
  SendNumbered(*a, kB, 3);
  EXPECT_EQ(network.counters().dropped, 3u);
  {
    auto b = network.Attach(kB);
    SendNumbered(*a, kB, 2);  // queued, then discarded with b
  }
  SendNumbered(*a, kB, 1);
  EXPECT_EQ(network.counters().dropped, 4u);
  EXPECT_EQ(network.counters().delivered, 2u);
  auto b = network.Attach(kB);  // the endpoint is free again, with an empty queue
  EXPECT_TRUE(DrainNumbers(*b, kA).empty());
}

TEST(MemoryNetworkTest, PortZeroPicksDistinctFreePorts) {
  MemoryNetwork network{FaultOptions{}};
  auto a = network.Attach(Endpoint{kLoopbackIpv4, 0});
  auto b = network.Attach(Endpoint{kLoopbackIpv4, 0});
  EXPECT_NE(a->local_endpoint().port, 0);
  EXPECT_NE(b->local_endpoint().port, 0);
  EXPECT_NE(a->local_endpoint(), b->local_endpoint());
  SendNumbered(*a, b->local_endpoint(), 1);
  EXPECT_EQ(DrainNumbers(*b, a->local_endpoint()).size(), 1u);
}

TEST(MemoryNetworkTest, TruncatesLongDatagrams) {
  MemoryNetwork network{FaultOptions{}};
  auto a = network.Attach(kA);
  auto b = network.Attach(kB, /*max_datagram_bytes=*/4);
  std::vector<uint8_t> payload = {1, 2, 3, 4, 5, 6};
  TxDatagram tx{kB, payload};
  ASSERT_EQ(*a->Send({&tx, 1}), 1u);
  RxDatagram rx;
  ASSERT_EQ(*b->Receive({&rx, 1}, milliseconds(0)), 1u);
  EXPECT_TRUE(rx.truncated);
  ASSERT_EQ(rx.data.size(), 4u);
  EXPECT_EQ(rx.data[3], 4);
}

TEST(MemoryNetworkTest, ReceiveHonoursTimeoutAndWake) {
  MemoryNetwork network{FaultOptions{}};
  auto b = network.Attach(kB);
  RxDatagram rx;

  auto start = Clock::now();
  EXPECT_EQ(*b->Receive({&rx, 1}, milliseconds(0)), 0u);
  EXPECT_EQ(*b->Receive({&rx, 1}, milliseconds(100)), 0u);
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(90));
  EXPECT_LT(elapsed, std::chrono::seconds(10));

  std::thread waker([&] {
    std::this_thread::sleep_for(milliseconds(100));
    b->Wake();
  });
  start = Clock::now();
  EXPECT_EQ(*b->Receive({&rx, 1}, std::chrono::hours(1000)), 0u);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  waker.join();
}

TEST(MemoryNetworkTest, BlockedReceiveWakesForADatagramFromAnotherThread) {
  MemoryNetwork network{FaultOptions{}};
  auto a = network.Attach(kA);
  auto b = network.Attach(kB);
  constexpr uint32_t kPerSender = 2000;
  auto c = network.Attach(Endpoint{0x0a000003, 3000});
  std::thread s1([&] { SendNumbered(*a, kB, kPerSender); });
  std::thread s2([&] { SendNumbered(*c, kB, kPerSender); });
  std::vector<RxDatagram> rx(32);
  uint32_t from_a = 0, from_c = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (from_a + from_c < 2 * kPerSender && Clock::now() < deadline) {
    auto n = b->Receive(rx, milliseconds(500));
    ASSERT_TRUE(n.ok());
    for (size_t i = 0; i < *n; ++i) {
      // Each sender's datagrams stay in order.
      if (rx[i].source == kA) {
        EXPECT_EQ(Decode(rx[i]), from_a++);
      } else {
        EXPECT_EQ(Decode(rx[i]), from_c++);
      }
    }
  }
  s1.join();
  s2.join();
  EXPECT_EQ(from_a, kPerSender);
  EXPECT_EQ(from_c, kPerSender);
}

}  // namespace
}  // namespace switchml::transport

namespace switchml::transport {
namespace {

// Given the late fault on every copy with a span of 5, Expect each datagram to arrive only after
// 1 to 5 further sends, none lost, and the delays counted.
TEST(MemoryNetworkTest, LateCopiesArriveAfterLaterSends) {
  FaultOptions f;
  f.late = 1.0;
  f.late_span = 5;
  f.seed = 3;
  MemoryNetwork net(f);
  auto a = net.Attach(kA);
  auto b = net.Attach(kB);
  SendNumbered(*a, kB, 1);
  EXPECT_TRUE(DrainNumbers(*b, kA).empty());  // held back
  SendNumbered(*a, kB, 200);
  std::vector<uint32_t> got = DrainNumbers(*b, kA);
  EXPECT_GT(got.size(), 190u);  // the last few may still be held
  EXPECT_EQ(net.counters().delayed, 201u);
  EXPECT_FALSE(std::is_sorted(got.begin(), got.end()));
}

}  // namespace
}  // namespace switchml::transport
