// The reference switch's scenario matrix, run against Switch through its public API for 2, 3, 8
// and 32 workers. Packets are built with proto::Encode and replies read with proto::Decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dataplane/switch.h"

namespace switchml::dataplane {
namespace {

using proto::SlotId;

constexpr uint64_t kSession = 77;
constexpr proto::SizeCode kSize = proto::SizeCode::k256B;
constexpr size_t kNumel = 64;

// What one Process() call did, copied out of the Switch (its spans die on the next call).
struct Outcome {
  Action::Kind kind = Action::Kind::kDrop;
  DropReason reason = DropReason::kNone;
  proto::Packet reply;
  std::vector<Endpoint> destinations;
};

// Value k of rank's contribution in a round; signs alternate so sums cross zero.
int32_t Value(uint32_t rank, uint32_t round, size_t k) {
  const int32_t v = static_cast<int32_t>((round + 1) * 100000 + (rank + 1) * 100 + k);
  return k % 2 ? -v : v;
}
int8_t E0(uint32_t rank, uint32_t round) { return static_cast<int8_t>(3 * rank - 40 + round); }
int8_t E1(uint32_t rank, uint32_t round) {
  return static_cast<int8_t>(-static_cast<int>(rank + round));
}
// Every worker sends the same (job_number, tsi) for a round, as real workers do (the tsi is their
// running round number of the slot), and each round of a slot has its own tsi: the switch relies on
// both to recognise late duplicates.
uint32_t Tsi(uint32_t round) { return 0x10000 * (round + 1); }
uint8_t JobNumber(uint32_t round) { return static_cast<uint8_t>(5 + round); }

class SwitchScenarioTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  SwitchScenarioTest() : sw_(SwitchConfig{32, 16, 4}), n_(GetParam()) {}

  // Opens the job with one exact-port worker per host: rank r at 10.0.0.(r+1), port 48000 + r.
  void OpenDefault() {
    std::vector<WorkerSpec> workers;
    for (uint32_t r = 0; r < n_; ++r)
      workers.push_back(WorkerSpec{0x0a000001 + r, uint16_t(48000 + r)});
    Open(workers, 1);
  }

