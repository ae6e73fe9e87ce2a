// RxFrames against a fill ring in plain memory whose "kernel" side the test plays, including the
// kernel's habit of publishing its fill ring consumer index after the received descriptors
// (the cause of the fill-ring abort in the AF_XDP transport benchmark).
#include "transport/xdp_frames.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

namespace switchml::transport::xdp {
namespace {

constexpr uint32_t kFrame = 2048;

// A fill ring in plain memory, set up as libxdp sets up a mapped one; the kernel's side is
// KernelTake (consume entries, keeping the consumer index private) and KernelPublish.
class FakeFillRing {
 public:
  explicit FakeFillRing(uint32_t size) : entries_(size) {
    ring_.cached_prod = 0;
    ring_.cached_cons = size;  // libxdp keeps the consumer index plus the size
    ring_.mask = size - 1;
    ring_.size = size;
    ring_.producer = &producer_;
    ring_.consumer = &consumer_;
    ring_.ring = entries_.data();
    ring_.flags = &flags_;
  }
  xsk_ring_prod* prod() { return &ring_; }

  // The kernel takes up to n frames from the ring (as received packets) without publishing its
  // consumer index.
  std::vector<uint64_t> KernelTake(uint32_t n) {
    std::vector<uint64_t> out;
    const uint32_t producer = __atomic_load_n(&producer_, __ATOMIC_ACQUIRE);
    while (out.size() < n && kernel_consumer_ != producer) {
      out.push_back(entries_[kernel_consumer_ & ring_.mask]);
      ++kernel_consumer_;
    }
    return out;
  }
  void KernelPublish() { __atomic_store_n(&consumer_, kernel_consumer_, __ATOMIC_RELEASE); }
  // What the ring really holds (from the kernel's consumer to the producer).
  std::vector<uint64_t> Contents() const {
    std::vector<uint64_t> out;
    for (uint32_t i = kernel_consumer_; i != producer_; ++i)
      out.push_back(entries_[i & ring_.mask]);
    return out;
  }

