#include "testing/pattern.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace switchml::testing {
namespace {

bool HasNonZero(const std::vector<std::vector<int32_t>>& in, size_t j, size_t numel, size_t count) {
  for (const auto& x : in) {
    for (size_t i = j * numel; i < std::min(count, (j + 1) * numel); ++i) {
      if ((x[i] & 0x7fffffff) != 0) return true;
    }
  }
  return false;
}

// Given every worker's input summed directly in float64 / int64, Expect Verify to accept that
// sum (rounded to the element type) and to reject a result that is off by more than the bound.
TEST(PatternTest, DirectSumVerifiesAndPerturbationFails) {
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    Pattern p{7, 3, 5, 64, dt};
    const size_t count = 1000;
    std::vector<double> sum(count, 0);
    std::vector<int64_t> isum(count, 0);
    for (uint32_t r = 0; r < p.num_workers; ++r) {
      std::vector<float> f(count);
      std::vector<int32_t> x(count);
      if (dt == DataType::kFloat32) {
        FillInput(p, r, f.data(), count);
        for (size_t i = 0; i < count; ++i) sum[i] += f[i];
      } else {
        FillInput(p, r, x.data(), count);
        for (size_t i = 0; i < count; ++i) isum[i] += x[i];
      }
    }
    if (dt == DataType::kFloat32) {
      std::vector<float> out(sum.begin(), sum.end());
      EXPECT_TRUE(Verify(p, out.data(), count).ok()) << Verify(p, out.data(), count).ToString();
      size_t i = 0;
      while (out[i] == 0) ++i;  // a non-zero element
      out[i] = out[i] * 1.01f + 1.f;
      VerifyResult v = Verify(p, out.data(), count);
      EXPECT_FALSE(v.ok());
      EXPECT_EQ(v.first_bad, i);
      out[i] = NAN;
      EXPECT_FALSE(Verify(p, out.data(), count).ok());
    } else {
      std::vector<int32_t> out(count);
      for (size_t i = 0; i < count; ++i)
        out[i] = static_cast<int32_t>(static_cast<uint32_t>(isum[i]));
      EXPECT_TRUE(Verify(p, out.data(), count).ok());
      out[999] += 1;
      EXPECT_EQ(Verify(p, out.data(), count).mismatches, 1u);
    }
  }
}

TEST(PatternTest, IterationsAndRanksDiffer) {
  Pattern p{1, 0, 2, 256, DataType::kInt32};
  std::vector<int32_t> a(100), b(100), c(100);
  FillInput(p, 0, a.data(), 100);
  FillInput(p, 1, b.data(), 100);
  p.iteration = 1;
  FillInput(p, 0, c.data(), 100);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
}

// Block-sparse inputs: Given n workers' inputs at a block density and overlap, Expect the union
// (blocks non-zero on some worker) to be about that fraction of the blocks, each union block held
// by the expected workers, the direct sum to verify, and a non-zero value in a block outside the
// union to fail.
TEST(PatternTest, SparseBlocksHaveTheirDensityAndHolders) {
  const uint32_t n = 5, numel = 64;
  const size_t blocks = 2000, count = blocks * numel - 7;  // a short last block
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    for (double overlap : {0.0, 0.5, 1.0}) {
      for (double density : {0.0, 0.01, 0.5, 1.0 - 1e-9}) {
        Pattern p{11, 2, n, numel, dt};
        p.density = density;
        p.overlap = overlap;
        std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count));
        for (uint32_t r = 0; r < n; ++r) FillInput(p, r, in[r].data(), count);
        size_t union_blocks = 0, shared = 0;
        std::vector<int32_t> isum(count, 0);
        std::vector<float> fsum(count, 0);
        for (size_t j = 0; j < blocks; ++j) {
          uint32_t holders = 0;
          for (uint32_t r = 0; r < n; ++r) {
            bool non_zero = false;
            for (size_t i = j * numel; i < std::min(count, (j + 1) * numel); ++i) {
              non_zero = non_zero || (in[r][i] & 0x7fffffff) != 0;
            }
            holders += non_zero ? 1 : 0;
          }
          union_blocks += holders > 0 ? 1 : 0;
          shared += holders > 1 ? 1 : 0;
          if (holders == 0) continue;
          if (overlap == 0) {
            EXPECT_EQ(holders, 1u) << "block " << j;
          } else if (overlap == 1) {
            EXPECT_EQ(holders, n) << "block " << j;
          }
        }
        // Within 5 standard deviations of the density.
        const double sd = std::sqrt(density * (1 - density) * blocks);
        EXPECT_NEAR(static_cast<double>(union_blocks), density * blocks, 5 * sd + 1)
            << DataTypeName(dt) << " density " << density << " overlap " << overlap;
        if (overlap == 0.5 && density > 0.4) {
          EXPECT_GT(shared, union_blocks / 2);
        }
        for (uint32_t r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) {
            if (dt == DataType::kInt32) {
              isum[i] = static_cast<int32_t>(static_cast<uint32_t>(isum[i]) +
                                             static_cast<uint32_t>(in[r][i]));
            } else {
              float x;
              std::memcpy(&x, &in[r][i], 4);
              fsum[i] += x;  // (exact: small integers times a power of two)
            }
          }
        }
        const void* out = dt == DataType::kInt32 ? static_cast<const void*>(isum.data())
                                                 : static_cast<const void*>(fsum.data());
        VerifyResult v = Verify(p, out, count);
        EXPECT_TRUE(v.ok()) << v.ToString();
        if (union_blocks < blocks) {
          // A value in a block that is zero on every worker.
          size_t j = 0;
          while (HasNonZero(in, j, numel, count)) ++j;
          if (dt == DataType::kInt32) {
            isum[j * numel] = 1;
          } else {
            fsum[j * numel] = 1e-30f;
          }
          EXPECT_EQ(Verify(p, out, count).mismatches, 1u);
        }
      }
    }
  }
}

TEST(PatternTest, DensityOneIsTheDensePattern) {
  for (DataType dt : {DataType::kInt32, DataType::kFloat32}) {
    Pattern dense{3, 1, 4, 256, dt};
    Pattern sparse = dense;
    sparse.density = 1;
    sparse.overlap = 0;  // (ignored at density 1)
    std::vector<int32_t> a(3000), b(3000);
    FillInput(dense, 2, a.data(), a.size());
    FillInput(sparse, 2, b.data(), b.size());
    EXPECT_EQ(a, b);
  }
}

}  // namespace
}  // namespace switchml::testing
