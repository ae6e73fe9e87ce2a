// Micro-benchmarks of the quantizer on one packet's block (256 elements, 1024 B payload); items
// are elements. Quantize and Dequantize are the scalar reference (host order); the *Wire forms are
// the data path's SIMD kernels (big-endian payload bytes).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "quant/quantizer.h"

namespace switchml::quant {
namespace {

constexpr size_t kBlock = 256;
constexpr uint32_t kWorkers = 8;

std::vector<float> RandomBlock() {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.01f);
  std::vector<float> b(kBlock);
  for (float& x : b) x = dist(rng);
  return b;
}

void BM_AnalyzeBlock(benchmark::State& state) {
  std::vector<float> in = RandomBlock();
  for (auto _ : state) {
    benchmark::DoNotOptimize(AnalyzeBlock(in));
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_AnalyzeBlock);

void BM_Quantize(benchmark::State& state) {
  std::vector<float> in = RandomBlock();
  std::vector<int32_t> out(kBlock);
  const int8_t e = AnalyzeBlock(in).exponent;
  for (auto _ : state) {
    Quantize(in, e, kWorkers, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_Quantize);

void BM_Dequantize(benchmark::State& state) {
  std::vector<float> in = RandomBlock();
  std::vector<int32_t> q(kBlock);
  const int8_t e = AnalyzeBlock(in).exponent;
  Quantize(in, e, kWorkers, q);
  std::vector<float> out(kBlock);
  for (auto _ : state) {
    Dequantize(q, e, kWorkers, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_Dequantize);

void BM_QuantizeToWire(benchmark::State& state) {
  std::vector<float> in = RandomBlock();
  std::vector<uint8_t> wire(4 * kBlock);
  const int8_t e = AnalyzeBlock(in).exponent;
  for (auto _ : state) {
    QuantizeToWire(in, e, kWorkers, wire);
    benchmark::DoNotOptimize(wire.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_QuantizeToWire);

void BM_DequantizeFromWire(benchmark::State& state) {
  std::vector<float> in = RandomBlock();
  std::vector<uint8_t> wire(4 * kBlock);
  const int8_t e = AnalyzeBlock(in).exponent;
  QuantizeToWire(in, e, kWorkers, wire);
  std::vector<float> out(kBlock);
  for (auto _ : state) {
    DequantizeFromWire(wire, e, kWorkers, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_DequantizeFromWire);

}  // namespace
}  // namespace switchml::quant

BENCHMARK_MAIN();
