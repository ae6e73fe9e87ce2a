#include "quant/quantizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hwy/tests/hwy_gtest.h"
#include "proto/byte_order.h"
#include "proto/wire.h"

namespace switchml::quant {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int8_t ExponentOf(std::vector<float> block) { return AnalyzeBlock(block).exponent; }

// AnalyzeBlock is a SIMD kernel: its tests run on every target compiled into the library that
// this CPU supports (the fixture forces Highway's dispatch to one target per instance).
class AnalyzeBlockTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(AnalyzeBlockTest);

TEST_P(AnalyzeBlockTest, ExponentGoldenValues) {
  EXPECT_EQ(ExponentOf({1.0f}), 1);
  EXPECT_EQ(ExponentOf({0.75f}), 0);
  EXPECT_EQ(ExponentOf({0.5f}), 0);
  EXPECT_EQ(ExponentOf({-3.0f, 0.25f}), 2);
  EXPECT_EQ(ExponentOf({std::ldexp(1.0f, -126)}), -125);  // smallest normal
  EXPECT_EQ(ExponentOf({std::ldexp(1.0f, -130)}), -126);  // denormal
  EXPECT_EQ(ExponentOf({std::numeric_limits<float>::denorm_min()}), -126);
  EXPECT_EQ(ExponentOf({std::ldexp(1.0f, 125)}), 126);
  EXPECT_EQ(ExponentOf({std::ldexp(1.0f, 126)}), 127);
  EXPECT_EQ(ExponentOf({std::ldexp(1.0f, 127)}), 127);  // clamped
  EXPECT_EQ(ExponentOf({FLT_MAX}), 127);                // clamped
  EXPECT_EQ(ExponentOf({-FLT_MAX}), 127);
  EXPECT_EQ(ExponentOf({}), kZeroBlockExponent);
  EXPECT_EQ(ExponentOf({0.0f, -0.0f, 0.0f}), kZeroBlockExponent);
}

TEST_P(AnalyzeBlockTest, ExponentBoundsTheBlockStrictly) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint32_t> bits_dist(0, 0x7f7fffffu);  // every finite |x| > 0
  for (int i = 0; i < 100000; ++i) {
    uint32_t bits = bits_dist(rng);
    const float x = std::bit_cast<float>(bits);
    if (x == 0) continue;
    int e = AnalyzeBlock(std::span<const float>(&x, 1)).exponent;
    int e_eff = e == kMaxExponent ? 128 : e;
    ASSERT_GT(std::ldexp(1.0, e_eff), static_cast<double>(x)) << x;
    if (e > -126 && e < kMaxExponent) {
      ASSERT_LE(std::ldexp(1.0, e - 1), static_cast<double>(x));
    }
  }
}

TEST_P(AnalyzeBlockTest, NonFiniteIsFlaggedAndIgnoredForTheExponent) {
  BlockInfo info = AnalyzeBlock(std::vector<float>{1.0f, kInf, 0.5f});
  EXPECT_TRUE(info.non_finite);
  EXPECT_EQ(info.exponent, 1);
  info = AnalyzeBlock(std::vector<float>{kNaN, -0.75f});
  EXPECT_TRUE(info.non_finite);
  EXPECT_EQ(info.exponent, 0);
  info = AnalyzeBlock(std::vector<float>{-kInf, kNaN});
  EXPECT_TRUE(info.non_finite);
  EXPECT_EQ(info.exponent, kZeroBlockExponent);
  EXPECT_FALSE(AnalyzeBlock(std::vector<float>{FLT_MAX, 0.0f}).non_finite);
}

TEST(ScaleTest, MatchesTheFormula) {
  EXPECT_EQ(Scale(kZeroBlockExponent, 4), 0.0);
  EXPECT_DOUBLE_EQ(Scale(0, 1), static_cast<double>(kInt32Max));
  EXPECT_DOUBLE_EQ(Scale(3, 2), static_cast<double>(kInt32Max) / 16);
  EXPECT_DOUBLE_EQ(Scale(-126, 1), std::ldexp(static_cast<double>(kInt32Max), 126));
  EXPECT_DOUBLE_EQ(Scale(126, 1), std::ldexp(static_cast<double>(kInt32Max), -126));
  EXPECT_DOUBLE_EQ(Scale(kMaxExponent, 32), std::ldexp(static_cast<double>(kInt32Max) / 32, -128));
}