  void Open(const std::vector<WorkerSpec>& workers, uint32_t num_ports) {
    workers_ = workers;
    JobSpec spec;
    spec.job_id = kSession;
    spec.num_workers = n_;
    spec.size = kSize;
    spec.num_ports = num_ports;
    spec.max_outstanding_packets = 8;
    ASSERT_TRUE(sw_.CreateJob(spec).ok());
    for (uint32_t r = 0; r < n_; ++r) {
      const Status st = sw_.AddWorker(kSession, r, workers_[r]);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }

  // rank's source endpoint for a packet from its port base + offset (a port-0 worker: 5000+rank).
  Endpoint Source(uint32_t rank, uint16_t offset = 0) const {
    const WorkerSpec& w = workers_[rank];
    return Endpoint{w.ipv4, w.port != 0 ? uint16_t(w.port + offset) : uint16_t(5000 + rank)};
  }

  std::vector<uint8_t> Datagram(uint32_t rank, uint32_t round, SlotId slot) const {
    proto::Packet p;
    p.header =
        proto::Header{proto::kMsgTypeData, kSize,          JobNumber(round), Tsi(round), slot,
                      E0(rank, round),     E1(rank, round)};
    for (size_t k = 0; k < kNumel; ++k) p.values[k] = Value(rank, round, k);
    std::vector<uint8_t> out(proto::DatagramBytes(kSize));
    proto::Encode(p, out);
    return out;
  }

  Outcome Deliver(const Endpoint& source, const std::vector<uint8_t>& datagram) {
    const Action& a = sw_.Process(source, datagram);
    Outcome o;
    o.kind = a.kind;
    o.reason = a.reason;
    o.destinations.assign(a.destinations.begin(), a.destinations.end());
    if (a.kind != Action::Kind::kDrop) {
      EXPECT_EQ(proto::Decode(a.reply, &o.reply), proto::DecodeError::kOk);
    } else {
      EXPECT_TRUE(a.reply.empty());
      EXPECT_TRUE(a.destinations.empty());
    }
    return o;
  }

  Outcome Send(uint32_t rank, uint32_t round, SlotId slot, uint16_t offset = 0) {
    return Deliver(Source(rank, offset), Datagram(rank, round, slot));
  }

  // Every worker's default destination (port base + offset, port-0 workers: port_zero_dest).
  std::vector<Endpoint> AllWorkers(uint16_t offset, uint16_t port_zero_dest) const {
    std::vector<Endpoint> out;
    for (const WorkerSpec& w : workers_) {
      out.push_back(Endpoint{w.ipv4, w.port != 0 ? uint16_t(w.port + offset) : port_zero_dest});
    }
    return out;
  }

  // Checks that o carries the result of round for slot (header fields echo the round's).
  void ExpectResult(const Outcome& o, uint32_t round, SlotId slot) const {
    EXPECT_EQ(o.reply.header.msg_type, proto::kMsgTypeData);
    EXPECT_EQ(o.reply.header.size, kSize);
    EXPECT_EQ(o.reply.header.job_number, JobNumber(round));
    EXPECT_EQ(o.reply.header.tsi, Tsi(round));
    EXPECT_EQ(o.reply.header.slot, slot);
    int8_t e0 = E0(0, round), e1 = E1(0, round);
    for (uint32_t r = 1; r < n_; ++r) {
      e0 = std::max(e0, E0(r, round));
      e1 = std::max(e1, E1(r, round));
    }
    EXPECT_EQ(o.reply.header.e0, e0);
    EXPECT_EQ(o.reply.header.e1, e1);
    for (size_t k = 0; k < kNumel; ++k) {
      int32_t sum = 0;
      for (uint32_t r = 0; r < n_; ++r) sum += Value(r, round, k);
      ASSERT_EQ(o.reply.values[k], sum) << "element " << k << " round " << round;
    }
  }

  void ExpectMulticast(const Outcome& o, uint32_t round, SlotId slot) const {
    ASSERT_EQ(o.kind, Action::Kind::kMulticast);
    ExpectResult(o, round, slot);
  }

  void ExpectUnicast(const Outcome& o, uint32_t round, SlotId slot, const Endpoint& to) const {
    ASSERT_EQ(o.kind, Action::Kind::kUnicast);
    ASSERT_EQ(o.destinations.size(), 1u);
    EXPECT_EQ(o.destinations[0], to);
    ExpectResult(o, round, slot);
  }

  static void ExpectConsumed(const Outcome& o) {
    EXPECT_EQ(o.kind, Action::Kind::kDrop);
    EXPECT_EQ(o.reason, DropReason::kNone);
  }
  static void ExpectDuplicate(const Outcome& o) {
    EXPECT_EQ(o.kind, Action::Kind::kDrop);
    EXPECT_EQ(o.reason, DropReason::kDuplicate);
  }

  // All workers send round's packet for slot in rank order; checks and returns the multicast.
  Outcome ReduceInOrder(uint32_t round, SlotId slot) {
    for (uint32_t r = 0; r + 1 < n_; ++r) ExpectConsumed(Send(r, round, slot));
    Outcome o = Send(n_ - 1, round, slot);
    ExpectMulticast(o, round, slot);
    return o;
  }

  const JobCounters& counters() const { return *sw_.job_counters(kSession); }
  const SlotCounters& slot(uint16_t i) const { return sw_.slot_counters(kSession)[i]; }

  Switch sw_;
  const uint32_t n_;
  std::vector<WorkerSpec> workers_;
};

// Given: every worker sends its packet for slot 0, set 0, once, in rank order.
// Expect: the first n-1 are consumed; the last completes the slot and the sum, max exponents and
// the round's job_number/tsi (echoed from the completing packet) are multicast to every worker.
TEST_P(SwitchScenarioTest, BasicReduction) {
  OpenDefault();
  const Outcome o = ReduceInOrder(0, {0, 0});
  EXPECT_EQ(o.destinations, AllWorkers(0, 0));
  EXPECT_EQ(counters().received, n_);
  EXPECT_EQ(counters().aggregated, n_);
  EXPECT_EQ(counters().completed, 1u);
  EXPECT_EQ(counters().multicast_packets, n_);
  EXPECT_EQ(counters().retransmitted, 0u);
  EXPECT_EQ(slot(0).received, n_);
  EXPECT_EQ(slot(0).completed, 1u);
}

// Given: slot 0 set 0 is complete; then every worker retransmits its packet (its result was lost).
// Expect: each retransmission gets the stored result unicast to its own source, echoing the
// completing packet's tsi; the stored result does not change however often it is asked for.
TEST_P(SwitchScenarioTest, RetransmitAfterReduction) {
  OpenDefault();
  ReduceInOrder(0, {0, 0});
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t r = 0; r < n_; ++r) {
      ExpectUnicast(Send(r, 0, {0, 0}), 0, {0, 0}, Source(r));
    }
  }
  EXPECT_EQ(counters().completed, 1u);
  EXPECT_EQ(counters().retransmitted, 2u * n_);
  EXPECT_EQ(counters().aggregated, n_);
  EXPECT_EQ(slot(0).retransmitted, 2u * n_);
}

