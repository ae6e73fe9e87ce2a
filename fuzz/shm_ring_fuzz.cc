// Fuzzes the shm transport's ring protocol (transport/shm_ring.h) over a heap buffer of exactly
// the ring's size (ASan catches any read or write outside it). The input picks a geometry, then
// a sequence of operations on one producer and one consumer: push (fresh or built in a lent
// slot), publish, take, return, and writes of arbitrary words anywhere in the region (the other
// process misbehaving); then a reader of a ring with many readers (ClassifyShmCursor +
// ShmSlots::Read) at an arbitrary producer index and cursor. Checks:
//   - always: every datagram handed out lies inside its slot's data and within the consumer's
//     limit, flagged truncated exactly when cut; take never fills more than asked nor reads more
//     than a ring's slots at once; a broken ring stays broken and hands out nothing;
//   - while no word was forged: the consumer receives exactly what the producer published, in
//     order and intact, never what it did not publish, and HasRoom agrees with the count of
//     slots not yet returned.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <new>
#include <vector>

#include "fuzz_check.h"
#include "transport/shm_ring.h"

namespace {

using namespace switchml;
using namespace switchml::transport;

struct Region {
  explicit Region(size_t n)
      : bytes(n), p(static_cast<uint8_t*>(::operator new (n, std::align_val_t{64}))) {
    std::memset(p, 0, n);
  }
  ~Region() { ::operator delete (p, std::align_val_t{64}); }
  size_t bytes;
  uint8_t* p;
};

std::vector<uint8_t> Datagram(FuzzedDataProvider& in, size_t max) {
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, max);
  std::vector<uint8_t> d(n);
  const uint8_t seed = in.ConsumeIntegral<uint8_t>();
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(seed * 31 + i);
  return d;
}