TEST(ScaleTest, IsExactlyTheFormulaForEveryExponent) {
  for (int e = -127; e <= 127; ++e) {
    const int e_eff = e == kMaxExponent ? 128 : e;
    for (uint32_t n : {1u, 2u, 3u, 7u, 64u, 1000u, 0xffffffffu}) {
      ASSERT_EQ(Scale(static_cast<int8_t>(e), n),
                std::ldexp(static_cast<double>(kInt32Max) / n, -e_eff))
          << "e " << e << " n " << n;
    }
  }
}

TEST(QuantizeTest, NonFiniteQuantizesToZeroAndTailIsZeroed) {
  std::vector<float> in = {1.0f, kInf, kNaN, -kInf, -0.5f};
  std::vector<int32_t> out(8, 12345);
  Quantize(in, AnalyzeBlock(in).exponent, 1, out);
  EXPECT_EQ(out[0], static_cast<int32_t>(std::nearbyint(kInt32Max / 2.0)));
  EXPECT_EQ(out[1], 0);
  EXPECT_EQ(out[2], 0);
  EXPECT_EQ(out[3], 0);
  EXPECT_EQ(out[4], -static_cast<int32_t>(std::nearbyint(kInt32Max / 4.0)));
  EXPECT_EQ(out[5], 0);
  EXPECT_EQ(out[6], 0);
  EXPECT_EQ(out[7], 0);
}

TEST(QuantizeTest, ZeroBlockRoundTripsToExactZeros) {
  std::vector<float> in(256, 0.0f);
  in[3] = -0.0f;
  for (uint32_t n : {1u, 2u, 32u}) {
    BlockInfo info = AnalyzeBlock(in);
    ASSERT_EQ(info.exponent, kZeroBlockExponent);
    std::vector<int32_t> q(256, 7);
    Quantize(in, info.exponent, n, q);
    for (int32_t v : q) ASSERT_EQ(v, 0);
    std::vector<float> out(256, 1.0f);
    Dequantize(q, info.exponent, n, out);
    for (float v : out) ASSERT_EQ(v, 0.0f);
  }
}

TEST(QuantizeTest, StaysWithinInt32MaxOverNEvenWhenTheExponentIsTooSmall) {
  // A caller bug (a stale exponent) must not produce undefined conversions or overflowing sums.
  std::vector<float> in = {1e30f, -1e30f, 3.0f};
  for (uint32_t n : {1u, 3u, 1000u}) {
    std::vector<int32_t> q(3);
    Quantize(in, 0, n, q);
    const int64_t limit = kInt32Max / n;
    EXPECT_EQ(q[0], limit);
    EXPECT_EQ(q[1], -limit);
    EXPECT_EQ(q[2], limit);
  }
}

// Draws a float of random sign with magnitude log-uniform over [2^lo, 2^hi).
float RandomFloat(std::mt19937_64& rng, int lo, int hi) {
  std::uniform_real_distribution<double> exp_dist(lo, hi);
  std::bernoulli_distribution sign(0.5);
  double v = std::exp2(exp_dist(rng));
  float f = static_cast<float>(v);
  if (std::isinf(f)) f = FLT_MAX;
  return sign(rng) ? -f : f;
}

enum class BlockKind { kUnit, kTiny, kHuge, kDenormal, kMixedRange, kZero, kSparse };

std::vector<float> RandomBlock(std::mt19937_64& rng, BlockKind kind, size_t size) {
  std::vector<float> b(size, 0.0f);
  for (float& x : b) {
    switch (kind) {
      case BlockKind::kUnit:
        x = RandomFloat(rng, -3, 3);
        break;
      case BlockKind::kTiny:
        x = RandomFloat(rng, -105, -95);
        break;  // ~1e-30
      case BlockKind::kHuge:
        x = RandomFloat(rng, 95, 105);
        break;  // ~1e30
      case BlockKind::kDenormal:
        x = RandomFloat(rng, -149, -127);
        break;
      case BlockKind::kMixedRange:
        x = RandomFloat(rng, -149, 128);
        break;
      case BlockKind::kZero:
        x = 0.0f;
        break;
      case BlockKind::kSparse:
        x = std::bernoulli_distribution(0.1)(rng) ? RandomFloat(rng, -10, 10) : 0.0f;
        break;
    }
  }
  return b;
}

