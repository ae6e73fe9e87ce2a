// A job striped over k switch hosts (worker/striped_session.h), in one process in virtual time:
// the real StripedSession of every worker against k real dataplane::Switches on a network with
// seeded loss, duplication and reordering; several all-reduces in a row, each worker starting its
// next as soon as its own previous one ended (so workers drift up to a slice apart, as real ones
// do). Optionally one host dies at a seeded moment (everything to and from it is dropped from
// then on) and each worker learns of it after a seeded delay of its own, as its control stream
// to the host breaks. Expect: every all-reduce completes on every worker, int32 sums exact and
// float32 within the quantization bound, each host aggregating a share of its own; after a
// failure, every worker moved off the dead host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "dataplane/switch.h"
#include "quant/quantizer.h"
#include "switch_hosts.h"
#include "testing/virtual_network.h"
#include "worker/striped_session.h"

namespace switchml {
namespace {

using testing::Faults;
using testing::SwitchHosts;
using testing::VirtualNetwork;
using worker::Nanos;
using worker::StripedSession;

constexpr proto::SizeCode kSize = proto::SizeCode::k256B;
constexpr size_t kNumel = 64;
constexpr uint64_t kSession = 77;
constexpr uint32_t kWindow = 16;

struct StripingParams {
  uint32_t workers;
  uint32_t hosts;
  Faults faults;
  // The host that dies (-1: none) and when: once this fraction of the datagrams a run without
  // failure delivers have been delivered (1 or more: once every worker is idle).
  int dead_host;
  double die_at;
  uint64_t seed;
  uint32_t early_retransmit = 0;  // RetransmitOptions::early_retransmit_after
};

void PrintTo(const StripingParams& p, std::ostream* os) {
  *os << p.workers << " workers, " << p.hosts << " hosts, loss " << p.faults.loss << ", dup "
      << p.faults.duplicate << ", jitter " << p.faults.jitter.count() << " ns, host " << p.dead_host
      << " dies at " << p.die_at << " of the run, seed " << p.seed;
}

class StripingTest : public ::testing::TestWithParam<StripingParams> {
 protected:
  struct Op {
    DataType dtype;
    bool in_place = false;        // float32 (int32 always is)
    std::vector<int32_t> int_in;  // int32: the caller's buffer (in place), and its input
    std::vector<float> float_in, float_out;
    std::vector<int32_t> int_input;
  };
  struct Worker {
    Endpoint address;
    std::unique_ptr<StripedSession> session;
    std::vector<Op> ops;
    size_t next_op = 0;  // the op to start when the session is free
    bool running_op = false;
    Nanos learns_of_death{-1};  // when this worker's control stream to the dead host breaks
    bool told = false;
  };

  void SetUp() override {
    const StripingParams& p = GetParam();
    for (uint32_t h = 0; h < p.hosts; ++h) {
      auto sw = std::make_unique<dataplane::Switch>(dataplane::SwitchConfig{64, 1024, 2});
      dataplane::JobSpec spec;
      spec.job_id = kSession;
      spec.num_workers = p.workers;
      spec.size = kSize;
      spec.max_outstanding_packets = kWindow * p.hosts;  // a slot range per generation
      spec.running_tsi = true;
      ASSERT_TRUE(sw->CreateJob(spec).ok());
      for (uint32_t r = 0; r < p.workers; ++r) {
        ASSERT_TRUE(sw->AddWorker(kSession, r, dataplane::WorkerSpec{WorkerIp(r), 40000}).ok());
      }
      hosts_.switches.push_back(std::move(sw));
    }
    std::mt19937_64 rng(p.seed);
    for (uint32_t r = 0; r < p.workers; ++r) {
      worker::StripedSessionConfig c;
      c.session.num_workers = p.workers;
      c.session.window = kWindow;
      c.session.size = kSize;
      c.session.retransmit.timeout = c.session.retransmit.min_timeout =
          std::chrono::microseconds(50);
      c.session.retransmit.max_timeout = std::chrono::milliseconds(5);
      c.session.retransmit.peer_timeout = std::chrono::seconds(5);
      c.session.retransmit.early_retransmit_after = p.early_retransmit;
      c.num_hosts = p.hosts;
      c.generations = p.hosts;
      c.generation_stride = kWindow;
      Worker w;
      w.address = Endpoint{WorkerIp(r), 40000};
      w.session = std::make_unique<StripedSession>(c);
      if (p.dead_host >= 0) {
        w.learns_of_death = Nanos(std::uniform_int_distribution<int64_t>(0, 3'000'000)(rng));
      }
      workers_.push_back(std::move(w));
    }
  }

