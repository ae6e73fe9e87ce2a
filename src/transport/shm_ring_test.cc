// Tests of the shm transport's ring protocol (shm_ring.h) over a heap buffer: a producer and a
// consumer, wrap-around, full and empty rings, lent slots, and indices and lengths forged into
// the region, which are refused and counted without a read outside the region.
#include "transport/shm_ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace switchml::transport {
namespace {

constexpr uint32_t kSlots = 8;
constexpr size_t kMaxDatagram = 100;
constexpr uint32_t kSlotBytes = ShmSlotBytes(kMaxDatagram);  // 128
const Endpoint kSource{0x7f000001, 4000};

// A ring region on the heap, zeroed (as a new file is), 64-byte aligned.
class Region {
 public:
  explicit Region(uint64_t bytes)
      : bytes_(bytes), p_(static_cast<uint8_t*>(::operator new (bytes, std::align_val_t{64}))) {
    std::memset(p_, 0, bytes);
  }
  ~Region() { ::operator delete (p_, std::align_val_t{64}); }
  std::span<uint8_t> span() const { return {p_, bytes_}; }
  template <class T>
  void Poke(size_t offset, T v) {
    std::memcpy(p_ + offset, &v, sizeof v);
  }

 private:
  uint64_t bytes_;
  uint8_t* p_;
};

std::vector<uint8_t> Payload(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i);
  return v;
}

class ShmRingTest : public ::testing::Test {
 protected:
  ShmRingTest()
      : region_(ShmRingBytes(kSlots, kSlotBytes)),
        producer_(region_.span(), kSlots, kSlotBytes, kMaxDatagram),
        consumer_(region_.span(), kSlots, kSlotBytes, kMaxDatagram) {}

  // Takes what waits (up to 2 * kSlots), checking each is whole, from kSource.
  std::vector<std::vector<uint8_t>> TakeAll(ShmRead* read = nullptr) {
    std::vector<RxDatagram> out(2 * kSlots);
    const ShmRead r = consumer_.Take(out, kSource);
    if (read != nullptr) *read = r;
    std::vector<std::vector<uint8_t>> got;
    for (size_t i = 0; i < r.filled; ++i) {
      EXPECT_EQ(out[i].source, kSource);
      got.emplace_back(out[i].data.begin(), out[i].data.end());
    }
    return got;
  }
  // Offset in the region of the slot of position p.
  static size_t SlotOffset(uint64_t p) { return kShmRingSlotsOffset + (p % kSlots) * kSlotBytes; }

  Region region_;
  ShmRingProducer producer_;
  ShmRingConsumer consumer_;
};

TEST_F(ShmRingTest, ConsumerSeesNothingBeforePublishThenEverythingInOrder) {
  // Given: three datagrams pushed. Expect: none visible before Publish, all three after.
  for (uint8_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(producer_.HasRoom(1));
    EXPECT_FALSE(producer_.Push(Payload(10 + k, k)));
  }
  EXPECT_TRUE(TakeAll().empty());
  producer_.Publish();
  const auto got = TakeAll();
  ASSERT_EQ(got.size(), 3u);
  for (uint8_t k = 0; k < 3; ++k) EXPECT_EQ(got[k], Payload(10 + k, k));
  EXPECT_TRUE(TakeAll().empty());
  EXPECT_TRUE(consumer_.Drained());
}

TEST_F(ShmRingTest, FullRingRefusesUntilTheConsumerReturnsAndThenWrapsAround) {
  // Given: a full ring. Expect: no room until the consumer took and returned its slots; then the
  // positions past the end of the slots reuse the first ones, in order.
  for (uint8_t k = 0; k < kSlots; ++k) {
    ASSERT_TRUE(producer_.HasRoom(1));
    producer_.Push(Payload(5, k));
  }
  EXPECT_FALSE(producer_.HasRoom(1));
  producer_.Publish();
  ASSERT_EQ(TakeAll().size(), kSlots);
  EXPECT_FALSE(producer_.HasRoom(1)) << "taken but not yet returned: still the consumer's";
  consumer_.Return();
  for (uint8_t round = 0; round < 3; ++round) {
    for (uint8_t k = 0; k < 5; ++k) {
      ASSERT_TRUE(producer_.HasRoom(1));
      producer_.Push(Payload(7, static_cast<uint8_t>(round * 16 + k)));
    }
    producer_.Publish();
    const auto got = TakeAll();
    ASSERT_EQ(got.size(), 5u);
    for (uint8_t k = 0; k < 5; ++k)
      EXPECT_EQ(got[k], Payload(7, static_cast<uint8_t>(round * 16 + k)));
    consumer_.Return();
  }
  EXPECT_EQ(producer_.head(), kSlots + 15);
}

