// Micro-benchmarks of the wire codec on one 256-element packet (1034-byte datagram). Items are
// payload elements, so items/s compares directly with the other cores' element rates.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>

#include "proto/wire.h"

namespace switchml::proto {
namespace {

Packet SamplePacket() {
  Packet p;
  p.header = Header{kMsgTypeData, SizeCode::k1024B, 7, 123456, SlotId{42, 1}, -3, 5};
  for (size_t i = 0; i < kMaxNumel; ++i) p.values[i] = static_cast<int32_t>(i * 2654435761u);
  return p;
}

void BM_Encode(benchmark::State& state) {
  const Packet p = SamplePacket();
  std::array<uint8_t, kMaxDatagramBytes> out;
  for (auto _ : state) {
    benchmark::DoNotOptimize(Encode(p, out));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kMaxNumel);
}
BENCHMARK(BM_Encode);

void BM_Decode(benchmark::State& state) {
  std::array<uint8_t, kMaxDatagramBytes> wire;
  Encode(SamplePacket(), wire);
  Packet p;
  for (auto _ : state) {
    benchmark::DoNotOptimize(Decode(wire, &p));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kMaxNumel);
}
BENCHMARK(BM_Decode);

}  // namespace
}  // namespace switchml::proto

BENCHMARK_MAIN();
