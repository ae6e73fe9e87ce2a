#include "testing/pattern.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

namespace switchml::testing {
namespace {

inline uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t ElementHash(const Pattern& p, size_t i) {
  return Mix(p.seed * 0x100000001b3ull ^ (uint64_t{p.iteration} << 48) ^ i);
}

struct BlockShape {
  bool zero;
  int shift;
};

inline BlockShape Block(const Pattern& p, size_t block) {
  const uint64_t h = Mix(~p.seed ^ (uint64_t{p.iteration} << 40) ^ (block * 0x9e37ull));
  return BlockShape{(h & 15) == 0, static_cast<int>((h >> 8) % 41) - 20};
}

inline void FloatCoefficients(uint64_t h, int* a, int* b) {
  *a = static_cast<int>(h & 2047) - 1024;
  *b = static_cast<int>((h >> 11) & 2047) - 1024;
}

// Block-sparse inputs (Pattern::density < 1): whether a block is in the union, and who holds it.
inline double Unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1p-53; }  // [0, 1)

inline uint64_t SparseHash(const Pattern& p, size_t block) {
  return Mix(p.seed * 0xd6e8feb86659fd93ull ^ (uint64_t{p.iteration} << 44) ^
             (block * 0xc2b2ae3d27d4eb4full) ^ 0x5ca1ab1eull);
}

// The workers that hold a block: none outside the union; else the block's owner and each other
// worker with probability p.overlap. Their factors (r + 1) summed (tri), counted, and the least and
// largest (the extremes of the linear x_r).
struct Holders {
  bool any = false;
  uint64_t tri = 0, count = 0;
  uint32_t lo = 0, hi = 0;  // least and largest r + 1
};

inline bool Holds(const Pattern& p, uint64_t h, uint32_t owner, uint32_t rank) {
  return rank == owner || Unit(Mix(h ^ (uint64_t{rank} + 1) * 0x9e3779b97f4a7c15ull)) < p.overlap;
}

inline bool InUnion(const Pattern& p, size_t block, uint64_t* h, uint32_t* owner) {
  *h = SparseHash(p, block);
  *owner = static_cast<uint32_t>(Mix(*h) % std::max<uint32_t>(1, p.num_workers));
  return Unit(*h) < p.density;
}

inline Holders HoldersOf(const Pattern& p, size_t block) {
  Holders w;
  if (p.density >= 1) {  // dense: every worker
    const uint64_t n = p.num_workers;
    return Holders{true, n * (n + 1) / 2, n, 1, p.num_workers};
  }
  uint64_t h;
  uint32_t owner;
  if (!InUnion(p, block, &h, &owner)) return w;
  for (uint32_t r = 0; r < p.num_workers; ++r) {
    if (!Holds(p, h, owner, r)) continue;
    if (!w.any) w.lo = r + 1;
    w.any = true;
    w.tri += r + 1;
    ++w.count;
    w.hi = r + 1;
  }
  return w;
}

// Whether worker `rank` is non-zero in the block (always, for the dense pattern's int32 blocks).
inline bool RankHolds(const Pattern& p, size_t block, uint32_t rank) {
  if (p.density >= 1) return true;
  uint64_t h;
  uint32_t owner;
  return InUnion(p, block, &h, &owner) && Holds(p, h, owner, rank);
}

}  // namespace

void FillInput(const Pattern& p, uint32_t rank, void* buf, size_t count) {
  const bool sparse = p.density < 1;
  if (p.dtype == DataType::kInt32) {
    auto* out = static_cast<int32_t*>(buf);
    for (size_t j = 0; j * p.packet_numel < count; ++j) {
      const size_t begin = j * p.packet_numel, end = std::min(count, begin + p.packet_numel);
      if (sparse && !RankHolds(p, j, rank)) {
        std::fill(out + begin, out + end, 0);
        continue;
      }
      for (size_t i = begin; i < end; ++i) {
        const uint64_t h = ElementHash(p, i);
        const uint32_t a = static_cast<uint32_t>(h), b = static_cast<uint32_t>(h >> 32);
        out[i] = static_cast<int32_t>(a * (rank + 1) + b);
      }
    }
    return;
  }
  auto* out = static_cast<float*>(buf);
  for (size_t j = 0; j * p.packet_numel < count; ++j) {
    const BlockShape shape = Block(p, j);
    const size_t begin = j * p.packet_numel, end = std::min(count, begin + p.packet_numel);
    if (sparse ? !RankHolds(p, j, rank) : shape.zero) {
      std::fill(out + begin, out + end, 0.f);
      continue;
    }
    // x * 2^s by a multiplication, exact as ldexp is (|s| <= 20 keeps every value normal), but
    // without a library call per element.
    const float scale = std::ldexp(1.f, shape.shift);
    for (size_t i = begin; i < end; ++i) {
      int a, b;
      FloatCoefficients(ElementHash(p, i), &a, &b);
      out[i] = static_cast<float>(a * static_cast<int>(rank + 1) + b) * scale;
    }
  }
}

