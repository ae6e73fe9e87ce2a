// Fuzzes the switch data plane (dataplane::Switch) with packet sequences for a configured job.
//
// The first byte picks the mode:
//   - arbitrary: every datagram is chosen by the fuzzer (raw bytes, or headers with chosen
//     fields) and comes from a registered worker, another port of its host, or a stranger; the
//     job may be re-created midway. It may be a top-of-rack job (docs/hierarchy.md: an upstream
//     spine set), and then datagrams also come from the spine's data ports (results). Checks: no
//     crash or sanitizer report; the switch's and the job's counters add up to the datagrams fed
//     and to the actions returned (top-of-rack: partial sums sent up, re-sent, results from the
//     spine); every reply decodes, has the job's size, echoes the packet's slot and set, and goes
//     to the job's workers (all of them for a multicast, the sender for a unicast) or, for a
//     partial sum, to one of the spine's ports; a top-of-rack job multicasts only the spine's
//     results.
//   - protocol: the job's workers follow the worker protocol (round k of slot j is packet id
//     k W + j, set k mod 2, sent again unchanged until its result arrives, round k + 1 only
//     after round k's result), and the fuzzer is the network: it delays, duplicates, reorders and
//     drops packets and results, and adds strangers' packets and malformed, wrong-size and
//     out-of-range packets from the workers' own addresses. Checks, beyond the above: each round
//     completes at most once, its result (multicast, and every unicast re-send of it) is the sum
//     of the workers' contributions to that round, with the maximum exponents, echoing the
//     round's tsi; and at the end, with a loss-free network, every round of every slot completes
//     (nothing is wedged).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <vector>

#include "base/endpoint.h"
#include "dataplane/switch.h"
#include "fuzz_check.h"
#include "proto/wire.h"

namespace switchml::dataplane {
namespace {

constexpr uint64_t kSession = 7;
constexpr uint16_t kBasePort = 40000;

uint32_t WorkerIp(uint32_t r) { return 0x0a000001 + r; }  // 10.0.0.1 + r
Endpoint WorkerEndpoint(uint32_t r) { return Endpoint{WorkerIp(r), kBasePort}; }
const Endpoint kStranger{0x0a0000fe, 5555};
// A top-of-rack job's spine: data ports kSpine.port .. + (1 or 2) - 1.
const Endpoint kSpine{0x0a0000c8, 50000};

struct Fixture {
  Switch sw;
  JobSpec spec;
  uint32_t spine_ports = 0;  // > 0: a top-of-rack job under kSpine
  // Totals kept by the harness, to check the switch's counters against.
  uint64_t fed = 0;
  uint64_t malformed = 0, unknown = 0;
  uint64_t attributed = 0;  // by earlier incarnations of the job (its counters went with it)
  uint64_t consumed = 0, multicasts = 0, unicasts = 0, drops = 0, ups = 0;

  explicit Fixture(const SwitchConfig& c) : sw(c) {}

  void CreateJob() {
    if (const JobCounters* c = sw.job_counters(kSession)) attributed += c->received;
    FUZZ_CHECK(sw.CreateJob(spec).ok());
    for (uint32_t r = 0; r < spec.num_workers; ++r) {
      FUZZ_CHECK(sw.AddWorker(kSession, r, WorkerSpec{WorkerIp(r), kBasePort}).ok());
    }
    if (spine_ports > 0) {
      FUZZ_CHECK(
          sw.SetUpstream(kSession, UpstreamSpec{kSpine.ipv4, kSpine.port, spine_ports}).ok());
    }
    consumed = multicasts = unicasts = drops = ups = 0;
  }
  bool FromSpine(const Endpoint& e) const {
    return spine_ports > 0 && e.ipv4 == kSpine.ipv4 && e.port >= kSpine.port &&
           e.port < kSpine.port + spine_ports;
  }

