#include "testing/pattern.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace switchml::testing {
namespace {

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

}  // namespace
}  // namespace switchml::testing
