// Hierarchical aggregation (docs/hierarchy.md): top-of-rack (ToR) Switches with an upstream spine
// Switch.
//
// TorScenarioTest drives one ToR job packet by packet through the cases of the argument: the
// partial sum goes up on local completion, the spine's result is stored and multicast, a worker's
// retransmission re-sends the partial sum before the result and is answered from the shadow copy
// after it, and duplicate, late or premature results are dropped.
//
// HierarchyTest runs the real WorkerSession of every worker against real ToR and spine Switches
// on a virtual-time network with seeded loss, duplication and reordering on every link (worker
// <-> ToR and ToR <-> spine, both directions), several all-reduces in a row, int32 (exact) and
// float32 (within the quantization bound, scaled for the global worker count).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "dataplane/switch.h"
#include "quant/quantizer.h"
#include "testing/virtual_network.h"
#include "worker/session.h"

namespace switchml::dataplane {
namespace {

using proto::SlotId;
using testing::Faults;
using testing::VirtualNetwork;
using worker::Nanos;

constexpr proto::SizeCode kSize = proto::SizeCode::k256B;
constexpr size_t kNumel = 64;

// ---------------------------------------------------------------------------------------------
// Packet-level scenarios on one ToR.

constexpr uint64_t kSession = 9;
const Endpoint kSpine{0x0a0000fe, 48864};

class TorScenarioTest : public ::testing::Test {
 protected:
  TorScenarioTest() : tor_(SwitchConfig{8, 4, 2}) {
    JobSpec spec;
    spec.job_id = kSession;
    spec.num_workers = 2;
    spec.size = kSize;
    spec.max_outstanding_packets = 4;
    spec.running_tsi = true;
    EXPECT_TRUE(tor_.CreateJob(spec).ok());
    for (uint32_t r = 0; r < 2; ++r) {
      EXPECT_TRUE(tor_.AddWorker(kSession, r, WorkerSpec{0x0a000001 + r, 40000}).ok());
    }
    const Status st = tor_.SetUpstream(kSession, UpstreamSpec{kSpine.ipv4, kSpine.port, 1});
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

  static Endpoint Worker(uint32_t r) { return Endpoint{0x0a000001 + r, 40000}; }

  static std::vector<uint8_t> Packet(uint32_t round, SlotId slot, int32_t base, int8_t e0) {
    proto::Packet p;
    p.header = proto::Header{proto::kMsgTypeData, kSize, 1, 100 + round, slot, e0, 0};
    for (size_t k = 0; k < kNumel; ++k) p.values[k] = base + static_cast<int32_t>(k);
    std::vector<uint8_t> out(proto::DatagramBytes(kSize));
    proto::Encode(p, out);
    return out;
  }

  struct Out {
    Action::Kind kind;
    DropReason reason;
    proto::Packet reply;
    std::vector<Endpoint> destinations;
  };
  Out Deliver(const Endpoint& from, const std::vector<uint8_t>& d) {
    const Action& a = tor_.Process(from, d);
    Out o{a.kind, a.reason, {}, {a.destinations.begin(), a.destinations.end()}};
    if (a.kind != Action::Kind::kDrop) {
      EXPECT_EQ(proto::Decode(a.reply, &o.reply), proto::DecodeError::kOk);
    }
    return o;
  }

  Switch tor_;
};

TEST_F(TorScenarioTest, PartialGoesUpResultComesDownShadowAnswersRetransmissions) {
  const SlotId s{1, 0};
  EXPECT_EQ(Deliver(Worker(0), Packet(0, s, 10, 3)).kind, Action::Kind::kDrop);
  // Local completion: the partial sum (and the rack's max exponent) goes to the spine only.
  Out up = Deliver(Worker(1), Packet(0, s, 1000, 5));
  ASSERT_EQ(up.kind, Action::Kind::kUpstream);
  ASSERT_EQ(up.destinations, std::vector<Endpoint>{kSpine});
  EXPECT_EQ(up.reply.header.tsi, 100u);
  EXPECT_EQ(up.reply.header.slot, s);
  EXPECT_EQ(up.reply.header.e0, 5);
  EXPECT_EQ(up.reply.values[3], 1010 + 6);

  // A worker's retransmission before the result: the partial goes up again (not to the worker).
  Out again = Deliver(Worker(0), Packet(0, s, 10, 3));
  ASSERT_EQ(again.kind, Action::Kind::kUpstream);
  EXPECT_EQ(again.reply.values[3], 1016);
  // Worker 1's retransmission in the same wave of timeouts is not sent up too (the uplink carries
  // the whole rack); worker 0 asking again means that re-send went unanswered: up once more.
  EXPECT_EQ(Deliver(Worker(1), Packet(0, s, 1000, 5)).reason, DropReason::kDuplicate);
  EXPECT_EQ(Deliver(Worker(0), Packet(0, s, 10, 3)).kind, Action::Kind::kUpstream);

  // The spine's result (the global sum and max exponent) is multicast to the rack.
  std::vector<uint8_t> result = Packet(0, s, 500000, 9);
  Out down = Deliver(kSpine, result);
  ASSERT_EQ(down.kind, Action::Kind::kMulticast);
  EXPECT_EQ(down.destinations, (std::vector<Endpoint>{Worker(0), Worker(1)}));
  EXPECT_EQ(down.reply.values[3], 500003);
  EXPECT_EQ(down.reply.header.e0, 9);

  // Its duplicate is dropped; a retransmission is answered from the stored result.
  EXPECT_EQ(Deliver(kSpine, result).reason, DropReason::kStaleResult);
  Out shadow = Deliver(Worker(1), Packet(0, s, 1000, 5));
  ASSERT_EQ(shadow.kind, Action::Kind::kUnicast);
  EXPECT_EQ(shadow.destinations, std::vector<Endpoint>{Worker(1)});
  EXPECT_EQ(shadow.reply.values[3], 500003);
  EXPECT_EQ(shadow.reply.header.e0, 9);

  const JobCounters& c = *tor_.job_counters(kSession);
  EXPECT_EQ(c.upstream_sent, 3u);
  EXPECT_EQ(c.upstream_resent, 2u);
  EXPECT_EQ(c.upstream_coalesced, 1u);
  EXPECT_EQ(c.upstream_results, 1u);
  // The switch-wide count outlives the job (its counters go with it when it closes).
  ASSERT_TRUE(tor_.RemoveJob(kSession).ok());
  EXPECT_EQ(tor_.counters().upstream_results, 1u);
  EXPECT_NE(tor_.FormatCounters(false).find("upstream_results 1\n"), std::string::npos)
      << tor_.FormatCounters(false);
}

TEST_F(TorScenarioTest, ResultsForNoWaitingRoundAreDropped) {
  const SlotId s{2, 1};
  // Before the rack completed the round: the spine cannot have this result; dropped.
  EXPECT_EQ(Deliver(kSpine, Packet(0, s, 7, 0)).reason, DropReason::kStaleResult);
  Deliver(Worker(0), Packet(0, s, 1, 0));
  EXPECT_EQ(Deliver(kSpine, Packet(0, s, 7, 0)).reason, DropReason::kStaleResult);
  ASSERT_EQ(Deliver(Worker(1), Packet(0, s, 2, 0)).kind, Action::Kind::kUpstream);
  // A late copy of another round's result (other tsi) is not taken for this round's.
  EXPECT_EQ(Deliver(kSpine, Packet(7, s, 7, 0)).reason, DropReason::kStaleResult);
  // The other set of the slot has no round: dropped too.
  EXPECT_EQ(Deliver(kSpine, Packet(0, SlotId{2, 0}, 7, 0)).reason, DropReason::kStaleResult);
  ASSERT_EQ(Deliver(kSpine, Packet(0, s, 7, 0)).kind, Action::Kind::kMulticast);

  // Next round on the other set, then this set again: the old result does not complete it.
  Deliver(Worker(0), Packet(1, SlotId{2, 0}, 1, 0));
  Deliver(Worker(1), Packet(1, SlotId{2, 0}, 1, 0));
  ASSERT_EQ(Deliver(kSpine, Packet(1, SlotId{2, 0}, 8, 0)).kind, Action::Kind::kMulticast);
  Deliver(Worker(0), Packet(2, s, 1, 0));
  EXPECT_EQ(Deliver(kSpine, Packet(0, s, 7, 0)).reason, DropReason::kStaleResult);
  ASSERT_EQ(Deliver(Worker(1), Packet(2, s, 1, 0)).kind, Action::Kind::kUpstream);
  EXPECT_EQ(Deliver(kSpine, Packet(0, s, 7, 0)).reason, DropReason::kStaleResult);
  Out down = Deliver(kSpine, Packet(2, s, 9, 0));
  ASSERT_EQ(down.kind, Action::Kind::kMulticast);
  EXPECT_EQ(down.reply.values[0], 9);
}

TEST_F(TorScenarioTest, UpstreamValidationAndMirror) {
  EXPECT_FALSE(tor_.SetUpstream(kSession + 1, UpstreamSpec{1, 2, 1}).ok());
  EXPECT_FALSE(tor_.SetUpstream(kSession, UpstreamSpec{0, 2, 1}).ok());
  EXPECT_FALSE(tor_.SetUpstream(kSession, UpstreamSpec{1, 65535, 2}).ok());
  // A worker's address cannot be the upstream, nor the upstream a worker's.
  EXPECT_FALSE(tor_.SetUpstream(kSession, UpstreamSpec{Worker(1).ipv4, 40000, 1}).ok());
  JobSpec other = *tor_.FindJob(kSession);
  other.job_id = kSession + 1;
  ASSERT_TRUE(tor_.CreateJob(other).ok());
  EXPECT_EQ(tor_.AddWorker(kSession + 1, 0, WorkerSpec{kSpine.ipv4, kSpine.port}).code(),
            StatusCode::kAlreadyExists);
  ASSERT_TRUE(tor_.RemoveJob(kSession + 1).ok());
  ASSERT_NE(tor_.FindUpstream(kSession), nullptr);
  EXPECT_EQ(*tor_.FindUpstream(kSession), (UpstreamSpec{kSpine.ipv4, kSpine.port, 1}));

  // A replica (a data-plane thread of the daemon) gets the upstream too.
  Switch replica(SwitchConfig{8, 4, 2});
  replica.MirrorJobs(tor_);
  ASSERT_NE(replica.FindUpstream(kSession), nullptr);
  const SlotId s{0, 0};
  replica.Process(Worker(0), Packet(0, s, 1, 0));
  EXPECT_EQ(replica.Process(Worker(1), Packet(0, s, 1, 0)).kind, Action::Kind::kUpstream);
  EXPECT_EQ(replica.Process(kSpine, Packet(0, s, 1, 0)).kind, Action::Kind::kMulticast);

  // Re-creating the job drops its upstream: it is a plain job until set again.
  JobSpec spec = *tor_.FindJob(kSession);
  ASSERT_TRUE(tor_.CreateJob(spec).ok());
  EXPECT_EQ(tor_.FindUpstream(kSession), nullptr);
  EXPECT_EQ(tor_.Process(kSpine, Packet(0, s, 1, 0)).reason, DropReason::kUnknownSource);
}

// ---------------------------------------------------------------------------------------------
// End to end on a virtual-time lossy network.

struct HierarchyParams {
  std::vector<uint32_t> rack_sizes;
  Faults faults;
  uint64_t seed;
};

void PrintTo(const HierarchyParams& p, std::ostream* os) {
  *os << "racks";
  for (uint32_t n : p.rack_sizes) *os << " " << n;
  *os << ", loss " << p.faults.loss << ", duplicate " << p.faults.duplicate << ", jitter "
      << p.faults.jitter.count() << " ns, seed " << p.seed;
}

class HierarchyTest : public ::testing::TestWithParam<HierarchyParams> {
 protected:
  static constexpr uint64_t kJob = 42;
  static constexpr uint32_t kWindow = 8;

