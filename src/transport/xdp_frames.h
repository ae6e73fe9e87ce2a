// The receive frames of one AF_XDP UMEM and the fill ring through which the kernel gets them
// (used by xdp.cc; compiled only where libxdp was found).
//
// A receive frame is held either by the kernel (in the fill ring, in a socket's RX ring, or in
// the kernel's own cache of the pool) or by this process (taken from an RX ring and lent to the
// caller of Receive until it is given back). RxFrames records which frames this process holds,
// so that a frame can neither be taken twice nor given back twice, and gives frames back to the
// fill ring.
//
// Sizing: the fill ring must have room for twice the receive frames. The kernel publishes the
// descriptors it received (the RX ring's producer index) before the fill ring's consumer index
// (net/xdp/xsk.c, xsk_flush; once per NAPI batch in native mode, per packet in generic mode), so
// a frame can already be in our hands while the fill ring's indices still count it as in the
// ring. The ring's indices count every frame in the ring or taken from it and not yet published
// (at most all frames), plus the frames given back since (at most all frames again), so a ring
// of 2 x frames always has room for a frame given back. A smaller ring (the cause of the
// abort "xsk_ring_prod__reserve(&fill_, n, &index) == n" seen in the transport benchmark, with
// a ring of exactly as many entries as frames) is still handled: what does not fit waits in a
// stash and goes to the ring on a later GiveBack, and the shortfall is counted.
//
// Thread-safety: Take may run on several threads at once (each frame is taken by the one socket
// the kernel delivered it to); GiveBack and the fill ring need the caller's lock (the fill ring
// is shared by the sockets of the UMEM).
#pragma once

#include <xdp/xsk.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace switchml::transport::xdp {

// The geometry xdp.cc uses: receive frames per UMEM, and its fill ring (twice: see above).
inline constexpr uint32_t kRxFrames = 4096;
inline constexpr uint32_t kFillRingEntries = 2 * kRxFrames;

class RxFrames {
 public:
  // Frames [0, count) of frame_size bytes at the start of the UMEM are the receive frames.
  RxFrames(uint32_t count, uint32_t frame_size);

  // Puts every receive frame into an empty fill ring (at start, or on a fresh UMEM); marks them
  // held by the kernel. The ring must have room for them all.
  void FillAll(xsk_ring_prod* fill);

  // Takes the frame of an address the kernel handed over (an RX descriptor's address): returns
  // its frame's address, or UINT64_MAX if the address is not in a receive frame or the frame is
  // not the kernel's to hand over (held already, or in the stash: the kernel misbehaved; the
  // frame is not lent again).
  uint64_t Take(uint64_t addr);

  // Gives frames taken with Take back to the kernel through the fill ring (frames waiting in the
  // stash first); what the ring has no room for waits in the stash. A frame not held by this
  // process is a bug of the caller: aborts, naming the frame.
  void GiveBack(xsk_ring_prod* fill, std::span<const uint64_t> frames);

  // Frames waiting for room in the fill ring; GiveBack(fill, {}) retries them.
  size_t stashed() const { return stashed_.load(std::memory_order_relaxed); }
  // GiveBack calls that found less room in the fill ring than they had frames.
  uint64_t short_refills() const { return short_refills_.load(std::memory_order_relaxed); }
  // Frames taken and not given back (O(count): for tests and statistics).
  size_t held() const;

  uint32_t count() const { return count_; }

 private:
  const uint32_t count_;
  const uint32_t frame_size_;
  // Where each frame is: with the kernel, held (taken, lent to a caller), or in the stash.
  // Written by the thread that holds the frame (or under the caller's lock for the stash); the
  // rings' release/acquire order the hand-overs between threads.
  enum : uint8_t { kWithKernel = 0, kHeld = 1, kStashed = 2 };
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::vector<uint64_t> stash_;  // under the caller's lock
  std::atomic<size_t> stashed_{0};
  std::atomic<uint64_t> short_refills_{0};
};

}  // namespace switchml::transport::xdp