  static uint32_t WorkerIp(uint32_t r) { return 0x0a000001 + r; }
  static Endpoint HostEndpoint(uint32_t h) { return SwitchHosts::HostEndpoint(h); }

  // Gives every worker the same ops: sizes that are not multiples of a packet or the window.
  void MakeOps(std::mt19937_64& rng) {
    const size_t n = workers_.size();
    const std::vector<std::pair<DataType, size_t>> shapes = {
        {DataType::kInt32, 37 * kNumel + 5},   {DataType::kFloat32, 29 * kNumel + 3},
        {DataType::kInt32, 3 * kNumel},        {DataType::kInt32, 61 * kNumel + 1},
        {DataType::kFloat32, 7 * kNumel},      {DataType::kInt32, 0},
        {DataType::kFloat32, 40 * kNumel + 1}, {DataType::kInt32, 45 * kNumel + 9}};
    bool float_in_place = false;
    std::uniform_int_distribution<int32_t> ints(-1000000, 1000000);
    std::uniform_real_distribution<float> u(-1, 1);
    for (const auto& [dtype, count] : shapes) {
      for (size_t w = 0; w < n; ++w) {
        Op op;
        op.dtype = dtype;
        if (dtype == DataType::kInt32) {
          op.int_input.resize(count);
          for (auto& v : op.int_input) v = ints(rng);
          op.int_in = op.int_input;  // all-reduced in place
        } else {
          op.float_in.resize(count);
          for (size_t k = 0; k < count; ++k) {
            op.float_in[k] = std::ldexp(u(rng), static_cast<int>(k / kNumel % 7) - 3);
          }
          op.in_place = float_in_place;
          op.float_out = op.in_place ? op.float_in : std::vector<float>(count, 0);
        }
        workers_[w].ops.push_back(std::move(op));
      }
      if (dtype == DataType::kFloat32) float_in_place = !float_in_place;
    }
  }

  void StartNext(Worker& w) {
    if (w.running_op || w.session->state() == StripedSession::State::kRunning) return;
    if (w.next_op >= w.ops.size()) return;
    Op& op = w.ops[w.next_op];
    worker::Slice slice;
    slice.allreduce = w.next_op + 1;
    slice.dtype = op.dtype;
    if (op.dtype == DataType::kInt32) {
      slice.in = slice.out = op.int_in.data();
      slice.count = op.int_in.size();
    } else {
      slice.in = op.in_place ? op.float_out.data() : op.float_in.data();
      slice.out = op.float_out.data();
      slice.count = op.float_in.size();
    }
    w.running_op = true;
    w.session->Start(slice, now_);
  }

  // After anything touched w's session: a finished op is recorded and the next started.
  void Settle(Worker& w) {
    while (w.session->state() == StripedSession::State::kDone) {
      const Status st = w.session->status();
      ASSERT_TRUE(st.ok()) << "rank " << (&w - workers_.data()) << ": " << st.ToString();
      if (w.running_op) {
        w.running_op = false;
        ++w.next_op;
      }
      if (w.next_op >= w.ops.size()) break;
      StartNext(w);
    }
    Drain(w);
  }

  void Drain(Worker& w) {
    uint8_t buf[proto::kMaxDatagramBytes];
    while (auto host = w.session->NextTransmitHost()) {
      const size_t n = w.session->PollTransmit(now_, buf);
      ASSERT_GT(n, 0u);
      net_.Send(now_, w.address, HostEndpoint(*host), {buf, n});
    }
  }

