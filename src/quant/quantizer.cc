// Block floating point: the scalar reference (Quantize, Dequantize) and the data path's kernels
// (AnalyzeBlock, QuantizeToWire, DequantizeFromWire), which Highway compiles once per SIMD target
// and dispatches at run time to the best target the CPU supports (docs/architecture.md, "SIMD
// kernels"). Every kernel gives exactly the reference's results: the same double arithmetic lane
// by lane, and the element-by-element code of block_math.h for the tails and on the scalar target.
#include "quant/quantizer.h"

#include "base/check.h"
#include "proto/byte_order.h"
#include "quant/block_math.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/quantizer.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "proto/byte_order-inl.h"

HWY_BEFORE_NAMESPACE();
namespace switchml::quant::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using proto::HWY_NAMESPACE::LoadBigEndian;
using proto::HWY_NAMESPACE::StoreBigEndian;

// On Highway's scalar target (one lane; it converts out-of-range doubles with saturation where the
// reference's casts give inf) the kernels run only the reference's element-by-element code; so
// does DequantizeFromWireKernel on HWY_EMU128, which saturates the same way.
#if HWY_TARGET != HWY_SCALAR
// The sign-cleared bits of float lanes x, as int32 lanes of di (below 2^31, so signed lanes order
// them like unsigned ones).
template <class DI, class VF>
HWY_INLINE hn::Vec<DI> AbsBits(DI di, VF x) {
  return hn::And(hn::BitCast(di, x), hn::Set(di, static_cast<int32_t>(internal::kAbsMask)));
}

// The lanes whose AbsBits are those of a finite float.
template <class DI>
HWY_INLINE hn::Mask<DI> IsFiniteBits(DI di, hn::Vec<DI> abs_bits) {
  return hn::Lt(abs_bits, hn::Set(di, static_cast<int32_t>(internal::kExponentMask)));
}
#endif

// The largest sign-cleared bits over the finite elements of in[0, n), given `max_bits`, the
// largest over all elements of in[0, n) (finite or not); *non_finite is set when some element is
// inf or NaN. The fast pass takes the max over all elements: it is a finite one's unless it
// reaches the exponent mask, and only then (a block with inf or NaN, an error case) a second,
// scalar pass leaves the non-finite elements out.
HWY_INLINE uint32_t FiniteMaxBits(const float* HWY_RESTRICT in, size_t n, uint32_t max_bits,
                                  bool* non_finite) {
  *non_finite = internal::IsNonFiniteBits(max_bits);
  if (!*non_finite) return max_bits;
  max_bits = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(in[i]) & internal::kAbsMask;
    if (!internal::IsNonFiniteBits(bits)) max_bits = std::max(max_bits, bits);
  }
  return max_bits;
}

// The largest sign-cleared bits of in[i, n) and `max_bits`, element by element.
HWY_INLINE uint32_t MaxBitsTail(const float* HWY_RESTRICT in, size_t i, size_t n,
                                uint32_t max_bits) {
  for (; i < n; ++i) {
    max_bits = std::max(max_bits, std::bit_cast<uint32_t>(in[i]) & internal::kAbsMask);
  }
  return max_bits;
}

#if HWY_TARGET != HWY_SCALAR
// The scan's step: folds the AbsBits of the full vector of floats at p into max.
template <class DI, class DF>
HWY_INLINE hn::Vec<DI> MaxBitsStep(DI di, DF df, const float* HWY_RESTRICT p, hn::Vec<DI> max) {
  return hn::Max(max, AbsBits(di, hn::LoadU(df, p)));
}

// The quantizer's constants, as double vectors of dd (f, -limit, limit and the rounding bias).
template <class DD>
struct QuantizeConstants {
  hn::Vec<DD> scale, low, high, round_bias;
};

template <class DD>
HWY_INLINE QuantizeConstants<DD> MakeQuantizeConstants(DD dd, double f, double limit) {
  // Adding 1.5 * 2^52 to a double of magnitude below 2^51 rounds it to an integer in the current
  // rounding mode, exactly as std::nearbyint does (to nearest, ties to even, by default), and
  // leaves that integer's two's complement in the sum's low 32 bits: rounding and conversion in
  // one add. |v| <= limit < 2^31 here.
  return {hn::Set(dd, f), hn::Set(dd, -limit), hn::Set(dd, limit), hn::Set(dd, 6755399441055744.0)};
}

// The quantizer's step: the full vector of floats at `in`, quantized, to wire (big-endian).
// Each half of the vector is widened to doubles.
template <class DF, class DD>
HWY_INLINE void QuantizeStep(DF df, const QuantizeConstants<DD>& c, const float* HWY_RESTRICT in,
                             uint8_t* HWY_RESTRICT wire) {
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint32_t, DF> du;
  const hn::Half<DF> df_half;
  const DD dd;
  // The rounded, clamped x f of a half vector, as doubles whose low 32 bits are the int32.
  const auto quantize = [&](auto x_half) {
    const auto v = hn::Min(hn::Max(hn::Mul(hn::PromoteTo(dd, x_half), c.scale), c.low), c.high);
    return hn::BitCast(du, hn::Add(v, c.round_bias));
  };
  const auto x = hn::LoadU(df, in);
  const auto finite = IsFiniteBits(di, AbsBits(di, x));
  // The low 32 bits of each double (little-endian: the even 32-bit lanes), in order.
  const auto q = hn::BitCast(di, hn::ConcatEven(du, quantize(hn::UpperHalf(df_half, x)),
                                                quantize(hn::LowerHalf(df_half, x))));
  StoreBigEndian(hn::IfThenElseZero(finite, q), di, wire);
}
#endif

