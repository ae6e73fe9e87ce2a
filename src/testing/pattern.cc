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

}  // namespace

void FillInput(const Pattern& p, uint32_t rank, void* buf, size_t count) {
  if (p.dtype == DataType::kInt32) {
    auto* out = static_cast<int32_t*>(buf);
    for (size_t i = 0; i < count; ++i) {
      const uint64_t h = ElementHash(p, i);
      const uint32_t a = static_cast<uint32_t>(h), b = static_cast<uint32_t>(h >> 32);
      out[i] = static_cast<int32_t>(a * (rank + 1) + b);
    }
    return;
  }
  auto* out = static_cast<float*>(buf);
  for (size_t j = 0; j * p.packet_numel < count; ++j) {
    const BlockShape shape = Block(p, j);
    const size_t begin = j * p.packet_numel, end = std::min(count, begin + p.packet_numel);
    if (shape.zero) {
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
  if (p.dtype == DataType::kInt32) {
    const auto* out = static_cast<const int32_t*>(buf);
    const uint64_t tri = n * (n + 1) / 2;
    for (size_t i = 0; i < count; ++i) {
      const uint64_t h = ElementHash(p, i);
      const uint64_t a = static_cast<uint32_t>(h), b = static_cast<uint32_t>(h >> 32);
      const auto expected = static_cast<int32_t>(static_cast<uint32_t>(a * tri + b * n));
      if (out[i] != expected) note(i, out[i], expected, 0);
    }
    return r;
  }
  const auto* out = static_cast<const float*>(buf);
  const double tri = static_cast<double>(n * (n + 1) / 2);
  // The block's exact sums before the block's power of two, from one hash per element.
  std::vector<double> sums(p.packet_numel);
  for (size_t j = 0; j * p.packet_numel < count; ++j) {
    const BlockShape shape = Block(p, j);
    const size_t begin = j * p.packet_numel, end = std::min(count, begin + p.packet_numel);
    // The block's largest |x_r[i]| over all workers: x is linear in r, so r = 0 or n - 1.
    double max_abs = 0;
    const double scale = std::ldexp(1.0, shape.shift);  // exact multiplications, as ldexp
    if (!shape.zero) {
      for (size_t i = begin; i < end; ++i) {
        int a, b;
        FloatCoefficients(ElementHash(p, i), &a, &b);
        max_abs = std::max({max_abs, std::fabs(static_cast<double>(a + b)),
                            std::fabs(static_cast<double>(a) * n + b)});
        sums[i - begin] = a * tri + b * static_cast<double>(n);
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
      const double expected = shape.zero ? 0.0 : sums[i - begin] * scale;
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