// Given: the workers start on set 1 of slot 3 (as after a previous job's odd number of rounds).
// Expect: set 1 reduces like set 0 and the reply echoes set 1; set 0 of slot 3 stays untouched.
TEST_P(SwitchScenarioTest, OtherSetReduction) {
  OpenDefault();
  ReduceInOrder(0, {3, 1});
  // Set 0 is fresh: the next round's packet there starts a new round instead of being answered.
  ExpectConsumed(Send(0, 1, {3, 0}));
  EXPECT_EQ(slot(3).completed, 1u);
  EXPECT_EQ(counters().aggregated, n_ + 1);
}

// Given: every worker contributes round 0 to slot 2 set 0 in rank order, then round 1 to slot 2
// set 1 in reverse rank order, while slot 5 reduces round 7 interleaved with both.
// Expect: three multicasts, each with its own round's sums, exponents and header fields; no
// mixing between sets or slots.
TEST_P(SwitchScenarioTest, BothSetsReduction) {
  OpenDefault();
  for (uint32_t r = 0; r < n_; ++r) {
    const Outcome a = Send(r, 0, {2, 0});
    const Outcome b = Send(r, 7, {5, 0});
    if (r + 1 < n_) {
      ExpectConsumed(a);
      ExpectConsumed(b);
    } else {
      ExpectMulticast(a, 0, {2, 0});
      ExpectMulticast(b, 7, {5, 0});
    }
  }
  for (uint32_t i = 0; i < n_; ++i) {
    const uint32_t r = n_ - 1 - i;
    const Outcome o = Send(r, 1, {2, 1});
    if (i + 1 < n_) {
      ExpectConsumed(o);
    } else {
      ExpectMulticast(o, 1, {2, 1});
    }
  }
  EXPECT_EQ(counters().completed, 3u);
  EXPECT_EQ(slot(2).completed, 2u);
  EXPECT_EQ(slot(5).completed, 1u);
}

// Given: slot 1 is used for six rounds in a row, alternating sets 0, 1, 0, 1, ... as workers do.
// Expect: each round's result is exactly that round's sum (a fresh round overwrites, never adds to
// the round that used the set two rounds before).
TEST_P(SwitchScenarioTest, SlotReuse) {
  OpenDefault();
  for (uint32_t round = 0; round < 6; ++round) {
    ReduceInOrder(round, {1, static_cast<uint8_t>(round % 2)});
  }
  EXPECT_EQ(counters().completed, 6u);
  EXPECT_EQ(counters().aggregated, 6u * n_);
  EXPECT_EQ(counters().dropped[static_cast<int>(DropReason::kDuplicate)], 0u);
}

// Given: while slot 0 set 0 is incomplete, every worker that already contributed retransmits
// (twice) before the next worker contributes.
// Expect: the retransmissions are dropped as duplicates, the sum counts each worker once, and
// the last new contribution completes the slot.
TEST_P(SwitchScenarioTest, IgnoreRetransmissions) {
  OpenDefault();
  for (uint32_t r = 0; r < n_; ++r) {
    const Outcome o = Send(r, 0, {0, 0});
    if (r + 1 == n_) {
      ExpectMulticast(o, 0, {0, 0});
      break;
    }
    ExpectConsumed(o);
    for (uint32_t q = 0; q <= r; ++q) {
      ExpectDuplicate(Send(q, 0, {0, 0}));
      ExpectDuplicate(Send(q, 0, {0, 0}));
    }
  }
  const uint64_t dups = uint64_t{n_} * (n_ - 1);  // 2 * (1 + 2 + ... + n-1)
  EXPECT_EQ(counters().dropped[static_cast<int>(DropReason::kDuplicate)], dups);
  EXPECT_EQ(slot(0).duplicates, dups);
  EXPECT_EQ(counters().aggregated, n_);
  EXPECT_EQ(counters().completed, 1u);
}

