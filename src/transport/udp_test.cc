#include "transport/udp.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace switchml::transport {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::unique_ptr<Transport> OpenLoopback(uint16_t port = 0) {
  UdpOptions options;
  options.bind_ipv4 = kLoopbackIpv4;
  options.port = port;
  auto t = OpenUdp(options);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<uint8_t> Payload(uint32_t index) {
  std::vector<uint8_t> p(8 + index % 1200);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(index * 31 + i);
  p[0] = static_cast<uint8_t>(index >> 24);
  p[1] = static_cast<uint8_t>(index >> 16);
  p[2] = static_cast<uint8_t>(index >> 8);
  p[3] = static_cast<uint8_t>(index);
  return p;
}

TEST(UdpTransportTest, BatchesOfDatagramsArriveWithExactContentsAndSource) {
  auto a = OpenLoopback();
  auto b = OpenLoopback();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->local_endpoint().ipv4, kLoopbackIpv4);
  EXPECT_NE(a->local_endpoint().port, 0);

  constexpr uint32_t kCount = 2000;
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < kCount; ++i) payloads.push_back(Payload(i));
  std::vector<TxDatagram> tx;
  for (const auto& p : payloads) tx.push_back({b->local_endpoint(), p});

  std::vector<std::vector<uint8_t>> storage(100, std::vector<uint8_t>(2048));
  std::vector<RxDatagram> rx(storage.size());
  for (size_t i = 0; i < rx.size(); ++i) rx[i].buffer = storage[i];

  // Interleave sending (in chunks of up to 256) and receiving so the receive buffer never fills.
  size_t sent = 0, received = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (received < kCount) {
    ASSERT_LT(Clock::now(), deadline) << "received " << received << " of " << kCount;
    if (sent < kCount) {
      const size_t n = std::min<size_t>(256, kCount - sent);
      auto taken = a->Send(std::span<const TxDatagram>(tx).subspan(sent, n));
      ASSERT_TRUE(taken.ok()) << taken.status().ToString();
      sent += *taken;
    }
    auto got = b->Receive(rx, milliseconds(100));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_LE(*got, rx.size());
    for (size_t i = 0; i < *got; ++i) {
      ASSERT_LT(received, kCount);
      const auto& expected = payloads[received];
      ASSERT_FALSE(rx[i].truncated);
      ASSERT_EQ(rx[i].source, a->local_endpoint());
      ASSERT_EQ(std::vector<uint8_t>(rx[i].buffer.begin(), rx[i].buffer.begin() + rx[i].length),
                expected)
          << "datagram " << received;
      ++received;
    }
  }
  UdpCounters counters;
  ASSERT_TRUE(GetUdpCounters(*a, &counters));
  EXPECT_EQ(counters.datagrams_sent, kCount);
  ASSERT_TRUE(GetUdpCounters(*b, &counters));
  EXPECT_EQ(counters.datagrams_received, kCount);
  EXPECT_EQ(counters.truncated, 0u);
}

TEST(UdpTransportTest, WakeUnblocksAReceive) {
  auto t = OpenLoopback();
  ASSERT_TRUE(t);
  std::vector<uint8_t> buf(64);
  std::vector<RxDatagram> rx(1);
  rx[0].buffer = buf;
  std::thread waker([&] {
    std::this_thread::sleep_for(milliseconds(100));
    t->Wake();
  });
  const auto start = Clock::now();
  auto got = t->Receive(rx, std::chrono::seconds(60));
  const auto elapsed = Clock::now() - start;
  waker.join();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0u);
  EXPECT_LT(elapsed, std::chrono::seconds(20));
  // The wake was consumed: the next wait lasts its timeout.
  got = t->Receive(rx, milliseconds(30));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0u);
}

TEST(UdpTransportTest, TimeoutReturnsZeroWithinABound) {
  auto t = OpenLoopback();
  ASSERT_TRUE(t);
  std::vector<uint8_t> buf(64);
  std::vector<RxDatagram> rx(4);
  for (auto& r : rx) r.buffer = buf;
  auto start = Clock::now();
  auto got = t->Receive(rx, milliseconds(0));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0u);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));

  start = Clock::now();
  got = t->Receive(rx, milliseconds(200));
  const auto elapsed = Clock::now() - start;
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0u);
  EXPECT_GE(elapsed, milliseconds(150));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
}

