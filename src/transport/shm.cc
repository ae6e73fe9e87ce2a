// The shm transport (shm.h): a thin Transport over its pieces. The inbox (shm_inbox.h) receives,
// the peers (shm_peers.h) are the inboxes it sends to, the group producer and member
// (shm_group.h) are its multicast, each over the rings of shm_ring.h; shm_cleanup.cc removes
// what dead processes left.
#include "transport/shm.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <ctime>

#include "base/check.h"
#include "base/status_macros.h"
#include "transport/shm_files.h"
#include "transport/shm_group.h"
#include "transport/shm_inbox.h"
#include "transport/shm_peers.h"

namespace switchml::transport {
namespace {

using Clock = std::chrono::steady_clock;

class ShmTransport final : public Transport {
 public:
  ShmTransport(const TransportOptions& o, std::string dir)
      : dir_(std::move(dir)),
        local_{o.bind_ipv4, o.port},
        source_{o.bind_ipv4 != 0 ? o.bind_ipv4 : kLoopbackIpv4, o.port},
        spin_(o.shm.spin),
        pid_(static_cast<uint32_t>(::getpid())),
        peers_(dir_, source_, pid_),
        groups_(dir_, source_, &counters_) {}

  // Creates the inbox (the transport is not usable before). *in_use: as ShmInbox::Create's.
  Status Listen(const TransportOptions& o, bool* in_use) {
    ASSIGN_OR_RETURN(inbox_, ShmInbox::Create(o, dir_, &counters_, in_use));
    return Status();
  }

  ~ShmTransport() override {
    member_.reset();  // leaves the group first (the last member removes its file)
  }

  Endpoint local_endpoint() const override { return local_; }
  size_t max_datagram_bytes() const override { return inbox_->geometry().max_datagram_bytes; }
  std::string name() const override { return "shm"; }

  std::span<uint8_t> TxBuffer(size_t index) override {
    if (index == 0) NewLendingBatch();
    return Transport::TxBuffer(index);
  }

  // A slot of the destination's ring (shm.h, "Lending"), else TxBuffer's memory.
  std::span<uint8_t> TxBufferTo(size_t index, const Endpoint& destination) override {
    if (index == 0) NewLendingBatch();
    CHECK_LT(index, kTxBuffers) << "TxBufferTo index out of range";
    const size_t bytes = max_datagram_bytes();
    const std::span<uint8_t> lent = IsGroupAddress(destination)
                                        ? groups_.Lend(destination, index, bytes)
                                        : peers_.Lend(destination.port, index, bytes);
    return lent.empty() ? Transport::TxBuffer(index) : lent;
  }

  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    size_t taken = 0;
    uint64_t copied = 0, errors = 0, in_place = 0;
    ShmPeers::Peer* peer = nullptr;
    bool have_port = false;
    uint16_t port = 0;
    for (; taken < batch.size(); ++taken) {
      const TxDatagram& d = batch[taken];
      if (IsGroupAddress(d.destination)) {  // (never stops the batch: dropped when full)
        if (d.data.size() <= kShmMaxDatagram && groups_.Send(d.destination, d.data, &in_place)) {
          ++copied;
        } else {
          ++errors;
        }
        continue;
      }
      if (!have_port || d.destination.port != port) {
        port = d.destination.port;
        have_port = true;
        peer = peers_.Find(port);
      }
      if (peer == nullptr || d.data.size() > kShmMaxDatagram) {
        ++errors;
        continue;
      }
      if (!peer->ring.HasRoom(1)) {
        if (!peer->Alive()) {
          peers_.Drop(port);
          peer = nullptr;
          ++errors;
          continue;
        }
        counters_.io.send_buffer_full.Add(1);
        break;
      }
      in_place += peers_.Push(*peer, d.data) ? 1 : 0;
      ++copied;
    }
    Publish();
    if (copied > 0) counters_.io.datagrams_sent.Add(copied);
    if (in_place > 0) counters_.sent_in_place.Add(in_place);
    if (errors > 0) counters_.io.send_errors.Add(errors);
    return taken;
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    if (batch.empty()) return size_t{0};
    if (member_) member_->ReturnLent();
    inbox_->ReturnLent();
    // Here, not only before sleeping: a receiver that never sleeps (busy polling, or traffic
    // without a pause) must free dead senders' rings too. (At most once a second.)
    inbox_->ReclaimDeadSenders(Clock::now());
    size_t n = Poll(batch);
    if (n > 0 || timeout <= timeout.zero()) return n;
    const bool forever = timeout > std::chrono::hours(24);
    const Clock::time_point deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
    for (;;) {
      if (wake_.exchange(false, std::memory_order_acq_rel)) return size_t{0};
      if (spin_ > spin_.zero()) {
        const Clock::time_point until = std::min(deadline, Clock::now() + spin_);
        while (Clock::now() < until) {
          if ((n = Poll(batch)) > 0) return n;
          if (wake_.load(std::memory_order_relaxed)) break;
          __builtin_ia32_pause();
        }
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return size_t{0};
      inbox_->ReclaimDeadSenders(now);
      // Announce the sleep, then look once more (shm.h, "Sleeping").
      const uint32_t seen = inbox_->AnnounceSleep();
      if ((n = Poll(batch)) > 0 || wake_.load(std::memory_order_acquire)) {
        inbox_->CancelSleep();
        if (n > 0) return n;
        continue;
      }
      timespec ts{};
      if (!forever) {
        const auto ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
        ts.tv_sec = static_cast<time_t>(ns / 1000000000);
        ts.tv_nsec = static_cast<long>(ns % 1000000000);
      }
      inbox_->Wait(seen, forever ? nullptr : &ts);
      inbox_->CancelSleep();
      if ((n = Poll(batch)) > 0) return n;
    }
  }

