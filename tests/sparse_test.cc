// Block-sparse all-reduces (docs/protocol.md 2.5) in one process in virtual time: the real
// SparseSession of every worker thread (lane) against real dataplane::Switches, on a network with
// seeded loss, duplication and reordering. Every lane runs the job's all-reduces in order on its
// own, as a Context's worker threads do (lanes drift apart). Inputs are testing::Pattern's
// block-sparse tensors at densities 0 (all zero), 0.1 %, 1 %, 50 % and 100 %, with the same,
// disjoint or partly shared non-zero blocks on the workers. Optionally the job is striped over
// several switch hosts and one dies at a seeded moment (failover during sparse all-reduces), and
// a dense job of other workers runs on the same switches at the same time.
//
// Expect: every all-reduce completes on every worker; int32 exact and float32 within the
// quantization bound (testing::Verify), zeros where every worker had zeros; every worker's
// output bit for bit the same; a float32 all-reduce run sparse and dense from the same inputs
// gives the same bits; without faults, exactly the announcement's and the union's packets were
// sent (the blocks zero everywhere never crossed the network), and each lane counted the union it
// should have.
#include "worker/sparse.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <vector>

#include "dataplane/switch.h"
#include "switch_hosts.h"
#include "testing/pattern.h"
#include "testing/virtual_network.h"
#include "worker/sparse_session.h"

namespace switchml {
namespace {

using testing::Faults;
using testing::SwitchHosts;
using testing::VirtualNetwork;
using worker::Nanos;
using worker::SparseSession;

constexpr proto::SizeCode kSize = proto::SizeCode::k256B;
constexpr size_t kNumel = 64;
constexpr uint32_t kWindow = 16;  // per lane
constexpr uint16_t kBasePort = 40000;

struct SparseParams {
  uint32_t workers;
  uint32_t lanes;  // worker threads
  uint32_t hosts;  // switch hosts the job is striped over
  Faults faults;
  // The host that dies (-1: none), once this many datagrams have been delivered.
  int dead_host;
  uint64_t die_after;
  bool neighbor;  // a dense job of other workers on the same switches
  uint64_t seed;
  bool small = false;  // fewer, smaller all-reduces (the seeded sweep)
  // The auto rule (Slice::sparse_auto): a lane whose union holds more than 7/8 of its blocks
  // runs its share dense.
  bool sparse_auto = false;
};

void PrintTo(const SparseParams& p, std::ostream* os) {
  *os << p.workers << " workers x " << p.lanes << " lanes, " << p.hosts << " hosts, loss "
      << p.faults.loss << ", dup " << p.faults.duplicate << ", jitter " << p.faults.jitter.count()
      << " ns, host " << p.dead_host << " dies after " << p.die_after << " deliveries, neighbor "
      << p.neighbor << ", seed " << p.seed << (p.sparse_auto ? ", auto" : "");
}

struct OpSpec {
  DataType dtype;
  size_t count;
  double density;
  double overlap;
  bool sparse;
  bool in_place;
  int twin = -1;  // float32: the index of the op with the same inputs run the other way
};

class SparseAllReduceTest : public ::testing::TestWithParam<SparseParams> {
 protected:
  struct Lane {
    Endpoint address;
    std::unique_ptr<SparseSession> session;
    size_t next_op = 0;
    bool running = false;
    Nanos learns_of_death{-1};
    bool told = false;
  };
  struct Worker {
    uint32_t ip = 0;
    std::vector<Lane> lanes;
    std::vector<std::vector<int32_t>> in, out;  // per op (out is in for an in-place op)
  };
  struct Job {
    uint64_t job_id = 0;
    uint32_t num_workers = 0;
    uint32_t lanes = 1;
    std::vector<OpSpec> ops;
    std::vector<Worker> workers;
  };

  static Endpoint HostEndpoint(uint32_t h) { return SwitchHosts::HostEndpoint(h); }

