// Block-sparse all-reduces (docs/protocol.md 2.5; ours, beyond the reference): the arithmetic of
// a worker thread's share of a tensor, of the announcement of its non-zero blocks, and of the
// compact buffer of the union's blocks. Pure functions on spans; no I/O, no state.
//
// A block is one packet's elements (numel). Thread `lane` of `lanes` takes the tensor's blocks b
// with b mod lanes == lane; j numbers them (share-local: block b = lane + j lanes). It announces
// which are non-zero on this worker as counts packed into int32 words (a field of
// bit_width(num_workers) bits per block), all-reduces them (exact int32 sums: per field, the
// number of workers on which the block is non-zero), and then all-reduces only the blocks whose
// count is non-zero (the union), gathered into a compact buffer and scattered back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "switchml/types.h"

namespace switchml::worker {

// One worker thread's share of a tensor of `count` elements.
struct BlockShare {
  size_t count = 0;  // elements of the whole tensor
  size_t numel = 256;
  uint32_t lane = 0;
  uint32_t lanes = 1;
  // Blocks of the share: ceil((tensor blocks - lane) / lanes), 0 when lane is past the last.
  uint64_t blocks() const;
  uint64_t TensorBlock(uint64_t j) const { return lane + j * lanes; }
  size_t FirstElement(uint64_t j) const { return TensorBlock(j) * numel; }
  // Elements of share block j: numel, or fewer for the tensor's last block.
  size_t Elements(uint64_t j) const;
};

// The announcement's packing for num_workers workers: fields of bit_width(num_workers) bits (so a
// field's sum, at most num_workers, never carries into the next), floor(32 / bits) per word.
struct AnnounceFormat {
  uint32_t field_bits = 1;
  uint32_t fields_per_word = 32;
};
AnnounceFormat AnnounceFormatFor(uint32_t num_workers);  // num_workers >= 1
// int32 words announcing `blocks` blocks.
size_t AnnounceWords(uint64_t blocks, uint32_t num_workers);

// Whether `elements` 4-byte elements at p are all zero: int32 0, float32 +0 or -0.
bool BlockIsZero(const void* p, size_t elements, DataType dtype);

// Writes this worker's announcement of the share's blocks of `in` (the whole tensor) into words
// (AnnounceWords(share.blocks(), num_workers) entries): 1 in block j's field when the block is
// non-zero here. Returns how many of the share's blocks are non-zero here.
uint64_t EncodeAnnouncement(const void* in, DataType dtype, const BlockShare& share,
                            uint32_t num_workers, std::span<int32_t> words);
// Block j's field of the summed announcement: on how many workers it is non-zero.
uint32_t AnnouncedCount(std::span<const int32_t> sums, uint64_t j, uint32_t num_workers);
// The share-local indices of the blocks whose count is non-zero (the union), ascending, into
// *out (replaced).
void UnionBlocks(std::span<const int32_t> sums, uint64_t blocks, uint32_t num_workers,
                 std::vector<uint64_t>* out);

// Copies union block u[i] of `in` (the whole tensor) to compact block i (numel elements of 4 bytes
// each; a short last block is zero padded). compact.size() must be 4 * numel * u.size().
void GatherBlocks(const void* in, const BlockShare& share, std::span<const uint64_t> u,
                  std::span<uint8_t> compact);
// Copies compact block i back to union block u[i] of `out` (the whole tensor), and with
// zero_others writes zeros in every other block of the share.
void ScatterBlocks(std::span<const uint8_t> compact, const BlockShare& share,
                   std::span<const uint64_t> u, void* out, bool zero_others);

}  // namespace switchml::worker