  // Feeds one datagram and checks the action's shape; returns it.
  const Action& Feed(const Endpoint& src, std::span<const uint8_t> d) {
    ++fed;
    proto::Header in;
    const bool decodes = proto::DecodeHeader(d, &in) == proto::DecodeError::kOk;
    const Action& a = sw.Process(src, d);
    if (!decodes) {
      FUZZ_CHECK(a.kind == Action::Kind::kDrop && a.reason == DropReason::kMalformed);
      ++malformed;
      return a;
    }
    if (a.kind == Action::Kind::kDrop && a.reason == DropReason::kUnknownSource) {
      ++unknown;
      return a;
    }
    FUZZ_CHECK(a.reason != DropReason::kMalformed);
    switch (a.kind) {
      case Action::Kind::kUpstream: {
        // Only a top-of-rack job sends up: a partial sum on a worker's packet, to the spine.
        FUZZ_CHECK(spine_ports > 0 && !FromSpine(src));
        ++ups;
        FUZZ_CHECK(a.destinations.size() == 1 && FromSpine(a.destinations[0]));
        proto::Header out;
        FUZZ_CHECK(proto::DecodeHeader(a.reply, &out) == proto::DecodeError::kOk);
        FUZZ_CHECK(out.size == spec.size && in.size == spec.size);
        FUZZ_CHECK(out.slot == in.slot);
        break;
      }
      case Action::Kind::kDrop:
        if (a.reason == DropReason::kNone) {
          ++consumed;
        } else {
          ++drops;
        }
        break;
      case Action::Kind::kMulticast:
      case Action::Kind::kUnicast: {
        a.kind == Action::Kind::kMulticast ? ++multicasts : ++unicasts;
        proto::Header out;
        FUZZ_CHECK(proto::DecodeHeader(a.reply, &out) == proto::DecodeError::kOk);
        FUZZ_CHECK(out.size == spec.size);
        FUZZ_CHECK(in.size == spec.size);
        FUZZ_CHECK(out.slot == in.slot);
        FUZZ_CHECK(in.slot.index < JobSlots(sw.config(), spec.size));
        if (a.kind == Action::Kind::kMulticast) {
          // A top-of-rack job multicasts the spine's results only; one switch, its own.
          FUZZ_CHECK(FromSpine(src) == (spine_ports > 0));
          FUZZ_CHECK(a.destinations.size() == spec.num_workers);
          for (uint32_t r = 0; r < spec.num_workers; ++r) {
            FUZZ_CHECK(a.destinations[r] == WorkerEndpoint(r));
          }
        } else {
          FUZZ_CHECK(a.destinations.size() == 1);
          FUZZ_CHECK(a.destinations[0] == src);
        }
        break;
      }
    }
    return a;
  }

