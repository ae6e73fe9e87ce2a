#include "transport/udp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace switchml::transport {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::unique_ptr<Transport> OpenLoopback(uint16_t port = 0, bool offloads = true) {
  TransportOptions options;
  options.bind_ipv4 = kLoopbackIpv4;
  options.port = port;
  options.udp.gso = offloads;
  options.udp.gro = offloads;
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

// Sends payloads a -> b in chunks of up to 256 interleaved with receives (so the receive buffer
// never fills) and checks that every datagram arrives once, in order, whole, from a. rx_batch is
// the receive batch size.
void ExpectDelivered(Transport& a, Transport& b, const std::vector<std::vector<uint8_t>>& payloads,
                     size_t rx_batch) {
  const size_t count = payloads.size();
  std::vector<TxDatagram> tx;
  for (const auto& p : payloads) tx.push_back({b.local_endpoint(), p});
  std::vector<RxDatagram> rx(rx_batch);

  // Interleave sending (in chunks of up to 256) and receiving so the receive buffer never fills.
  size_t sent = 0, received = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (received < count) {
    ASSERT_LT(Clock::now(), deadline) << "received " << received << " of " << count;
    if (sent < count) {
      const size_t n = std::min<size_t>(256, count - sent);
      auto taken = a.Send(std::span<const TxDatagram>(tx).subspan(sent, n));
      ASSERT_TRUE(taken.ok()) << taken.status().ToString();
      sent += *taken;
    }
    auto got = b.Receive(rx, milliseconds(100));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_LE(*got, rx.size());
    for (size_t i = 0; i < *got; ++i) {
      ASSERT_LT(received, count);
      const auto& expected = payloads[received];
      ASSERT_FALSE(rx[i].truncated);
      ASSERT_EQ(rx[i].source, a.local_endpoint());
      ASSERT_EQ(std::vector<uint8_t>(rx[i].data.begin(), rx[i].data.end()), expected)
          << "datagram " << received;
      ++received;
    }
  }
  EXPECT_EQ(a.counters().datagrams_sent, count);
  EXPECT_EQ(b.counters().datagrams_received, count);
  EXPECT_EQ(b.counters().truncated, 0u);
}

// Runs each test with the segmentation offloads (where the kernel has them) and without.
class UdpPathTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<Transport> Open() { return OpenLoopback(0, GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Offloads, UdpPathTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "GsoGro" : "Plain"; });

TEST_P(UdpPathTest, BatchesOfDatagramsOfMixedSizesArriveWithExactContentsAndSource) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->local_endpoint().ipv4, kLoopbackIpv4);
  EXPECT_NE(a->local_endpoint().port, 0);
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < 2000; ++i) payloads.push_back(Payload(i));
  ExpectDelivered(*a, *b, payloads, 100);
}

TEST_P(UdpPathTest, RunsOfEqualDatagramsArriveWholeEvenInSmallReceiveBatches) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  // Runs of equal-length datagrams (what a segmented send carries), of several lengths, some
  // longer than one segmented send can hold (64 datagrams or 64 KiB).
  std::vector<std::vector<uint8_t>> payloads;
  uint32_t index = 0;
  for (size_t length : {1034u, 266u, 1034u, 9u, 2000u}) {
    for (int k = 0; k < 150; ++k, ++index) {
      std::vector<uint8_t> p(length);
      for (size_t i = 0; i < length; ++i) p[i] = static_cast<uint8_t>(index * 7 + i);
      payloads.push_back(std::move(p));
    }
  }
  // A receive batch of 5 splits coalesced runs across calls.
  ExpectDelivered(*a, *b, payloads, 5);
  if (GetParam()) {
    EXPECT_GT(a->counters().segmented_sends, 0u) << a->name();
    EXPECT_LT(a->counters().send_calls, payloads.size() / 10);
    EXPECT_GT(b->counters().coalesced_receives, 0u) << b->name();
  } else {
    EXPECT_EQ(a->counters().segmented_sends, 0u);
    EXPECT_EQ(b->counters().coalesced_receives, 0u);
  }
}