  void Run() {
    const StripingParams& p = GetParam();
    // The datagrams of a run without failure (or loss): each packet and its result, per worker;
    // a float32 slice also has a window of exponents first.
    uint64_t packets = 0;
    for (const Op& op : workers_[0].ops) {
      const uint64_t count = op.dtype == DataType::kInt32 ? op.int_in.size() : op.float_in.size();
      const uint64_t blocks = (count + kNumel - 1) / kNumel;
      packets +=
          blocks + (op.dtype == DataType::kFloat32 ? std::min<uint64_t>(blocks, kWindow) : 0);
    }
    const uint64_t die_after =
        static_cast<uint64_t>(p.die_at * static_cast<double>(2 * packets * workers_.size()));
    for (Worker& w : workers_) {
      StartNext(w);
      Drain(w);
    }
    uint64_t steps = 0;
    while (true) {
      ASSERT_LT(++steps, 20'000'000u) << "no end in sight";
      if (hosts_.dead < 0 && p.dead_host >= 0 && (delivered_ >= die_after || Idle())) {
        hosts_.dead = p.dead_host;
        died_at_ = now_;
      }
      // The next event: a delivery, a worker's timer, or a worker learning of the death.
      std::optional<Nanos> next;
      Worker* timer_worker = nullptr;
      Worker* told_worker = nullptr;
      bool busy = false;
      for (Worker& w : workers_) {
        if (w.session->state() == StripedSession::State::kRunning) {
          busy = true;
          if (auto t = w.session->PollTimeout(); t && (!next || *t < *next)) {
            next = t;
            timer_worker = &w;
          }
        } else if (w.next_op < w.ops.size()) {
          busy = true;
        }
        if (hosts_.dead >= 0 && !w.told) {
          busy = true;
          const Nanos t = died_at_ + w.learns_of_death;
          if (!next || t < *next) {
            next = t;
            timer_worker = nullptr;
            told_worker = &w;
          }
        }
      }
      if (!busy) break;
      if (!net_.empty() && (!next || net_.next() <= *next)) {
        VirtualNetwork::Event e = net_.Pop();
        now_ = std::max(now_, e.at);
        Deliver(e);
        continue;
      }
      ASSERT_TRUE(next.has_value()) << "nothing to do while workers run: a hang";
      now_ = std::max(now_, *next);
      if (told_worker != nullptr) {
        told_worker->told = true;
        const Status st = told_worker->session->Failover(static_cast<uint32_t>(hosts_.dead), now_);
        ASSERT_TRUE(st.ok()) << st.ToString();
        Settle(*told_worker);
      } else if (timer_worker != nullptr) {
        timer_worker->session->HandleTimeout(now_);
        Settle(*timer_worker);
      }
    }
  }

  bool Idle() const {
    for (const Worker& w : workers_) {
      if (w.session->state() == StripedSession::State::kRunning || w.next_op < w.ops.size()) {
        return false;
      }
    }
    return true;
  }

  void Deliver(const VirtualNetwork::Event& e) {
    ++delivered_;
    if (hosts_.Deliver(e, net_, now_)) return;
    for (Worker& w : workers_) {
      if (e.to != w.address) continue;
      w.session->HandleDatagram(e.data, now_);
      Settle(w);
      return;
    }
    ADD_FAILURE() << "datagram to nowhere: " << e.to.ToString();
  }

  void Verify() {
    const size_t n = workers_.size();
    for (size_t i = 0; i < workers_[0].ops.size(); ++i) {
      const Op& first = workers_[0].ops[i];
      if (first.dtype == DataType::kInt32) {
        std::vector<int32_t> expected(first.int_input.size(), 0);
        for (const Worker& w : workers_) {
          for (size_t k = 0; k < expected.size(); ++k) expected[k] += w.ops[i].int_input[k];
        }
        for (size_t r = 0; r < n; ++r) {
          ASSERT_EQ(workers_[r].ops[i].int_in, expected) << "op " << i << " rank " << r;
        }
      } else {
        const size_t count = first.float_in.size();
        for (size_t k = 0; k < count; ++k) {
          double exact = 0;
          for (const Worker& w : workers_) exact += w.ops[i].float_in[k];
          const int8_t e = static_cast<int8_t>(static_cast<int>(k / kNumel % 7) - 3);
          // Each worker rounds by at most half a step of 1/f, f = Scale(E, n) (a block
          // aggregated again after a failover is aggregated from the same inputs).
          const double bound =
              n * 0.5 / quant::Scale(e, static_cast<uint32_t>(n)) + 1e-6 * std::fabs(exact);
          for (size_t r = 0; r < n; ++r) {
            ASSERT_NEAR(workers_[r].ops[i].float_out[k], exact, bound)
                << "op " << i << " rank " << r << " element " << k;
            // Every worker has the very same result (a block aggregated again after a failover
            // is the same inputs quantized alike), as without failure.
            ASSERT_EQ(workers_[r].ops[i].float_out[k], workers_[0].ops[i].float_out[k])
                << "op " << i << " rank " << r << " element " << k;
          }
        }
      }
    }
  }