TEST(UdpTransportTest, LongDatagramIsTruncatedAndFlagged) {
  auto a = OpenLoopback();
  auto b = OpenLoopback();
  ASSERT_TRUE(a && b);
  std::vector<uint8_t> payload = Payload(100);
  ASSERT_GT(payload.size(), 10u);
  TxDatagram tx{b->local_endpoint(), payload};
  ASSERT_EQ(*a->Send({&tx, 1}), 1u);
  std::vector<uint8_t> small(10);
  RxDatagram rx;
  rx.buffer = small;
  auto got = b->Receive({&rx, 1}, std::chrono::seconds(10));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(*got, 1u);
  EXPECT_TRUE(rx.truncated);
  EXPECT_EQ(rx.length, 10u);
  EXPECT_EQ(small, std::vector<uint8_t>(payload.begin(), payload.begin() + 10));
  UdpCounters counters;
  ASSERT_TRUE(GetUdpCounters(*b, &counters));
  EXPECT_EQ(counters.truncated, 1u);
}

TEST(UdpTransportTest, BadDestinationIsCountedAndSkipped) {
  auto a = OpenLoopback();
  auto b = OpenLoopback();
  ASSERT_TRUE(a && b);
  const uint8_t byte = 42;
  // Port 0 is not a valid destination; a closed port on loopback is silently unreachable.
  TxDatagram tx[3] = {{Endpoint{kLoopbackIpv4, 0}, {&byte, 1}},
                      {Endpoint{kLoopbackIpv4, 9}, {&byte, 1}},
                      {b->local_endpoint(), {&byte, 1}}};
  auto taken = a->Send(tx);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_EQ(*taken, 3u);
  uint8_t got_byte = 0;
  RxDatagram rx;
  rx.buffer = {&got_byte, 1};
  auto got = b->Receive({&rx, 1}, std::chrono::seconds(10));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 1u);
  EXPECT_EQ(got_byte, 42);
  UdpCounters counters;
  ASSERT_TRUE(GetUdpCounters(*a, &counters));
  EXPECT_EQ(counters.send_errors + counters.datagrams_sent, 3u);
  // Later receives on the sender are not broken by any ICMP error.
  got = a->Receive({&rx, 1}, milliseconds(20));
  EXPECT_TRUE(got.ok()) << got.status().ToString();
}

TEST(UdpTransportTest, PortInUseErrorNamesTheAddressAndTheFix) {
  auto a = OpenLoopback();
  ASSERT_TRUE(a);
  UdpOptions options;
  options.bind_ipv4 = kLoopbackIpv4;
  options.port = a->local_endpoint().port;
  auto b = OpenUdp(options);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  const std::string m = b.status().message();
  EXPECT_NE(m.find(a->local_endpoint().ToString()), std::string::npos) << m;
  EXPECT_NE(m.find("in use"), std::string::npos) << m;
  EXPECT_NE(m.find("port 0"), std::string::npos) << m;
}

TEST(UdpTransportTest, NonLocalAddressAndBadOptionsAreInvalidArguments) {
  UdpOptions options;
  options.bind_ipv4 = 0xc0000201;  // 192.0.2.1, TEST-NET-1: not an address of this host
  auto t = OpenUdp(options);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("192.0.2.1"), std::string::npos) << t.status().message();

  options = UdpOptions{};
  options.max_batch = 0;
  t = OpenUdp(options);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
}

TEST(UdpTransportTest, ConsecutivePortsWithARandomBase) {
  UdpOptions options;
  options.bind_ipv4 = kLoopbackIpv4;
  auto ts = OpenUdpConsecutive(options, 4);
  ASSERT_TRUE(ts.ok()) << ts.status().ToString();
  ASSERT_EQ(ts->size(), 4u);
  const uint16_t base = (*ts)[0]->local_endpoint().port;
  EXPECT_GE(base, 20000);
  EXPECT_LT(base, 32000);
  for (size_t i = 0; i < ts->size(); ++i) {
    EXPECT_EQ((*ts)[i]->local_endpoint().port, base + i);
  }
}

TEST(UdpTransportTest, ConsecutivePortsWithAGivenBaseFailWhenOneIsTaken) {
  UdpOptions options;
  options.bind_ipv4 = kLoopbackIpv4;
  auto first = OpenUdpConsecutive(options, 3);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const uint16_t base = (*first)[0]->local_endpoint().port;
  // Ports base+1 and base+2 are held by `first`; a range starting at base - 1 reaches them.
  options.port = static_cast<uint16_t>(base - 1);
  auto second = OpenUdpConsecutive(options, 3);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  options.port = 65534;
  auto too_high = OpenUdpConsecutive(options, 3);
  ASSERT_FALSE(too_high.ok());
  EXPECT_EQ(too_high.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(OpenUdpConsecutive(options, 0).ok());
}

}  // namespace
}  // namespace switchml::transport