// The largest sign-cleared bits over the finite elements of in[0, n); *non_finite is set when
// some element is inf or NaN.
uint32_t MaxFiniteBitsKernel(const float* HWY_RESTRICT in, size_t n, bool* non_finite) {
  size_t i = 0;
  uint32_t max_bits = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<int32_t> di;
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(di);
  auto max = hn::Zero(di);
  for (; i + lanes <= n; i += lanes) max = MaxBitsStep(di, df, in + i, max);
  max_bits = static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(di, max)));
#endif
  return FiniteMaxBits(in, n, MaxBitsTail(in, i, n, max_bits), non_finite);
}

// wire[4i, 4i + 4) = big-endian QuantizeOne(in[i], f, limit) for i < n.
void QuantizeToWireKernel(const float* HWY_RESTRICT in, size_t n, double f, double limit,
                          uint8_t* HWY_RESTRICT wire) {
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> df;
  const hn::Repartition<double, decltype(df)> dd;
  const size_t lanes = hn::Lanes(df);
  const auto c = MakeQuantizeConstants(dd, f, limit);
  for (; i + lanes <= n; i += lanes) QuantizeStep(df, c, in + i, wire + 4 * i);
#endif
  for (; i < n; ++i) {
    proto::StoreBe32(static_cast<uint32_t>(internal::QuantizeOne(in[i], f, limit)), wire + 4 * i);
  }
}

// QuantizeToWireKernel(in, n, f, limit, wire) and MaxFiniteBitsKernel(next, m, non_finite) in
// one pass: the worker's packet carries one block's data and a later block's exponent, and one
// loop over both (after one dispatch) costs less than two.
uint32_t QuantizeAndMaxBitsKernel(const float* HWY_RESTRICT in, size_t n, double f, double limit,
                                  uint8_t* HWY_RESTRICT wire, const float* HWY_RESTRICT next,
                                  size_t m, bool* non_finite) {
  size_t i = 0, j = 0;
  uint32_t max_bits = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> df;
  const hn::ScalableTag<int32_t> di;
  const hn::Repartition<double, decltype(df)> dd;
  const size_t lanes = hn::Lanes(df);
  const auto c = MakeQuantizeConstants(dd, f, limit);
  auto max = hn::Zero(di);
  for (; i + lanes <= n && i + lanes <= m; i += lanes) {
    QuantizeStep(df, c, in + i, wire + 4 * i);
    max = MaxBitsStep(di, df, next + i, max);
  }
  // (Blocks differ in length only at the end of the slice.)
  for (j = i; j + lanes <= m; j += lanes) max = MaxBitsStep(di, df, next + j, max);
  for (; i + lanes <= n; i += lanes) QuantizeStep(df, c, in + i, wire + 4 * i);
  max_bits = static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(di, max)));
#endif
  for (; i < n; ++i) {
    proto::StoreBe32(static_cast<uint32_t>(internal::QuantizeOne(in[i], f, limit)), wire + 4 * i);
  }
  return FiniteMaxBits(next, m, MaxBitsTail(next, j, m, max_bits), non_finite);
}

// out[i] = DequantizeOne(big-endian wire element i, inverse) for i < n. Element by element on
// HWY_EMU128 too (the fallback target of clang and GCC >= 12.3 builds, where HWY_SCALAR is GCC
// 12.2's): its DemoteTo saturates doubles beyond the float range to +-FLT_MAX where the
// reference's cast gives +-inf.
void DequantizeFromWireKernel(const uint8_t* HWY_RESTRICT wire, size_t n, double inverse,
                              float* HWY_RESTRICT out) {
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  // A full vector of int32s per step; each half is widened to doubles, scaled and narrowed to
  // floats.
  const hn::ScalableTag<int32_t> di;
  const hn::ScalableTag<float> df;
  const hn::Half<decltype(di)> di_half;
  const hn::Half<decltype(df)> df_half;
  const hn::Repartition<double, decltype(df)> dd;
  const size_t lanes = hn::Lanes(di);
  const auto scale = hn::Set(dd, inverse);
  const auto dequantize = [&](auto q_half) {
    return hn::DemoteTo(df_half, hn::Mul(hn::PromoteTo(dd, q_half), scale));
  };
  for (; i + lanes <= n; i += lanes) {
    const auto q = LoadBigEndian(di, wire + 4 * i);
    hn::StoreU(hn::Combine(df, dequantize(hn::UpperHalf(di_half, q)),
                           dequantize(hn::LowerHalf(di_half, q))),
               df, out + i);
  }
#endif
  for (; i < n; ++i) {
    out[i] = internal::DequantizeOne(static_cast<int32_t>(proto::LoadBe32(wire + 4 * i)), inverse);
  }
}

}  // namespace switchml::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace switchml::quant {