  void CheckCounters() const {
    const SwitchCounters& s = sw.counters();
    uint64_t bad = 0;
    for (uint64_t c : s.dropped_malformed) bad += c;
    FUZZ_CHECK(s.received == fed);
    FUZZ_CHECK(bad == malformed);
    FUZZ_CHECK(s.dropped_unknown_source == unknown);
    const JobCounters* j = sw.job_counters(kSession);
    FUZZ_CHECK(j != nullptr);
    FUZZ_CHECK(s.received == bad + s.dropped_unknown_source + attributed + j->received);
    uint64_t dropped = 0;
    for (uint64_t c : j->dropped) dropped += c;
    FUZZ_CHECK(j->dropped[static_cast<int>(DropReason::kNone)] == 0);
    FUZZ_CHECK(j->received == consumed + multicasts + unicasts + drops + ups);
    FUZZ_CHECK(j->multicast_packets == multicasts * spec.num_workers);
    FUZZ_CHECK(j->retransmitted == unicasts);
    FUZZ_CHECK(dropped == drops);
    if (spine_ports == 0) {
      FUZZ_CHECK(ups == 0);
      FUZZ_CHECK(j->aggregated == consumed + multicasts);
      FUZZ_CHECK(j->completed == multicasts);
    } else {
      // Local completions are first sends up; the rest of the sends are re-sends.
      FUZZ_CHECK(j->upstream_sent == ups);
      FUZZ_CHECK(j->upstream_resent <= ups);
      FUZZ_CHECK(j->completed == ups - j->upstream_resent);
      FUZZ_CHECK(j->aggregated == consumed + j->completed);
      FUZZ_CHECK(j->upstream_results == multicasts);
      FUZZ_CHECK(j->upstream_results <= j->completed);
    }
  }
};

void RunArbitrary(FuzzedDataProvider& in) {
  SwitchConfig config;
  config.slots_per_job = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  config.max_workers_per_job = 8;
  config.max_packet_numel = 512;  // jumbo jobs too (docs/protocol.md 2.6), of 2 KiB payloads
  Fixture f(config);
  f.spec.job_id = kSession;
  f.spec.num_workers = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  constexpr proto::SizeCode kSizes[] = {proto::SizeCode::k256B, proto::SizeCode::k1024B,
                                        proto::SizeCode::k2048B};
  f.spec.size = kSizes[in.ConsumeIntegralInRange<int>(0, 2)];
  f.spec.max_outstanding_packets = JobSlots(config, f.spec.size);
  f.spec.running_tsi = in.ConsumeBool();
  f.spine_ports = in.ConsumeIntegralInRange<uint32_t>(0, 2);  // 0: one switch; else a ToR job
  f.CreateJob();
  std::vector<uint8_t> d(proto::kMaxDatagramBytes + 8);
  std::vector<int32_t> values(proto::kMaxNumel);
  while (in.remaining_bytes() > 0) {
    const uint8_t op = in.ConsumeIntegral<uint8_t>();
    const uint32_t who = in.ConsumeIntegralInRange<uint32_t>(0, f.spec.num_workers + 3);
    Endpoint src = who < f.spec.num_workers ? WorkerEndpoint(who) : kStranger;
    if (who == f.spec.num_workers) src = Endpoint{WorkerIp(0), kBasePort + 1};  // not registered
    // The spine's ports (a result; from one switch's job: an unknown source).
    if (who >= f.spec.num_workers + 2) {
      src = Endpoint{kSpine.ipv4, static_cast<uint16_t>(kSpine.port + (who & 1))};
    }
    switch (op % 8) {
      case 0: {  // raw bytes
        const size_t n = in.ConsumeIntegralInRange<size_t>(0, d.size());
        const std::vector<uint8_t> raw = in.ConsumeBytes<uint8_t>(n);
        f.Feed(src, raw);
        break;
      }
      case 1: {  // a valid header then chosen bytes: wrong lengths, odd payloads
        proto::Header h;
        h.size = in.ConsumeBool() ? proto::SizeCode::k256B : proto::SizeCode::k1024B;
        h.slot.index = in.ConsumeIntegralInRange<uint16_t>(0, proto::kMaxSlots - 1);
        proto::EncodeHeader(h, d);
        const size_t n = proto::kPrefixBytes + in.ConsumeIntegralInRange<size_t>(0, 1024 + 4);
        for (size_t i = proto::kPrefixBytes; i < n; ++i) d[i] = static_cast<uint8_t>(i);
        f.Feed(src, std::span<const uint8_t>(d.data(), n));
        break;
      }
      case 7:
        if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
          f.CreateJob();  // the job re-created midway: fresh state, same workers
          break;
        }
        [[fallthrough]];
      default: {  // a well-formed packet with chosen fields
        proto::Header h;
        h.size = in.ConsumeIntegralInRange<int>(0, 15) == 0
                     ? (f.spec.size == proto::SizeCode::k256B ? proto::SizeCode::k1024B
                                                              : proto::SizeCode::k256B)
                     : f.spec.size;
        h.job_number = in.ConsumeIntegralInRange<uint8_t>(0, 2);
        h.tsi = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 32)
                                 : in.ConsumeIntegral<uint32_t>();
        h.slot.index = in.ConsumeIntegralInRange<uint16_t>(0, config.slots_per_job);
        h.slot.set = in.ConsumeBool();
        h.e0 = in.ConsumeIntegral<int8_t>();
        h.e1 = in.ConsumeIntegralInRange<int8_t>(-1, 1);
        const uint32_t seed = in.ConsumeIntegral<uint32_t>();
        const size_t numel = proto::NumelOf(h.size);
        for (size_t i = 0; i < numel; ++i)
          values[i] = static_cast<int32_t>(FuzzMix(seed + i * 977));
        const size_t n = proto::Encode(h, std::span<const int32_t>(values.data(), numel), d);
        f.Feed(src, std::span<const uint8_t>(d.data(), n));
        break;
      }
    }
    f.CheckCounters();
  }
}