// Given: round 0 on slot 0 set 0 is complete; all workers but the last received the result and
// sent round 1 on set 1 (clearing their bits in set 0); the last worker lost the result and
// retransmits its round-0 packet.
// Expect: it gets the round-0 result (the shadow copy) unicast, echoing round 0's fields; then its
// round-1 packet completes set 1 with round 1's sum.
TEST_P(SwitchScenarioTest, RetransmitFromPreviousSet) {
  OpenDefault();
  ReduceInOrder(0, {0, 0});
  for (uint32_t r = 0; r + 1 < n_; ++r) ExpectConsumed(Send(r, 1, {0, 1}));
  const uint32_t last = n_ - 1;
  ExpectUnicast(Send(last, 0, {0, 0}), 0, {0, 0}, Source(last));
  ExpectMulticast(Send(last, 1, {0, 1}), 1, {0, 1});
  EXPECT_EQ(counters().retransmitted, 1u);
  EXPECT_EQ(counters().completed, 2u);
}

// Given: slot 4 is reused for five rounds; in each round every packet is sent twice (a duplicate
// straight after the original), and after completion every worker retransmits once more.
// Expect: each round multicasts its exact sum once; duplicates before completion are dropped;
// retransmissions after completion get that round's result unicast.
TEST_P(SwitchScenarioTest, SlotReuseAndRetransmit) {
  OpenDefault();
  for (uint32_t round = 0; round < 5; ++round) {
    const SlotId s{4, static_cast<uint8_t>(round % 2)};
    for (uint32_t r = 0; r < n_; ++r) {
      const Outcome o = Send(r, round, s);
      const Outcome dup = Send(r, round, s);
      if (r + 1 < n_) {
        ExpectConsumed(o);
        ExpectDuplicate(dup);
      } else {
        ExpectMulticast(o, round, s);
        ExpectUnicast(dup, round, s, Source(r));
      }
    }
    for (uint32_t r = 0; r < n_; ++r) ExpectUnicast(Send(r, round, s), round, s, Source(r));
  }
  EXPECT_EQ(counters().completed, 5u);
  EXPECT_EQ(counters().aggregated, 5u * n_);
  EXPECT_EQ(counters().retransmitted, 5u * (n_ + 1));
  EXPECT_EQ(counters().dropped[static_cast<int>(DropReason::kDuplicate)], 5u * (n_ - 1));
}

// Given: round 0 completes on slot 0 set 0 and round 1 on set 1, so every worker has moved on and
// set 0's bitmap is empty; then late network copies of round-0 packets arrive on set 0: worker
// A's (rank 0) and the one that completed round 0 (the last rank's).
// Expect: both are dropped as duplicates (they carry the round set 0 completed last; taken as new
// they would open a fresh round holding stale data); they leave set 1 alone, so A's
// retransmission of round 1 is still answered with round 1's result; the next real round on set 0
// (round 2) completes with exactly round 2's sum: its first n-1 packets are consumed, not
// answered, and nothing of round 0 is left in it.
TEST_P(SwitchScenarioTest, LateDuplicateAfterEveryoneMovedOnIsDropped) {
  OpenDefault();
  const SlotId set0{0, 0};
  const SlotId set1{0, 1};
  ReduceInOrder(0, set0);
  ReduceInOrder(1, set1);

  ExpectDuplicate(Send(0, 0, set0));
  ExpectDuplicate(Send(n_ - 1, 0, set0));
  ExpectUnicast(Send(0, 1, set1), 1, set1, Source(0));

  ReduceInOrder(2, set0);
  EXPECT_EQ(counters().completed, 3u);
  EXPECT_EQ(counters().aggregated, 3u * n_);
  EXPECT_EQ(counters().retransmitted, 1u);
  EXPECT_EQ(counters().dropped[static_cast<int>(DropReason::kDuplicate)], 2u);
  EXPECT_EQ(slot(0).duplicates, 2u);
}