TEST_F(ShmRingTest, LentSlotsAreSentInPlaceAndOneLeftOutMovesTheRestDown) {
  // Given: three slots lent and built; the first is left out. Expect: the other two are moved
  // down (not in place) and arrive intact; a datagram built in its own lent slot is in place.
  for (uint8_t k = 0; k < 3; ++k) {
    const std::vector<uint8_t> p = Payload(20, static_cast<uint8_t>(40 * k));
    std::memcpy(producer_.Lend(k).data(), p.data(), p.size());
    EXPECT_EQ(producer_.Lend(k).size(), kMaxDatagram);
  }
  const std::vector<uint8_t> second(producer_.Lend(1).begin(), producer_.Lend(1).begin() + 20);
  const std::vector<uint8_t> third(producer_.Lend(2).begin(), producer_.Lend(2).begin() + 20);
  EXPECT_FALSE(producer_.Push({producer_.Lend(1).data(), 20}));  // slot 1 -> slot 0
  EXPECT_FALSE(producer_.Push({producer_.Lend(1).data(), 20}));  // slot 2 -> slot 1
  EXPECT_TRUE(producer_.Push({producer_.Lend(0).data(), 20}));   // built where it goes
  producer_.Publish();
  const auto got = TakeAll();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], second);
  EXPECT_EQ(got[1], third);
}

TEST_F(ShmRingTest, LongDatagramIsCutToTheConsumersLimitAndFlagged) {
  // Given: a consumer that takes datagrams of 40 bytes at most. Expect: a 100-byte one is handed
  // out as its first 40 bytes, flagged and counted.
  ShmRingConsumer small(region_.span(), kSlots, kSlotBytes, 40);
  producer_.Push(Payload(100, 3));
  producer_.Push(Payload(40, 4));
  producer_.Publish();
  std::vector<RxDatagram> out(4);
  const ShmRead r = small.Take(out, kSource);
  ASSERT_EQ(r.filled, 2u);
  EXPECT_EQ(r.truncated, 1u);
  EXPECT_TRUE(out[0].truncated);
  const std::vector<uint8_t> sent = Payload(100, 3);
  EXPECT_EQ(std::vector<uint8_t>(out[0].data.begin(), out[0].data.end()),
            std::vector<uint8_t>(sent.begin(), sent.begin() + 40));
  EXPECT_FALSE(out[1].truncated);
  EXPECT_EQ(out[1].data.size(), 40u);
}

TEST_F(ShmRingTest, ForgedLengthWordIsCountedAndSkipped) {
  // Given: three datagrams, the second's length word forged beyond 65535, the third's beyond
  // the slot. Expect: the second is skipped and counted malformed, the third cut to the limit
  // (never read past its slot), the first whole.
  for (uint8_t k = 0; k < 3; ++k) producer_.Push(Payload(30, k));
  producer_.Publish();
  region_.Poke<uint32_t>(SlotOffset(1), 70000);
  region_.Poke<uint32_t>(SlotOffset(2), 65535);
  std::vector<RxDatagram> out(4);
  const ShmRead r = consumer_.Take(out, kSource);
  EXPECT_EQ(r.filled, 2u);
  EXPECT_EQ(r.malformed, 1u);
  EXPECT_EQ(r.truncated, 1u);
  EXPECT_EQ(out[0].data.size(), 30u);
  EXPECT_EQ(out[1].data.size(), kMaxDatagram);
  EXPECT_TRUE(out[1].truncated);
}