// The protocol mode's workers and network.
struct Net {
  struct InFlight {
    uint32_t rank;
    uint32_t slot;
    uint32_t round;
  };
  Fixture& f;
  uint32_t slots, rounds;
  // round[r][j]: the round worker r is on for slot j (== rounds when done); got[r][j]: it has
  // that round's result.
  std::vector<std::vector<uint32_t>> round;
  std::vector<std::vector<uint32_t>> completions;  // per (slot, round)
  std::deque<InFlight> wire;                       // packets in the network
  std::vector<uint8_t> buf = std::vector<uint8_t>(proto::kMaxDatagramBytes);
  std::vector<int32_t> values = std::vector<int32_t>(proto::kMaxNumel);
  std::vector<int32_t> expect = std::vector<int32_t>(proto::kMaxNumel);

  Net(Fixture& fx, uint32_t s, uint32_t k) : f(fx), slots(s), rounds(k) {
    round.assign(f.spec.num_workers, std::vector<uint32_t>(slots, 0));
    completions.assign(slots, std::vector<uint32_t>(rounds, 0));
  }
  size_t numel() const { return proto::NumelOf(f.spec.size); }
  int32_t Value(uint32_t r, uint32_t j, uint32_t k, size_t i) const {
    return static_cast<int32_t>(FuzzMix((uint64_t{r} << 48) ^ (uint64_t{j} << 32) ^ (k << 12) ^ i));
  }
  int8_t E0(uint32_t r, uint32_t j, uint32_t k) const {
    return static_cast<int8_t>(FuzzMix(0xe0e0 + r * 131 + j * 7 + k) % 40 - 20);
  }
  int8_t E1(uint32_t r, uint32_t j, uint32_t k) const {
    return static_cast<int8_t>(FuzzMix(0xe1e1 + r * 131 + j * 7 + k) % 7 == 0);
  }
  uint32_t Tsi(uint32_t j, uint32_t k) const { return k * slots + j; }
  proto::Header HeaderOf(uint32_t r, uint32_t j, uint32_t k) const {
    proto::Header h;
    h.size = f.spec.size;
    h.job_number = 1;
    h.tsi = Tsi(j, k);
    h.slot = proto::SlotId{static_cast<uint16_t>(j), static_cast<uint8_t>(k % 2)};
    h.e0 = E0(r, j, k);
    h.e1 = E1(r, j, k);
    return h;
  }

  // Worker r sends (or re-sends) its current packet of slot j.
  void Send(uint32_t r, uint32_t j) {
    if (round[r][j] < rounds) wire.push_back({r, j, round[r][j]});
  }

