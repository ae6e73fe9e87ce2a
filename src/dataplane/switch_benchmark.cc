// Micro-benchmarks of Switch::Process: a stream of 256-element contributions from n workers, slot
// after slot, as the workers of one job send them. Each round of a slot is n packets: n - 1 are
// consumed and the last one completes the set and produces the multicast reply. Items are
// contributed elements (256 per packet), so items/s is the switch's aggregation rate and the time
// per iteration is the time per packet.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "dataplane/switch.h"
#include "proto/wire.h"

namespace switchml::dataplane {
namespace {

constexpr uint32_t kSlots = 256;  // a job's window: 2 * 256 KiB of registers
constexpr uint32_t kBaseIp = 0x0a000001;
constexpr uint16_t kPort = 40000;

struct Bench {
  explicit Bench(uint32_t n) : sw(Config()), n(n), datagrams(n) {
    JobSpec spec;
    spec.job_id = 1;
    spec.num_workers = n;
    spec.size = proto::SizeCode::k1024B;
    spec.max_outstanding_packets = kSlots;
    spec.running_tsi = true;
    CHECK(sw.CreateJob(spec).ok());
    for (uint32_t w = 0; w < n; ++w) {
      CHECK(sw.AddWorker(1, w, WorkerSpec{kBaseIp + w, kPort}).ok());
      proto::Packet p;
      p.header.size = proto::SizeCode::k1024B;
      p.header.e0 = static_cast<int8_t>(w);
      for (size_t i = 0; i < proto::kReferenceMaxNumel; ++i)
        p.values[i] = static_cast<int32_t>(i + w);
      proto::Encode(p, datagrams[w]);
    }
  }
  static SwitchConfig Config() {
    SwitchConfig c;
    c.slots_per_job = kSlots;
    return c;
  }
  // Rewrites worker w's datagram for round r: tsi r, slot r mod kSlots, set alternating.
  std::span<const uint8_t> Next(uint32_t w, uint32_t r) {
    std::array<uint8_t, proto::kReferenceMaxDatagramBytes>& d = datagrams[w];
    d[2] = static_cast<uint8_t>(r >> 24);
    d[3] = static_cast<uint8_t>(r >> 16);
    d[4] = static_cast<uint8_t>(r >> 8);
    d[5] = static_cast<uint8_t>(r);
    const uint16_t pool = proto::EncodePoolIndex(
        proto::SlotId{static_cast<uint16_t>(r % kSlots), static_cast<uint8_t>((r / kSlots) & 1)});
    d[6] = static_cast<uint8_t>(pool >> 8);
    d[7] = static_cast<uint8_t>(pool);
    return d;
  }

  Switch sw;
  uint32_t n;
  std::vector<std::array<uint8_t, proto::kReferenceMaxDatagramBytes>> datagrams;
};

// One contribution per iteration from workers in turn; the last of each round gets the reply.
// in_place: each reply is built over the datagram it answers (the daemon's form over a transport
// that lends received buffers for replies, e.g. DPDK: no second buffer is written); else it goes
// straight into a separate transmit buffer.
void RunProcess(benchmark::State& state, bool in_place) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  Bench b(n);
  uint32_t w = 0, r = 1;
  int64_t replies = 0;
  std::array<uint8_t, proto::kReferenceMaxDatagramBytes> transmit;
  for (auto _ : state) {
    const std::span<const uint8_t> d = b.Next(w, r);
    const std::span<uint8_t> out = in_place ? std::span<uint8_t>(b.datagrams[w]) : transmit;
    const Action& a = b.sw.Process(Endpoint{kBaseIp + w, kPort}, d, out);
    replies += a.kind == Action::Kind::kMulticast;
    benchmark::DoNotOptimize(a.reply.data());
    if (++w == n) {
      w = 0;
      ++r;
    }
  }
  CHECK(replies == state.iterations() / n) << replies;
  state.SetItemsProcessed(state.iterations() * proto::kReferenceMaxNumel);
}

void BM_Process(benchmark::State& state) { RunProcess(state, false); }
BENCHMARK(BM_Process)->Arg(1)->Arg(2)->Arg(4)->Arg(8);

void BM_ProcessInPlace(benchmark::State& state) { RunProcess(state, true); }
BENCHMARK(BM_ProcessInPlace)->Arg(1)->Arg(2)->Arg(4)->Arg(8);

}  // namespace
}  // namespace switchml::dataplane

BENCHMARK_MAIN();
