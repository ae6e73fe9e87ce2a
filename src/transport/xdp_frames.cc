#include "transport/xdp_frames.h"

#include <algorithm>

#include "base/check.h"

namespace switchml::transport::xdp {

RxFrames::RxFrames(uint32_t count, uint32_t frame_size)
    : count_(count), frame_size_(frame_size), state_(new std::atomic<uint8_t>[count]) {
  for (uint32_t i = 0; i < count_; ++i) state_[i].store(kWithKernel, std::memory_order_relaxed);
  stash_.reserve(count_);
}

void RxFrames::FillAll(xsk_ring_prod* fill) {
  uint32_t index = 0;
  CHECK_EQ(xsk_ring_prod__reserve(fill, count_, &index), count_)
      << "AF_XDP: a new fill ring of " << fill->size << " entries has no room for " << count_
      << " receive frames";
  for (uint32_t i = 0; i < count_; ++i) {
    state_[i].store(kWithKernel, std::memory_order_relaxed);
    *xsk_ring_prod__fill_addr(fill, index + i) = uint64_t{i} * frame_size_;
  }
  xsk_ring_prod__submit(fill, count_);
  stash_.clear();
  stashed_.store(0, std::memory_order_relaxed);
}

uint64_t RxFrames::Take(uint64_t addr) {
  const uint64_t i = addr / frame_size_;
  if (i >= count_) return UINT64_MAX;
  if (state_[i].load(std::memory_order_relaxed) != kWithKernel) return UINT64_MAX;
  state_[i].store(kHeld, std::memory_order_relaxed);
  return i * frame_size_;
}

void RxFrames::GiveBack(xsk_ring_prod* fill, std::span<const uint64_t> frames) {
  for (uint64_t frame : frames) {
    const uint64_t i = frame / frame_size_;
    CHECK(frame % frame_size_ == 0 && i < count_)
        << "AF_XDP: " << frame << " is not the address of a receive frame";
    CHECK_EQ(state_[i].load(std::memory_order_relaxed), kHeld)
        << "AF_XDP: receive frame " << i << " given back, but this process does not hold it "
        << "(given back twice?)";
  }
  const size_t want = stash_.size() + frames.size();
  if (want == 0) return;
  const uint32_t room = std::min<uint32_t>(xsk_prod_nb_free(fill, static_cast<uint32_t>(want)),
                                           static_cast<uint32_t>(want));
  if (room < want) short_refills_.fetch_add(1, std::memory_order_relaxed);
  uint32_t index = 0;
  if (room > 0) {
    CHECK_EQ(xsk_ring_prod__reserve(fill, room, &index), room);
  }
  // The stash first (the oldest), then the new frames; the rest waits in the stash.
  uint32_t k = 0;
  auto to_ring = [&](uint64_t frame) {
    state_[frame / frame_size_].store(kWithKernel, std::memory_order_relaxed);
    *xsk_ring_prod__fill_addr(fill, index + k++) = frame;
  };
  const size_t from_stash = std::min<size_t>(room, stash_.size());
  for (size_t s = 0; s < from_stash; ++s) to_ring(stash_[s]);
  stash_.erase(stash_.begin(), stash_.begin() + static_cast<std::ptrdiff_t>(from_stash));
  size_t f = 0;
  for (; f < frames.size() && k < room; ++f) to_ring(frames[f]);
  for (; f < frames.size(); ++f) {
    state_[frames[f] / frame_size_].store(kStashed, std::memory_order_relaxed);
    stash_.push_back(frames[f]);
  }
  if (room > 0) xsk_ring_prod__submit(fill, room);
  stashed_.store(stash_.size(), std::memory_order_relaxed);
}

size_t RxFrames::held() const {
  size_t n = 0;
  for (uint32_t i = 0; i < count_; ++i) n += state_[i].load(std::memory_order_relaxed) == kHeld;
  return n;
}

}  // namespace switchml::transport::xdp