HWY_EXPORT(MaxFiniteBitsKernel);
HWY_EXPORT(QuantizeToWireKernel);
HWY_EXPORT(QuantizeAndMaxBitsKernel);
HWY_EXPORT(DequantizeFromWireKernel);

BlockInfo AnalyzeBlock(std::span<const float> block) {
  BlockInfo info;
  const uint32_t max_bits =
      HWY_DYNAMIC_DISPATCH(MaxFiniteBitsKernel)(block.data(), block.size(), &info.non_finite);
  info.exponent = internal::ExponentOfMaxBits(max_bits);
  return info;
}

double Scale(int8_t max_exponent, uint32_t num_workers) {
  CHECK(num_workers > 0) << "Scale needs at least one worker";
  if (max_exponent == kZeroBlockExponent) return 0.0;
  // INT32_MAX / (n * 2^E): one rounding in the division, the power of two is exact (no
  // under/overflow in double for E in [-127, 128] and n < 2^32).
  return internal::kInt32Max / num_workers *
         internal::Pow2(-internal::EffectiveExponent(max_exponent));
}

// Why |q| <= INT32_MAX / n: a finite x with exponent <= E has |x| <= 2^E (1 - 2^-24), so the
// exact |x f| <= (1 - 2^-24) INT32_MAX / n and the two double roundings (of f and of x f) add at
// most 2^-52 relative. For n <= 256, INT32_MAX / n >= 2^23, so the margin 2^-24 INT32_MAX / n
// >= 0.5 keeps the rounded value at or below floor(INT32_MAX / n). The clamp (QuantizeLimit) makes
// the bound hold for any n and also when a caller passes a smaller exponent than the block's.
void Quantize(std::span<const float> in, int8_t max_exponent, uint32_t num_workers,
              std::span<int32_t> out) {
  CHECK_LE(in.size(), out.size()) << "Quantize output too small";
  const double f = Scale(max_exponent, num_workers);
  const double limit = internal::QuantizeLimit(num_workers);
  for (size_t i = 0; i < in.size(); ++i) out[i] = internal::QuantizeOne(in[i], f, limit);
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(in.size()), out.end(), 0);
}

void QuantizeToWire(std::span<const float> in, int8_t max_exponent, uint32_t num_workers,
                    std::span<uint8_t> wire) {
  CHECK(wire.size() % 4 == 0 && in.size() <= wire.size() / 4) << "QuantizeToWire output size";
  const double f = Scale(max_exponent, num_workers);
  HWY_DYNAMIC_DISPATCH(QuantizeToWireKernel)
  (in.data(), in.size(), f, internal::QuantizeLimit(num_workers), wire.data());
  std::fill(wire.begin() + static_cast<std::ptrdiff_t>(4 * in.size()), wire.end(), 0);
}

BlockInfo QuantizeToWireAndAnalyze(std::span<const float> in, int8_t max_exponent,
                                   uint32_t num_workers, std::span<uint8_t> wire,
                                   std::span<const float> next) {
  CHECK(wire.size() % 4 == 0 && in.size() <= wire.size() / 4) << "QuantizeToWire output size";
  const double f = Scale(max_exponent, num_workers);
  BlockInfo info;
  const uint32_t max_bits = HWY_DYNAMIC_DISPATCH(QuantizeAndMaxBitsKernel)(
      in.data(), in.size(), f, internal::QuantizeLimit(num_workers), wire.data(), next.data(),
      next.size(), &info.non_finite);
  std::fill(wire.begin() + static_cast<std::ptrdiff_t>(4 * in.size()), wire.end(), 0);
  info.exponent = internal::ExponentOfMaxBits(max_bits);
  return info;
}

void Dequantize(std::span<const int32_t> in, int8_t max_exponent, uint32_t num_workers,
                std::span<float> out) {
  CHECK_LE(out.size(), in.size()) << "Dequantize input too small";
  CHECK(num_workers > 0) << "Dequantize needs at least one worker";
  if (max_exponent == kZeroBlockExponent) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  // The product is rounded to double and to float, so the float rounding dominates the error.
  const double inverse = internal::InverseScale(max_exponent, num_workers);
  for (size_t i = 0; i < out.size(); ++i) out[i] = internal::DequantizeOne(in[i], inverse);
}

void DequantizeFromWire(std::span<const uint8_t> wire, int8_t max_exponent, uint32_t num_workers,
                        std::span<float> out) {
  CHECK_LE(4 * out.size(), wire.size()) << "DequantizeFromWire input too small";
  CHECK(num_workers > 0) << "DequantizeFromWire needs at least one worker";
  if (max_exponent == kZeroBlockExponent) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  HWY_DYNAMIC_DISPATCH(DequantizeFromWireKernel)
  (wire.data(), out.size(), internal::InverseScale(max_exponent, num_workers), out.data());
}

}  // namespace switchml::quant
#endif  // HWY_ONCE