// Simulates the whole exchange for n workers: each analyzes its block, the "switch" takes the max
// exponent, each quantizes with it, the switch sums with 32-bit wrap-around, each dequantizes.
// Checks: no int32 overflow (the sum is also computed in int64), and every result within
// n / (2f) of the exact sum plus the float32 rounding of the result.
void CheckAggregation(const std::vector<std::vector<float>>& blocks, const std::string& label) {
  const uint32_t n = static_cast<uint32_t>(blocks.size());
  const size_t size = blocks[0].size();
  int8_t e = kZeroBlockExponent;
  for (const auto& b : blocks) e = std::max(e, AnalyzeBlock(b).exponent);

  std::vector<int64_t> wide(size, 0);
  std::vector<int32_t> wrapped(size, 0);
  std::vector<int32_t> q(size);
  for (const auto& b : blocks) {
    Quantize(b, e, n, q);
    for (size_t i = 0; i < size; ++i) {
      ASSERT_LE(std::llabs(q[i]), kInt32Max / n) << label;
      wide[i] += q[i];
      wrapped[i] =
          static_cast<int32_t>(static_cast<uint32_t>(wrapped[i]) + static_cast<uint32_t>(q[i]));
    }
  }
  std::vector<float> result(size);
  Dequantize(wrapped, e, n, result);

  const double f = Scale(e, n);
  for (size_t i = 0; i < size; ++i) {
    ASSERT_LE(std::llabs(wide[i]), kInt32Max) << label << " element " << i;
    ASSERT_EQ(wide[i], wrapped[i]) << label << " element " << i;
    double exact = 0;
    for (const auto& b : blocks) exact += static_cast<double>(b[i]);
    if (e == kZeroBlockExponent) {
      ASSERT_EQ(result[i], 0.0f) << label;
      continue;
    }
    const double quantization = n / (2 * f);
    if (std::isinf(result[i])) {
      // Only a sum beyond the float range may come back as infinity (with its sign).
      ASSERT_GE(std::fabs(exact) + quantization * (1 + 1e-9), static_cast<double>(FLT_MAX))
          << label << " element " << i << " exact " << exact;
      ASSERT_EQ(result[i] > 0, exact > 0) << label << " element " << i;
      continue;
    }
    const double tolerance =
        quantization * (1 + 1e-9) + std::fabs(exact) * std::ldexp(1.0, -24) + std::ldexp(1.0, -149);
    ASSERT_LE(std::fabs(static_cast<double>(result[i]) - exact), tolerance)
        << label << " element " << i << " exact " << exact << " got " << result[i] << " exponent "
        << int{e};
  }
}