  SwitchHosts hosts_;  // the switches and the dead one
  std::vector<Worker> workers_;
  VirtualNetwork net_{GetParam().faults, GetParam().seed};
  Nanos now_{0};
  uint64_t delivered_ = 0;
  Nanos died_at_{0};
};

TEST_P(StripingTest, EveryAllReduceCompletesExactlyOnEveryWorker) {
  const StripingParams& p = GetParam();
  std::mt19937_64 rng(p.seed * 7919);
  MakeOps(rng);
  Run();
  if (HasFatalFailure()) return;
  Verify();
  // Each host alive aggregated a share of its own.
  for (uint32_t h = 0; h < p.hosts; ++h) {
    if (static_cast<int>(h) == p.dead_host) continue;
    const dataplane::JobCounters* c = hosts_.switches[h]->job_counters(kSession);
    ASSERT_NE(c, nullptr);
    EXPECT_GT(c->completed, 0u) << "host " << h;
  }
  for (const Worker& w : workers_) {
    if (p.dead_host >= 0) {
      EXPECT_EQ(w.session->live_hosts().size(), p.hosts - 1);
      EXPECT_EQ(w.session->failover_counters().failovers, 1u);
      EXPECT_EQ(std::count(w.session->live_hosts().begin(), w.session->live_hosts().end(),
                           static_cast<uint32_t>(p.dead_host)),
                0);
    } else {
      EXPECT_EQ(w.session->failover_counters().failovers, 0u);
    }
  }
}

// die_at spreads the failure over the run: in the first all-reduce, in the middle, near the end
// (workers a slice apart), after it (every worker idle).
INSTANTIATE_TEST_SUITE_P(
    Scenarios, StripingTest,
    ::testing::Values(StripingParams{2, 2, {}, -1, 0, 1}, StripingParams{3, 3, {}, -1, 0, 2},
                      StripingParams{4, 3, {0.03, 0.02, Nanos(20000)}, -1, 0, 3},
                      StripingParams{3, 2, {}, 1, 0.05, 4}, StripingParams{3, 2, {}, 0, 0.5, 5},
                      StripingParams{4, 4, {0.02, 0.02, Nanos(30000)}, 2, 0.3, 6},
                      StripingParams{2, 3, {0.05, 0, Nanos(10000)}, 1, 0.9, 7},
                      StripingParams{4, 2, {0.01, 0.01, Nanos(50000)}, 0, 0.7, 8},
                      StripingParams{5, 3, {0.02, 0.05, Nanos(40000)}, 2, 0.97, 9},
                      StripingParams{3, 2, {}, 1, 2, 10}));

// Many seeded runs: the failure at every kind of moment, with loss, duplication and reordering.
std::vector<StripingParams> Sweep() {
  std::vector<StripingParams> v;
  std::mt19937_64 rng(2026);
  for (uint64_t seed = 100; seed < 1100; ++seed) {
    StripingParams p;
    p.workers = 2 + rng() % 5;
    p.hosts = 2 + rng() % 3;
    p.faults.loss = (rng() % 4) * 0.01;
    p.faults.duplicate = (rng() % 3) * 0.02;
    p.faults.jitter = Nanos((rng() % 4) * 20000);
    p.dead_host = static_cast<int>(rng() % p.hosts);
    p.die_at = std::uniform_real_distribution<double>(0, 1.05)(rng);
    p.seed = seed;
    p.early_retransmit = rng() % 3 == 0 ? 2 : 0;
    v.push_back(p);
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Sweep, StripingTest, ::testing::ValuesIn(Sweep()));

}  // namespace
}  // namespace switchml