  void Wake() override {
    wake_.store(true, std::memory_order_release);
    inbox_->Ring();
  }

  TransportCounters counters() const override { return counters_.Snapshot(); }

  // Joins the group on this host (shm.h, "Groups"): interface_index must be 0 (loopback).
  Status JoinGroup(const Endpoint& group, uint32_t interface_index) override {
    LeaveGroup();
    if (interface_index != 0) {
      return UnimplementedError(
          "the shm transport's groups are of this host only (interface "
          "index 0), not on interface " +
          std::to_string(interface_index));
    }
    if (!IsGroupAddress(group) || group.port == 0) {
      return InvalidArgumentError("shm: " + group.ToString() + " is not a multicast group");
    }
    const InboxGeometry& g = inbox_->geometry();
    ASSIGN_OR_RETURN(
        member_,
        ShmGroupMember::Join(dir_, group, MakeGroupGeometry(g.ring_slots, g.max_datagram_bytes),
                             source_, pid_, &counters_));
    return Status();
  }

  void LeaveGroup() override { member_.reset(); }

 private:
  // Starts another batch of lent transmit memory: destinations dropped while lent in the last
  // one are unmapped now (their slots were the caller's until this call).
  void NewLendingBatch() {
    ++lending_batch_;
    peers_.sends().NewLendingBatch(lending_batch_);
    groups_.sends().NewLendingBatch(lending_batch_);
  }

  // Publishes the rings this Send filled, then rings the doorbells of receivers that sleep.
  void Publish() {
    if (!peers_.sends().touched() && !groups_.sends().touched()) return;
    counters_.io.send_calls.Add(peers_.PublishRings() + groups_.PublishRings());
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const size_t rang = groups_.RingDoorbells() + peers_.RingDoorbells();
    if (rang > 0) counters_.doorbells.Add(rang);
  }