TEST(QuantizeTest, ErrorBoundForNWorkersOverVariedMagnitudes) {
  const BlockKind kinds[] = {BlockKind::kUnit,     BlockKind::kTiny,       BlockKind::kHuge,
                             BlockKind::kDenormal, BlockKind::kMixedRange, BlockKind::kZero,
                             BlockKind::kSparse};
  for (uint32_t n : {1u, 2u, 3u, 8u, 32u}) {
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      std::mt19937_64 rng(seed * 1000 + n);
      std::vector<std::vector<float>> blocks;
      // Either every worker uses the same kind of block, or each draws its own (so a worker with
      // a zero or tiny block is combined with one with huge values).
      const bool mixed = seed % 2 == 0;
      const BlockKind common = kinds[seed / 2 % std::size(kinds)];
      for (uint32_t w = 0; w < n; ++w) {
        BlockKind kind = mixed ? kinds[rng() % std::size(kinds)] : common;
        blocks.push_back(RandomBlock(rng, kind, 256));
      }
      CheckAggregation(blocks, "n=" + std::to_string(n) + " seed=" + std::to_string(seed));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(QuantizeTest, AllZeroBlocksFromEveryWorkerGiveExactZeros) {
  for (uint32_t n : {1u, 3u, 32u}) {
    CheckAggregation(std::vector<std::vector<float>>(n, std::vector<float>(64, 0.0f)),
                     "zeros n=" + std::to_string(n));
  }
}

TEST(QuantizeTest, ValuesNearFltMaxWithThirtyTwoWorkersDoNotOverflow) {
  const uint32_t n = 32;
  // Alternating signs keep the exact sums finite in float; every q is near INT32_MAX / n.
  std::vector<std::vector<float>> blocks;
  for (uint32_t w = 0; w < n; ++w) {
    std::vector<float> b(64);
    for (size_t i = 0; i < b.size(); ++i) {
      float mag = i % 2 == 0 ? FLT_MAX : std::nextafter(FLT_MAX, 0.0f) / (1 + i);
      b[i] = (w + i) % 2 == 0 ? mag : -mag;
    }
    blocks.push_back(b);
  }
  CheckAggregation(blocks, "alternating near FLT_MAX");

  // Same sign everywhere: the int32 sum still fits; the true sum exceeds the float range, so the
  // float result is +inf.
  std::vector<float> all_max(64, FLT_MAX);
  const int8_t e = AnalyzeBlock(all_max).exponent;
  ASSERT_EQ(e, kMaxExponent);
  std::vector<int32_t> q(64);
  Quantize(all_max, e, n, q);
  int64_t sum = int64_t{q[0]} * n;
  EXPECT_LE(sum, kInt32Max);
  EXPECT_GT(sum, kInt32Max - 64 * int64_t{n});
  std::vector<int32_t> summed(64, static_cast<int32_t>(sum));
  std::vector<float> out(64);
  Dequantize(summed, e, n, out);
  EXPECT_TRUE(std::isinf(out[0]) && out[0] > 0);
  // One worker's contribution alone comes back as FLT_MAX within float rounding.
  Dequantize(q, e, n, out);
  EXPECT_NEAR(out[0] / n, FLT_MAX / n, FLT_MAX / n * 1e-6);
}

TEST(DequantizeTest, InvertsQuantizeForExactlyRepresentableValues) {
  // With one worker and e = 1, f = INT32_MAX / 2; values k / f round-trip exactly in double.
  std::vector<int32_t> in = {0, 1, -1, 1 << 20, -(1 << 30), static_cast<int32_t>(kInt32Max)};
  std::vector<float> out(in.size());
  Dequantize(in, 1, 1, out);
  const double f = Scale(1, 1);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i], static_cast<float>(in[i] / f)) << i;
  }
  // A shorter output only writes its own elements.
  std::vector<float> two(2);
  Dequantize(in, 1, 1, two);
  EXPECT_EQ(two[1], out[1]);
}

// The data path's kernels against the scalar reference, bit for bit, on every compiled target:
// QuantizeToWire against Quantize then big-endian bytes, DequantizeFromWire against Dequantize of
// the loaded values, AnalyzeBlock against its definition (smallest e with 2^e > max finite |x|).
class WireKernelTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(WireKernelTest);

constexpr size_t kSizes[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 100, 255, 256};
constexpr uint32_t kWorkerCounts[] = {1, 2, 3, 7, 32, 256};

// Edge values: signed zeros, denormals, the normal range's ends, non-finite, and exact ties of
// round(x f) for one worker (x = 2^k with exponent k + 1 gives x f = INT32_MAX / 2 = m + 0.5).
std::vector<float> EdgeBlock(size_t size) {
  const float edges[] = {0.0f,
                         -0.0f,
                         std::numeric_limits<float>::denorm_min(),
                         -FLT_MIN,
                         FLT_MAX,
                         -FLT_MAX,
                         kInf,
                         -kInf,
                         kNaN,
                         1.0f,
                         -1.0f,
                         0.5f,
                         -0.25f,
                         3.0f,
                         std::ldexp(1.0f, -126),
                         std::ldexp(1.0f, 126)};
  std::vector<float> b(size);
  for (size_t i = 0; i < size; ++i) b[i] = edges[i % std::size(edges)];
  return b;
}

