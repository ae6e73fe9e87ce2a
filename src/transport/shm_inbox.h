// The inbox of the shm transport (shm.h, "Open", "Receive", "Sleeping"): a process's receive
// area, the file `inbox-<port>` that holds its doorbell, the registration table of its senders
// and one SPSC ring (shm_ring.h) per sender. Here: the file's layout, the receiver's side
// (ShmInbox) and the doorbell as a sender sees it (ShmDoorbell). The senders' side of the table
// and rings is shm_peers.h. Internal to src/transport.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "switchml/status.h"
#include "transport/options.h"
#include "transport/shm_files.h"
#include "transport/shm_ring.h"
#include "transport/transport.h"

namespace switchml::transport {

// ---- The inbox file's layout (shm.h). Every multi-byte field is the host's byte order: the file
// never leaves the host. Shared fields are plain integers accessed through atomic_ref.

inline constexpr uint64_t kInboxMagic = 0x314d48534c4d5753ULL;  // "SWMLSHM1" read little-endian
inline constexpr uint32_t kInboxVersion = 1;
inline constexpr uint32_t kMaxSenders = 4096;

struct InboxFixed {  // offset 0; written once by the receiver before the file gets its name
  uint64_t magic;
  uint32_t version;
  uint32_t max_senders;
  uint32_t ring_slots;
  uint32_t slot_bytes;
  uint32_t max_datagram_bytes;
  uint32_t owner_pid;
  uint64_t header_bytes;
  uint64_t ring_bytes;
  uint64_t total_bytes;
};
static_assert(sizeof(InboxFixed) <= kShmLine);

struct InboxDoorbell {  // offset 64
  uint32_t bell;        // the futex word: bumped by every ring of the doorbell
  uint32_t sleeping;    // 1: the receiver announced that it is about to sleep
  uint32_t closed;      // 1: the receiver is gone (or was replaced): senders forget this inbox
};
inline constexpr size_t kDoorbellOffset = kShmLine;
inline constexpr size_t kTableVersionOffset = 2 * kShmLine;  // uint32_t: bumped on (un)registration

struct InboxEntry {  // one per ring, from kEntriesOffset
  uint64_t state;    // kind << 32 | pid
  uint32_t ipv4;     // the sender's endpoint
  uint32_t port;
  uint64_t reserved[2];
};
static_assert(sizeof(InboxEntry) == 32);
inline constexpr size_t kEntriesOffset = 4 * kShmLine;

enum EntryKind : uint64_t { kFree = 0, kClaimed = 1, kActive = 2, kClosed = 3 };
inline uint64_t StateOf(EntryKind kind, uint32_t pid) { return uint64_t{kind} << 32 | pid; }
inline size_t EntryOffset(uint32_t e) { return kEntriesOffset + e * sizeof(InboxEntry); }

struct InboxGeometry {
  uint32_t max_senders = 0;
  uint32_t ring_slots = 0;
  uint32_t slot_bytes = 0;
  uint32_t max_datagram_bytes = 0;
  uint64_t header_bytes = 0;
  uint64_t ring_bytes = 0;
  uint64_t total_bytes = 0;
};

InboxGeometry MakeInboxGeometry(uint32_t max_senders, uint32_t ring_slots, uint32_t max_datagram);

// The geometry a file's header claims, if it is one this code would have made; read once.
bool ReadInboxGeometry(const uint8_t* header, uint64_t file_bytes, InboxGeometry* out);

std::string InboxPath(const std::string& dir, uint16_t port);

// Marks the inbox behind fd closed (a stale one being replaced), if it looks like an inbox.
void MarkInboxClosed(int fd);

// The doorbell of an inbox as its senders (and a group's producer) see it: the inbox's first
// page, mapped. Ring after publishing and a full fence (shm.h, "Sleeping").
class ShmDoorbell {
 public:
  ShmDoorbell() = default;
  // The header page of the inbox of port, if it is an inbox of ours; else a null one.
  static ShmDoorbell Map(const std::string& dir, uint32_t port);
  // header: the inbox's first page (mapped by the caller, who keeps it mapped).
  explicit ShmDoorbell(uint8_t* header) : header_(header) {}
  ShmDoorbell(ShmDoorbell&& o) noexcept
      : page_(std::move(o.page_)), header_(std::exchange(o.header_, nullptr)) {}
  ShmDoorbell& operator=(ShmDoorbell&& o) noexcept {
    page_ = std::move(o.page_);
    header_ = std::exchange(o.header_, nullptr);
    return *this;
  }