// A datagram handed out by a read lies within a slot's data, within the limit.
void CheckHandedOut(const RxDatagram& d, const Region& r, size_t slots_offset, uint32_t slot_bytes,
                    size_t limit) {
  const size_t at = static_cast<size_t>(d.data.data() - r.p);
  FUZZ_CHECK(d.data.data() >= r.p && at >= slots_offset);
  FUZZ_CHECK((at - slots_offset) % slot_bytes == kShmSlotDataOffset);
  FUZZ_CHECK(d.data.size() <= limit);
  FUZZ_CHECK(at + d.data.size() <= r.bytes);
  const uint32_t length = *reinterpret_cast<const uint32_t*>(d.data.data() - kShmSlotDataOffset);
  // (The word may be rewritten by a later op of the input, never between the read and here.)
  FUZZ_CHECK(d.truncated == (length > limit));
  FUZZ_CHECK(d.data.size() == (d.truncated ? limit : length));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const uint32_t slots = 1u << in.ConsumeIntegralInRange<uint32_t>(1, 5);  // 2..32
  const size_t capacity = in.ConsumeIntegralInRange<size_t>(1, 300);
  const uint32_t slot_bytes = ShmSlotBytes(capacity);
  const size_t limit = in.ConsumeIntegralInRange<size_t>(0, capacity);
  const Endpoint source{0x7f000001, 9};
  Region region(ShmRingBytes(slots, slot_bytes));
  const std::span<uint8_t> span{region.p, region.bytes};
  ShmRingProducer producer(span, slots, slot_bytes, capacity);
  ShmRingConsumer consumer(span, slots, slot_bytes, limit);

  bool forged = false;
  std::deque<std::vector<uint8_t>> pushed;     // pushed, not yet published (model)
  std::deque<std::vector<uint8_t>> published;  // published, not yet taken
  uint64_t taken_unreturned = 0;
  std::vector<RxDatagram> out(2 * slots);
  for (int op = 0; op < 200 && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
      case 0:
      case 1: {  // push, fresh or built in a lent slot
        const std::vector<uint8_t> d = Datagram(in, capacity + 20);
        const uint64_t held = pushed.size() + published.size() + taken_unreturned;
        const bool room = producer.HasRoom(1);
        if (!forged) FUZZ_CHECK(room == (held < slots));
        if (!room) break;
        bool in_place = false;
        if (in.ConsumeBool() && d.size() <= capacity) {
          const std::span<uint8_t> lent = producer.Lend(0);
          FUZZ_CHECK(lent.size() == capacity);
          if (!d.empty()) std::memcpy(lent.data(), d.data(), d.size());
          in_place = producer.Push({lent.data(), d.size()});
          FUZZ_CHECK(in_place);
        } else {
          FUZZ_CHECK(!producer.Push(d));
        }
        pushed.push_back(d);
        break;
      }
      case 2:  // publish
        producer.Publish();
        while (!pushed.empty()) {
          published.push_back(std::move(pushed.front()));
          pushed.pop_front();
        }
        break;
      case 3: {  // take
        const size_t want = in.ConsumeIntegralInRange<size_t>(0, out.size());
        const bool was_broken = consumer.broken();
        const ShmRead r = consumer.Take({out.data(), want}, source);
        FUZZ_CHECK(r.filled <= want);
        FUZZ_CHECK(r.filled + r.malformed <= slots);  // never more than a ring's worth at once
        if (was_broken) FUZZ_CHECK(r.filled == 0 && r.malformed == 0);
        uint64_t truncated = 0;
        for (size_t i = 0; i < r.filled; ++i) {
          CheckHandedOut(out[i], region, kShmRingSlotsOffset, slot_bytes, limit);
          FUZZ_CHECK(out[i].source == source);
          truncated += out[i].truncated ? 1 : 0;
        }
        FUZZ_CHECK(truncated == r.truncated);
        if (!forged) {
          FUZZ_CHECK(r.malformed == 0 && !consumer.broken());
          FUZZ_CHECK(r.filled == std::min(want, published.size()));
          for (size_t i = 0; i < r.filled; ++i) {
            const std::vector<uint8_t>& d = published.front();
            const size_t n = std::min({d.size(), capacity, limit});
            FUZZ_CHECK(out[i].data.size() == n);
            FUZZ_CHECK(n == 0 || std::memcmp(out[i].data.data(), d.data(), n) == 0);
            published.pop_front();
          }
          taken_unreturned += r.filled;
        }
        break;
      }
      case 4:  // return
        consumer.Return();
        taken_unreturned = 0;
        break;
      case 5:
      case 6: {  // the other process writes a word anywhere in the region
        const size_t width = size_t{1} << in.ConsumeIntegralInRange<int>(0, 3);
        const size_t at =
            in.ConsumeIntegralInRange<size_t>(0, region.bytes - width) / width * width;
        const uint64_t v = in.ConsumeIntegral<uint64_t>();
        std::memcpy(region.p + at, &v, width);
        forged = true;
        break;
      }
    }
  }

  // A reader of a ring with many readers, at an arbitrary producer index and cursor.
  const uint64_t head = in.ConsumeIntegral<uint64_t>();
  uint64_t cursor = in.ConsumeBool() ? head - in.ConsumeIntegralInRange<uint64_t>(0, 2 * slots)
                                     : in.ConsumeIntegral<uint64_t>();
  const ShmCursor where = ClassifyShmCursor(head, cursor, slots);
  const uint64_t waiting = head - cursor;
  FUZZ_CHECK((where == ShmCursor::kEmpty) == (waiting == 0));
  if (where == ShmCursor::kWaiting) {
    FUZZ_CHECK(waiting <= slots);
    const ShmSlots ring(span.subspan(kShmRingSlotsOffset), slots, slot_bytes, capacity);
    const uint64_t take = std::min<uint64_t>(waiting, out.size());
    const uint64_t start = cursor;
    const ShmRead r = ring.Read(&cursor, take, limit, source, out);
    FUZZ_CHECK(cursor == start + take);
    FUZZ_CHECK(r.filled + r.malformed == take);
    for (size_t i = 0; i < r.filled; ++i) {
      CheckHandedOut(out[i], region, kShmRingSlotsOffset, slot_bytes, limit);
    }
  }
  return 0;
}
