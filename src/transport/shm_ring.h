// The ring protocol of the shm transport (shm.h), pure: no files, processes or system calls, only
// loads and stores in a region of memory that another process may write at any time. The files
// of shm_inbox.h and shm_group.h lay rings out in shared memory; a test or a fuzzer drives the same
// code over a plain heap buffer.
//
// A slot array (ShmSlots): ring_slots slots (a power of two) of slot_bytes each (a multiple of 8):
// a uint32_t length word, 4 bytes unused, then the data. A position is a 64-bit count; its slot is
// position & (ring_slots - 1).
//
// An SPSC ring (ShmRingProducer, ShmRingConsumer): one region holding the producer index (a
// uint64_t at 0), the consumer index (at 64, a cache line of its own) and the slot array (from
// 128). The producer owns the producer index and the slots between the consumer index and it; the
// consumer owns the consumer index. Each publishes its index with release and reads the other's
// with acquire.
//
// Untrusted, everything read from the region (another process may have written anything there):
// the other side's index is read once per call; a producer index more than a ring ahead of the
// consumer's breaks the ring for good (counted); a consumer index beyond the producer's reads as a
// full ring; a length word is read once, one beyond 65535 is counted malformed and its slot
// skipped, one beyond the reader's limit is cut and flagged; slot indices are masked. What the
// ring is given by its owner (the region's size and geometry) is trusted and CHECKed.
//
// Thread-safety: one producer object and one consumer object per ring, each used by one thread
// (each normally in a process of its own). Nothing blocks.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "base/endpoint.h"
#include "transport/transport.h"

namespace switchml::transport {

inline constexpr size_t kShmLine = 64;
inline constexpr size_t kShmSlotDataOffset = 8;   // a slot: uint32_t length, 4 unused, the data
inline constexpr uint32_t kShmMaxLength = 65535;  // a length word beyond this is malformed
inline constexpr uint32_t kShmMaxRingSlots = 65536;
// An SPSC ring's region: the producer index, the consumer index, then the slots.
inline constexpr size_t kShmRingHeadOffset = 0;
inline constexpr size_t kShmRingTailOffset = kShmLine;
inline constexpr size_t kShmRingSlotsOffset = 2 * kShmLine;

// A shared word of the region at base + offset (a plain integer of the file, accessed atomically).
template <class T>
std::atomic_ref<T> ShmRef(uint8_t* base, size_t offset) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(base + offset));
}

constexpr size_t ShmRoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }
constexpr bool ShmPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }
// The slot size for datagrams of up to max_datagram bytes: the length word and the data, 64-byte
// aligned.
constexpr uint32_t ShmSlotBytes(size_t max_datagram) {
  return static_cast<uint32_t>(ShmRoundUp(kShmSlotDataOffset + max_datagram, kShmLine));
}

// What one read of slots found: how many entries of `out` it filled, how many of them it cut
// (their length beyond the reader's limit) and how many slots it skipped (malformed lengths).
struct ShmRead {
  size_t filled = 0;
  uint64_t truncated = 0;
  uint64_t malformed = 0;
};

// A slot array in a region (see above). Writes copy at most `capacity` bytes of a datagram.
class ShmSlots {
 public:
  ShmSlots() = default;
  // region must hold ring_slots * slot_bytes bytes, 8-byte aligned; ring_slots a power of two;
  // capacity <= slot_bytes - 8 (CHECKed: the owner's geometry, not the region's contents).
  ShmSlots(std::span<uint8_t> region, uint32_t ring_slots, uint32_t slot_bytes, size_t capacity);

  uint32_t ring_slots() const { return mask_ + 1; }
  size_t capacity() const { return capacity_; }
  uint8_t* Slot(uint64_t position) const {
    return base_ + (position & mask_) * size_t{slot_bytes_};
  }
  uint8_t* Data(uint64_t position) const { return Slot(position) + kShmSlotDataOffset; }

  // Writes data into the slot of `position`, its length word = data.size() (the bytes copied are
  // cut to capacity()); memmove: data may be another slot of this array. True when the data was
  // already there (built in place: nothing copied).
  bool Write(uint64_t position, std::span<const uint8_t> data) const {
    uint8_t* slot = Slot(position);
    const size_t n = data.size() < capacity_ ? data.size() : capacity_;
    const bool in_place = data.data() == slot + kShmSlotDataOffset;
    if (n > 0 && !in_place) std::memmove(slot + kShmSlotDataOffset, data.data(), n);
    ShmRef<uint32_t>(slot, 0).store(static_cast<uint32_t>(data.size()), std::memory_order_relaxed);
    return in_place;
  }

  // Reads `take` slots from *cursor on into out (take <= out.size()), each as a view of its
  // slot, from `source`, advancing *cursor past each. Untrusted lengths: see above (limit: the
  // reader's max_datagram_bytes, at most capacity()).
  ShmRead Read(uint64_t* cursor, uint64_t take, size_t limit, const Endpoint& source,
               std::span<RxDatagram> out) const;

 private:
  uint8_t* base_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t slot_bytes_ = 0;
  size_t capacity_ = 0;
};