TEST_P(UdpPathTest, LentTxBuffersAreStableAndSendable) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  std::vector<TxDatagram> tx;
  for (size_t i = 0; i < 100; ++i) {
    std::span<uint8_t> buf = a->TxBuffer(i);
    ASSERT_GE(buf.size(), 2048u);
    EXPECT_EQ(buf.data(), a->TxBuffer(i).data());
    std::fill(buf.begin(), buf.begin() + 1000, static_cast<uint8_t>(i));
    tx.push_back({b->local_endpoint(), buf.first(1000)});
  }
  size_t sent = 0;
  for (int attempt = 0; sent < tx.size() && attempt < 100; ++attempt) {
    sent += *a->Send(std::span<const TxDatagram>(tx).subspan(sent));
  }
  ASSERT_EQ(sent, tx.size());
  std::vector<RxDatagram> rx(16);
  size_t received = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (received < tx.size() && Clock::now() < deadline) {
    auto got = b->Receive(rx, milliseconds(100));
    ASSERT_TRUE(got.ok());
    for (size_t i = 0; i < *got; ++i, ++received) {
      ASSERT_EQ(rx[i].data.size(), 1000u);
      EXPECT_EQ(rx[i].data[999], static_cast<uint8_t>(received));
    }
  }
  EXPECT_EQ(received, tx.size());
}

TEST_P(UdpPathTest, WakeUnblocksAReceive) {
  auto t = Open();
  ASSERT_TRUE(t);
  std::vector<RxDatagram> rx(1);
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

// After a receive that drained the queue, a waiting Receive goes to poll first (udp.cc,
// TryBeforeWaiting): datagrams that come while it waits, or that came before it was called,
// are still received at once, every round (more rounds than the transport's probe period), and
// a zero-timeout Receive on an empty queue returns nothing.
TEST_P(UdpPathTest, DatagramsAfterADrainedQueueArriveWhetherSentBeforeOrDuringTheWait) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  std::vector<RxDatagram> rx(8);
  const std::vector<uint8_t> payload(100, 7);
  const TxDatagram d{b->local_endpoint(), payload};
  for (int round = 0; round < 40; ++round) {
    auto none = b->Receive(rx, milliseconds(0));
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(*none, 0u) << "round " << round;
    std::thread sender;
    if (round % 2 == 0) {
      // Sent while the receiver waits.
      sender = std::thread([&] {
        std::this_thread::sleep_for(milliseconds(2));
        ASSERT_EQ(*a->Send(std::span(&d, 1)), 1u);
      });
    } else {
      // Sent (and queued) before it is called.
      ASSERT_EQ(*a->Send(std::span(&d, 1)), 1u);
      std::this_thread::sleep_for(milliseconds(1));
    }
    const auto start = Clock::now();
    auto got = b->Receive(rx, std::chrono::seconds(20));
    const auto elapsed = Clock::now() - start;
    if (sender.joinable()) sender.join();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(*got, 1u) << "round " << round;
    EXPECT_EQ(rx[0].data.size(), payload.size());
    EXPECT_LT(elapsed, std::chrono::seconds(10)) << "round " << round;
  }
  EXPECT_EQ(b->counters().datagrams_received, 40u);
}

// A transport that joined a (loopback) multicast group receives from both of its sockets: a
// zero-timeout Receive finds what is queued on either (one poll names the readable ones), and a
// waiting Receive wakes for either.
TEST_P(UdpPathTest, GroupAndUnicastDatagramsBothArrive) {
  auto member = Open();
  auto sender = Open();
  ASSERT_TRUE(member && sender);
  const Endpoint group{0xefc0f00du, static_cast<uint16_t>(member->local_endpoint().port ^ 0x5a5a)};
  const Status joined = member->JoinGroup(group, 0);
  if (!joined.ok()) GTEST_SKIP() << "no loopback multicast here: " << joined.ToString();
  std::vector<RxDatagram> rx(8);
  const std::vector<uint8_t> to_group(64, 1), to_member(32, 2);
  const TxDatagram g{group, to_group}, u{member->local_endpoint(), to_member};
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (int round = 0; round < 20; ++round) {
    const bool zero_timeout = round % 2 == 0;
    ASSERT_EQ(*sender->Send(std::span(&g, 1)), 1u);
    ASSERT_EQ(*sender->Send(std::span(&u, 1)), 1u);
    if (zero_timeout) std::this_thread::sleep_for(milliseconds(2));
    size_t group_bytes = 0, unicast_bytes = 0;
    while ((group_bytes == 0 || unicast_bytes == 0) && Clock::now() < deadline) {
      auto got = member->Receive(rx, zero_timeout ? milliseconds(0) : milliseconds(100));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (size_t i = 0; i < *got; ++i) {
        (rx[i].data.size() == to_group.size() ? group_bytes : unicast_bytes) += rx[i].data.size();
      }
    }
    ASSERT_EQ(group_bytes, to_group.size()) << "round " << round;
    ASSERT_EQ(unicast_bytes, to_member.size()) << "round " << round;
  }
  EXPECT_EQ(member->counters().group_datagrams_received, 20u);
  EXPECT_EQ(member->counters().datagrams_received, 40u);
}

