#include "worker/session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

#include "quant/quantizer.h"

namespace switchml::worker {
namespace {

using std::chrono::milliseconds;

constexpr Nanos kT0{1'000'000'000};

// A datagram as the session sent it, decoded.
struct Sent {
  proto::Packet packet;
  std::vector<uint8_t> bytes;
};

std::vector<Sent> DrainTransmit(WorkerSession& s, Nanos now) {
  std::vector<Sent> out;
  std::vector<uint8_t> buf(proto::kMaxDatagramBytes);
  while (size_t n = s.PollTransmit(now, buf)) {
    Sent sent;
    sent.bytes.assign(buf.begin(), buf.begin() + n);
    EXPECT_EQ(proto::Decode(sent.bytes, &sent.packet), proto::DecodeError::kOk);
    out.push_back(std::move(sent));
  }
  return out;
}

// The switch's reply to a packet whose round it completed: same header, given sums/exponents.
std::vector<uint8_t> Reply(const proto::Packet& p, std::span<const int32_t> sums, int8_t e0 = 0,
                           int8_t e1 = 0) {
  proto::Packet r = p;
  r.header.e0 = e0;
  r.header.e1 = e1;
  std::copy(sums.begin(), sums.end(), r.values.begin());
  std::vector<uint8_t> bytes(proto::DatagramBytes(p.header.size));
  proto::Encode(r, bytes);
  return bytes;
}

std::vector<uint8_t> Echo(const proto::Packet& p) {
  return Reply(p, p.payload(), p.header.e0, p.header.e1);
}

SessionConfig SmallConfig(uint32_t window = 2) {
  SessionConfig c;
  c.num_workers = 1;
  c.slot_start = 10;
  c.window = window;
  c.size = proto::SizeCode::k256B;  // 64 elements
  return c;
}

TEST(WorkerSessionTest, ValidateRejectsBadConfigs) {
  SessionConfig c = SmallConfig();
  EXPECT_TRUE(c.Validate().ok());
  c.window = 0;
  EXPECT_FALSE(c.Validate().ok());
  c = SmallConfig();
  c.slot_start = proto::kMaxSlots - 1;
  EXPECT_NE(c.Validate().message().find("exceed"), std::string::npos);
  c = SmallConfig();
  c.size = proto::SizeCode::k512B;
  EXPECT_FALSE(c.Validate().ok());
  c = SmallConfig();
  c.retransmit.peer_timeout = milliseconds(1);
  EXPECT_FALSE(c.Validate().ok());
  c = SmallConfig();
  c.retransmit.min_timeout = Nanos{0};
  EXPECT_NE(c.Validate().message().find("min_timeout"), std::string::npos);
  c = SmallConfig();
  c.retransmit.max_timeout = c.retransmit.min_timeout / 2;
  EXPECT_NE(c.Validate().message().find("max_timeout"), std::string::npos);
}

// Given a window of 8 and 1000 packets answered in order, 1 us apart (far within the 10 ms RTO),
// Expect the session to hold no more timers than packets in flight, and its next deadline to be
// the oldest packet in flight's, not an answered one's. (Answered timers stayed until due: RTO x
// rate entries, here all 1000, and a wake-up at each of their deadlines.)
TEST(WorkerSessionTest, AnsweredTimersAreDroppedWithTheirResults) {
  WorkerSession s(SmallConfig(8));
  std::vector<int32_t> in(64 * 1000, 1), out(in.size());
  s.Start(Slice{5, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  std::vector<proto::Packet> in_flight;
  Nanos now = kT0;
  for (const Sent& p : DrainTransmit(s, now)) in_flight.push_back(p.packet);
  size_t answered = 0;
  while (!in_flight.empty()) {
    now += std::chrono::microseconds(1);
    s.HandleDatagram(Echo(in_flight.front()), now);
    in_flight.erase(in_flight.begin());
    ++answered;
    for (const Sent& p : DrainTransmit(s, now)) in_flight.push_back(p.packet);
    ASSERT_LE(s.timers_held(), 8u) << "after " << answered << " results";
    if (s.state() == WorkerSession::State::kRunning) {
      // The oldest packet in flight was sent (answered - 1) us after kT0 at the latest: its
      // deadline is beyond every answered packet's.
      ASSERT_GE(*s.PollTimeout(), kT0 + std::chrono::milliseconds(10) +
                                      std::chrono::microseconds(answered > 8 ? answered - 8 : 0))
          << "after " << answered << " results";
    }
  }
  EXPECT_EQ(answered, 1000u);
  EXPECT_EQ(s.state(), WorkerSession::State::kDone);
  EXPECT_TRUE(s.status().ok());
  EXPECT_EQ(s.counters().retransmitted, 0u);
}

// Given a window of 2 and an int32 slice of 130 elements (3 packets, the last with 2 elements),
// Expect packets 0 and 1 first on slots 10 and 11 set 0, packet 2 only after the result of
// packet 0, on slot 10 set 1, and the results copied to the output.
TEST(WorkerSessionTest, Int32SelfClockedWindow) {
  WorkerSession s(SmallConfig());
  std::vector<int32_t> in(130), out(130, -7);
  std::iota(in.begin(), in.end(), -60);
  s.Start(Slice{5, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  auto first = DrainTransmit(s, kT0);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].packet.header.tsi, 0u);
  EXPECT_EQ(first[0].packet.header.slot, (proto::SlotId{10, 0}));
  EXPECT_EQ(first[0].packet.header.job_number, 5);
  EXPECT_EQ(first[1].packet.header.slot, (proto::SlotId{11, 0}));
  EXPECT_EQ(first[1].packet.values[0], 4);  // in[64]
  EXPECT_TRUE(DrainTransmit(s, kT0).empty());

  s.HandleDatagram(Echo(first[0].packet), kT0);
  auto next = DrainTransmit(s, kT0);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].packet.header.tsi, 2u);
  EXPECT_EQ(next[0].packet.header.slot, (proto::SlotId{10, 1}));
  EXPECT_EQ(next[0].packet.values[0], 68);
  EXPECT_EQ(next[0].packet.values[1], 69);
  EXPECT_EQ(next[0].packet.values[2], 0);  // zero padding
  s.HandleDatagram(Echo(next[0].packet), kT0);
  EXPECT_EQ(s.state(), WorkerSession::State::kRunning);
  s.HandleDatagram(Echo(first[1].packet), kT0);
  ASSERT_EQ(s.state(), WorkerSession::State::kDone);
  EXPECT_TRUE(s.status().ok());
  EXPECT_EQ(out, in);
  EXPECT_EQ(s.counters().sent, 3u);
  EXPECT_EQ(s.counters().results, 3u);
}

// Given a result that already arrived, a second copy of it, a result of another all-reduce, one for
// a slot outside the session's range and a truncated datagram, Expect all four dropped and counted
// and the output untouched by them.
TEST(WorkerSessionTest, DropsDuplicateStaleForeignAndMalformedResults) {
  WorkerSession s(SmallConfig());
  std::vector<int32_t> in(128, 3), out(128, 0);
  s.Start(Slice{9, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  auto sent = DrainTransmit(s, kT0);
  ASSERT_EQ(sent.size(), 2u);
  std::vector<int32_t> sums(64, 6);
  s.HandleDatagram(Reply(sent[0].packet, sums), kT0);
  std::vector<int32_t> bad(64, 999);
  s.HandleDatagram(Reply(sent[0].packet, bad), kT0);  // duplicate
  EXPECT_EQ(s.counters().duplicates, 1u);
  proto::Packet stale = sent[1].packet;
  stale.header.job_number = 8;
  s.HandleDatagram(Reply(stale, bad), kT0);
  EXPECT_EQ(s.counters().stale, 1u);
  proto::Packet foreign = sent[1].packet;
  foreign.header.slot.index = 12;
  s.HandleDatagram(Reply(foreign, bad), kT0);
  EXPECT_EQ(s.counters().foreign_slot, 1u);
  auto truncated = Reply(sent[1].packet, bad);
  truncated.pop_back();
  s.HandleDatagram(truncated, kT0);
  EXPECT_EQ(s.counters().malformed, 1u);
  proto::Packet wrong_set = sent[1].packet;
  wrong_set.header.slot.set = 1;
  s.HandleDatagram(Reply(wrong_set, bad), kT0);
  EXPECT_EQ(s.counters().duplicates, 2u);
  EXPECT_EQ(s.state(), WorkerSession::State::kRunning);
  s.HandleDatagram(Reply(sent[1].packet, sums), kT0);
  ASSERT_EQ(s.state(), WorkerSession::State::kDone);
  EXPECT_EQ(out, std::vector<int32_t>(128, 6));
}

// Given a result that names a packet the session has queued but not sent yet (a forger that
// guessed the header), Expect it dropped as a duplicate and the packet still sent: the switch
// cannot complete that round without this worker's contribution.
TEST(WorkerSessionTest, ResultForAPacketNotYetSentIsDropped) {
  WorkerSession s(SmallConfig()), twin(SmallConfig());
  std::vector<int32_t> in(128, 3), out(128, 0), twin_out(128, 0);
  const Slice slice{9, DataType::kInt32, in.data(), out.data(), in.size(), 0};
  Slice twin_slice = slice;
  twin_slice.out = twin_out.data();
  s.Start(slice, kT0);
  twin.Start(twin_slice, kT0);
  auto guessed = DrainTransmit(twin, kT0);  // the same headers s is about to send
  ASSERT_EQ(guessed.size(), 2u);
  std::vector<int32_t> forged(64, 999);
  s.HandleDatagram(Reply(guessed[0].packet, forged), kT0);
  EXPECT_EQ(s.counters().duplicates, 1u);
  EXPECT_EQ(s.counters().results, 0u);
  auto sent = DrainTransmit(s, kT0);
  ASSERT_EQ(sent.size(), 2u) << "the queued packet must still be sent";
  EXPECT_EQ(sent[0].packet.header.tsi, guessed[0].packet.header.tsi);
  std::vector<int32_t> sums(64, 6);
  for (const Sent& p : sent) s.HandleDatagram(Reply(p.packet, sums), kT0);
  ASSERT_EQ(s.state(), WorkerSession::State::kDone);
  EXPECT_EQ(out, std::vector<int32_t>(128, 6));
}

// Given a packet whose result does not come back, Expect it re-sent unchanged (same bytes, same
// slot and set) once its timeout passes, not before.
TEST(WorkerSessionTest, RetransmitsUnchangedOnTimeout) {
  SessionConfig c = SmallConfig(1);
  c.retransmit.timeout = milliseconds(10);
  WorkerSession s(c);
  std::vector<int32_t> in(64, 1), out(64);
  s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  auto sent = DrainTransmit(s, kT0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(s.PollTimeout().has_value());
  EXPECT_EQ(*s.PollTimeout(), kT0 + milliseconds(10));
  s.HandleTimeout(kT0 + milliseconds(9));
  EXPECT_TRUE(DrainTransmit(s, kT0 + milliseconds(9)).empty());
  s.HandleTimeout(kT0 + milliseconds(10));
  auto again = DrainTransmit(s, kT0 + milliseconds(10));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].bytes, sent[0].bytes);
  EXPECT_EQ(s.counters().retransmitted, 1u);
  EXPECT_EQ(s.counters().timeouts, 1u);
  s.HandleDatagram(Echo(again[0].packet), kT0 + milliseconds(11));
  EXPECT_EQ(s.state(), WorkerSession::State::kDone);
}

// Given early retransmission after 2 later results, When packet 0's result is missing and the
// results of packets 1 and 2 (sent after it) arrive, Expect packet 0 re-sent unchanged at once,
// before its timeout, and only once early; without the option, nothing until the timeout.
TEST(WorkerSessionTest, EarlyRetransmissionWhenLaterResultsArrive) {
  for (uint32_t after : {0u, 2u}) {
    SCOPED_TRACE("early_retransmit_after " + std::to_string(after));
    SessionConfig c = SmallConfig(4);
    c.retransmit.timeout = milliseconds(10);
    c.retransmit.early_retransmit_after = after;
    WorkerSession s(c);
    std::vector<int32_t> in(64 * 8, 1), out(64 * 8);
    s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
    auto sent = DrainTransmit(s, kT0);
    ASSERT_EQ(sent.size(), 4u);
    const Nanos t1 = kT0 + milliseconds(1);
    s.HandleDatagram(Echo(sent[1].packet), t1);
    auto next = DrainTransmit(s, t1);  // packet 5 on slot 1; packet 0 not yet (1 later result)
    ASSERT_EQ(next.size(), 1u);
    EXPECT_EQ(next[0].packet.header.tsi, 5u);
    s.HandleDatagram(Echo(sent[2].packet), t1);
    next = DrainTransmit(s, t1);
    if (after == 0) {
      ASSERT_EQ(next.size(), 1u);  // packet 6 only
      EXPECT_EQ(s.counters().retransmitted, 0u);
      continue;
    }
    ASSERT_EQ(next.size(), 2u);
    EXPECT_EQ(next[0].bytes, sent[0].bytes);  // packet 0 again, unchanged, first in the queue
    EXPECT_EQ(next[1].packet.header.tsi, 6u);
    EXPECT_EQ(s.counters().early_retransmits, 1u);
    EXPECT_EQ(s.counters().retransmitted, 1u);
    EXPECT_EQ(s.counters().timeouts, 0u);
    // More later results: no second early re-send of packet 0.
    s.HandleDatagram(Echo(sent[3].packet), t1);
    s.HandleDatagram(Echo(next[1].packet), t1);
    for (const Sent& x : DrainTransmit(s, t1)) EXPECT_NE(x.packet.header.tsi, 0u);
    EXPECT_EQ(s.counters().early_retransmits, 1u);
    s.HandleDatagram(Echo(sent[0].packet), t1);
    EXPECT_EQ(s.counters().results, 5u);
  }
}

// Given early retransmission after 2 later results, When packet 0 was re-sent early and its
// result stays missing, Expect its timer to stay the first transmission's (the config's "the
// timer stays"): one timeout and one re-send per RTO. The early re-send used to arm a second
// timer for the same packet, so every RTO counted two timeouts and sent two re-sends of it (and
// the back-off counted twice as fast).
// Given a window of 4 striped over 2 switch hosts (slots 0-1 on host 0, 2-3 on host 1) and early
// retransmission after 1 later result, When host 1 answers packets 2 and 3 before host 0
// answers anything, Expect no early re-send of packets 0 and 1 (results of another host say
// nothing about them); with one host the same answers re-send both.
TEST(WorkerSessionTest, EarlyRetransmissionComparesResultsOfOneHostOnly) {
  for (uint32_t stripes : {1u, 2u}) {
    SCOPED_TRACE("stripes " + std::to_string(stripes));
    SessionConfig c = SmallConfig(4);
    c.slot_start = 0;
    c.retransmit.timeout = milliseconds(10);
    c.retransmit.early_retransmit_after = 1;
    c.stripes = stripes;
    WorkerSession s(c);
    std::vector<int32_t> in(64 * 4, 1), out(64 * 4);
    s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
    auto sent = DrainTransmit(s, kT0);
    ASSERT_EQ(sent.size(), 4u);
    const Nanos t1 = kT0 + milliseconds(1);
    s.HandleDatagram(Echo(sent[2].packet), t1);
    s.HandleDatagram(Echo(sent[3].packet), t1);
    EXPECT_EQ(s.counters().early_retransmits, stripes == 1 ? 2u : 0u);
  }
}

TEST(WorkerSessionTest, EarlyRetransmissionArmsNoSecondTimer) {
  SessionConfig c = SmallConfig(4);
  c.retransmit.timeout = milliseconds(10);
  c.retransmit.early_retransmit_after = 2;
  WorkerSession s(c);
  std::vector<int32_t> in(64 * 8, 1), out(64 * 8);
  s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  auto sent = DrainTransmit(s, kT0);
  ASSERT_EQ(sent.size(), 4u);
  const Nanos t1 = kT0 + milliseconds(1);
  s.HandleDatagram(Echo(sent[1].packet), t1);
  s.HandleDatagram(Echo(sent[2].packet), t1);
  std::vector<Sent> next = DrainTransmit(s, t1);
  ASSERT_EQ(next.size(), 3u);  // packets 5, 0 (early) and 6
  ASSERT_EQ(s.counters().early_retransmits, 1u);
  ASSERT_EQ(s.counters().retransmitted, 1u);
  // Answer everything but packet 0 (the later packets keep their own timers quiet).
  s.HandleDatagram(Echo(sent[3].packet), t1);
  for (const Sent& x : next) {
    if (x.packet.header.tsi != 0) s.HandleDatagram(Echo(x.packet), t1);
  }
  std::vector<Sent> more = DrainTransmit(s, t1);
  for (const Sent& x : more) s.HandleDatagram(Echo(x.packet), t1);
  ASSERT_TRUE(DrainTransmit(s, t1).empty());
  ASSERT_EQ(s.remaining(), 2u);  // packet 0, and packet 4 behind it on its slot
  const Nanos rto = s.counters().rto;
  ASSERT_EQ(rto, milliseconds(10));
  // Packet 0's timer is its first transmission's: kT0 + RTO.
  s.HandleTimeout(kT0 + rto);
  ASSERT_EQ(DrainTransmit(s, kT0 + rto).size(), 1u);
  EXPECT_EQ(s.counters().timeouts, 1u);
  EXPECT_EQ(s.counters().retransmitted, 2u);
  // The early re-send's time plus an RTO: nothing is due.
  s.HandleTimeout(t1 + rto);
  EXPECT_TRUE(DrainTransmit(s, t1 + rto).empty());
  EXPECT_EQ(s.counters().timeouts, 1u);
  EXPECT_EQ(s.counters().retransmitted, 2u);
  // The next one is an RTO after the timeout's re-send, and it is the only one in that RTO.
  ASSERT_TRUE(s.PollTimeout().has_value());
  EXPECT_EQ(*s.PollTimeout(), kT0 + 2 * rto);
  for (Nanos t = kT0 + rto; t <= kT0 + 3 * rto - milliseconds(1); t += milliseconds(1)) {
    s.HandleTimeout(t);
    DrainTransmit(s, t);
  }
  EXPECT_EQ(s.counters().timeouts, 2u);
  EXPECT_EQ(s.counters().retransmitted, 3u);
  s.HandleDatagram(Echo(sent[0].packet), kT0 + 3 * rto);
  for (const Sent& x : DrainTransmit(s, kT0 + 3 * rto)) {
    s.HandleDatagram(Echo(x.packet), kT0 + 3 * rto);
  }
  EXPECT_EQ(s.state(), WorkerSession::State::kDone);
}

// Given `timeout_threshold` timeouts with no result in between, Expect the timeout to double.
TEST(WorkerSessionTest, BacksOffWhileNothingComesBack) {
  SessionConfig c = SmallConfig(8);  // one packet outstanding; the threshold is below the window
  c.retransmit.timeout = milliseconds(10);
  c.retransmit.timeout_threshold = 2;
  c.retransmit.timeout_threshold_increment = 2;
  WorkerSession s(c);
  std::vector<int32_t> in(64, 1), out(64);
  s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  Nanos now = kT0;
  DrainTransmit(s, now);
  std::vector<Nanos> gaps;
  for (int i = 0; i < 5; ++i) {
    Nanos next = *s.PollTimeout();
    gaps.push_back(next - now);
    now = next;
    s.HandleTimeout(now);
    ASSERT_EQ(DrainTransmit(s, now).size(), 1u);
  }
  // timeouts 1,2 at 10 ms; the 2nd doubles to 20 ms; threshold 4: the 4th doubles to 40 ms.
  EXPECT_EQ(gaps, (std::vector<Nanos>{milliseconds(10), milliseconds(10), milliseconds(20),
                                      milliseconds(20), milliseconds(40)}));
}

// Given a whole window timing out at once, Expect at most one doubling for that period; Expect
// the result of a re-sent packet not to undo it (Karn's rule: the next packet is timed with the
// doubled timeout), the first fresh round-trip sample to end it, and the next slice to start
// from the estimate that sample gave.
TEST(WorkerSessionTest, BackOffIsOncePerPeriodAndEndsWithAFreshSample) {
  SessionConfig c = SmallConfig(8);
  c.retransmit.timeout = milliseconds(10);
  c.retransmit.timeout_threshold = 4;
  WorkerSession s(c);
  std::vector<int32_t> in(64 * 16, 1), out(64 * 16);
  s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  auto first = DrainTransmit(s, kT0);
  ASSERT_EQ(first.size(), 8u);
  Nanos now = kT0 + milliseconds(10);
  s.HandleTimeout(now);  // 8 timeouts at once, threshold 4: one doubling only
  auto again = DrainTransmit(s, now);
  ASSERT_EQ(again.size(), 8u);
  EXPECT_EQ(*s.PollTimeout(), now + milliseconds(20));
  s.HandleDatagram(Echo(again[0].packet), now);
  auto next = DrainTransmit(s, now);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(*s.PollTimeout(), now + milliseconds(20));  // still 20 ms after the result
  EXPECT_EQ(s.counters().rtt_samples, 0u);
  EXPECT_EQ(s.counters().backoffs, 1u);
  // Packet 8 was sent once: its result 4 ms later is a sample (SRTT 4, RTTVAR 2, RTO 12 ms).
  s.HandleDatagram(Echo(next[0].packet), now + milliseconds(4));
  EXPECT_EQ(s.counters().rtt_samples, 1u);
  EXPECT_EQ(s.counters().rto, milliseconds(12));
  now += milliseconds(4);
  for (auto& p : again) s.HandleDatagram(Echo(p.packet), now);
  while (s.state() == WorkerSession::State::kRunning) {
    for (auto& p : DrainTransmit(s, now)) s.HandleDatagram(Echo(p.packet), now);
  }
  ASSERT_TRUE(s.status().ok());
  const Nanos rto = s.counters().rto;
  s.Start(Slice{2, DataType::kInt32, in.data(), out.data(), 64, 0}, now);
  ASSERT_EQ(DrainTransmit(s, now).size(), 1u);
  EXPECT_EQ(*s.PollTimeout(), now + rto);
}

// Runs slices against a one-worker "switch" that echoes every packet after rtt(packet, n), n
// counting the packets it saw (nullopt: dropped), in virtual time. Returns when the slice ends.
class EchoNetwork {
 public:
  using RttFn = std::function<std::optional<Nanos>(const proto::Packet&, uint64_t n)>;
  EchoNetwork(WorkerSession& s, RttFn rtt) : s_(s), rtt_(std::move(rtt)) {}

  void RunSlice(uint64_t allreduce, size_t count) {
    in_.assign(count, 1);
    out_.assign(count, 0);
    s_.Start(Slice{allreduce, DataType::kInt32, in_.data(), out_.data(), count, 0}, now_);
    for (int step = 0; s_.state() == WorkerSession::State::kRunning; ++step) {
      ASSERT_LT(step, 1'000'000);
      for (auto& p : DrainTransmit(s_, now_)) {
        if (auto d = rtt_(p.packet, seen_++)) flight_.emplace(now_ + *d, Echo(p.packet));
      }
      Nanos next = *s_.PollTimeout();
      if (!flight_.empty()) next = std::min(next, flight_.begin()->first);
      now_ = next;
      while (!flight_.empty() && flight_.begin()->first <= now_) {
        s_.HandleDatagram(flight_.begin()->second, now_);
        flight_.erase(flight_.begin());
      }
      if (s_.state() == WorkerSession::State::kRunning && *s_.PollTimeout() <= now_) {
        s_.HandleTimeout(now_);
      }
    }
    ASSERT_TRUE(s_.status().ok()) << s_.status().ToString();
    EXPECT_EQ(out_, in_);
  }
  Nanos now() const { return now_; }

 private:
  WorkerSession& s_;
  RttFn rtt_;
  Nanos now_ = kT0;
  uint64_t seen_ = 0;
  std::multimap<Nanos, std::vector<uint8_t>> flight_;
  std::vector<int32_t> in_, out_;
};

SessionConfig EstimatorConfig(uint32_t window = 1) {
  SessionConfig c = SmallConfig(window);
  c.retransmit.timeout = milliseconds(100);
  c.retransmit.min_timeout = std::chrono::microseconds(1);
  c.retransmit.clock_granularity = std::chrono::microseconds(1);
  return c;
}

// Given round trips of 4, 8 and 2 ms, Expect SRTT, RTTVAR and the RTO of RFC 6298: the first
// sample gives SRTT = R, RTTVAR = R/2; later ones RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R| and
// SRTT = 7/8 SRTT + 1/8 R; RTO = SRTT + max(G, 4 RTTVAR). Expect the next packet timed with it.
TEST(WorkerSessionTest, RttEstimateFollowsRfc6298) {
  WorkerSession s(EstimatorConfig());
  const std::vector<Nanos> rtts = {milliseconds(4), milliseconds(8), milliseconds(2)};
  // The configured timeout before any sample.
  EXPECT_EQ(s.counters().rto, milliseconds(100));
  std::vector<std::tuple<double, double, double>> seen;  // (SRTT, RTTVAR, RTO) in ms
  std::vector<int32_t> in(64 * 4, 1), out(in.size());
  s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  Nanos now = kT0;
  for (Nanos rtt : rtts) {
    auto sent = DrainTransmit(s, now);
    ASSERT_EQ(sent.size(), 1u);
    now += rtt;
    s.HandleDatagram(Echo(sent[0].packet), now);
    const SessionCounters& c = s.counters();
    seen.emplace_back(c.srtt.count() / 1e6, c.rttvar.count() / 1e6, c.rto.count() / 1e6);
  }
  using T = std::tuple<double, double, double>;
  EXPECT_EQ(seen, (std::vector<T>{T{4, 2, 12}, T{4.5, 2.5, 14.5}, T{4.1875, 2.5, 14.1875}}));
  EXPECT_EQ(s.counters().rtt_samples, 3u);
  ASSERT_EQ(DrainTransmit(s, now).size(), 1u);
  // (Timers of answered packets fire without effect.)
  while (*s.PollTimeout() < now + Nanos{14'187'500}) s.HandleTimeout(*s.PollTimeout());
  EXPECT_EQ(*s.PollTimeout(), now + Nanos{14'187'500});
  EXPECT_EQ(s.counters().timeouts, 0u);
}

// Given a window of 4 (four samples per round trip) and equal round trips of 2 ms after the
// first, Expect RTTVAR to fall once per four samples (1 ms -> 0.75^3 ms after 12 more), not at
// every sample; and one sample deviating by 1 ms to raise it at once, as RFC 6298 would.
TEST(WorkerSessionTest, RttVarFallsOncePerWindowOfSamplesAndRisesAtOnce) {
  WorkerSession s(EstimatorConfig(4));
  EchoNetwork net(s, [](const proto::Packet&, uint64_t n) {
    return n == 13 ? milliseconds(3) : milliseconds(2);
  });
  net.RunSlice(1, 64 * 13);
  EXPECT_EQ(s.counters().srtt, milliseconds(2));
  EXPECT_EQ(s.counters().rttvar, Nanos{421'875});  // 0.75^3 ms
  EXPECT_EQ(s.counters().rto, Nanos{3'687'500});
  net.RunSlice(2, 64);                             // packet 13: 3 ms
  EXPECT_EQ(s.counters().rttvar, Nanos{566'406});  // 3/4 0.421875 + 1/4 ms
  EXPECT_EQ(s.counters().srtt, Nanos{2'125'000});  // 7/8 2 + 3/8 ms
}

// Given a packet that timed out and was re-sent, Expect its result, however quick, not to be a
// sample (Karn's rule: it may answer either transmission), and the estimate unchanged.
TEST(WorkerSessionTest, NoRttSampleFromRetransmittedPackets) {
  WorkerSession s(EstimatorConfig());
  std::vector<int32_t> in(64 * 2, 1), out(in.size());
  s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  auto sent = DrainTransmit(s, kT0);
  s.HandleDatagram(Echo(sent[0].packet), kT0 + milliseconds(30));  // sample: 30 ms
  ASSERT_EQ(s.counters().rtt_samples, 1u);
  const SessionCounters before = s.counters();
  Nanos now = kT0 + milliseconds(30);
  sent = DrainTransmit(s, now);
  now += milliseconds(90);  // RTO = 30 + 4 * 15 ms: lost, re-sent
  s.HandleTimeout(now);
  ASSERT_EQ(DrainTransmit(s, now).size(), 1u);
  s.HandleDatagram(Echo(sent[0].packet), now + std::chrono::microseconds(10));
  ASSERT_EQ(s.state(), WorkerSession::State::kDone);
  EXPECT_EQ(s.counters().rtt_samples, 1u);
  EXPECT_EQ(s.counters().srtt, before.srtt);
  EXPECT_EQ(s.counters().rttvar, before.rttvar);
}

// Given a slot held up for 50 ms (as when a peer lost its packet and the round waited for the
// peer's retransmission) while the other slots' later packets come back within 1 ms, Expect its
// result counted out of order and not sampled: SRTT stays at the path's 1 ms.
TEST(WorkerSessionTest, ResultHeldUpBehindLaterOnesIsNoSample) {
  WorkerSession s(EstimatorConfig(4));
  EchoNetwork net(s, [](const proto::Packet&, uint64_t n) {
    return n == 0 ? milliseconds(50) : milliseconds(1);
  });
  net.RunSlice(1, 64 * 200);
  EXPECT_EQ(s.counters().rtt_out_of_order, 1u);
  EXPECT_EQ(s.counters().rtt_samples, 199u);
  EXPECT_EQ(s.counters().srtt, milliseconds(1));
  EXPECT_EQ(s.counters().retransmitted, 0u);
}

// Given round trips far below the floor and far above the ceiling, Expect the RTO clamped to
// min_timeout and to max_timeout (and to the progress timeout when that is lower), while SRTT
// still reports the measured round trip.
TEST(WorkerSessionTest, RtoIsClampedToFloorAndCeiling) {
  SessionConfig c = EstimatorConfig();
  c.retransmit.min_timeout = milliseconds(5);
  c.retransmit.max_timeout = milliseconds(200);
  c.retransmit.peer_timeout = std::chrono::seconds(10);
  WorkerSession s(c);
  EchoNetwork fast(s, [](const proto::Packet&, uint64_t) { return std::chrono::microseconds(20); });
  fast.RunSlice(1, 64 * 20);
  EXPECT_EQ(s.counters().srtt, std::chrono::microseconds(20));
  EXPECT_EQ(s.counters().rto, milliseconds(5));
  WorkerSession t(c);
  EchoNetwork slow(t, [](const proto::Packet&, uint64_t) { return milliseconds(150); });
  slow.RunSlice(1, 64 * 3);
  EXPECT_EQ(t.counters().srtt, milliseconds(150));
  EXPECT_EQ(t.counters().rto, milliseconds(200));  // 150 + 4 * 75 = 450, clamped
  c.retransmit.peer_timeout = milliseconds(120);
  WorkerSession u(c);
  EchoNetwork slower(u, [](const proto::Packet&, uint64_t) { return milliseconds(100); });
  slower.RunSlice(1, 64);
  EXPECT_EQ(u.counters().rto, milliseconds(120));
}

// Given many equal round trips, Expect RTTVAR to fade and the RTO to settle at SRTT + G.
TEST(WorkerSessionTest, RtoSettlesAtSrttPlusClockGranularity) {
  SessionConfig c = EstimatorConfig();
  c.retransmit.clock_granularity = milliseconds(1);
  WorkerSession s(c);
  EchoNetwork net(s, [](const proto::Packet&, uint64_t) { return milliseconds(3); });
  net.RunSlice(1, 64 * 100);
  EXPECT_EQ(s.counters().srtt, milliseconds(3));
  EXPECT_LT(s.counters().rttvar, std::chrono::microseconds(1));
  EXPECT_EQ(s.counters().rto, milliseconds(4));
}

// Given a first slice that measured 2 ms round trips, Expect the next slice (and a slice after
// an idle gap) to time its first packets with the RTO it ended with, not the configured timeout.
TEST(WorkerSessionTest, RtoCarriesOverAcrossSlices) {
  WorkerSession s(EstimatorConfig(4));
  EchoNetwork net(s, [](const proto::Packet&, uint64_t) { return milliseconds(2); });
  net.RunSlice(1, 64 * 40);
  const Nanos rto = s.counters().rto;
  EXPECT_LT(rto, milliseconds(5));
  const Nanos later = net.now() + std::chrono::seconds(3);
  std::vector<int32_t> in(64 * 4, 1), out(in.size());
  s.Start(Slice{2, DataType::kInt32, in.data(), out.data(), in.size(), 0}, later);
  ASSERT_EQ(DrainTransmit(s, later).size(), 4u);
  EXPECT_EQ(*s.PollTimeout(), later + rto);
}

// Given a round trip of 50 ms, five times the initial timeout, and a window of 16, Expect the
// back-off to lift the RTO above it within the first few windows (each whole window timing out
// doubles it once), the first fresh sample to set the estimate, and no retransmission after that
// (none at all in the next slice): no retransmission storm.
TEST(WorkerSessionTest, RoundTripAboveInitialTimeoutConvergesWithoutStorm) {
  SessionConfig c = EstimatorConfig(16);
  c.retransmit.timeout = milliseconds(10);
  WorkerSession s(c);
  EchoNetwork net(s, [](const proto::Packet&, uint64_t) { return milliseconds(50); });
  net.RunSlice(1, 64 * 16 * 20);  // 20 windows
  const SessionCounters first = s.counters();
  EXPECT_LE(first.retransmitted, 3u * 16);  // three windows: at 10 ms, 30 ms and 90 ms
  EXPECT_LE(first.backoffs, 3u);
  EXPECT_EQ(first.srtt, milliseconds(50));
  EXPECT_GT(first.rto, milliseconds(50));
  net.RunSlice(2, 64 * 16 * 20);
  EXPECT_EQ(s.counters().retransmitted, first.retransmitted);
  EXPECT_EQ(s.counters().backoffs, first.backoffs);
}

// Given a whole window lost once (the switch went quiet), Expect the back-off, the slice to
// finish, and the first fresh sample afterwards to bring the RTO back to the estimate.
TEST(WorkerSessionTest, FreshSampleEndsBackOff) {
  SessionConfig c = EstimatorConfig(8);
  c.retransmit.min_timeout = milliseconds(2);
  WorkerSession s(c);
  EchoNetwork net(s, [](const proto::Packet&, uint64_t n) -> std::optional<Nanos> {
    if (n >= 80 && n < 88 + 8 * 3) return std::nullopt;  // a silence of several windows
    return milliseconds(1);
  });
  net.RunSlice(1, 64 * 8 * 30);
  EXPECT_GE(s.counters().backoffs, 2u);
  EXPECT_EQ(s.counters().rto, milliseconds(2));  // back to the floor (1 ms round trips)
}

// Given a slice aborted by its driver, Expect it done with that status and later results for it
// dropped without touching the output buffer.
TEST(WorkerSessionTest, AbortStopsTouchingTheBuffers) {
  WorkerSession s(SmallConfig(2));
  std::vector<int32_t> in(128, 5), out(128, -1);
  s.Start(Slice{3, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  auto sent = DrainTransmit(s, kT0);
  ASSERT_EQ(sent.size(), 2u);
  s.Abort(UnavailableError("transport gone"));
  ASSERT_EQ(s.state(), WorkerSession::State::kDone);
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  s.HandleDatagram(Echo(sent[0].packet), kT0);
  EXPECT_EQ(out, std::vector<int32_t>(128, -1));
  EXPECT_EQ(s.counters().stale, 1u);
  EXPECT_FALSE(s.PollTimeout().has_value());
}

// Given no result at all for the progress timeout, Expect the slice to end with a
// DEADLINE_EXCEEDED status whose message says what is probably wrong.
TEST(WorkerSessionTest, FailsWithClearErrorWhenNothingComesBack) {
  SessionConfig c = SmallConfig();
  c.retransmit.peer_timeout = milliseconds(100);
  WorkerSession s(c);
  std::vector<int32_t> in(256, 1), out(256);
  s.Start(Slice{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
  Nanos now = kT0;
  for (int i = 0; i < 1000 && s.state() == WorkerSession::State::kRunning; ++i) {
    DrainTransmit(s, now);
    now = *s.PollTimeout();
    s.HandleTimeout(now);
  }
  ASSERT_EQ(s.state(), WorkerSession::State::kDone);
  EXPECT_EQ(s.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.status().message().find("peer worker"), std::string::npos) << s.status().message();
  EXPECT_GE(now - kT0, milliseconds(100));
  EXPECT_LE(now - kT0, milliseconds(101));
}

// Given int32 and float32 slices shorter and longer than the window of 3, Expect every slot to
// alternate sets across the slices: no slot ever sees the same set twice in a row.
TEST(WorkerSessionTest, SetAlternationContinuesAcrossJobs) {
  WorkerSession s(SmallConfig(3));
  std::vector<int32_t> in(640, 1), out(640);
  std::vector<std::vector<int>> sets(3);
  const std::vector<std::pair<size_t, DataType>> slices = {
      {192, DataType::kInt32},   {64, DataType::kFloat32},  {0, DataType::kInt32},
      {130, DataType::kFloat32}, {640, DataType::kFloat32}, {64, DataType::kInt32},
      {64, DataType::kFloat32},  {128, DataType::kInt32},   {500, DataType::kFloat32}};
  uint64_t id = 0;
  for (auto [count, dtype] : slices) {
    s.Start(Slice{++id, dtype, in.data(), out.data(), count, 0}, kT0);
    while (s.state() == WorkerSession::State::kRunning) {
      auto sent = DrainTransmit(s, kT0);
      ASSERT_FALSE(sent.empty());
      for (auto& p : sent) {
        sets[p.packet.header.slot.index - 10].push_back(p.packet.header.slot.set);
        s.HandleDatagram(Echo(p.packet), kT0);
      }
    }
  }
  for (auto& per_slot : sets) {
    for (size_t i = 1; i < per_slot.size(); ++i) EXPECT_NE(per_slot[i], per_slot[i - 1]) << i;
  }
}

// Given a window of 4, a float32 slice that uses every slot, then float32 slices of one block
// (which use slot 0 only and skip the others) and again a slice that uses every slot, Expect the
// tsi of each slot's successive rounds to grow by exactly the window, however many slices skipped
// it. (The switch drops a first contribution whose tsi is not after its set's last round in
// 32-bit serial order: with tsi = the running packet id, 65536 one-block float32 slices with a
// window of 16384 put a skipped slot's next tsi 2^31 ahead, and that slot stalled for good.)
TEST(WorkerSessionTest, TsiOfASlotGrowsByTheWindowPerRoundEvenWhenSlicesSkipIt) {
  constexpr uint32_t kWindow = 4;
  WorkerSession s(SmallConfig(kWindow));
  std::vector<float> in(4 * 64, 1.f), out(4 * 64);
  std::map<uint16_t, std::vector<uint32_t>> tsis;  // by slot index
  uint64_t id = 0;
  auto run = [&](size_t count) {
    s.Start(Slice{++id, DataType::kFloat32, in.data(), out.data(), count, 0}, kT0);
    while (s.state() == WorkerSession::State::kRunning) {
      auto sent = DrainTransmit(s, kT0);
      ASSERT_FALSE(sent.empty());
      for (auto& p : sent) {
        tsis[p.packet.header.slot.index].push_back(p.packet.header.tsi);
        s.HandleDatagram(Echo(p.packet), kT0);
      }
    }
    ASSERT_TRUE(s.status().ok());
  };
  run(4 * 64);
  for (int i = 0; i < 3; ++i) run(1);
  run(4 * 64);
  ASSERT_EQ(tsis.size(), kWindow);
  for (const auto& [slot, t] : tsis) {
    for (size_t i = 1; i < t.size(); ++i) {
      EXPECT_EQ(t[i] - t[i - 1], kWindow) << "slot " << slot << ", round " << i;
    }
  }
  EXPECT_EQ(tsis[11], (std::vector<uint32_t>{1, 5, 9, 13}));
}

// Given a float32 slice of 3 blocks with a window of 2 and one worker, Expect packets 0 and 1 to
// carry exponents only, packet 2 (after the result of 0) the exponent of block 2 and the data of
// block 0 scaled with the returned exponent, and the output within the quantization bound.
TEST(WorkerSessionTest, Float32ExponentsTravelOneWindowAhead) {
  WorkerSession s(SmallConfig(2));
  std::vector<float> in(150), out(150);
  for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(0.1f * i) * (i < 64 ? 1.f : 1000.f);
  s.Start(Slice{1, DataType::kFloat32, in.data(), out.data(), in.size(), 0}, kT0);
  auto sent = DrainTransmit(s, kT0);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].packet.header.e0, quant::AnalyzeBlock({in.data(), 64}).exponent);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(sent[0].packet.values[i], 0);
  int packets = 2;
  while (s.state() == WorkerSession::State::kRunning) {
    for (auto& p : sent) s.HandleDatagram(Echo(p.packet), kT0);
    sent = DrainTransmit(s, kT0);
    packets += sent.size();
  }
  EXPECT_EQ(packets, 5);  // ids 0..4: 0,1 exponents only, 2 both, 3,4 data only
  ASSERT_TRUE(s.status().ok()) << s.status().ToString();
  for (size_t i = 0; i < in.size(); ++i) {
    const int8_t e =
        quant::AnalyzeBlock({in.data() + i / 64 * 64, std::min<size_t>(64, 150 - i / 64 * 64)})
            .exponent;
    const double bound = 1.0 / (2 * quant::Scale(e, 1)) + std::fabs(in[i]) * 1e-7;
    EXPECT_NEAR(out[i], in[i], bound) << i;
  }
}

// Given a float32 slice whose block 1 holds an infinity, Expect the slice to end with a clear
// INVALID_ARGUMENT error naming the elements, NaN there, and correct values elsewhere.
TEST(WorkerSessionTest, NonFiniteInputGivesClearErrorAndNaN) {
  WorkerSession s(SmallConfig(4));
  std::vector<float> in(192, 0.5f), out(192);
  in[70] = INFINITY;
  s.Start(Slice{1, DataType::kFloat32, in.data(), out.data(), in.size(), 1000}, kT0);
  while (s.state() == WorkerSession::State::kRunning) {
    auto sent = DrainTransmit(s, kT0);
    ASSERT_FALSE(sent.empty());
    for (auto& p : sent) s.HandleDatagram(Echo(p.packet), kT0);
  }
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("[1064, 1128)"), std::string::npos) << s.status().message();
  EXPECT_TRUE(std::isnan(out[64]) && std::isnan(out[127]));
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[191], 0.5f);
}

// Given an all-zero float block, Expect exact zeros back (the reference divides by zero here).
TEST(WorkerSessionTest, ZeroBlocksGiveZeros) {
  WorkerSession s(SmallConfig(1));
  std::vector<float> in(64, 0.f), out(64, 1.f);
  s.Start(Slice{1, DataType::kFloat32, in.data(), out.data(), in.size(), 0}, kT0);
  while (s.state() == WorkerSession::State::kRunning) {
    for (auto& p : DrainTransmit(s, kT0)) s.HandleDatagram(Echo(p.packet), kT0);
  }
  ASSERT_TRUE(s.status().ok());
  EXPECT_EQ(out, std::vector<float>(64, 0.f));
}

}  // namespace
}  // namespace switchml::worker
