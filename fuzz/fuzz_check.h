// What the fuzz targets share. FUZZ_CHECK: their invariant check; a failed invariant prints
// where and what, then aborts, which libFuzzer reports as a crash and saves the input that caused
// it. FuzzMix: a 64-to-32-bit mix (splitmix64's finaliser) for input values made from a seed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace switchml {

inline uint32_t FuzzMix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

}  // namespace switchml

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