TEST(UdpTransportTest, TimeoutReturnsZeroWithinABound) {
  auto t = OpenLoopback();
  ASSERT_TRUE(t);
  std::vector<RxDatagram> rx(4);
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

TEST_P(UdpPathTest, LongDatagramIsTruncatedAndFlagged) {
  auto a = Open();
  TransportOptions options;
  options.bind_ipv4 = kLoopbackIpv4;
  options.max_datagram_bytes = 10;
  options.udp.gso = options.udp.gro = GetParam();
  auto b = std::move(OpenUdp(options)).value();
  std::vector<uint8_t> payload = Payload(100);
  ASSERT_GT(payload.size(), 10u);
  // Two long ones (which a coalescing receive may join) and a short one.
  TxDatagram tx[3] = {{b->local_endpoint(), payload},
                      {b->local_endpoint(), payload},
                      {b->local_endpoint(), std::span(payload).first(5)}};
  ASSERT_EQ(*a->Send(tx), 3u);
  std::vector<RxDatagram> rx(3);
  size_t got = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (got < 3 && Clock::now() < deadline) {
    auto r = b->Receive(std::span(rx).subspan(got), milliseconds(100));
    ASSERT_TRUE(r.ok());
    got += *r;
  }
  ASSERT_EQ(got, 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(rx[i].truncated);
    EXPECT_EQ(std::vector<uint8_t>(rx[i].data.begin(), rx[i].data.end()),
              std::vector<uint8_t>(payload.begin(), payload.begin() + 10));
  }
  EXPECT_FALSE(rx[2].truncated);
  EXPECT_EQ(rx[2].data.size(), 5u);
  EXPECT_EQ(b->counters().truncated, 2u);
}

TEST_P(UdpPathTest, BadDestinationIsCountedAndSkipped) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  const uint8_t byte = 42;
  // Port 0 is not a valid destination; a closed port on loopback is silently unreachable.
  TxDatagram tx[3] = {{Endpoint{kLoopbackIpv4, 0}, {&byte, 1}},
                      {Endpoint{kLoopbackIpv4, 9}, {&byte, 1}},
                      {b->local_endpoint(), {&byte, 1}}};
  auto taken = a->Send(tx);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_EQ(*taken, 3u);
  RxDatagram rx;
  auto got = b->Receive({&rx, 1}, std::chrono::seconds(10));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(*got, 1u);
  ASSERT_EQ(rx.data.size(), 1u);
  EXPECT_EQ(rx.data[0], 42);
  const TransportCounters counters = a->counters();
  EXPECT_EQ(counters.send_errors + counters.datagrams_sent, 3u);
  // Later receives on the sender are not broken by any ICMP error.
  got = a->Receive({&rx, 1}, milliseconds(20));
  EXPECT_TRUE(got.ok()) << got.status().ToString();
}

TEST(UdpTransportTest, PortInUseErrorNamesTheAddressAndTheFix) {
  auto a = OpenLoopback();
  ASSERT_TRUE(a);
  TransportOptions options;
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
  TransportOptions options;
  options.bind_ipv4 = 0xc0000201;  // 192.0.2.1, TEST-NET-1: not an address of this host
  auto t = OpenUdp(options);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("192.0.2.1"), std::string::npos) << t.status().message();

  options = TransportOptions{};
  options.max_batch = 0;
  t = OpenUdp(options);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
}

TEST(UdpTransportTest, ConsecutivePortsWithARandomBase) {
  TransportOptions options;
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
  TransportOptions options;
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