TEST_F(ShmRingTest, ProducerIndexMoreThanARingAheadBreaksTheRingForGood) {
  // Given: a producer index forged a ring and one slot ahead. Expect: nothing read, the ring
  // counted malformed once and ignored from then on, also after a sane index is written back.
  region_.Poke<uint64_t>(kShmRingHeadOffset, kSlots + 1);
  ShmRead r;
  EXPECT_TRUE(TakeAll(&r).empty());
  EXPECT_EQ(r.malformed, 1u);
  EXPECT_TRUE(consumer_.broken());
  EXPECT_TRUE(consumer_.Drained());
  region_.Poke<uint64_t>(kShmRingHeadOffset, 1);
  EXPECT_TRUE(TakeAll(&r).empty());
  EXPECT_EQ(r.malformed, 0u) << "counted once";
}

TEST_F(ShmRingTest, ProducerIndexBehindTheConsumerBreaksTheRing) {
  // Given: two datagrams taken, then the producer index forged back to 0 (head - tail wraps to
  // almost 2^64). Expect: refused as a ring too far ahead, not read.
  producer_.Push(Payload(8, 1));
  producer_.Push(Payload(8, 2));
  producer_.Publish();
  ASSERT_EQ(TakeAll().size(), 2u);
  region_.Poke<uint64_t>(kShmRingHeadOffset, 0);
  ShmRead r;
  EXPECT_TRUE(TakeAll(&r).empty());
  EXPECT_EQ(r.malformed, 1u);
  EXPECT_TRUE(consumer_.broken());
}

TEST_F(ShmRingTest, ConsumerIndexBeyondTheProducersReadsAsAFullRing) {
  // Given: a full ring whose consumer index is forged beyond the producer index (by one, or far).
  // Expect: the producer sees no room (it never writes over slots on the strength of a forged
  // index); a sane index written back frees what it says.
  for (uint8_t k = 0; k < kSlots; ++k) producer_.Push(Payload(8, k));
  producer_.Publish();
  region_.Poke<uint64_t>(kShmRingTailOffset, kSlots + 1);
  EXPECT_FALSE(producer_.HasRoom(1));
  region_.Poke<uint64_t>(kShmRingTailOffset, 1000);
  EXPECT_FALSE(producer_.HasRoom(1));
  region_.Poke<uint64_t>(kShmRingTailOffset, 2);  // a sane index: two slots free
  EXPECT_TRUE(producer_.HasRoom(2));
  EXPECT_FALSE(producer_.HasRoom(3));
}

TEST_F(ShmRingTest, ResetRingStartsAgainAtZero) {
  // Given: a ring with traffic, reset by its consumer. Expect: a new producer and consumer start
  // at 0 and see each other's datagrams.
  producer_.Push(Payload(8, 1));
  producer_.Publish();
  ASSERT_EQ(TakeAll().size(), 1u);
  consumer_.Return();
  consumer_.Reset();
  ShmRingProducer p(region_.span(), kSlots, kSlotBytes, kMaxDatagram);
  ShmRingConsumer c(region_.span(), kSlots, kSlotBytes, kMaxDatagram);
  EXPECT_TRUE(c.Drained());
  p.Push(Payload(9, 9));
  p.Publish();
  std::vector<RxDatagram> out(2);
  ASSERT_EQ(c.Take(out, kSource).filled, 1u);
  EXPECT_EQ(std::vector<uint8_t>(out[0].data.begin(), out[0].data.end()), Payload(9, 9));
}

TEST(ShmCursorTest, CursorAgainstAProducerIndex) {
  // A reader of a ring of 8 slots with many readers: where its cursor stands.
  EXPECT_EQ(ClassifyShmCursor(10, 10, 8), ShmCursor::kEmpty);
  EXPECT_EQ(ClassifyShmCursor(12, 10, 8), ShmCursor::kWaiting);
  EXPECT_EQ(ClassifyShmCursor(18, 10, 8), ShmCursor::kWaiting);
  EXPECT_EQ(ClassifyShmCursor(19, 10, 8), ShmCursor::kCorrupt);
  EXPECT_EQ(ClassifyShmCursor(10, 13, 8), ShmCursor::kUnpublished);
  EXPECT_EQ(ClassifyShmCursor(10, 18, 8), ShmCursor::kUnpublished);
  EXPECT_EQ(ClassifyShmCursor(10, 19, 8), ShmCursor::kCorrupt);
  EXPECT_EQ(ClassifyShmCursor(0, ~uint64_t{0} - 2, 8), ShmCursor::kWaiting);  // wraps
}

}  // namespace
}  // namespace switchml::transport
