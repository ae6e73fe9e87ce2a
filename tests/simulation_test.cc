// Seeded simulation: N worker sessions and the switch core over an in-memory network that drops,
// duplicates and reorders datagrams, in virtual time, in one thread. Many seeds; every result
// checked (int32 exact, float32 within the quantization bound); the failing seed is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "dataplane/switch.h"
#include "testing/pattern.h"
#include "transport/memory.h"
#include "worker/session.h"

namespace switchml {
namespace {

using worker::Nanos;
using worker::WorkerSession;

struct SimParams {
  uint32_t workers;
  uint32_t window;
  proto::SizeCode size;
  double loss, duplicate, reorder;
  double late = 0;       // copies held back for up to 400 sends: many rounds late
  uint32_t threads = 1;  // sessions (worker threads, UDP ports, slot ranges) per worker
};

// Runs five all-reduces (int32 and float32 of sizes around and below the window, and an empty
// one) back to back on the same sessions, so set alternation across jobs is exercised too.
void RunSimulation(const SimParams& sp, uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with this seed to reproduce)");
  transport::FaultOptions faults;
  faults.loss = sp.loss;
  faults.duplicate = sp.duplicate;
  faults.reorder = sp.reorder;
  faults.late = sp.late;
  faults.late_span = 400;
  faults.seed = seed;
  transport::MemoryNetwork net(faults);
  dataplane::SwitchConfig sc;
  sc.slots_per_job = 64;
  dataplane::Switch sw(sc);
  constexpr uint64_t kSession = 42;
  // Our worker sessions send a running tsi (as the control plane tells the switch).
  const uint32_t T = sp.threads;
  ASSERT_TRUE(
      sw.CreateJob({kSession, sp.workers, sp.size, T, T * sp.window, /*running_tsi=*/true}).ok());
  const Endpoint switch_ep{kLoopbackIpv4, 48864};
  auto switch_tx = net.Attach(switch_ep);
  std::vector<std::unique_ptr<transport::Transport>> links;
  std::vector<std::unique_ptr<WorkerSession>> sessions;
  worker::SessionConfig wc;
  wc.num_workers = sp.workers;
  wc.window = sp.window;
  wc.size = sp.size;
  wc.timeout = std::chrono::milliseconds(1);
  // A floor of one step: the measured RTO follows the schedule's round trips down, so timeouts
  // still fire while results are in flight (Karn's rule and the back-off get exercised).
  wc.min_timeout = std::chrono::microseconds(300);
  wc.progress_timeout = std::chrono::seconds(5);
  // Session r * T + t is thread t of worker r: port base_r + t, slots [t W, (t + 1) W). Two
  // workers share each IP address, told apart by their ports (as several processes on a host).
  for (uint32_t r = 0; r < sp.workers; ++r) {
    const Endpoint base{kLoopbackIpv4 + 1 + r / 2, static_cast<uint16_t>(40000 + 16 * r)};
    ASSERT_TRUE(sw.AddWorker(kSession, r, {base.ipv4, base.port}).ok());
    for (uint32_t t = 0; t < T; ++t) {
      links.push_back(net.Attach({base.ipv4, static_cast<uint16_t>(base.port + t)}));
      wc.slot_start = t * sp.window;
      sessions.push_back(std::make_unique<WorkerSession>(wc));
    }
  }
  const size_t numel = proto::NumelOf(sp.size);
  struct JobDef {
    DataType dtype;
    size_t count;
  };
  const std::vector<JobDef> jobs = {{DataType::kInt32, numel * sp.window * 12 + 17},
                                    {DataType::kFloat32, numel * sp.window * 9 + numel / 2},
                                    {DataType::kFloat32, numel / 2 + 1},
                                    {DataType::kInt32, numel * 2 + 1},
                                    {DataType::kInt32, 0}};
  Nanos now{0};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::vector<uint8_t> buf(proto::kMaxDatagramBytes);
  std::vector<transport::RxDatagram> rx(64);
  for (size_t j = 0; j < jobs.size(); ++j) {
    testing::Pattern pat{seed, static_cast<uint32_t>(j), sp.workers, static_cast<uint32_t>(numel),
                         jobs[j].dtype};
    std::vector<std::vector<int32_t>> in(sp.workers), out(sp.workers);
    for (uint32_t r = 0; r < sp.workers; ++r) {
      in[r].resize(jobs[j].count);
      out[r].assign(jobs[j].count, 0x7fc00000);  // NaN pattern: untouched outputs fail
      testing::FillInput(pat, r, in[r].data(), jobs[j].count);
      // Slices of whole packets per thread, as Context cuts them.
      const size_t count = jobs[j].count, packets = (count + numel - 1) / numel;
      for (uint32_t t = 0; t < T; ++t) {
        const size_t e0 = std::min(count, packets * t / T * numel);
        const size_t e1 = std::min(count, packets * (t + 1) / T * numel);
        sessions[r * T + t]->Start(
            {j + 1, jobs[j].dtype, in[r].data() + e0, out[r].data() + e0, e1 - e0, e0}, now);
      }
    }
    // Each step, every component (a worker's sending, the switch, a worker's receiving, a
    // worker's timers) runs with probability 3/4, and virtual time advances by 0.3 ms, a third
    // of the initial retransmission timeout and the RTO's floor: so timeouts fire while results
    // are still in flight, and queues build up for the network to reorder.
    for (int step = 0;; ++step) {
      ASSERT_LT(step, 2'000'000) << "simulation did not finish";
      bool moved = false;
      // A skipped component may have work pending: only a step in which everything ran and
      // nothing moved lets virtual time jump to the next timer.
      auto skip = [&] {
        const bool s = coin(rng) < 0.25;
        moved = moved || s;
        return s;
      };
      for (size_t r = 0; r < sessions.size(); ++r) {
        if (skip()) continue;
        while (size_t n = sessions[r]->PollTransmit(now, buf)) {
          transport::TxDatagram d{switch_ep, {buf.data(), n}};
          ASSERT_TRUE(links[r]->Send({&d, 1}).ok());
          moved = true;
        }
      }
      while (!skip()) {
        auto got = switch_tx->Receive(rx, Nanos{0});
        ASSERT_TRUE(got.ok());
        if (*got == 0) break;
        moved = true;
        for (size_t i = 0; i < *got; ++i) {
          const dataplane::Action& a = sw.Process(rx[i].source, rx[i].data);
          std::vector<uint8_t> reply(a.reply.begin(), a.reply.end());
          for (const Endpoint& dst : a.destinations) {
            transport::TxDatagram d{dst, reply};
            ASSERT_TRUE(switch_tx->Send({&d, 1}).ok());
          }
        }
      }
      for (size_t r = 0; r < sessions.size(); ++r) {
        if (skip()) continue;
        auto got = links[r]->Receive(rx, Nanos{0});
        ASSERT_TRUE(got.ok());
        moved = moved || *got > 0;
        for (size_t i = 0; i < *got; ++i) {
          sessions[r]->HandleDatagram(rx[i].data, now);
        }
      }
      bool all_done = std::all_of(sessions.begin(), sessions.end(), [](auto& s) {
        return s->state() == WorkerSession::State::kDone;
      });
      if (all_done) break;
      now += std::chrono::microseconds(300);
      if (!moved) {  // quiet network: jump to the earliest timer
        Nanos next = Nanos::max();
        for (auto& s : sessions) {
          if (auto t = s->PollTimeout()) next = std::min(next, *t);
        }
        ASSERT_NE(next, Nanos::max());
        now = std::max(now, next);
      }
      for (auto& s : sessions) {
        if (!moved || coin(rng) >= 0.25) s->HandleTimeout(now);
      }
    }
    for (size_t i = 0; i < sessions.size(); ++i) {
      ASSERT_TRUE(sessions[i]->status().ok())
          << "rank " << i / T << " thread " << i % T << ": " << sessions[i]->status().ToString();
    }
    for (uint32_t r = 0; r < sp.workers; ++r) {
      testing::VerifyResult v = testing::Verify(pat, out[r].data(), jobs[j].count);
      ASSERT_TRUE(v.ok()) << "job " << j << " (" << DataTypeName(jobs[j].dtype) << ") rank " << r
                          << ": " << v.ToString();
    }
  }
  // The faults did happen, and were recovered from. (Without loss there may still be
  // retransmissions: the timeout is shorter than a slow round in this schedule.)
  uint64_t retransmitted = 0;
  for (auto& s : sessions) retransmitted += s->counters().retransmitted;
  if (sp.loss > 0) {
    EXPECT_GT(net.counters().dropped, 0u);
    EXPECT_GT(retransmitted, 0u);
  }
  if (sp.duplicate > 0) {
    EXPECT_GT(net.counters().duplicated, 0u);
  }
  if (sp.late > 0) {
    EXPECT_GT(net.counters().delayed, 0u);
  }
  // Every reply reached the thread that owns its slot (multicast port offsets are right).
  for (auto& s : sessions) EXPECT_EQ(s->counters().foreign_slot, 0u);
  // Invariants: nothing was ever misaddressed, oversized or out of the pool.
  const dataplane::JobCounters* jc = sw.job_counters(kSession);
  ASSERT_NE(jc, nullptr);
  EXPECT_EQ(jc->dropped[static_cast<int>(dataplane::DropReason::kWrongSize)], 0u);
  EXPECT_EQ(jc->dropped[static_cast<int>(dataplane::DropReason::kSlotOutOfRange)], 0u);
  EXPECT_EQ(sw.counters().dropped_unknown_source, 0u);
}

class SimulationTest : public ::testing::TestWithParam<SimParams> {};

TEST_P(SimulationTest, LossyDuplicatingReorderingLinksManySeeds) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    RunSimulation(GetParam(), seed);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, SimulationTest,
    ::testing::Values(SimParams{2, 4, proto::SizeCode::k256B, 0.05, 0.05, 0.3},
                      SimParams{3, 8, proto::SizeCode::k256B, 0.10, 0.10, 0.5},
                      SimParams{8, 4, proto::SizeCode::k1024B, 0.02, 0.02, 0.2},
                      SimParams{5, 1, proto::SizeCode::k256B, 0.05, 0.0, 0.0},
                      SimParams{4, 16, proto::SizeCode::k256B, 0.0, 0.0, 0.0},
                      // Copies that arrive many rounds late (delayed originals and duplicates).
                      SimParams{2, 4, proto::SizeCode::k256B, 0.02, 0.05, 0.2, 0.03},
                      SimParams{3, 8, proto::SizeCode::k256B, 0.0, 0.10, 0.0, 0.05},
                      SimParams{8, 2, proto::SizeCode::k1024B, 0.01, 0.02, 0.1, 0.02},
                      // Several threads (ports, slot ranges) per worker: replies routed by port
                      // offset from each worker's base port.
                      SimParams{3, 4, proto::SizeCode::k256B, 0.05, 0.05, 0.3, 0.02, 3},
                      SimParams{2, 2, proto::SizeCode::k1024B, 0.0, 0.0, 0.0, 0.0, 4}));

}  // namespace
}  // namespace switchml