  void SetUp() override {
    const SparseParams& p = GetParam();
    const uint32_t generations = p.dead_host >= 0 ? p.hosts : 1;
    for (uint32_t h = 0; h < p.hosts; ++h) {
      hosts_.switches.push_back(
          std::make_unique<dataplane::Switch>(dataplane::SwitchConfig{64, 1024, 4}));
    }
    jobs_.push_back(MakeJob(77, p.workers, p.lanes, generations, 0x0a000001, SparseOps(p)));
    if (p.neighbor) {
      // A plain dense job: other workers, its own pool, the reference's rule for late duplicates.
      std::vector<OpSpec> ops = {{DataType::kInt32, 300 * kNumel + 7, 1, 1, false, true},
                                 {DataType::kFloat32, 200 * kNumel, 1, 1, false, false},
                                 {DataType::kInt32, 150 * kNumel, 1, 1, false, true}};
      jobs_.push_back(MakeJob(78, 3, 1, generations, 0x0a000101, ops, /*running_tsi=*/false));
    }
    std::mt19937_64 rng(p.seed);
    for (Job& job : jobs_) {
      for (Worker& w : job.workers) {
        for (Lane& l : w.lanes) {
          if (p.dead_host >= 0) {
            l.learns_of_death = Nanos(std::uniform_int_distribution<int64_t>(0, 2'000'000)(rng));
          }
        }
      }
    }
  }

  // The sparse job's all-reduces: every density of the issue, both types, in place and not, the
  // same / disjoint / partly shared non-zero blocks, and float32 twins run dense.
  static std::vector<OpSpec> SparseOps(const SparseParams& p) {
    std::vector<OpSpec> ops;
    const size_t scale = p.small ? 1 : 2;
    struct D {
      double density;
      size_t blocks;
    };
    const std::vector<D> densities = {{0, 100 * scale},  {0.001, 1200 * scale}, {0.01, 400 * scale},
                                      {0.5, 60 * scale}, {0.9, 40 * scale},     {1, 40 * scale}};
    const double overlaps[] = {1, 0, 0.5};
    size_t k = 0;
    for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
      for (const D& d : densities) {
        const double overlap = overlaps[k % 3];
        // A short last block on every other op.
        const size_t count = d.blocks * kNumel - (k % 2 == 0 ? 0 : 13);
        const bool in_place = dt == DataType::kInt32 || k % 2 == 0;
        ops.push_back({dt, count, d.density, overlap, true, in_place});
        if (dt == DataType::kFloat32 && d.density > 0) {
          ops.back().twin = static_cast<int>(ops.size());
          ops.push_back(
              {dt, count, d.density, overlap, false, !in_place, static_cast<int>(ops.size()) - 1});
        }
        ++k;
      }
    }
    return ops;
  }

  Job MakeJob(uint64_t id, uint32_t n, uint32_t lanes, uint32_t generations, uint32_t ip0,
              std::vector<OpSpec> ops, bool running_tsi = true) {
    const SparseParams& p = GetParam();
    Job job;
    job.job_id = id;
    job.num_workers = n;
    job.lanes = lanes;
    job.ops = std::move(ops);
    for (auto& sw : hosts_.switches) {
      dataplane::JobSpec spec;
      spec.job_id = id;
      spec.num_workers = n;
      spec.size = kSize;
      spec.num_ports = lanes;
      spec.max_outstanding_packets = kWindow * lanes * generations;
      spec.running_tsi = running_tsi;
      EXPECT_TRUE(sw->CreateJob(spec).ok());
      for (uint32_t r = 0; r < n; ++r) {
        EXPECT_TRUE(sw->AddWorker(id, r, dataplane::WorkerSpec{ip0 + r, kBasePort}).ok());
      }
    }
    for (uint32_t r = 0; r < n; ++r) {
      Worker w;
      w.ip = ip0 + r;
      for (uint32_t t = 0; t < lanes; ++t) {
        worker::StripedSessionConfig c;
        c.session.num_workers = n;
        c.session.slot_start = t * kWindow;
        c.session.window = kWindow;
        c.session.size = kSize;
        c.session.retransmit.timeout = c.session.retransmit.min_timeout =
            std::chrono::microseconds(50);
        c.session.retransmit.max_timeout = std::chrono::milliseconds(5);
        c.session.retransmit.peer_timeout = std::chrono::seconds(5);
        c.num_hosts = p.hosts;
        c.generations = generations;
        c.generation_stride = kWindow * lanes;
        Lane l;
        l.address = Endpoint{w.ip, static_cast<uint16_t>(kBasePort + t)};
        l.session = std::make_unique<SparseSession>(c);
        w.lanes.push_back(std::move(l));
      }
      for (size_t o = 0; o < job.ops.size(); ++o) {
        const OpSpec& op = job.ops[o];
        w.in.emplace_back(op.count);
        FillInput(PatternOf(job, o), r, w.in.back().data(), op.count);
        // Outputs start as NaN: an element nobody writes fails the check.
        w.out.push_back(op.in_place ? w.in.back() : std::vector<int32_t>(op.count, 0x7fc00000));
      }
      job.workers.push_back(std::move(w));
    }
    return job;
  }

