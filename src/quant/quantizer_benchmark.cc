// Micro-benchmarks of the quantizer on one packet's block (256 elements, 1024 B payload); items
// are elements. Quantize and Dequantize are the scalar reference (host order); the *Wire* forms
// are the data path's SIMD kernels (big-endian payload bytes).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "quant/quantizer.h"

namespace switchml::quant {
namespace {

constexpr size_t kBlock = 256;
constexpr uint32_t kWorkers = 8;

// One block of gradient-like values, with its exponent and its quantized forms.
struct Block {
  Block() : in(kBlock), q(kBlock), wire(4 * kBlock), out(kBlock) {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.01f);
    for (float& x : in) x = dist(rng);
    e = AnalyzeBlock(in).exponent;
    Quantize(in, e, kWorkers, q);
    QuantizeToWire(in, e, kWorkers, wire);
  }
  std::vector<float> in;
  int8_t e;
  std::vector<int32_t> q;
  std::vector<uint8_t> wire;
  std::vector<float> out;
};

// Runs op once per iteration; one block's elements per iteration.
template <typename Op>
void PerBlock(benchmark::State& state, Op op) {
  for (auto _ : state) {
    op();
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}

void BM_AnalyzeBlock(benchmark::State& state) {
  Block b;
  PerBlock(state, [&] { benchmark::DoNotOptimize(AnalyzeBlock(b.in)); });
}
BENCHMARK(BM_AnalyzeBlock);

void BM_Quantize(benchmark::State& state) {
  Block b;
  PerBlock(state, [&] { Quantize(b.in, b.e, kWorkers, b.q); });
}
BENCHMARK(BM_Quantize);

void BM_Dequantize(benchmark::State& state) {
  Block b;
  PerBlock(state, [&] { Dequantize(b.q, b.e, kWorkers, b.out); });
}
BENCHMARK(BM_Dequantize);

void BM_QuantizeToWire(benchmark::State& state) {
  Block b;
  PerBlock(state, [&] { QuantizeToWire(b.in, b.e, kWorkers, b.wire); });
}
BENCHMARK(BM_QuantizeToWire);

// A worker's packet: the data of one block and the exponent of another, as two kernels and as
// the fused one.
void BM_QuantizeToWireThenAnalyzeBlock(benchmark::State& state) {
  Block b, next;
  PerBlock(state, [&] {
    QuantizeToWire(b.in, b.e, kWorkers, b.wire);
    benchmark::DoNotOptimize(AnalyzeBlock(next.in));
  });
}
BENCHMARK(BM_QuantizeToWireThenAnalyzeBlock);

void BM_QuantizeToWireAndAnalyze(benchmark::State& state) {
  Block b, next;
  PerBlock(state, [&] {
    benchmark::DoNotOptimize(QuantizeToWireAndAnalyze(b.in, b.e, kWorkers, b.wire, next.in));
  });
}
BENCHMARK(BM_QuantizeToWireAndAnalyze);

void BM_DequantizeFromWire(benchmark::State& state) {
  Block b;
  PerBlock(state, [&] { DequantizeFromWire(b.wire, b.e, kWorkers, b.out); });
}
BENCHMARK(BM_DequantizeFromWire);

}  // namespace
}  // namespace switchml::quant

BENCHMARK_MAIN();