 private:
  std::vector<uint64_t> entries_;
  uint32_t producer_ = 0, consumer_ = 0, flags_ = 0;
  uint32_t kernel_consumer_ = 0;
  xsk_ring_prod ring_{};
};

// Every receive frame is in exactly one place: the ring, held, or the stash.
void ExpectEveryFrameOnce(const RxFrames& frames, const FakeFillRing& ring,
                          const std::vector<uint64_t>& held) {
  std::vector<uint64_t> all = ring.Contents();
  all.insert(all.end(), held.begin(), held.end());
  EXPECT_EQ(all.size() + frames.stashed(), frames.count());
  std::sort(all.begin(), all.end());
  EXPECT_TRUE(std::adjacent_find(all.begin(), all.end()) == all.end()) << "a frame twice";
  EXPECT_EQ(frames.held(), held.size());
}

// Given the transport's geometry (a fill ring of kFillRingEntries for kRxFrames frames), a
// receiver that keeps up (almost every frame in the ring) and a kernel that has handed over a
// batch of frames but not yet published its fill ring consumer index,
// Expect the frames given back to fit in the ring at once: none waits in the stash.
// (With a ring of exactly kRxFrames entries, as before, this gave back more than the ring had
// room for: the transport benchmark's abort in XdpPort::Refill.)
TEST(RxFramesTest, GivenBackFramesFitWhileTheKernelLagsInPublishingItsConsumer) {
  FakeFillRing ring(kFillRingEntries);
  RxFrames frames(kRxFrames, kFrame);
  frames.FillAll(ring.prod());
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    // The kernel hands over a batch (as one NAPI poll: one flush), the receiver takes the frames
    // and gives them back before the kernel has published its consumer index.
    const uint32_t batch = 1 + rng() % 64;
    std::vector<uint64_t> got = ring.KernelTake(batch);
    ASSERT_EQ(got.size(), batch);
    std::vector<uint64_t> taken;
    for (uint64_t a : got) {
      const uint64_t f = frames.Take(a + 256);  // the packet starts after the XDP headroom
      ASSERT_NE(f, UINT64_MAX);
      taken.push_back(f);
    }
    frames.GiveBack(ring.prod(), taken);
    ASSERT_EQ(frames.stashed(), 0u) << "round " << round;
    if (rng() % 4 != 0) ring.KernelPublish();
  }
  EXPECT_EQ(frames.short_refills(), 0u);
  ExpectEveryFrameOnce(frames, ring, {});
}

// Given a fill ring with no more entries than frames (the old geometry) and the same lagging
// kernel, Expect no abort: what does not fit waits in the stash, goes to the ring once the
// kernel has published, and no frame is lost or doubled.
TEST(RxFramesTest, FramesThatDoNotFitWaitInTheStashAndGoOnLater) {
  FakeFillRing ring(kRxFrames);
  RxFrames frames(kRxFrames, kFrame);
  frames.FillAll(ring.prod());
  std::vector<uint64_t> got = ring.KernelTake(64);
  std::vector<uint64_t> taken;
  for (uint64_t a : got) taken.push_back(frames.Take(a));
  frames.GiveBack(ring.prod(), taken);
  EXPECT_EQ(frames.stashed(), 64u);
  EXPECT_EQ(frames.short_refills(), 1u);
  ExpectEveryFrameOnce(frames, ring, {});
  // A stashed frame is not the kernel's to hand over.
  EXPECT_EQ(frames.Take(taken[0]), UINT64_MAX);
  ring.KernelPublish();
  frames.GiveBack(ring.prod(), {});
  EXPECT_EQ(frames.stashed(), 0u);
  ExpectEveryFrameOnce(frames, ring, {});
}

// Given frames taken in one order and given back in batches of other sizes, some held across
// several receives (as a caller keeps a batch until its next Receive),
// Expect every frame in one place at every step.
TEST(RxFramesTest, PartialBatchesAndLateGiveBacksKeepEveryFrameOnce) {
  FakeFillRing ring(kFillRingEntries);
  RxFrames frames(kRxFrames, kFrame);
  frames.FillAll(ring.prod());
  std::mt19937 rng(11);
  std::deque<uint64_t> held;
  for (int round = 0; round < 500; ++round) {
    for (uint64_t a : ring.KernelTake(rng() % 200)) {
      const uint64_t f = frames.Take(a);
      ASSERT_NE(f, UINT64_MAX);
      held.push_back(f);
    }
    const size_t back = std::min<size_t>(held.size(), rng() % 150);
    std::vector<uint64_t> batch(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(back));
    held.erase(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(back));
    frames.GiveBack(ring.prod(), batch);
    if (rng() % 3 == 0) ring.KernelPublish();
    ExpectEveryFrameOnce(frames, ring, std::vector<uint64_t>(held.begin(), held.end()));
    if (HasFailure()) return;
  }
  EXPECT_EQ(frames.stashed(), 0u);
}

// Given an address outside the receive frames, or a frame handed over twice by the kernel,
// Expect Take to refuse it (the transport reports it instead of lending the frame twice).
TEST(RxFramesTest, TakeRefusesWhatIsNotTheKernelsToHandOver) {
  FakeFillRing ring(kFillRingEntries);
  RxFrames frames(kRxFrames, kFrame);
  frames.FillAll(ring.prod());
  EXPECT_EQ(frames.Take(uint64_t{kRxFrames} * kFrame), UINT64_MAX);  // a transmit frame
  const uint64_t f = frames.Take(3 * kFrame + 256);
  EXPECT_EQ(f, 3u * kFrame);
  EXPECT_EQ(frames.Take(3 * kFrame + 256), UINT64_MAX);
  EXPECT_EQ(frames.held(), 1u);
}

// Given a frame given back twice (a bug of the caller),
// Expect an abort naming the frame, not a corrupt fill ring.
TEST(RxFramesDeathTest, GivingAFrameBackTwiceAborts) {
  FakeFillRing ring(kFillRingEntries);
  RxFrames frames(kRxFrames, kFrame);
  frames.FillAll(ring.prod());
  const uint64_t f = frames.Take(ring.KernelTake(1)[0]);
  frames.GiveBack(ring.prod(), {&f, 1});
  EXPECT_DEATH(frames.GiveBack(ring.prod(), {&f, 1}), "receive frame 0 given back");
}

}  // namespace
}  // namespace switchml::transport::xdp
