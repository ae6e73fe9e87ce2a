// Deterministic all-reduce inputs whose exact sum is known in closed form, and the check of a
// result against it: how `switchml worker`/`run` and the tests verify every result without
// exchanging data.
//
// Worker r's element i is x_r[i] = (a_i * (r + 1) + b_i) * 2^s_j (float32; s_j per packet-size
// block j, some blocks all zero) or A_i * (r + 1) + B_i (int32, wrap-around), with a_i, b_i, A_i,
// B_i, s_j drawn from a hash of (seed, iteration, i). With a block density below 1 (block-sparse
// inputs), only a drawn fraction of the blocks is non-zero on any worker, each on a drawn subset
// of the workers (its holders; zero on the others). The expected sum is computed independently
// in float64 / 64-bit integers. float32 results are accepted within the quantization bound
// n / (2 f) of their block plus the float32 rounding of the result (docs/architecture.md).
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "switchml/types.h"

namespace switchml::testing {

struct Pattern {
  uint64_t seed = 1;
  uint32_t iteration = 0;
  uint32_t num_workers = 1;
  uint32_t packet_numel = 256;  // quantization block size
  DataType dtype = DataType::kFloat32;
  // Block-sparse inputs (docs/protocol.md 2.5), for tests and benchmarks: the fraction of blocks
  // (packet_numel elements) that are non-zero on at least one worker (the union), drawn per block;
  // every other block is zero on every worker. 1: the dense pattern (where 1 in 16 float32 blocks
  // is zero, none of int32's). In [0, 1].
  double density = 1;
  // With density < 1, who holds a union block (is non-zero there): its owner, a worker drawn per
  // block, and each other worker with this probability: 1, every worker (the same blocks
  // everywhere); 0, the owner alone (disjoint blocks). In [0, 1].
  double overlap = 1;
};

// Writes worker `rank`'s input for the pattern into buf[0..count).
void FillInput(const Pattern& p, uint32_t rank, void* buf, size_t count);

struct VerifyResult {
  size_t checked = 0;
  size_t mismatches = 0;
  size_t first_bad = 0;
  double got = 0, expected = 0, bound = 0;  // at first_bad
  double max_error = 0;                     // float32: largest |got - expected| seen
  bool ok() const { return mismatches == 0; }
  std::string ToString() const;
};

// Checks out[0..count) against the exact sum of all workers' inputs.
VerifyResult Verify(const Pattern& p, const void* out, size_t count);

}  // namespace switchml::testing