  testing::Pattern PatternOf(const Job& job, size_t o) const {
    const OpSpec& op = job.ops[o];
    // Twins share their inputs: the pattern of the first of the pair.
    const size_t iteration = op.twin >= 0 ? std::min<size_t>(o, op.twin) : o;
    testing::Pattern pat{GetParam().seed, static_cast<uint32_t>(iteration), job.num_workers, kNumel,
                         op.dtype};
    pat.density = op.density;
    pat.overlap = op.overlap;
    return pat;
  }

  void StartNext(Job& job, Worker& w, uint32_t t) {
    Lane& l = w.lanes[t];
    if (l.running || l.session->state() == SparseSession::State::kRunning) return;
    if (l.next_op >= job.ops.size()) return;
    const size_t o = l.next_op;
    const OpSpec& op = job.ops[o];
    worker::Slice s;
    s.allreduce = o + 1;
    s.dtype = op.dtype;
    int32_t* out = w.out[o].data();
    const int32_t* in = op.in_place ? out : w.in[o].data();
    if (op.sparse) {
      s.in = in;
      s.out = out;
      s.count = op.count;
      s.sparse = true;
      s.sparse_auto = GetParam().sparse_auto;
      s.lane = t;
      s.lanes = job.lanes;
    } else {  // contiguous slices of whole packets, as the Context cuts them
      const size_t packets = (op.count + kNumel - 1) / kNumel;
      const size_t e0 = std::min(op.count, packets * t / job.lanes * kNumel);
      const size_t e1 = std::min(op.count, packets * (t + 1) / job.lanes * kNumel);
      s.in = in + e0;
      s.out = out + e0;
      s.count = e1 - e0;
      s.element_offset = e0;
    }
    l.running = true;
    l.session->Start(s, now_);
  }

  void Settle(Job& job, Worker& w, uint32_t t) {
    Lane& l = w.lanes[t];
    while (l.session->state() == SparseSession::State::kDone) {
      const Status st = l.session->status();
      ASSERT_TRUE(st.ok()) << "job " << job.job_id << " ip " << w.ip << " lane " << t << ": "
                           << st.ToString();
      if (l.running) {
        l.running = false;
        ++l.next_op;
      }
      if (l.next_op >= job.ops.size()) break;
      StartNext(job, w, t);
    }
    uint8_t buf[proto::kMaxDatagramBytes];
    while (auto host = l.session->NextTransmitHost()) {
      const size_t n = l.session->PollTransmit(now_, buf);
      ASSERT_GT(n, 0u);
      net_.Send(now_, l.address, HostEndpoint(*host), {buf, n});
    }
  }

  bool Busy(const Lane& l, const Job& job) const {
    return l.session->state() == SparseSession::State::kRunning || l.next_op < job.ops.size();
  }

  void Run() {
    const SparseParams& p = GetParam();
    for (Job& job : jobs_) {
      for (Worker& w : job.workers) {
        for (uint32_t t = 0; t < job.lanes; ++t) {
          StartNext(job, w, t);
          Settle(job, w, t);
        }
      }
    }
    for (uint64_t steps = 0;; ++steps) {
      ASSERT_LT(steps, 20'000'000u) << "no end in sight";
      if (hosts_.dead < 0 && p.dead_host >= 0 && delivered_ >= p.die_after) {
        hosts_.dead = p.dead_host;
        died_at_ = now_;
      }
      std::optional<Nanos> next;
      Job* job_of = nullptr;
      Worker* worker_of = nullptr;
      uint32_t lane_of = 0;
      bool told = false, busy = false;
      for (Job& job : jobs_) {
        for (Worker& w : job.workers) {
          for (uint32_t t = 0; t < job.lanes; ++t) {
            Lane& l = w.lanes[t];
            busy = busy || Busy(l, job);
            std::optional<Nanos> at;
            bool is_told = false;
            if (l.session->state() == SparseSession::State::kRunning) at = l.session->PollTimeout();
            if (hosts_.dead >= 0 && !l.told) {
              busy = true;
              const Nanos d = died_at_ + l.learns_of_death;
              if (!at || d < *at) {
                at = d;
                is_told = true;
              }
            }
            if (at && (!next || *at < *next)) {
              next = at;
              job_of = &job;
              worker_of = &w;
              lane_of = t;
              told = is_told;
            }
          }
        }
      }
      if (!busy) break;
      if (!net_.empty() && (!next || net_.next() <= *next)) {
        VirtualNetwork::Event e = net_.Pop();
        now_ = std::max(now_, e.at);
        Deliver(e);
        if (HasFatalFailure()) return;
        continue;
      }
      ASSERT_TRUE(next.has_value()) << "nothing to do while workers run: a hang";
      now_ = std::max(now_, *next);
      Lane& l = worker_of->lanes[lane_of];
      if (told) {
        l.told = true;
        const Status st = l.session->Failover(static_cast<uint32_t>(hosts_.dead), now_);
        ASSERT_TRUE(st.ok()) << st.ToString();
      } else {
        l.session->HandleTimeout(now_);
      }
      Settle(*job_of, *worker_of, lane_of);
      if (HasFatalFailure()) return;
    }
  }

