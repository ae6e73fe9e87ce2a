#include "transport/shm_ring.h"

#include <algorithm>

#include "base/check.h"

namespace switchml::transport {
namespace {

void CheckRegion(std::span<uint8_t> region, uint64_t bytes, uint32_t ring_slots,
                 uint32_t slot_bytes) {
  CHECK(ShmPowerOfTwo(ring_slots) && ring_slots <= kShmMaxRingSlots)
      << "shm ring: " << ring_slots << " slots is not a power of two up to 65536";
  CHECK(slot_bytes > kShmSlotDataOffset && slot_bytes % 8 == 0)
      << "shm ring: bad slot size " << slot_bytes;
  CHECK(reinterpret_cast<uintptr_t>(region.data()) % 8 == 0) << "shm ring: unaligned region";
  CHECK_LE(bytes, region.size()) << "shm ring: region too small";
}

}  // namespace

ShmSlots::ShmSlots(std::span<uint8_t> region, uint32_t ring_slots, uint32_t slot_bytes,
                   size_t capacity)
    : base_(region.data()), mask_(ring_slots - 1), slot_bytes_(slot_bytes), capacity_(capacity) {
  CheckRegion(region, uint64_t{ring_slots} * slot_bytes, ring_slots, slot_bytes);
  CHECK_LE(capacity, slot_bytes - kShmSlotDataOffset) << "shm ring: capacity beyond a slot";
}

ShmRead ShmSlots::Read(uint64_t* cursor, uint64_t take, size_t limit, const Endpoint& source,
                       std::span<RxDatagram> out) const {
  ShmRead r;
  limit = std::min(limit, capacity_);
  for (uint64_t i = 0; i < take; ++i, ++*cursor) {
    uint8_t* slot = Slot(*cursor);
    const uint32_t length = ShmRef<uint32_t>(slot, 0).load(std::memory_order_relaxed);
    if (length > kShmMaxLength) {
      ++r.malformed;
      continue;
    }
    RxDatagram& d = out[r.filled++];
    const bool cut = length > limit;
    d.data = {slot + kShmSlotDataOffset, std::min<size_t>(length, limit)};
    d.source = source;
    d.truncated = cut;
    r.truncated += cut ? 1 : 0;
  }
  return r;
}

ShmRingProducer::ShmRingProducer(std::span<uint8_t> region, uint32_t ring_slots,
                                 uint32_t slot_bytes, size_t capacity)
    : base_(region.data()) {
  CheckRegion(region, ShmRingBytes(ring_slots, slot_bytes), ring_slots, slot_bytes);
  slots_ = ShmSlots(region.subspan(kShmRingSlotsOffset), ring_slots, slot_bytes, capacity);
}

ShmRingConsumer::ShmRingConsumer(std::span<uint8_t> region, uint32_t ring_slots,
                                 uint32_t slot_bytes, size_t limit)
    : base_(region.data()), limit_(limit) {
  CheckRegion(region, ShmRingBytes(ring_slots, slot_bytes), ring_slots, slot_bytes);
  slots_ = ShmSlots(region.subspan(kShmRingSlotsOffset), ring_slots, slot_bytes,
                    slot_bytes - kShmSlotDataOffset);
}

ShmRead ShmRingConsumer::Take(std::span<RxDatagram> out, const Endpoint& source) {
  if (broken_ || out.empty()) return {};
  const uint64_t head = ShmRef<uint64_t>(base_, kShmRingHeadOffset).load(std::memory_order_acquire);
  const uint64_t waiting = head - tail_;
  if (waiting == 0) return {};
  if (waiting > slots_.ring_slots()) {
    broken_ = true;
    ShmRead r;
    r.malformed = 1;
    return r;
  }
  return slots_.Read(&tail_, std::min<uint64_t>(waiting, out.size()), limit_, source, out);
}

}  // namespace switchml::transport