BlockInfo ReferenceAnalyze(const std::vector<float>& block) {
  BlockInfo info;
  float max = 0.0f;
  for (float x : block) {
    if (!std::isfinite(x)) {
      info.non_finite = true;
    } else {
      max = std::max(max, std::fabs(x));
    }
  }
  if (max == 0.0f) return info;
  int e = -126;  // denormals: 2^-126 > max
  while (e < 127 && !(std::ldexp(1.0, e) > max)) ++e;
  info.exponent = static_cast<int8_t>(e);
  return info;
}

std::vector<std::vector<float>> KernelInputs() {
  std::mt19937_64 rng(7);
  std::vector<std::vector<float>> blocks;
  for (size_t size : kSizes) {
    blocks.push_back(EdgeBlock(size));
    for (BlockKind kind :
         {BlockKind::kUnit, BlockKind::kTiny, BlockKind::kHuge, BlockKind::kDenormal,
          BlockKind::kMixedRange, BlockKind::kZero, BlockKind::kSparse}) {
      blocks.push_back(RandomBlock(rng, kind, size));
    }
    std::vector<float> with_nan = RandomBlock(rng, BlockKind::kUnit, size);
    if (size > 0) with_nan[size - 1] = kNaN;  // non-finite in the scalar tail
    blocks.push_back(with_nan);
  }
  return blocks;
}

TEST_P(WireKernelTest, AnalyzeBlockMatchesTheDefinition) {
  for (const std::vector<float>& block : KernelInputs()) {
    const BlockInfo want = ReferenceAnalyze(block);
    const BlockInfo got = AnalyzeBlock(block);
    ASSERT_EQ(int{got.exponent}, int{want.exponent}) << "size " << block.size();
    ASSERT_EQ(got.non_finite, want.non_finite) << "size " << block.size();
  }
}

TEST_P(WireKernelTest, QuantizeToWireMatchesTheReferenceBitForBit) {
  for (const std::vector<float>& block : KernelInputs()) {
    const int8_t own = AnalyzeBlock(block).exponent;
    // The block's exponent, a larger one, too small ones (the clamp), the zero block, the ends.
    for (int e : {int{own}, own + 3, own - 1, own - 20, int{kZeroBlockExponent}, -126, 127}) {
      const int8_t exponent = static_cast<int8_t>(std::clamp(e, -128, 127));
      for (uint32_t n : kWorkerCounts) {
        SCOPED_TRACE(testing::Message()
                     << "size " << block.size() << " e " << int{exponent} << " n " << n);
        const size_t numel = block.size() + 5;  // a padded packet
        std::vector<int32_t> want(numel);
        Quantize(block, exponent, n, want);
        // The payload where a datagram has it: 10 bytes in, not 4-byte aligned.
        std::vector<uint8_t> datagram(proto::kPrefixBytes + 4 * numel, 0xee);
        const std::span<uint8_t> wire(datagram.data() + proto::kPrefixBytes, 4 * numel);
        QuantizeToWire(block, exponent, n, wire);
        for (size_t i = 0; i < numel; ++i) {
          ASSERT_EQ(static_cast<int32_t>(proto::LoadBe32(&wire[4 * i])), want[i])
              << "element " << i << " x " << (i < block.size() ? block[i] : 0.0f);
        }
      }
    }
  }
}