// The bytes of an SPSC ring's region (not rounded to pages).
constexpr uint64_t ShmRingBytes(uint32_t ring_slots, uint32_t slot_bytes) {
  return kShmRingSlotsOffset + uint64_t{ring_slots} * slot_bytes;
}

// The producer's side of an SPSC ring: writes datagrams at its index, publishes them in batches.
class ShmRingProducer {
 public:
  ShmRingProducer() = default;
  // region: ShmRingBytes(ring_slots, slot_bytes) or more; datagrams of up to capacity bytes.
  // The producer starts at index 0 (a new ring, or one its consumer reset).
  ShmRingProducer(std::span<uint8_t> region, uint32_t ring_slots, uint32_t slot_bytes,
                  size_t capacity);

  // Whether the next `slots` slots are free; reads the consumer index only when the one last read
  // says they are not. A consumer index beyond ours reads as a full ring.
  bool HasRoom(uint64_t slots) {
    if (Room(slots)) return true;
    tail_seen_ = ShmRef<uint64_t>(base_, kShmRingTailOffset).load(std::memory_order_acquire);
    return Room(slots);
  }
  // The data of slot head + i, to build a datagram in (lent; caller checked HasRoom(i + 1)).
  std::span<uint8_t> Lend(uint64_t i) const { return {slots_.Data(head_ + i), slots_.capacity()}; }
  // Writes a datagram at the head (caller checked HasRoom(1)); nothing is visible to the consumer
  // before Publish. True when it was built there (Lend).
  bool Push(std::span<const uint8_t> data) { return slots_.Write(head_++, data); }
  // Makes what Push wrote visible to the consumer (release).
  void Publish() const {
    ShmRef<uint64_t>(base_, kShmRingHeadOffset).store(head_, std::memory_order_release);
  }
  uint64_t head() const { return head_; }

 private:
  bool Room(uint64_t slots) const {
    const uint64_t used = head_ - tail_seen_;
    return used <= slots_.ring_slots() && slots_.ring_slots() - used >= slots;
  }

  uint8_t* base_ = nullptr;
  ShmSlots slots_;
  uint64_t head_ = 0;       // the next slot to fill (ours alone)
  uint64_t tail_seen_ = 0;  // the consumer index last read
};

// The consumer's side of an SPSC ring: takes published datagrams as views into the ring, and
// gives their slots back on the next Return.
class ShmRingConsumer {
 public:
  ShmRingConsumer() = default;
  // As ShmRingProducer's; limit: the longest datagram handed out whole (longer ones are cut).
  ShmRingConsumer(std::span<uint8_t> region, uint32_t ring_slots, uint32_t slot_bytes,
                  size_t limit);

  // Takes up to out.size() waiting datagrams (from `source`). A producer index more than a ring
  // ahead breaks the ring: it is counted in `malformed` once and never read again.
  ShmRead Take(std::span<RxDatagram> out, const Endpoint& source);
  // Gives back the slots taken so far (stores the consumer index, release).
  void Return() {
    if (tail_ == published_) return;
    ShmRef<uint64_t>(base_, kShmRingTailOffset).store(tail_, std::memory_order_release);
    published_ = tail_;
  }
  // Whether nothing more will be read: the ring is broken, or everything published was taken.
  bool Drained() const {
    return broken_ ||
           ShmRef<uint64_t>(base_, kShmRingHeadOffset).load(std::memory_order_acquire) == tail_;
  }
  bool broken() const { return broken_; }
  // Sets both indices of the region to 0, for the ring's next producer (this object is then
  // done with).
  void Reset() const {
    ShmRef<uint64_t>(base_, kShmRingHeadOffset).store(0, std::memory_order_relaxed);
    ShmRef<uint64_t>(base_, kShmRingTailOffset).store(0, std::memory_order_relaxed);
  }

 private:
  uint8_t* base_ = nullptr;
  ShmSlots slots_;
  size_t limit_ = 0;
  uint64_t tail_ = 0;       // the next slot to read
  uint64_t published_ = 0;  // tail_ last stored (slots before it are the producer's again)
  bool broken_ = false;     // its producer index made no sense: ignored from then on
};

// A reader of a ring with many readers (shm_group.h): where its cursor stands against a producer
// index read once. kCorrupt: the index is more than a ring ahead; kUnpublished: up to a ring
// behind the cursor (the producer placed the cursor at its next slot while it wrote a batch it has
// not published yet: nothing waits).
enum class ShmCursor { kEmpty, kWaiting, kUnpublished, kCorrupt };
constexpr ShmCursor ClassifyShmCursor(uint64_t head, uint64_t cursor, uint32_t ring_slots) {
  const uint64_t waiting = head - cursor;
  if (waiting == 0) return ShmCursor::kEmpty;
  if (cursor - head <= ring_slots) return ShmCursor::kUnpublished;
  if (waiting > ring_slots) return ShmCursor::kCorrupt;
  return ShmCursor::kWaiting;
}

// Inline: once per receive batch of every ring, on the data path.
inline ShmRead ShmSlots::Read(uint64_t* cursor, uint64_t take, size_t limit, const Endpoint& source,
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

inline ShmRead ShmRingConsumer::Take(std::span<RxDatagram> out, const Endpoint& source) {
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
