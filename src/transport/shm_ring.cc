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

}  // namespace switchml::transport