// Given: rounds 0 (set 0) and 1 (set 1) of slot 0 complete; round 2 is in progress on set 0 with
// every contribution but worker A's (A = the last rank); then a late network copy of A's round-0
// packet arrives on set 0, and one of rank 0's round-0 packet (rank 0 is already in round 2).
// Expect: both copies are dropped as duplicates and add nothing; A's copy leaves both bitmaps as
// they were, so A's retransmission of round 1 is still answered from set 1 and A's real round-2
// packet is accepted and completes set 0 with exactly round 2's sum and exponents.
TEST_P(SwitchScenarioTest, LateDuplicateIntoNewerRoundIsDropped) {
  OpenDefault();
  const SlotId set0{0, 0};
  const SlotId set1{0, 1};
  ReduceInOrder(0, set0);
  ReduceInOrder(1, set1);
  const uint32_t a = n_ - 1;
  for (uint32_t r = 0; r < a; ++r) ExpectConsumed(Send(r, 2, set0));

  ExpectDuplicate(Send(a, 0, set0));
  ExpectDuplicate(Send(0, 0, set0));
  ExpectUnicast(Send(a, 1, set1), 1, set1, Source(a));
  ExpectMulticast(Send(a, 2, set0), 2, set0);

  EXPECT_EQ(counters().completed, 3u);
  EXPECT_EQ(counters().aggregated, 3u * n_);
  EXPECT_EQ(counters().retransmitted, 1u);
  EXPECT_EQ(counters().dropped[static_cast<int>(DropReason::kDuplicate)], 2u);
}

// Given: before and during a reduction of slot 0, the switch sees datagrams that are not SwitchML
// (text, a 3-byte datagram, a wrong msg_type, a truncated packet) from a registered worker, and
// valid SwitchML packets for slot 0 from an unregistered host and from a registered host's
// unregistered port. Expect: none is aggregated or changes any slot state: they are dropped and
// counted, and the reduction still yields the exact sum with every worker counted once.
TEST_P(SwitchScenarioTest, NonSwitchML) {
  OpenDefault();
  const std::vector<uint8_t> text = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1'};
  const std::vector<uint8_t> tiny = {0x11, 0x00, 0x00};
  std::vector<uint8_t> wrong_type = Datagram(0, 0, {0, 0});
  wrong_type[0] = 0x21;  // msg_type 2
  std::vector<uint8_t> truncated = Datagram(0, 0, {0, 0});
  truncated.pop_back();
  const Endpoint stranger{0xc0a80001, 48000};
  const Endpoint wrong_port{workers_[0].ipv4, uint16_t(workers_[0].port + 1)};

  auto inject = [&] {
    EXPECT_EQ(Deliver(Source(0), text).reason, DropReason::kMalformed);
    EXPECT_EQ(Deliver(Source(0), tiny).reason, DropReason::kMalformed);
    EXPECT_EQ(Deliver(Source(0), wrong_type).reason, DropReason::kMalformed);
    EXPECT_EQ(Deliver(Source(0), truncated).reason, DropReason::kMalformed);
    EXPECT_EQ(Deliver(stranger, Datagram(0, 0, {0, 0})).reason, DropReason::kUnknownSource);
    EXPECT_EQ(Deliver(wrong_port, Datagram(1, 0, {0, 0})).reason, DropReason::kUnknownSource);
  };
  inject();
  for (uint32_t r = 0; r + 1 < n_; ++r) {
    ExpectConsumed(Send(r, 0, {0, 0}));
    inject();
  }
  ExpectMulticast(Send(n_ - 1, 0, {0, 0}), 0, {0, 0});

  const SwitchCounters& c = sw_.counters();
  EXPECT_EQ(c.dropped_malformed[static_cast<int>(proto::DecodeError::kTooShort)], 0u + n_);
  EXPECT_EQ(c.dropped_malformed[static_cast<int>(proto::DecodeError::kBadMsgType)], 2u * n_);
  EXPECT_EQ(c.dropped_malformed[static_cast<int>(proto::DecodeError::kLengthMismatch)], 0u + n_);
  EXPECT_EQ(c.dropped_unknown_source, 2u * n_);
  EXPECT_EQ(c.received, 7u * n_);
  EXPECT_EQ(counters().received, n_);
  EXPECT_EQ(counters().aggregated, n_);
  EXPECT_EQ(slot(0).received, n_);
}