  struct Worker {
    uint32_t rack;
    Endpoint address;
    worker::WorkerSession session;
  };

  void SetUp() override {
    const HierarchyParams& p = GetParam();
    const uint32_t racks = static_cast<uint32_t>(p.rack_sizes.size());
    for (uint32_t n : p.rack_sizes) num_workers_ += n;
    // The spine: one "worker" per rack, the ToR.
    spine_ = std::make_unique<Switch>(SwitchConfig{64, 64, 2});
    JobSpec spine_job{kJob, racks, kSize, 1, kWindow, true, {}};
    ASSERT_TRUE(spine_->CreateJob(spine_job).ok());
    for (uint32_t r = 0; r < racks; ++r) {
      ASSERT_TRUE(
          spine_->AddWorker(kJob, r, WorkerSpec{TorEndpoint(r).ipv4, TorEndpoint(r).port}).ok());
      auto tor = std::make_unique<Switch>(SwitchConfig{64, 64, 2});
      JobSpec rack_job{kJob, p.rack_sizes[r], kSize, 1, kWindow, true, {}};
      ASSERT_TRUE(tor->CreateJob(rack_job).ok());
      for (uint32_t i = 0; i < p.rack_sizes[r]; ++i) {
        ASSERT_TRUE(tor->AddWorker(kJob, i, WorkerSpec{WorkerEndpoint(r, i).ipv4, 40000}).ok());
        worker::SessionConfig sc;
        sc.num_workers = num_workers_;  // the GLOBAL count: the scale every worker shares
        sc.window = kWindow;
        sc.size = kSize;
        sc.retransmit.timeout = sc.retransmit.min_timeout = std::chrono::microseconds(50);
        sc.retransmit.max_timeout = std::chrono::milliseconds(5);
        sc.retransmit.peer_timeout = std::chrono::seconds(5);
        workers_.push_back(Worker{r, WorkerEndpoint(r, i), worker::WorkerSession(sc)});
      }
      ASSERT_TRUE(tor->SetUpstream(kJob, UpstreamSpec{kSpineEp.ipv4, kSpineEp.port, 1}).ok());
      tors_.push_back(std::move(tor));
    }
  }

