#include "worker/sparse.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "base/check.h"

namespace switchml::worker {

uint64_t BlockShare::blocks() const {
  const uint64_t total = (count + numel - 1) / numel;
  return total > lane ? (total - lane + lanes - 1) / lanes : 0;
}

size_t BlockShare::Elements(uint64_t j) const {
  const size_t first = FirstElement(j);
  return std::min(numel, count - first);
}

AnnounceFormat AnnounceFormatFor(uint32_t num_workers) {
  CHECK(num_workers >= 1);
  AnnounceFormat f;
  f.field_bits = static_cast<uint32_t>(std::bit_width(num_workers));
  f.fields_per_word = 32 / f.field_bits;
  return f;
}

size_t AnnounceWords(uint64_t blocks, uint32_t num_workers) {
  const AnnounceFormat f = AnnounceFormatFor(num_workers);
  return static_cast<size_t>((blocks + f.fields_per_word - 1) / f.fields_per_word);
}

bool BlockIsZero(const void* p, size_t elements, DataType dtype) {
  // An OR of every word: zero (sign bits aside, for float32) only if every element is. Four
  // accumulators and 128-byte steps let the compiler vectorize; a non-zero block usually stops
  // in its first step.
  const auto* b = static_cast<const uint8_t*>(p);
  const uint64_t mask = dtype == DataType::kFloat32 ? 0x7fffffff7fffffffull : ~uint64_t{0};
  const size_t bytes = 4 * elements;
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    uint64_t w[16];
    std::memcpy(w, b + i, sizeof w);
    uint64_t a = 0;
    for (uint64_t x : w) a |= x;
    if ((a & mask) != 0) return false;
  }
  uint64_t a = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t x;
    std::memcpy(&x, b + i, 8);
    a |= x;
  }
  if (i < bytes) {  // one element left
    uint32_t x;
    std::memcpy(&x, b + i, 4);
    a |= x;
  }
  return (a & mask) == 0;
}

uint64_t EncodeAnnouncement(const void* in, DataType dtype, const BlockShare& share,
                            uint32_t num_workers, std::span<int32_t> words) {
  const uint64_t blocks = share.blocks();
  CHECK(words.size() == AnnounceWords(blocks, num_workers))
      << words.size() << " announcement words for " << blocks << " blocks";
  const AnnounceFormat f = AnnounceFormatFor(num_workers);
  const auto* base = static_cast<const uint8_t*>(in);
  uint64_t non_zero = 0;
  for (size_t w = 0; w < words.size(); ++w) {
    uint32_t word = 0;
    const uint64_t first = uint64_t{w} * f.fields_per_word;
    const uint64_t last = std::min<uint64_t>(blocks, first + f.fields_per_word);
    for (uint64_t j = first; j < last; ++j) {
      if (BlockIsZero(base + 4 * share.FirstElement(j), share.Elements(j), dtype)) continue;
      word |= uint32_t{1} << (f.field_bits * (j - first));
      ++non_zero;
    }
    words[w] = static_cast<int32_t>(word);
  }
  return non_zero;
}

uint32_t AnnouncedCount(std::span<const int32_t> sums, uint64_t j, uint32_t num_workers) {
  const AnnounceFormat f = AnnounceFormatFor(num_workers);
  const uint32_t word = static_cast<uint32_t>(sums[j / f.fields_per_word]);
  const uint32_t shift = f.field_bits * static_cast<uint32_t>(j % f.fields_per_word);
  return (word >> shift) & ((uint32_t{1} << f.field_bits) - 1);
}

void UnionBlocks(std::span<const int32_t> sums, uint64_t blocks, uint32_t num_workers,
                 std::vector<uint64_t>* out) {
  CHECK(sums.size() == AnnounceWords(blocks, num_workers));
  const AnnounceFormat f = AnnounceFormatFor(num_workers);
  const uint32_t field = (uint32_t{1} << f.field_bits) - 1;
  out->clear();
  for (size_t w = 0; w < sums.size(); ++w) {
    uint32_t word = static_cast<uint32_t>(sums[w]);
    if (word == 0) continue;  // (mostly, for a sparse tensor)
    const uint64_t first = uint64_t{w} * f.fields_per_word;
    for (uint32_t k = 0; k < f.fields_per_word && first + k < blocks; ++k, word >>= f.field_bits) {
      if ((word & field) != 0) out->push_back(first + k);
    }
  }
}

void GatherBlocks(const void* in, const BlockShare& share, std::span<const uint64_t> u,
                  std::span<uint8_t> compact) {
  const size_t block_bytes = 4 * share.numel;
  CHECK(compact.size() == block_bytes * u.size());
  const auto* base = static_cast<const uint8_t*>(in);
  for (size_t i = 0; i < u.size(); ++i) {
    const size_t n = 4 * share.Elements(u[i]);
    uint8_t* dst = compact.data() + i * block_bytes;
    std::memcpy(dst, base + 4 * share.FirstElement(u[i]), n);
    std::memset(dst + n, 0, block_bytes - n);
  }
}

void ScatterBlocks(std::span<const uint8_t> compact, const BlockShare& share,
                   std::span<const uint64_t> u, void* out, bool zero_others) {
  const size_t block_bytes = 4 * share.numel;
  CHECK(compact.size() == block_bytes * u.size());
  auto* base = static_cast<uint8_t*>(out);
  if (!zero_others) {  // (only the union's blocks: the others are not touched)
    for (size_t i = 0; i < u.size(); ++i) {
      std::memcpy(base + 4 * share.FirstElement(u[i]), compact.data() + i * block_bytes,
                  4 * share.Elements(u[i]));
    }
    return;
  }
  const uint64_t blocks = share.blocks();
  size_t i = 0;
  for (uint64_t j = 0; j < blocks; ++j) {
    uint8_t* dst = base + 4 * share.FirstElement(j);
    const size_t n = 4 * share.Elements(j);
    if (i < u.size() && u[i] == j) {
      std::memcpy(dst, compact.data() + i * block_bytes, n);
      ++i;
    } else {
      std::memset(dst, 0, n);
    }
  }
  CHECK(i == u.size()) << "union block " << (i < u.size() ? u[i] : 0) << " is not in the share";
}

}  // namespace switchml::worker
