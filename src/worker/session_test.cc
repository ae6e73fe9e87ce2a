#include "worker/session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
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
  c.progress_timeout = milliseconds(1);
  EXPECT_FALSE(c.Validate().ok());
}

// Given a window of 2 and an int32 slice of 130 elements (3 packets, the last with 2 elements),
// Expect packets 0 and 1 first on slots 10 and 11 set 0, packet 2 only after the result of
// packet 0, on slot 10 set 1, and the results copied to the output.
TEST(WorkerSessionTest, Int32SelfClockedWindow) {
  WorkerSession s(SmallConfig());
  std::vector<int32_t> in(130), out(130, -7);
  std::iota(in.begin(), in.end(), -60);
  s.Start(SliceJob{5, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
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

// Given a result that already arrived, a second copy of it, a result of another job, one for a
// slot outside the session's range and a truncated datagram, Expect all four dropped and counted
// and the output untouched by them.
TEST(WorkerSessionTest, DropsDuplicateStaleForeignAndMalformedResults) {
  WorkerSession s(SmallConfig());
  std::vector<int32_t> in(128, 3), out(128, 0);
  s.Start(SliceJob{9, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
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

// Given a packet whose result does not come back, Expect it re-sent unchanged (same bytes, same
// slot and set) once its timeout passes, not before.
TEST(WorkerSessionTest, RetransmitsUnchangedOnTimeout) {
  SessionConfig c = SmallConfig(1);
  c.timeout = milliseconds(10);
  WorkerSession s(c);
  std::vector<int32_t> in(64, 1), out(64);
  s.Start(SliceJob{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
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

// Given `timeout_threshold` timeouts with no result in between, Expect the timeout to double.
TEST(WorkerSessionTest, BacksOffWhileNothingComesBack) {
  SessionConfig c = SmallConfig(1);
  c.timeout = milliseconds(10);
  c.timeout_threshold = 2;
  c.timeout_threshold_increment = 2;
  WorkerSession s(c);
  std::vector<int32_t> in(64, 1), out(64);
  s.Start(SliceJob{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
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
// a result not to undo it (the next packet is timed with the doubled timeout), and the next
// slice to start again from the configured timeout.
TEST(WorkerSessionTest, BackOffIsOncePerPeriodAndLastsTheSlice) {
  SessionConfig c = SmallConfig(8);
  c.timeout = milliseconds(10);
  c.timeout_threshold = 4;
  WorkerSession s(c);
  std::vector<int32_t> in(64 * 16, 1), out(64 * 16);
  s.Start(SliceJob{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
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
  // Finish the slice; the next one starts from 10 ms again.
  for (auto& p : again) s.HandleDatagram(Echo(p.packet), now);
  while (s.state() == WorkerSession::State::kRunning) {
    for (auto& p : DrainTransmit(s, now)) s.HandleDatagram(Echo(p.packet), now);
    for (auto& p : next) s.HandleDatagram(Echo(p.packet), now);
  }
  ASSERT_TRUE(s.status().ok());
  s.Start(SliceJob{2, DataType::kInt32, in.data(), out.data(), 64, 0}, now);
  ASSERT_EQ(DrainTransmit(s, now).size(), 1u);
  EXPECT_EQ(*s.PollTimeout(), now + milliseconds(10));
}

// Given a slice aborted by its driver, Expect it done with that status and later results for it
// dropped without touching the output buffer.
TEST(WorkerSessionTest, AbortStopsTouchingTheBuffers) {
  WorkerSession s(SmallConfig(2));
  std::vector<int32_t> in(128, 5), out(128, -1);
  s.Start(SliceJob{3, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
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
  c.progress_timeout = milliseconds(100);
  WorkerSession s(c);
  std::vector<int32_t> in(256, 1), out(256);
  s.Start(SliceJob{1, DataType::kInt32, in.data(), out.data(), in.size(), 0}, kT0);
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
    s.Start(SliceJob{++id, dtype, in.data(), out.data(), count, 0}, kT0);
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

// Given a float32 slice of 3 blocks with a window of 2 and one worker, Expect packets 0 and 1 to
// carry exponents only, packet 2 (after the result of 0) the exponent of block 2 and the data of
// block 0 scaled with the returned exponent, and the output within the quantization bound.
TEST(WorkerSessionTest, Float32ExponentsTravelOneWindowAhead) {
  WorkerSession s(SmallConfig(2));
  std::vector<float> in(150), out(150);
  for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(0.1f * i) * (i < 64 ? 1.f : 1000.f);
  s.Start(SliceJob{1, DataType::kFloat32, in.data(), out.data(), in.size(), 0}, kT0);
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
  s.Start(SliceJob{1, DataType::kFloat32, in.data(), out.data(), in.size(), 1000}, kT0);
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
  s.Start(SliceJob{1, DataType::kFloat32, in.data(), out.data(), in.size(), 0}, kT0);
  while (s.state() == WorkerSession::State::kRunning) {
    for (auto& p : DrainTransmit(s, kT0)) s.HandleDatagram(Echo(p.packet), kT0);
  }
  ASSERT_TRUE(s.status().ok());
  EXPECT_EQ(out, std::vector<float>(64, 0.f));
}

}  // namespace
}  // namespace switchml::worker