  // Delivers a packet to the switch; the results reach worker r' when deliver(r') says so.
  template <typename Deliver>
  void Arrive(const InFlight& p, Deliver deliver) {
    const proto::Header h = HeaderOf(p.rank, p.slot, p.round);
    for (size_t i = 0; i < numel(); ++i) values[i] = Value(p.rank, p.slot, p.round, i);
    const size_t n = proto::Encode(h, std::span<const int32_t>(values.data(), numel()), buf);
    const Action& a = f.Feed(WorkerEndpoint(p.rank), std::span<const uint8_t>(buf.data(), n));
    if (a.kind == Action::Kind::kDrop) {
      // A legitimate packet is never malformed, foreign or out of range.
      FUZZ_CHECK(a.reason == DropReason::kNone || a.reason == DropReason::kDuplicate);
      return;
    }
    proto::Header out;
    FUZZ_CHECK(proto::DecodeHeader(a.reply, &out) == proto::DecodeError::kOk);
    // The result belongs to the round of the packet's set the workers are on: find which round
    // it claims by its echoed tsi, and check it is that round's sum.
    FUZZ_CHECK(out.tsi % slots == p.slot);
    const uint32_t k = out.tsi / slots;
    FUZZ_CHECK(k < rounds && k % 2 == p.round % 2);
    if (a.kind == Action::Kind::kMulticast) {
      FUZZ_CHECK(k == p.round);
      FUZZ_CHECK(++completions[p.slot][k] == 1);  // each round completes once
      // Every worker has sent round k at least once (it is on round k, or past it).
      for (uint32_t r = 0; r < f.spec.num_workers; ++r) FUZZ_CHECK(round[r][p.slot] >= k);
    } else {
      FUZZ_CHECK(completions[p.slot][k] == 1);
    }
    int8_t e0 = INT8_MIN, e1 = INT8_MIN;
    std::fill(expect.begin(), expect.end(), 0);
    for (uint32_t r = 0; r < f.spec.num_workers; ++r) {
      e0 = std::max(e0, E0(r, p.slot, k));
      e1 = std::max(e1, E1(r, p.slot, k));
      for (size_t i = 0; i < numel(); ++i) {
        expect[i] = static_cast<int32_t>(static_cast<uint32_t>(expect[i]) +
                                         static_cast<uint32_t>(Value(r, p.slot, k, i)));
      }
    }
    FUZZ_CHECK(out.e0 == e0 && out.e1 == e1);
    FUZZ_CHECK(out.job_number == 1);
    proto::LoadPayload(a.reply.subspan(proto::kPrefixBytes),
                       std::span<int32_t>(values.data(), numel()));
    FUZZ_CHECK(std::equal(values.begin(), values.begin() + numel(), expect.begin()));
    // Who gets the result: a worker still on round k moves to round k + 1.
    for (uint32_t r = 0; r < f.spec.num_workers; ++r) {
      const bool addressed = a.kind == Action::Kind::kMulticast || r == p.rank;
      if (addressed && round[r][p.slot] == k && deliver(r)) ++round[r][p.slot];
    }
  }
};