// The fused kernel against its two parts, with every pairing of the kernel inputs' lengths (the
// two blocks differ in length at the end of a slice: either may be the shorter, or empty).
TEST_P(WireKernelTest, QuantizeToWireAndAnalyzeMatchesItsPartsBitForBit) {
  const std::vector<std::vector<float>> inputs = KernelInputs();
  for (size_t a = 0; a < inputs.size(); ++a) {
    const std::vector<float>& block = inputs[a];
    // Every input as the next block once, paired with a varied block (all pairs would be slow).
    const std::vector<float>& next = inputs[(a * 7 + 3) % inputs.size()];
    const std::vector<float>& same_length = inputs[std::min(a ^ 1, inputs.size() - 1)];
    for (const std::vector<float>* other : {&next, &same_length, &block}) {
      const int8_t own = AnalyzeBlock(block).exponent;
      for (int e : {int{own}, own - 1, int{kZeroBlockExponent}, 127}) {
        const int8_t exponent = static_cast<int8_t>(std::clamp(e, -128, 127));
        for (uint32_t n : {1u, 3u, 256u}) {
          SCOPED_TRACE(testing::Message() << "size " << block.size() << " next size "
                                          << other->size() << " e " << int{exponent} << " n " << n);
          const size_t numel = block.size() + 5;  // a padded packet
          std::vector<uint8_t> want(4 * numel, 0xee);
          QuantizeToWire(block, exponent, n, want);
          const BlockInfo want_info = AnalyzeBlock(*other);
          std::vector<uint8_t> got(4 * numel, 0xee);
          const BlockInfo got_info = QuantizeToWireAndAnalyze(block, exponent, n, got, *other);
          ASSERT_EQ(got, want);
          ASSERT_EQ(int{got_info.exponent}, int{want_info.exponent});
          ASSERT_EQ(got_info.non_finite, want_info.non_finite);
        }
      }
    }
  }
}

TEST_P(WireKernelTest, QuantizeToWireRoundsTiesToEven) {
  // One worker, x = +-2^(e-1): x f = +-(INT32_MAX / 2) = +-(2^30 - 0.5), a tie; the even
  // neighbour is +-2^30. (Not just the block's first vector: 20 elements reach the tail too.)
  for (int e : {-100, 1, 60}) {
    std::vector<float> block(20);
    for (size_t i = 0; i < block.size(); ++i) {
      block[i] = std::ldexp(i % 2 == 0 ? 1.0f : -1.0f, e - 1);
    }
    ASSERT_EQ(AnalyzeBlock(block).exponent, e);
    std::vector<uint8_t> wire(4 * block.size());
    QuantizeToWire(block, static_cast<int8_t>(e), 1, wire);
    for (size_t i = 0; i < block.size(); ++i) {
      const int32_t want = i % 2 == 0 ? (1 << 30) : -(1 << 30);
      ASSERT_EQ(static_cast<int32_t>(proto::LoadBe32(&wire[4 * i])), want)
          << "e " << e << " i " << i;
    }
  }
}

TEST_P(WireKernelTest, DequantizeFromWireMatchesTheReferenceBitForBit) {
  std::mt19937_64 rng(11);
  for (size_t size : kSizes) {
    std::vector<int32_t> values(size);
    for (int32_t& v : values) v = static_cast<int32_t>(rng());
    const int32_t edges[] = {0, 1, -1, std::numeric_limits<int32_t>::max(),
                             std::numeric_limits<int32_t>::min()};
    for (size_t i = 0; i < size && i < std::size(edges); ++i) values[i] = edges[i];
    // Longer than the output needs, and where a datagram has it: 10 bytes in, not aligned.
    std::vector<uint8_t> datagram(proto::kPrefixBytes + 4 * size + 8);
    const std::span<const uint8_t> wire(datagram.data() + proto::kPrefixBytes, 4 * size + 8);
    for (size_t i = 0; i < size; ++i) {
      proto::StoreBe32(static_cast<uint32_t>(values[i]), &datagram[proto::kPrefixBytes + 4 * i]);
    }
    // e = 127 with many workers overflows float: both give inf.
    for (int8_t exponent :
         {int8_t{0}, int8_t{-126}, int8_t{-3}, int8_t{20}, int8_t{127}, kZeroBlockExponent}) {
      for (uint32_t n : kWorkerCounts) {
        SCOPED_TRACE(testing::Message() << "size " << size << " e " << int{exponent} << " n " << n);
        std::vector<float> want(size);
        Dequantize(values, exponent, n, want);
        std::vector<float> got(size + 1, 42.0f);
        DequantizeFromWire(wire, exponent, n, std::span<float>(got).first(size));
        for (size_t i = 0; i < size; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
              << "element " << i << ": " << got[i] << " vs " << want[i];
        }
        ASSERT_EQ(got[size], 42.0f);
      }
    }
  }
}

}  // namespace
}  // namespace switchml::quant
