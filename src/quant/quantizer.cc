#include "quant/quantizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "base/check.h"

namespace switchml::quant {
namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kExponentMask = 0x7f800000u;
constexpr int kExponentShift = 23;
constexpr double kInt32Max = static_cast<double>(std::numeric_limits<int32_t>::max());

bool IsNonFiniteBits(uint32_t bits) { return (bits & kExponentMask) == kExponentMask; }

// The power of two the scale divides by: 2^128 for the clamped exponent 127, which covers every
// finite float (FLT_MAX < 2^128), 2^e otherwise.
int EffectiveExponent(int8_t max_exponent) {
  return max_exponent == kMaxExponent ? 128 : max_exponent;
}

}  // namespace

BlockInfo AnalyzeBlock(std::span<const float> block) {
  // For non-negative finite floats the bit pattern orders like the value, so the max |x| is the
  // max of the sign-cleared bits; its biased exponent field is floor(log2 m) + 127 for normals.
  uint32_t max_bits = 0;
  bool non_finite = false;
  for (float x : block) {
    const uint32_t bits = std::bit_cast<uint32_t>(x) & kAbsMask;
    if (IsNonFiniteBits(bits)) {
      non_finite = true;
      continue;
    }
    max_bits = std::max(max_bits, bits);
  }
  BlockInfo info;
  info.non_finite = non_finite;
  if (max_bits == 0) return info;  // all zeros (or only non-finite): kZeroBlockExponent
  const int biased = static_cast<int>(max_bits >> kExponentShift);  // 0 for denormals
  // Normals: 2^(biased - 126) = 2^(floor(log2 m) + 1) > m. Denormals: m < 2^-126.
  const int e = std::max(biased, 0) - 126;
  info.exponent = static_cast<int8_t>(std::min(e, static_cast<int>(kMaxExponent)));
  return info;
}

double Scale(int8_t max_exponent, uint32_t num_workers) {
  CHECK(num_workers > 0) << "Scale needs at least one worker";
  if (max_exponent == kZeroBlockExponent) return 0.0;
  // INT32_MAX / (n * 2^E): one rounding in the division, ldexp is exact (no under/overflow in
  // double for E in [-127, 128] and n < 2^32).
  return std::ldexp(kInt32Max / num_workers, -EffectiveExponent(max_exponent));
}

void Quantize(std::span<const float> in, int8_t max_exponent, uint32_t num_workers,
              std::span<int32_t> out) {
  CHECK_LE(in.size(), out.size()) << "Quantize output too small";
  const double f = Scale(max_exponent, num_workers);
  // Why |q| <= INT32_MAX / n: a finite x with exponent <= E has |x| <= 2^E (1 - 2^-24), so the
  // exact |x f| <= (1 - 2^-24) INT32_MAX / n and the two double roundings (of f and of x f) add
  // at most 2^-52 relative. For n <= 256, INT32_MAX / n >= 2^23, so the margin 2^-24 INT32_MAX / n
  // >= 0.5 keeps the rounded value at or below floor(INT32_MAX / n). The clamp below makes the
  // bound hold for any n and also when a caller passes a smaller exponent than the block's.
  const double limit = static_cast<double>(std::numeric_limits<int32_t>::max() / num_workers);
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = in[i];
    if (IsNonFiniteBits(std::bit_cast<uint32_t>(x))) {
      out[i] = 0;
      continue;
    }
    const double v = std::clamp(static_cast<double>(x) * f, -limit, limit);
    out[i] = static_cast<int32_t>(std::nearbyint(v));
  }
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(in.size()), out.end(), 0);
}

void Dequantize(std::span<const int32_t> in, int8_t max_exponent, uint32_t num_workers,
                std::span<float> out) {
  CHECK_LE(out.size(), in.size()) << "Dequantize input too small";
  CHECK(num_workers > 0) << "Dequantize needs at least one worker";
  if (max_exponent == kZeroBlockExponent) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  // 1 / f = n * 2^E / INT32_MAX, rounded once; the product is then rounded to double and to
  // float, so the float rounding dominates the error of this step.
  const double inverse =
      std::ldexp(static_cast<double>(num_workers) / kInt32Max, EffectiveExponent(max_exponent));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(in[i]) * inverse);
  }
}

}  // namespace switchml::quant