void RunProtocol(FuzzedDataProvider& in) {
  SwitchConfig config;
  config.slots_per_job = in.ConsumeIntegralInRange<uint32_t>(1, 4);
  config.max_workers_per_job = 8;
  Fixture f(config);
  f.spec.job_id = kSession;
  f.spec.num_workers = in.ConsumeIntegralInRange<uint32_t>(1, 5);
  f.spec.size = in.ConsumeBool() ? proto::SizeCode::k256B : proto::SizeCode::k1024B;
  f.spec.max_outstanding_packets = config.slots_per_job;
  f.spec.running_tsi = true;
  f.CreateJob();
  Net net(f, config.slots_per_job, in.ConsumeIntegralInRange<uint32_t>(1, 6));
  const uint32_t n = f.spec.num_workers;
  std::vector<uint8_t> junk(proto::kMaxDatagramBytes + 4);
  while (in.remaining_bytes() > 0) {
    const uint8_t op = in.ConsumeIntegral<uint8_t>();
    switch (op % 8) {
      case 0:
      case 1:
      case 2: {  // a worker sends or re-sends its current packet on a slot
        net.Send(in.ConsumeIntegralInRange<uint32_t>(0, n - 1),
                 in.ConsumeIntegralInRange<uint32_t>(0, net.slots - 1));
        break;
      }
      case 3:
      case 4:
      case 5: {  // the network delivers a packet (maybe keeping a copy: a duplicate later)
        if (net.wire.empty()) break;
        const size_t i = in.ConsumeIntegralInRange<size_t>(0, net.wire.size() - 1);
        const Net::InFlight p = net.wire[i];
        if (!in.ConsumeBool()) net.wire.erase(net.wire.begin() + static_cast<long>(i));
        const uint8_t lose = in.ConsumeIntegral<uint8_t>();  // which workers lose the result
        net.Arrive(p, [&](uint32_t r) { return ((lose >> (r % 8)) & 1) == 0; });
        break;
      }
      case 6: {  // the network loses a packet
        if (net.wire.empty()) break;
        const size_t i = in.ConsumeIntegralInRange<size_t>(0, net.wire.size() - 1);
        net.wire.erase(net.wire.begin() + static_cast<long>(i));
        break;
      }
      case 7: {  // junk: a stranger's packet, or a worker's malformed / wrong-size / out-of-range
        const uint32_t r = in.ConsumeIntegralInRange<uint32_t>(0, n - 1);
        const int kind = in.ConsumeIntegralInRange<int>(0, 3);
        proto::Header h = net.HeaderOf(r, in.ConsumeIntegralInRange<uint32_t>(0, net.slots - 1),
                                       in.ConsumeIntegralInRange<uint32_t>(0, net.rounds - 1));
        Endpoint src = WorkerEndpoint(r);
        size_t len = proto::DatagramBytes(h.size);
        if (kind == 0) {
          src = kStranger;
        } else if (kind == 1) {  // any length but the right one (that would be a contribution)
          len = in.ConsumeIntegralInRange<size_t>(0, junk.size());
          if (len == proto::DatagramBytes(h.size)) --len;
        } else if (kind == 2) {
          h.size =
              h.size == proto::SizeCode::k256B ? proto::SizeCode::k1024B : proto::SizeCode::k256B;
          len = proto::DatagramBytes(h.size);
        } else {
          h.slot.index = static_cast<uint16_t>(
              in.ConsumeIntegralInRange<uint32_t>(net.slots, proto::kMaxSlots - 1));
        }
        proto::EncodeHeader(h, junk);
        const size_t filled = std::min(len, junk.size());
        for (size_t i = proto::kPrefixBytes; i < filled; ++i) junk[i] = static_cast<uint8_t>(i);
        const Action& a = f.Feed(src, std::span<const uint8_t>(junk.data(), filled));
        FUZZ_CHECK(a.kind == Action::Kind::kDrop && a.reason != DropReason::kNone);
        break;
      }
    }
    f.CheckCounters();
  }
  // Liveness: a loss-free network from here on (the copies still in flight arrive first, in
  // order); every worker re-sends until every round of every slot completed.
  while (!net.wire.empty()) {
    const Net::InFlight p = net.wire.front();
    net.wire.pop_front();
    net.Arrive(p, [](uint32_t) { return true; });
  }
  for (uint32_t pass = 0; pass < 4 * net.rounds + 4; ++pass) {
    for (uint32_t j = 0; j < net.slots; ++j) {
      for (uint32_t r = 0; r < n; ++r) {
        if (net.round[r][j] < net.rounds)
          net.Arrive({r, j, net.round[r][j]}, [](uint32_t) { return true; });
      }
    }
  }
  for (uint32_t j = 0; j < net.slots; ++j) {
    for (uint32_t r = 0; r < n; ++r) FUZZ_CHECK(net.round[r][j] == net.rounds);
    for (uint32_t k = 0; k < net.rounds; ++k) FUZZ_CHECK(net.completions[j][k] == 1);
  }
  f.CheckCounters();
}

}  // namespace
}  // namespace switchml::dataplane

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    switchml::dataplane::RunProtocol(in);
  } else {
    switchml::dataplane::RunArbitrary(in);
  }
  return 0;
}
