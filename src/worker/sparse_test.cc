// The arithmetic of block-sparse all-reduces (sparse.h): shares, the announcement's packing and
// its sums over many workers, the union, and the compact buffer. The protocol end to end, with
// real sessions and switches, is sparse_session_test.cc.
#include "worker/sparse.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

namespace switchml::worker {
namespace {

TEST(BlockShareTest, StridedSharesCoverEveryBlockOnce) {
  // 10 blocks (the last one short) over 3 lanes, and more lanes than blocks.
  for (uint32_t lanes : {1u, 3u, 16u}) {
    std::vector<int> seen(10, 0);
    uint64_t total = 0;
    for (uint32_t lane = 0; lane < lanes; ++lane) {
      const BlockShare s{9 * 4 + 3, 4, lane, lanes};
      total += s.blocks();
      for (uint64_t j = 0; j < s.blocks(); ++j) {
        const uint64_t b = s.TensorBlock(j);
        ASSERT_LT(b, 10u);
        ++seen[b];
        EXPECT_EQ(s.Elements(j), b == 9 ? 3u : 4u);
        EXPECT_EQ(s.FirstElement(j), b * 4);
      }
    }
    EXPECT_EQ(total, 10u) << lanes << " lanes";
    for (int c : seen) EXPECT_EQ(c, 1);
  }
  EXPECT_EQ((BlockShare{0, 4, 0, 2}.blocks()), 0u);
}

TEST(AnnounceFormatTest, FieldsHoldTheWorkerCount) {
  struct Case {
    uint32_t n, bits, fields;
  };
  for (const Case c : {Case{1, 1, 32}, Case{2, 2, 16}, Case{3, 2, 16}, Case{8, 4, 8},
                       Case{64, 7, 4}, Case{255, 8, 4}, Case{256, 9, 3}}) {
    const AnnounceFormat f = AnnounceFormatFor(c.n);
    EXPECT_EQ(f.field_bits, c.bits) << c.n;
    EXPECT_EQ(f.fields_per_word, c.fields) << c.n;
    EXPECT_LE(c.n, (1u << f.field_bits) - 1) << c.n;  // a full count fits
  }
  EXPECT_EQ(AnnounceWords(0, 8), 0u);
  EXPECT_EQ(AnnounceWords(8, 8), 1u);
  EXPECT_EQ(AnnounceWords(9, 8), 2u);
  EXPECT_EQ(AnnounceWords(1025, 64), 257u);
}

TEST(BlockIsZeroTest, SignedZerosAreZeroAnythingElseIsNot) {
  for (size_t n : {1u, 2u, 7u, 32u, 33u, 64u, 255u, 256u}) {
    std::vector<float> f(n, 0.f);
    for (size_t i = 0; i < n; i += 2) f[i] = -0.f;
    EXPECT_TRUE(BlockIsZero(f.data(), n, DataType::kFloat32)) << n;
    // A non-zero element anywhere, including the last (the tail of the word loops).
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      for (float x :
           {1.f, -2.5f, std::numeric_limits<float>::denorm_min(),
            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> g = f;
        g[at] = x;
        EXPECT_FALSE(BlockIsZero(g.data(), n, DataType::kFloat32)) << n << " " << at << " " << x;
      }
      std::vector<int32_t> k(n, 0);
      EXPECT_TRUE(BlockIsZero(k.data(), n, DataType::kInt32));
      for (int32_t x : {1, -1, INT32_MIN}) {  // INT32_MIN has the bits of float -0
        k[at] = x;
        EXPECT_FALSE(BlockIsZero(k.data(), n, DataType::kInt32)) << n << " " << at << " " << x;
        k[at] = 0;
      }
    }
  }
}

// n workers' announcements of random blocks, summed as the switch sums int32 words (wrap-around
// addition): every field is the number of workers holding the block, and the union is the blocks
// some worker holds.
TEST(AnnouncementTest, SumsCountTheHoldersOfEachBlockWithoutCarries) {
  std::mt19937_64 rng(7);
  for (uint32_t n : {1u, 2u, 3u, 8u, 31u, 64u, 255u, 256u}) {
    const size_t numel = 4;
    const BlockShare share{1000 * numel - 1, numel, 1, 3};  // lane 1 of 3, a short last block
    const uint64_t blocks = share.blocks();
    std::vector<uint32_t> holders(blocks, 0);
    std::vector<int32_t> sums(AnnounceWords(blocks, n), 0);
    for (uint32_t r = 0; r < n; ++r) {
      std::vector<float> in(share.count, 0.f);
      uint64_t held = 0;
      for (uint64_t j = 0; j < blocks; ++j) {
        // Blocks 0-9 on every worker (full counts), then each with probability 1/4.
        if (j >= 10 && rng() % 4 != 0) continue;
        in[share.FirstElement(j) + rng() % share.Elements(j)] = 1.f + static_cast<float>(r);
        ++holders[j];
        ++held;
      }
      std::vector<int32_t> words(sums.size());
      EXPECT_EQ(EncodeAnnouncement(in.data(), DataType::kFloat32, share, n, words), held);
      for (size_t w = 0; w < sums.size(); ++w) {
        sums[w] =
            static_cast<int32_t>(static_cast<uint32_t>(sums[w]) + static_cast<uint32_t>(words[w]));
      }
    }
    std::vector<uint64_t> expected_union;
    for (uint64_t j = 0; j < blocks; ++j) {
      ASSERT_EQ(AnnouncedCount(sums, j, n), holders[j]) << n << " workers, block " << j;
      if (holders[j] > 0) expected_union.push_back(j);
    }
    std::vector<uint64_t> u;
    UnionBlocks(sums, blocks, n, &u);
    EXPECT_EQ(u, expected_union) << n << " workers";
  }
}

TEST(AnnouncementTest, AllZeroAndEmptyShares) {
  const BlockShare share{4096, 256, 0, 1};
  std::vector<int32_t> in(share.count, 0);
  std::vector<int32_t> words(AnnounceWords(share.blocks(), 4), -1);
  EXPECT_EQ(EncodeAnnouncement(in.data(), DataType::kInt32, share, 4, words), 0u);
  for (int32_t w : words) EXPECT_EQ(w, 0);
  std::vector<uint64_t> u = {99};
  UnionBlocks(words, share.blocks(), 4, &u);
  EXPECT_TRUE(u.empty());
  const BlockShare none{100, 256, 1, 2};  // one block, on lane 0
  EXPECT_EQ(none.blocks(), 0u);
  EXPECT_EQ(AnnounceWords(none.blocks(), 4), 0u);
  EXPECT_EQ(EncodeAnnouncement(in.data(), DataType::kInt32, none, 4, {}), 0u);
}

TEST(CompactBufferTest, GatherScatterRoundTripPadsAndZeroes) {
  const size_t numel = 4;
  const BlockShare share{7 * numel + 2, numel, 0, 2};  // blocks 0, 2, 4, 6 (7 is lane 1's)
  ASSERT_EQ(share.blocks(), 4u);
  const BlockShare last{7 * numel + 2, numel, 1, 2};  // blocks 1, 3, 5, 7 (7 is short)
  std::vector<int32_t> in(share.count);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int32_t>(i + 1);
  const std::vector<uint64_t> u = {1, 3};  // tensor blocks 3 and 7
  std::vector<uint8_t> compact(4 * numel * u.size(), 0xee);
  GatherBlocks(in.data(), last, u, compact);
  std::vector<int32_t> c(compact.size() / 4);
  std::memcpy(c.data(), compact.data(), compact.size());
  EXPECT_EQ(c, (std::vector<int32_t>{13, 14, 15, 16, 29, 30, 0, 0}));  // block 7 padded

  // Scatter doubled values back; with zero_others the share's other blocks become 0, the other
  // lane's blocks stay as they were.
  for (int32_t& x : c) x *= 2;
  std::memcpy(compact.data(), c.data(), compact.size());
  std::vector<int32_t> out(in.size(), -5);
  ScatterBlocks(compact, last, u, out.data(), /*zero_others=*/true);
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t b = i / numel;
    if (b == 3 || b == 7) {
      EXPECT_EQ(out[i], 2 * in[i]) << i;
    } else if (b % 2 == 1) {
      EXPECT_EQ(out[i], 0) << i;
    } else {
      EXPECT_EQ(out[i], -5) << i;
    }
  }
  std::vector<int32_t> kept(in.size(), -5);
  ScatterBlocks(compact, last, u, kept.data(), /*zero_others=*/false);
  for (size_t i = 0; i < kept.size(); ++i) {
    const size_t b = i / numel;
    EXPECT_EQ(kept[i], (b == 3 || b == 7) ? 2 * in[i] : -5) << i;
  }
}

}  // namespace
}  // namespace switchml::worker
