// The element-by-element arithmetic of block floating point, shared by the scalar reference
// functions and the SIMD kernels' tails (quantizer.cc), so both have one definition. Internal to
// the quant module.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "quant/quantizer.h"

namespace switchml::quant::internal {

inline constexpr uint32_t kAbsMask = 0x7fffffffu;
// The exponent field of a float's bits: all ones for inf and NaN, so the sign-cleared bits of a
// finite float are below this.
inline constexpr uint32_t kExponentMask = 0x7f800000u;
inline constexpr double kInt32Max = static_cast<double>(std::numeric_limits<int32_t>::max());

inline bool IsNonFiniteBits(uint32_t bits) { return (bits & kExponentMask) == kExponentMask; }

// The power of two the scale divides by: 2^128 for the clamped exponent 127, which covers every
// finite float (FLT_MAX < 2^128), 2^e otherwise.
inline int EffectiveExponent(int8_t max_exponent) {
  return max_exponent == kMaxExponent ? 128 : max_exponent;
}

// 2^k exactly, for k in [-1022, 1023]: what std::ldexp multiplies by, without its libm call. For
// the scales below (normal doubles, k in [-128, 128]) x * Pow2(k) is exactly std::ldexp(x, k).
inline double Pow2(int k) { return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52); }

// The block's exponent from the largest sign-cleared bits of its finite elements (0: none).
// For non-negative finite floats the bit pattern orders like the value, so that is max |x|; its
// biased exponent field is floor(log2 m) + 127 for normals, 0 for denormals.
inline int8_t ExponentOfMaxBits(uint32_t max_bits) {
  if (max_bits == 0) return kZeroBlockExponent;  // all zeros (or only non-finite)
  const int biased = static_cast<int>(max_bits >> 23);
  // Normals: 2^(biased - 126) = 2^(floor(log2 m) + 1) > m. Denormals: m < 2^-126.
  const int e = std::max(biased, 0) - 126;
  return static_cast<int8_t>(std::min(e, static_cast<int>(kMaxExponent)));
}

// The largest |q| a worker may send: INT32_MAX / n, so that n of them cannot overflow.
inline double QuantizeLimit(uint32_t num_workers) {
  return static_cast<double>(std::numeric_limits<int32_t>::max() / num_workers);
}

// 1 / f = n * 2^E / INT32_MAX for a block that is not a zero block, rounded once.
inline double InverseScale(int8_t max_exponent, uint32_t num_workers) {
  return static_cast<double>(num_workers) / kInt32Max * Pow2(EffectiveExponent(max_exponent));
}

// One element: round(x * f) clamped to +-limit, 0 for inf and NaN.
inline int32_t QuantizeOne(float x, double f, double limit) {
  if (IsNonFiniteBits(std::bit_cast<uint32_t>(x))) return 0;
  const double v = std::clamp(static_cast<double>(x) * f, -limit, limit);
  return static_cast<int32_t>(std::nearbyint(v));
}

inline float DequantizeOne(int32_t q, double inverse) {
  return static_cast<float>(static_cast<double>(q) * inverse);
}

}  // namespace switchml::quant::internal