  // Takes what waits in the inbox's rings and the joined group's ring, into batch.
  size_t Poll(std::span<RxDatagram> batch) {
    inbox_->Rescan();
    size_t n = 0;
    const size_t limit = max_datagram_bytes();
    // The joined group's ring first every other poll (as UDP's group socket).
    group_first_ = !group_first_;
    if (member_ && group_first_) n += member_->Take(batch, limit);
    n += inbox_->Take(batch.subspan(n));
    if (member_ && !group_first_ && n < batch.size()) n += member_->Take(batch.subspan(n), limit);
    if (n > 0) {
      counters_.io.datagrams_received.Add(n);
      counters_.io.receive_calls.Add(1);
    }
    return n;
  }

  const std::string dir_;
  const Endpoint local_;   // as bound (ipv4 0 when bound to any)
  const Endpoint source_;  // as receivers see us
  const std::chrono::nanoseconds spin_;
  const uint32_t pid_;
  ShmCounters counters_;
  std::atomic<bool> wake_{false};
  std::unique_ptr<ShmInbox> inbox_;  // (destroyed last: senders' entries are closed before)
  ShmPeers peers_;
  ShmGroupProducer groups_;
  uint64_t lending_batch_ = 0;              // batches of lent transmit memory so far
  std::unique_ptr<ShmGroupMember> member_;  // the group we receive from, if any
  bool group_first_ = false;                // whether this poll takes the group's ring first
};

Status ValidateOptions(const TransportOptions& o) {
  const std::string where = "shm transport on port " + std::to_string(o.port);
  if (o.max_datagram_bytes == 0 || o.max_datagram_bytes > kShmMaxDatagram) {
    return InvalidArgumentError(where + ": max_datagram_bytes must be in 1..65507");
  }
  if (!ShmPowerOfTwo(o.shm.ring_slots) || o.shm.ring_slots < 2 ||
      o.shm.ring_slots > kShmMaxRingSlots) {
    return InvalidArgumentError(where + ": ring_slots must be a power of two in 2..65536");
  }
  if (o.shm.max_senders == 0 || o.shm.max_senders > kMaxSenders) {
    return InvalidArgumentError(where + ": max_senders must be in 1..4096");
  }
  if (o.shm.spin < o.shm.spin.zero())
    return InvalidArgumentError(where + ": spin must not be negative");
  return Status();
}

Result<std::unique_ptr<Transport>> OpenShmImpl(const TransportOptions& o, const std::string& dir,
                                               bool* in_use) {
  *in_use = false;
  auto t = std::make_unique<ShmTransport>(o, dir);
  RETURN_IF_ERROR(t->Listen(o, in_use));
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace

std::string ShmDirectory(const ShmOptions& options) {
  if (!options.directory.empty()) return options.directory;
  return "/dev/shm/switchml-" + std::to_string(::geteuid());
}

bool ShmPortHeld(const std::string& dir, uint16_t port) {
  if (port == 0) return false;
  uint64_t bytes = 0;
  Fd fd = OpenOwnFile(InboxPath(dir, port), &bytes);
  return fd.get() >= 0 && InboxHeld(fd.get());
}

Result<std::unique_ptr<Transport>> OpenShm(const TransportOptions& options) {
  if (options.port == 0) {
    return InvalidArgumentError("OpenShm needs a port (OpenShmConsecutive picks free ones)");
  }
  RETURN_IF_ERROR(ValidateOptions(options));
  const std::string dir = ShmDirectory(options.shm);
  RETURN_IF_ERROR(EnsureDirectory(dir));
  bool in_use = false;
  return OpenShmImpl(options, dir, &in_use);
}

Result<std::vector<std::unique_ptr<Transport>>> OpenShmConsecutive(const TransportOptions& base,
                                                                   size_t count) {
  RETURN_IF_ERROR(ValidateOptions(base));
  const std::string dir = ShmDirectory(base.shm);
  RETURN_IF_ERROR(EnsureDirectory(dir));
  return OpenOnConsecutivePorts(base.port, count, "shm", " in " + dir, "close some transports",
                                [&](uint16_t port, bool* in_use) {
                                  TransportOptions o = base;
                                  o.port = port;
                                  return OpenShmImpl(o, dir, in_use);
                                });
}

}  // namespace switchml::transport