VerifyResult Verify(const Pattern& p, const void* buf, size_t count) {
  VerifyResult r;
  r.checked = count;
  const uint64_t n = p.num_workers;
  auto note = [&](size_t i, double got, double expected, double bound) {
    if (r.mismatches++ == 0) {
      r.first_bad = i;
      r.got = got;
      r.expected = expected;
      r.bound = bound;
    }
  };
  const bool sparse = p.density < 1;
  if (p.dtype == DataType::kInt32) {
    const auto* out = static_cast<const int32_t*>(buf);
    for (size_t j = 0; j * p.packet_numel < count; ++j) {
      const size_t begin = j * p.packet_numel, end = std::min(count, begin + p.packet_numel);
      const Holders w = HoldersOf(p, j);  // (dense: every worker)
      for (size_t i = begin; i < end; ++i) {
        const uint64_t h = ElementHash(p, i);
        const uint64_t a = static_cast<uint32_t>(h), b = static_cast<uint32_t>(h >> 32);
        const auto expected = static_cast<int32_t>(static_cast<uint32_t>(a * w.tri + b * w.count));
        if (out[i] != expected) note(i, out[i], expected, 0);
      }
    }
    return r;
  }
  const auto* out = static_cast<const float*>(buf);
  // The block's exact sums before the block's power of two, from one hash per element.
  std::vector<double> sums(p.packet_numel);
  for (size_t j = 0; j * p.packet_numel < count; ++j) {
    const BlockShape shape = Block(p, j);
    const size_t begin = j * p.packet_numel, end = std::min(count, begin + p.packet_numel);
    const Holders w = HoldersOf(p, j);
    const bool zero = sparse ? !w.any : shape.zero;
    // The block's largest |x_r[i]| over its holders: x is linear in r, so r + 1 = lo or hi.
    double max_abs = 0;
    const double scale = std::ldexp(1.0, shape.shift);  // exact multiplications, as ldexp
    if (!zero) {
      const double tri = static_cast<double>(w.tri), holders = static_cast<double>(w.count);
      for (size_t i = begin; i < end; ++i) {
        int a, b;
        FloatCoefficients(ElementHash(p, i), &a, &b);
        max_abs = std::max({max_abs, std::fabs(static_cast<double>(a) * w.lo + b),
                            std::fabs(static_cast<double>(a) * w.hi + b)});
        sums[i - begin] = a * tri + b * holders;
      }
      max_abs *= scale;
    }
    // Quantization error bound: each worker rounds to 1/f with f = (2^31 - 1) / (n 2^E), where
    // 2^E > max_abs is the block's power-of-two bound (E = frexp exponent).
    double qerr = 0;
    if (max_abs > 0) {
      int e;
      std::frexp(max_abs, &e);
      qerr = static_cast<double>(n) * static_cast<double>(n) * std::ldexp(1.0, e) /
             (2.0 * 2147483647.0);
    }
    constexpr double kFloatRounding = 0x1p-24;
    for (size_t i = begin; i < end; ++i) {
      const double expected = zero ? 0.0 : sums[i - begin] * scale;
      const double got = out[i];
      const double bound = qerr * (1 + 1e-9) + (std::fabs(expected) + qerr) * kFloatRounding;
      const double err = std::fabs(got - expected);
      if (!(err <= bound)) note(i, got, expected, bound);  // NaN fails too
      if (err > r.max_error) r.max_error = err;
    }
  }
  return r;
}

std::string VerifyResult::ToString() const {
  std::ostringstream s;
  if (ok()) {
    s << "verified " << checked << " elements";
    if (max_error > 0) s << " (max error " << max_error << ")";
    return s.str();
  }
  s.precision(10);
  s << mismatches << " of " << checked << " elements wrong; first at index " << first_bad
    << ": got " << got << ", expected " << expected;
  if (bound > 0) s << " (allowed error " << bound << ")";
  return s.str();
}

}  // namespace switchml::testing