  void Deliver(const VirtualNetwork::Event& e) {
    ++delivered_;
    if (hosts_.Deliver(e, net_, now_)) return;
    for (Job& job : jobs_) {
      for (Worker& w : job.workers) {
        if (e.to.ipv4 != w.ip) continue;
        const uint32_t t = e.to.port - kBasePort;
        ASSERT_LT(t, job.lanes);
        w.lanes[t].session->HandleDatagram(e.data, now_);
        Settle(job, w, t);
        return;
      }
    }
    ADD_FAILURE() << "datagram to nowhere: " << e.to.ToString();
  }

  void Verify() {
    for (const Job& job : jobs_) {
      for (size_t o = 0; o < job.ops.size(); ++o) {
        const OpSpec& op = job.ops[o];
        const testing::Pattern pat = PatternOf(job, o);
        for (size_t r = 0; r < job.workers.size(); ++r) {
          const testing::VerifyResult v =
              testing::Verify(pat, job.workers[r].out[o].data(), op.count);
          ASSERT_TRUE(v.ok()) << "job " << job.job_id << " op " << o << " (density "
                              << op.density << ", overlap " << op.overlap << ", "
                              << (op.sparse ? "sparse" : "dense") << ") rank " << r << ": "
                              << v.ToString();
          ASSERT_EQ(job.workers[r].out[o], job.workers[0].out[o]) << "op " << o << " rank " << r;
        }
        if (op.twin >= 0) {
          ASSERT_EQ(job.workers[0].out[o], job.workers[0].out[op.twin])
              << "op " << o << ": sparse and dense results differ";
        }
      }
    }
  }

  // Without faults, what each lane of the sparse job sent and counted: for a sparse all-reduce
  // the announcement's packets and the union's (with float32's window of exponents), nothing for
  // a block zero on every worker, or, where the lane's union holds every block or (auto) more
  // than 7/8 of them, every block of its share; for a dense one every block.
  void CheckTraffic() {
    const Job& job = jobs_[0];
    const uint32_t n = static_cast<uint32_t>(job.workers.size());
    for (const Worker& w : job.workers) {
      for (uint32_t t = 0; t < job.lanes; ++t) {
        uint64_t packets = 0, union_blocks = 0, dense_shares = 0;
        for (size_t o = 0; o < job.ops.size(); ++o) {
          const OpSpec& op = job.ops[o];
          const bool fl = op.dtype == DataType::kFloat32;
          auto slice = [&](uint64_t blocks) {
            return blocks + (fl ? std::min<uint64_t>(blocks, kWindow) : 0);
          };
          if (!op.sparse) {
            const size_t packets_all = (op.count + kNumel - 1) / kNumel;
            packets += slice(packets_all * (t + 1) / job.lanes - packets_all * t / job.lanes);
            continue;
          }
          const worker::BlockShare share{op.count, kNumel, t, job.lanes};
          uint64_t u = 0;
          for (uint64_t j = 0; j < share.blocks(); ++j) {
            bool any = false;
            for (const Worker& other : job.workers) {
              any = any || !worker::BlockIsZero(other.in[o].data() + share.FirstElement(j),
                                                share.Elements(j), op.dtype);
            }
            u += any ? 1 : 0;
          }
          union_blocks += u;
          const uint64_t b = share.blocks();
          const bool dense = u == b || (GetParam().sparse_auto && 8 * u > 7 * b);
          dense_shares += dense ? 1 : 0;
          auto_dense_ += dense && u < b ? 1 : 0;
          const uint64_t words = worker::AnnounceWords(b, n);
          packets += (words + kNumel - 1) / kNumel + slice(dense ? b : u);
        }
        EXPECT_EQ(w.lanes[t].session->counters().sent, packets) << "ip " << w.ip << " lane " << t;
        if (GetParam().faults.jitter.count() == 0) {  // (else spurious timeouts may re-send)
          EXPECT_EQ(w.lanes[t].session->counters().retransmitted, 0u);
        }
        EXPECT_EQ(w.lanes[t].session->sparse_counters().union_blocks, union_blocks);
        EXPECT_EQ(w.lanes[t].session->sparse_counters().dense_shares, dense_shares);
      }
    }
  }