  static Endpoint TorEndpoint(uint32_t rack) { return Endpoint{0x0a00ff01 + rack, 48864}; }
  static Endpoint WorkerEndpoint(uint32_t rack, uint32_t i) {
    return Endpoint{0x0a000001 + (rack << 8) + i, 40000};
  }

  // Runs one all-reduce: worker w contributes in[w]; returns each worker's output.
  template <typename T>
  std::vector<std::vector<T>> AllReduce(const std::vector<std::vector<T>>& in, DataType dtype,
                                        uint64_t allreduce) {
    std::vector<std::vector<T>> out(in.size(), std::vector<T>(in[0].size()));
    for (size_t w = 0; w < workers_.size(); ++w) {
      worker::Slice slice;
      slice.allreduce = allreduce;
      slice.dtype = dtype;
      slice.in = in[w].data();
      slice.out = out[w].data();
      slice.count = in[w].size();
      workers_[w].session.Start(slice, now_);
      Drain(workers_[w]);
    }
    while (true) {
      bool running = false;
      std::optional<Nanos> next;
      for (const Worker& w : workers_) {
        if (w.session.state() != worker::WorkerSession::State::kRunning) continue;
        running = true;
        if (auto t = w.session.PollTimeout(); t && (!next || *t < *next)) next = t;
      }
      if (!running) break;
      if (!net_.empty() && (!next || net_.next() <= *next)) {
        VirtualNetwork::Event e = net_.Pop();
        now_ = std::max(now_, e.at);
        Deliver(e);
      } else {
        EXPECT_TRUE(next.has_value()) << "nothing to do while workers run: a hang";
        if (!next) break;
        now_ = std::max(now_, *next);
        for (Worker& w : workers_) {
          if (w.session.state() != worker::WorkerSession::State::kRunning) continue;
          if (auto t = w.session.PollTimeout(); t && *t <= now_) {
            w.session.HandleTimeout(now_);
            Drain(w);
          }
        }
      }
    }
    for (const Worker& w : workers_)
      EXPECT_TRUE(w.session.status().ok()) << w.session.status().ToString();
    return out;
  }