  bool valid() const { return header_ != nullptr; }
  // Whether the receiver closed its inbox (or it was replaced).
  bool Closed() const {
    return ShmRef<uint32_t>(header_, kDoorbellOffset + offsetof(InboxDoorbell, closed))
               .load(std::memory_order_acquire) != 0;
  }
  // Rings the doorbell if the receiver announced that it sleeps (and no one rang it since):
  // whether it rang.
  bool RingIfSleeping() const;

 private:
  Mapping page_;  // (Map's: owned)
  uint8_t* header_ = nullptr;
};

// A transport's own inbox, the receiver's side: creates the file (locked for its life), takes
// datagrams from its senders' rings round robin, frees the entries of senders that closed or
// died, and sleeps on its doorbell. Owns the file, its lock and its mapping; on destruction marks
// the inbox closed and removes it. Thread-safety: one thread; Wake() from any thread.
class ShmInbox {
 public:
  // Creates the inbox of o.port in dir (shm.h, "Open"). *in_use: failed only because a live
  // transport holds the port.
  static Result<std::unique_ptr<ShmInbox>> Create(const TransportOptions& o, const std::string& dir,
                                                  ShmCounters* counters, bool* in_use);
  ~ShmInbox();
  ShmInbox(const ShmInbox&) = delete;
  ShmInbox& operator=(const ShmInbox&) = delete;

  const InboxGeometry& geometry() const { return g_; }

  // Gives back the slots lent by the previous Take, and frees the entries of senders that are
  // gone once their rings are drained.
  void ReturnLent();
  // Looks for senders that registered or closed since the last look (the table's version).
  void Rescan();
  // Entries of senders whose process is gone: claimed ones are freed, active ones drained first.
  // At most once a second.
  void ReclaimDeadSenders(std::chrono::steady_clock::time_point now);
  // Takes what waits in the rings into out, starting with the next ring in turn. Counts
  // truncated and malformed datagrams.
  size_t Take(std::span<RxDatagram> out);

  // Sleeping (shm.h): announce, then look once more, then wait on the value AnnounceSleep read.
  uint32_t AnnounceSleep();
  void CancelSleep();
  void Wait(uint32_t seen, const struct timespec* timeout);
  // Bumps the doorbell's word and wakes the receiver (any thread).
  void Ring();

 private:
  // A sender's ring in our inbox.
  struct SenderRing {
    uint32_t entry = 0;
    Endpoint source;
    ShmRingConsumer ring;
    bool closing = false;  // the sender is gone: free the entry once drained
  };

  ShmInbox(std::string path, Fd fd, Mapping map, const InboxGeometry& g, const Endpoint& self,
           ShmCounters* counters);
  uint8_t* RingBase(uint32_t e) const { return base_ + g_.header_bytes + e * g_.ring_bytes; }
  std::atomic_ref<uint64_t> EntryState(uint32_t e) const {
    return ShmRef<uint64_t>(base_, EntryOffset(e));
  }
  void FreeEntry(uint32_t e);
  SenderRing* FindRing(uint32_t e);
  SenderRing& AddRing(uint32_t e);

  const std::string path_;
  Fd fd_;
  Mapping map_;
  const InboxGeometry g_;
  const Endpoint self_;  // as senders see us (for log lines)
  ShmCounters* const counters_;
  uint8_t* const base_;
  uint32_t* const bell_;
  std::vector<SenderRing> rings_;
  size_t next_ring_ = 0;
  uint32_t table_version_ = 0;
  std::chrono::steady_clock::time_point last_reclaim_{};
};

}  // namespace switchml::transport