// Given: workers on different addresses and ports, two ports per worker: rank 0 and one other
// rank (rank 1 with 2 workers, else rank 2) share one IP with different base ports; with 3+
// workers rank 1 registers port 0 (reference mode: any port of its IP); the rest have their own
// IPs and base ports. Slot 0 is completed by a packet from the last rank's base port, slot 1 from
// its second port, slot 2 (3+ workers) by the port-0 worker sending from port 5001.
// Expect: every multicast goes to each worker's base port plus the completer's port offset, and
// to the completer's source port for port-0 workers; a retransmission is answered at its exact
// source port.
TEST_P(SwitchScenarioTest, DifferentPortsReduction) {
  constexpr uint32_t kSharedIp = 0x0a000001;
  constexpr uint32_t kPortZeroIp = 0x0a000063;
  std::vector<WorkerSpec> workers;
  for (uint32_t r = 0; r < n_; ++r) {
    if (r == 0) {
      workers.push_back(WorkerSpec{kSharedIp, 40000});
    } else if (r == 1) {
      workers.push_back(n_ == 2 ? WorkerSpec{kSharedIp, 40010} : WorkerSpec{kPortZeroIp, 0});
    } else if (r == 2) {
      workers.push_back(WorkerSpec{kSharedIp, 40010});
    } else {
      workers.push_back(WorkerSpec{0x0a000001 + r, uint16_t(41000 + 7 * r)});
    }
  }
  Open(workers, 2);
  const uint32_t last = n_ - 1;

  // Slot 0: everyone from its base port; the last rank completes.
  for (uint32_t r = 0; r < last; ++r) ExpectConsumed(Send(r, 0, {0, 0}));
  Outcome o = Send(last, 0, {0, 0});
  ExpectMulticast(o, 0, {0, 0});
  EXPECT_EQ(o.destinations, AllWorkers(0, Source(last).port));

  // Slot 1: everyone from its second port; the last rank's packet (offset 1) completes.
  for (uint32_t r = 0; r < last; ++r) ExpectConsumed(Send(r, 1, {1, 0}, 1));
  o = Send(last, 1, {1, 0}, 1);
  ExpectMulticast(o, 1, {1, 0});
  EXPECT_EQ(o.destinations, AllWorkers(1, Source(last, 1).port));
  EXPECT_EQ(o.destinations[0], (Endpoint{kSharedIp, 40001}));
  // A retransmission from rank 0's second port is answered there.
  ExpectUnicast(Send(0, 1, {1, 0}, 1), 1, {1, 0}, (Endpoint{kSharedIp, 40001}));

  if (n_ >= 3) {
    EXPECT_EQ(o.destinations[1], (Endpoint{kPortZeroIp, Source(last, 1).port}));
    // Slot 2: the port-0 worker (rank 1, from port 5001) completes: offset 0 for the others,
    // the completing packet's source port for itself.
    for (uint32_t r = 0; r < n_; ++r) {
      if (r != 1) ExpectConsumed(Send(r, 2, {2, 0}, 1));
    }
    o = Send(1, 2, {2, 0});
    ExpectMulticast(o, 2, {2, 0});
    EXPECT_EQ(o.destinations, AllWorkers(0, 5001));
    EXPECT_EQ(o.destinations[1], (Endpoint{kPortZeroIp, 5001}));
    // The port-0 worker's packets from any port of its IP count as rank 1.
    ExpectUnicast(Deliver(Endpoint{kPortZeroIp, 6000}, Datagram(1, 2, {2, 0})), 2, {2, 0},
                  (Endpoint{kPortZeroIp, 6000}));
  }
  EXPECT_EQ(sw_.counters().dropped_unknown_source, 0u);
}

INSTANTIATE_TEST_SUITE_P(Workers, SwitchScenarioTest, ::testing::Values(2u, 3u, 8u, 32u),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return std::to_string(info.param) + "Workers";
                         });

}  // namespace
}  // namespace switchml::dataplane