  void Drain(Worker& w) {
    uint8_t buf[proto::kMaxDatagramBytes];
    while (size_t n = w.session.PollTransmit(now_, buf)) {
      net_.Send(now_, w.address, TorEndpoint(w.rack), {buf, n});
    }
  }

  void Deliver(const VirtualNetwork::Event& e) {
    if (e.to == kSpineEp) {
      Forward(*spine_, kSpineEp, e);
      return;
    }
    for (uint32_t r = 0; r < tors_.size(); ++r) {
      if (e.to == TorEndpoint(r)) {
        Forward(*tors_[r], TorEndpoint(r), e);
        return;
      }
    }
    for (Worker& w : workers_) {
      if (e.to == w.address) {
        w.session.HandleDatagram(e.data, now_);
        Drain(w);
        return;
      }
    }
    ADD_FAILURE() << "datagram to nowhere: " << e.to.ToString();
  }

  void Forward(Switch& sw, const Endpoint& self, const VirtualNetwork::Event& e) {
    const Action& a = sw.Process(e.from, e.data);
    if (a.kind == Action::Kind::kDrop) return;
    const std::vector<uint8_t> reply(a.reply.begin(), a.reply.end());
    const std::vector<Endpoint> dsts(a.destinations.begin(), a.destinations.end());
    for (const Endpoint& d : dsts) net_.Send(now_, self, d, reply);
  }

