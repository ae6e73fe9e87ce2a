// What a forged result does to a job without the authenticated data plane (docs/security.md
// 4.2), as a packet-by-packet scenario over the sans-I/O cores: two worker sessions and the
// switch, every datagram handed over by the test, a forger's result slipped in where it wants.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dataplane/switch.h"
#include "proto/wire.h"
#include "worker/session.h"

namespace switchml {
namespace {

using std::chrono::nanoseconds;

constexpr uint32_t kIp = 0x0a000001;
constexpr uint32_t kWindow = 4;
constexpr proto::SizeCode kSize = proto::SizeCode::k256B;  // 64 elements per packet

// Every datagram a session wants to send now.
std::vector<std::vector<uint8_t>> Drain(worker::WorkerSession& s) {
  std::vector<std::vector<uint8_t>> out;
  std::vector<uint8_t> buf(proto::kMaxDatagramBytes);
  while (const size_t n = s.PollTransmit(nanoseconds(0), buf)) {
    out.emplace_back(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return out;
}

// Issue 28, found 8: a forged result at one rank also corrupted the other rank, where the docs
// said that forging the switch's address replaces results "at one worker". The mechanism: in a
// float32 all-reduce, the first round's results are the block exponents every worker scales the
// next round's data with (docs/protocol.md 5). Given a job of two workers, When rank 0 takes a
// forged first-round result (its block exponent raised by 20) that arrives before the switch's
// and rank 1 the switch's, Expect the next round's sums wrong at rank 1 too: rank 0 scales its
// data with the forged exponent, the switch adds it to rank 1's, scaled with the true one.
// (Forged before the peers contributed, the result instead makes rank 0 run ahead of its round:
// the switch drops the peers' packets of that round as stale and the job ends in a timeout.)
TEST(ForgedResultTest, AForgedFloatResultAtOneWorkerCorruptsEveryWorkersNextRound) {
  dataplane::SwitchConfig sc;
  sc.max_workers_per_job = 2;
  sc.slots_per_job = kWindow;
  sc.max_jobs = 1;
  dataplane::Switch sw(sc);
  dataplane::JobSpec spec;
  spec.job_id = 1;
  spec.num_workers = 2;
  spec.size = kSize;
  spec.max_outstanding_packets = kWindow;
  spec.running_tsi = true;
  ASSERT_TRUE(sw.CreateJob(spec).ok());
  const Endpoint at[2] = {{kIp, 40000}, {kIp, 40001}};
  ASSERT_TRUE(sw.AddWorker(1, 0, {at[0].ipv4, at[0].port}).ok());
  ASSERT_TRUE(sw.AddWorker(1, 1, {at[1].ipv4, at[1].port}).ok());

  worker::SessionConfig wc;
  wc.num_workers = 2;
  wc.window = kWindow;
  wc.size = kSize;
  constexpr size_t kCount = kWindow * 64;
  std::vector<float> in(kCount, 1.0f);
  std::vector<std::vector<float>> out(2, std::vector<float>(kCount, -1.0f));
  std::vector<worker::WorkerSession> s;
  for (int r = 0; r < 2; ++r) {
    s.emplace_back(wc);
    worker::Slice slice;
    slice.allreduce = 1;
    slice.dtype = DataType::kFloat32;
    slice.in = in.data();
    slice.out = out[r].data();
    slice.count = kCount;
    s[r].Start(slice, nanoseconds(0));
  }
  // Rounds until both are done (first round: exponents; second: data).
  for (int round = 0; round < 2; ++round) {
    auto sent0 = Drain(s[0]), sent1 = Drain(s[1]);
    ASSERT_EQ(sent0.size(), kWindow);
    ASSERT_EQ(sent1.size(), kWindow);
    for (const auto& d : sent0) {
      ASSERT_EQ(sw.Process(at[0], d).reason, dataplane::DropReason::kNone);
    }
    for (const auto& d : sent1) {
      const dataplane::Action& a = sw.Process(at[1], d);
      ASSERT_EQ(a.kind, dataplane::Action::Kind::kMulticast);
      const std::vector<uint8_t> real(a.reply.begin(), a.reply.end());
      if (round == 0) {  // the forger's copy reaches rank 0 first
        proto::Packet p;
        ASSERT_EQ(proto::Decode(real, &p), proto::DecodeError::kOk);
        p.header.e0 = static_cast<int8_t>(p.header.e0 + 20);
        std::vector<uint8_t> forged(proto::kMaxDatagramBytes);
        forged.resize(proto::Encode(p.header, p.payload(), forged));
        s[0].HandleDatagram(forged, nanoseconds(1));
      }
      s[0].HandleDatagram(real, nanoseconds(1));
      s[1].HandleDatagram(real, nanoseconds(1));
    }
  }
  ASSERT_EQ(s[0].state(), worker::WorkerSession::State::kDone);
  ASSERT_EQ(s[1].state(), worker::WorkerSession::State::kDone);
  EXPECT_TRUE(s[0].status().ok()) << s[0].status().ToString();
  EXPECT_TRUE(s[1].status().ok()) << s[1].status().ToString();
  size_t wrong[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    for (float v : out[r]) wrong[r] += v != 2.0f;
  }
  EXPECT_EQ(wrong[0], kCount);
  EXPECT_EQ(wrong[1], kCount) << "rank 1's results were not touched by rank 0's forged exponents";
}

}  // namespace
}  // namespace switchml