  SwitchHosts hosts_;  // the switches and the dead one
  std::vector<Job> jobs_;
  VirtualNetwork net_{GetParam().faults, GetParam().seed};
  Nanos now_{0};
  uint64_t delivered_ = 0;
  Nanos died_at_{0};
  uint64_t auto_dense_ = 0;  // CheckTraffic: lane shares the auto rule ran dense (union < all)
};

TEST_P(SparseAllReduceTest, ResultsAreDensesOnEveryWorkerAndOnlyTheUnionTravels) {
  const SparseParams& p = GetParam();
  Run();
  if (HasFatalFailure()) return;
  Verify();
  if (HasFatalFailure()) return;
  const bool clean = p.faults.loss == 0 && p.faults.duplicate == 0 && p.dead_host < 0;
  if (clean) {
    CheckTraffic();
    // The 90 %-dense ops give some lanes a union between 7/8 and all of their blocks.
    if (p.sparse_auto) {
      EXPECT_GT(auto_dense_, 0u);
    }
  }
  for (const Worker& w : jobs_[0].workers) {
    for (const Lane& l : w.lanes) {
      EXPECT_EQ(l.session->failover_counters().failovers, p.dead_host >= 0 ? 1u : 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, SparseAllReduceTest,
    ::testing::Values(
        // Clean: the traffic is exactly the announcements and the unions.
        SparseParams{4, 1, 1, {}, -1, 0, false, 1}, SparseParams{3, 3, 1, {}, -1, 0, false, 2},
        SparseParams{9, 2, 1, {}, -1, 0, true, 3},
        // Loss, duplication and reordering, and a dense job beside it on the same switch.
        SparseParams{4, 2, 1, {0.02, 0.02, Nanos(20000)}, -1, 0, true, 4},
        SparseParams{3, 1, 1, {0.05, 0.05, Nanos(50000)}, -1, 0, false, 5},
        // Striped over hosts, one of which dies in the middle of sparse all-reduces.
        SparseParams{3, 2, 2, {}, -1, 0, false, 6}, SparseParams{3, 2, 2, {}, 1, 3000, false, 7},
        SparseParams{4, 1, 3, {0.02, 0.02, Nanos(20000)}, 0, 20000, true, 8},
        // The auto rule: dense shares in place (one lane) and gathered whole (several).
        SparseParams{4, 1, 1, {}, -1, 0, false, 9, false, true},
        SparseParams{3, 3, 1, {}, -1, 0, false, 10, false, true},
        SparseParams{3, 1, 2, {0.02, 0.02, Nanos(20000)}, 1, 5000, true, 11, false, true}));

// Many seeded runs, smaller: loss, duplication, reordering, lanes, hosts and a failure at any
// moment of the run.
std::vector<SparseParams> Sweep() {
  std::vector<SparseParams> v;
  std::mt19937_64 rng(27);
  for (uint64_t seed = 100; seed < 124; ++seed) {
    SparseParams p;
    p.workers = 2 + rng() % 4;
    p.lanes = 1 + rng() % 3;
    p.hosts = 1 + rng() % 3;
    p.faults.loss = (rng() % 4) * 0.01;
    p.faults.duplicate = (rng() % 3) * 0.02;
    p.faults.jitter = Nanos((rng() % 4) * 20000);
    p.dead_host = p.hosts > 1 && rng() % 2 == 0 ? static_cast<int>(rng() % p.hosts) : -1;
    p.die_after = rng() % 8000;
    p.neighbor = rng() % 3 == 0;
    p.seed = seed;
    p.small = true;
    p.sparse_auto = seed % 2 == 1;
    v.push_back(p);
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Sweep, SparseAllReduceTest, ::testing::ValuesIn(Sweep()));

}  // namespace
}  // namespace switchml