  const Endpoint kSpineEp{0x0a0fffff, 48864};
  uint32_t num_workers_ = 0;
  std::unique_ptr<Switch> spine_;
  std::vector<std::unique_ptr<Switch>> tors_;
  std::vector<Worker> workers_;
  VirtualNetwork net_{GetParam().faults, GetParam().seed};
  Nanos now_{0};
};

TEST_P(HierarchyTest, Int32IsExactAndFloat32WithinTheBound) {
  const size_t n = workers_.size();
  std::mt19937 rng(GetParam().seed);
  // Several all-reduces in a row (the sets alternate across them), sizes not multiples of the
  // packet or the window.
  for (uint64_t allreduce = 1; allreduce <= 3; ++allreduce) {
    const size_t count = 37 * kNumel + 5 * allreduce;
    std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count));
    std::vector<int32_t> expected(count, 0);
    for (size_t w = 0; w < n; ++w) {
      for (size_t k = 0; k < count; ++k) {
        in[w][k] = static_cast<int32_t>(rng() % 2000001) - 1000000;
        expected[k] += in[w][k];
      }
    }
    const auto out = AllReduce(in, DataType::kInt32, allreduce);
    for (size_t w = 0; w < n; ++w)
      ASSERT_EQ(out[w], expected) << "worker " << w << " all-reduce " << allreduce;
  }
  for (uint64_t allreduce = 4; allreduce <= 5; ++allreduce) {
    const size_t count = 29 * kNumel + 3;
    // Every value positive and near its block's maximum: the rack sums are large, so a scale
    // for fewer workers than the global count would overflow where the racks' sums meet.
    std::vector<std::vector<float>> in(n, std::vector<float>(count));
    std::vector<double> exact(count, 0);
    std::uniform_real_distribution<float> u(0.75f, 0.999f);
    for (size_t w = 0; w < n; ++w) {
      for (size_t k = 0; k < count; ++k) {
        in[w][k] = std::ldexp(u(rng), static_cast<int>(k / kNumel % 7) - 3);
        exact[k] += in[w][k];
      }
    }
    const auto out = AllReduce(in, DataType::kFloat32, allreduce);
    for (size_t k = 0; k < count; ++k) {
      // Each worker rounds by at most half a step of 1/f, f = Scale(E, n); E = the block's max.
      const int8_t e = static_cast<int8_t>(static_cast<int>(k / kNumel % 7) - 3);
      const double bound = n * 0.5 / quant::Scale(e, static_cast<uint32_t>(n)) + 1e-6 * exact[k];
      for (size_t w = 0; w < n; ++w) {
        ASSERT_NEAR(out[w][k], exact[k], bound) << "worker " << w << " element " << k;
      }
    }
  }
  // Every level did its part; with faults, recovery happened at both levels.
  uint64_t resent = 0, results = 0;
  for (const auto& tor : tors_) {
    const JobCounters& c = *tor->job_counters(kJob);
    resent += c.upstream_resent;
    results += c.upstream_results;
  }
  EXPECT_GT(results, 0u);
  if (GetParam().faults.loss > 0) {
    EXPECT_GT(resent, 0u);
    EXPECT_GT(spine_->job_counters(kJob)->retransmitted, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, HierarchyTest,
    ::testing::Values(HierarchyParams{{2, 2}, {}, 1}, HierarchyParams{{3, 1, 2}, {}, 2},
                      HierarchyParams{{2, 3}, {0.05, 0, Nanos(0)}, 3},
                      HierarchyParams{{2, 2, 2}, {0.02, 0.05, Nanos(20000)}, 4},
                      HierarchyParams{{4, 1, 3}, {0.05, 0.05, Nanos(50000)}, 5},
                      HierarchyParams{{1, 1}, {0.1, 0.1, Nanos(30000)}, 6}));

}  // namespace
}  // namespace switchml::dataplane
