// The groups of the shm transport (shm.h, "Groups"): the file `group-<address>-<port>` that one
// producer writes each datagram into once and every member reads with a cursor of its own. Here:
// the file's layout, the producer's side (ShmGroupProducer: the groups a transport sends to) and a
// member's side (ShmGroupMember: the group a transport joined). The ring is a slot array of
// shm_ring.h. Internal to src/transport.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/endpoint.h"
#include "switchml/status.h"
#include "transport/shm_files.h"
#include "transport/shm_inbox.h"
#include "transport/shm_ring.h"
#include "transport/transport.h"

namespace switchml::transport {

// ---- The group file's layout.

inline constexpr uint64_t kGroupMagic = 0x315052474c4d5753ULL;  // "SWMLGRP1" read little-endian
inline constexpr uint32_t kGroupVersion = 1;
inline constexpr uint32_t kGroupMembers = 128;

struct GroupFixed {  // offset 0; written once by the member that made the file
  uint64_t magic;
  uint32_t version;
  uint32_t max_members;
  uint32_t ring_slots;
  uint32_t slot_bytes;
  uint32_t max_datagram_bytes;
  uint32_t reserved;
  uint64_t header_bytes;
  uint64_t total_bytes;
};
static_assert(sizeof(GroupFixed) <= kShmLine);
inline constexpr size_t kGroupClosedOffset = kShmLine;        // uint32_t: 1 once removed/replaced
inline constexpr size_t kGroupVersionOffset = kShmLine + 4;   // uint32_t: bumped on member changes
inline constexpr size_t kGroupHeadOffset = 2 * kShmLine;      // uint64_t: the producer index
inline constexpr size_t kGroupProducerOffset = 3 * kShmLine;  // uint32_t ipv4, port: the producer
inline constexpr size_t kGroupMembersOffset = 4 * kShmLine;   // kGroupMembers entries, a line each

struct GroupMemberEntry {  // a member's entry: written by the member, but cursor set by the
                           // producer
  uint64_t state;          // kind << 32 | pid
  uint64_t cursor;         // the next slot the member reads
  uint32_t ipv4;           // the member's endpoint (its inbox: where its doorbell is)
  uint32_t port;
};
static_assert(sizeof(GroupMemberEntry) <= kShmLine);

enum MemberKind : uint64_t {
  kMemberFree = 0,
  kMemberClaimed = 1,  // being set up by a member
  kMemberJoining = 2,  // waits for the producer to set its cursor to the head
  kMemberActive = 3,  // reads from its cursor; the producer does not overwrite what it has not read
  kMemberDropped = 4,  // its cursor made no sense to the producer: it must join again
};

// The byte of the file that a live producer, or member e, holds an OFD lock on.
inline constexpr off_t kProducerLockByte = 0;
inline off_t MemberLockByte(uint32_t e) { return 1 + static_cast<off_t>(e); }

struct GroupGeometry {
  uint32_t ring_slots = 0;
  uint32_t slot_bytes = 0;
  uint32_t max_datagram_bytes = 0;  // the whole slot after its length word
  uint64_t header_bytes = 0;
  uint64_t total_bytes = 0;
};

GroupGeometry MakeGroupGeometry(uint32_t ring_slots, uint32_t max_datagram);

inline bool IsGroupAddress(const Endpoint& e) { return (e.ipv4 & 0xf0000000u) == 0xe0000000u; }

std::atomic_ref<uint64_t> MemberState(uint8_t* header, uint32_t e);
std::atomic_ref<uint64_t> MemberCursor(uint8_t* header, uint32_t e);

// A group file mapped whole (header, member table, ring).
struct GroupFile {
  std::string path;
  Fd fd;
  Mapping map;
  GroupGeometry g;
  ShmSlots slots;  // the ring, over map (valid once mapped)
  uint8_t* header() const { return map.get(); }
  bool Closed() const {
    return ShmRef<uint32_t>(map.get(), kGroupClosedOffset).load(std::memory_order_acquire) != 0;
  }
  void MarkClosed() const {
    ShmRef<uint32_t>(map.get(), kGroupClosedOffset).store(1, std::memory_order_release);
  }
  void BumpVersion() const {
    ShmRef<uint32_t>(map.get(), kGroupVersionOffset).fetch_add(1, std::memory_order_acq_rel);
  }
};

// Maps an open group file (f->fd) after checking that it is ours and has a header this code knows;
// false otherwise.
bool MapGroupFile(GroupFile* f);

// The groups a transport sends to, as their producer (it holds each one's producer lock). Owns a
// descriptor and a mapping of each group file, and a doorbell page of each member's inbox; lets go
// of groups whose last member left when it opens a new one, except while lent. Thread-safety: one
// thread. Blocking: never (a system call per member when a ring is full, at most every 10 ms).
class ShmGroupProducer {
  struct Group;

 public:
  ShmGroupProducer(std::string dir, const Endpoint& source, ShmCounters* counters)
      : dir_(std::move(dir)), source_(source), counters_(counters) {}

  // A slot of the group's ring for datagram `index` of this batch, `bytes` long, while every live
  // member has room for it and the slots hold `bytes`; else an empty span.
  std::span<uint8_t> Lend(const Endpoint& group, size_t index, size_t bytes);
  // Copies (or publishes in place) one datagram to a group: false when it was dropped (no group
  // file, another producer, or a live member has not read the ring's oldest slot).
  bool Send(const Endpoint& group, std::span<const uint8_t> data, uint64_t* in_place);

  // Publishes the rings Send filled: how many.
  size_t PublishRings();
  // After PublishRings and a full fence: rings the doorbells of the members that sleep, and starts
  // the next Send. Returns how many it rang.
  size_t RingDoorbells();

  // What Send touched and lending holds (shm_files.h).
  ShmSendSet<Group>& sends() { return sends_; }

 private:
  // A member as the producer knows it: its entry, the state it saw there, its inbox's doorbell.
  struct Member {
    uint32_t entry = 0;
    uint64_t state = 0;
    ShmDoorbell bell;  // (invalid: no doorbell to ring)
  };
  // A group this transport sends to.
  struct Group {
    Endpoint group;
    GroupFile file;
    uint64_t head = 0;          // the next slot to fill (ours alone)
    uint64_t min_cursor = 0;    // the members' least cursor as last read
    uint32_t version_seen = 0;  // the member table's version the members reflect
    bool rescan = true;
    bool touched = false;
    bool full_warned = false;
    uint64_t lent_batch = 0;
    std::chrono::steady_clock::time_point last_reclaim{};
    std::vector<Member> members;
  };

  Group* Find(const Endpoint& group);
  std::unique_ptr<Group> Open(const Endpoint& group);
  void Drop(const Endpoint& group);
  void ForgetClosed();
  void RescanMembers(Group& p);
  void RefreshCursors(Group& p);
  void ReclaimDeadMembers(Group& p, uint64_t slots);
  bool Room(Group& p, uint64_t slots, bool reclaim);

  const std::string dir_;
  const Endpoint source_;
  ShmCounters* const counters_;
  std::unordered_map<Endpoint, std::unique_ptr<Group>> groups_;
  Group* last_group_ = nullptr;  // Find's last answer
  ShmSendSet<Group> sends_;
  std::unordered_map<Endpoint, std::chrono::steady_clock::time_point> retry_;  // no file till then
  std::unordered_set<Endpoint> producer_warned_;  // groups another producer held, logged
};

// The group a transport joined: its entry in the member table (and the OFD lock on its byte), its
// cursor, and LOCK_SH on the file. Leaving (destruction) gives the entry back; the last member to
// leave removes the file. Thread-safety: one thread. Blocking: Join and leaving may wait on the
// file (up to a second, while another member is leaving).
class ShmGroupMember {
 public:
  // Joins the group (shm.h, "Groups") as the transport of endpoint `self`, whose ring geometry the
  // group's file takes if this member makes it.
  static Result<std::unique_ptr<ShmGroupMember>> Join(const std::string& dir, const Endpoint& group,
                                                      const GroupGeometry& want,
                                                      const Endpoint& self, uint32_t pid,
                                                      ShmCounters* counters);
  ~ShmGroupMember();
  ShmGroupMember(const ShmGroupMember&) = delete;
  ShmGroupMember& operator=(const ShmGroupMember&) = delete;

  // Takes what waits in the group's ring into out (datagrams of up to `limit` bytes whole).
  size_t Take(std::span<RxDatagram> out, size_t limit);
  // Gives back the slots the previous Take lent (stores the cursor).
  void ReturnLent();

 private:
  ShmGroupMember(const Endpoint& group, GroupFile file, const Endpoint& self, uint32_t pid,
                 ShmCounters* counters)
      : group_(group), file_(std::move(file)), self_(self), pid_(pid), counters_(counters) {}
  bool Claim();
  void Release();
  void Rejoin();
  static bool TakeAlone(const GroupFile& f);

  const Endpoint group_;
  GroupFile file_;
  const Endpoint self_;
  const uint32_t pid_;
  ShmCounters* const counters_;
  uint32_t entry_ = UINT32_MAX;  // our entry (UINT32_MAX: none; claimed again on the next poll)
  bool active_ = false;          // the producer set our cursor
  uint64_t cursor_ = 0;          // the next slot to read
  uint64_t published_ = 0;       // cursor_ last stored
  bool full_warned_ = false;
};

}  // namespace switchml::transport
