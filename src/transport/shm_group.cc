#include "transport/shm_group.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "base/logging.h"
#include "base/status_macros.h"

namespace switchml::transport {
namespace {

using Clock = std::chrono::steady_clock;

// The geometry a group file's header claims, if it is one this code would have made; read once.
bool ReadGroupGeometry(const uint8_t* header, uint64_t file_bytes, GroupGeometry* out) {
  GroupFixed f;
  std::memcpy(&f, header, sizeof f);
  if (f.magic != kGroupMagic || f.version != kGroupVersion || f.max_members != kGroupMembers) {
    return false;
  }
  if (!ShmPowerOfTwo(f.ring_slots) || f.ring_slots < 2 || f.ring_slots > kShmMaxRingSlots) {
    return false;
  }
  if (f.slot_bytes < kShmSlotDataOffset + 1 ||
      f.slot_bytes > kShmSlotDataOffset + kShmMaxDatagram + kShmLine) {
    return false;
  }
  const GroupGeometry g =
      MakeGroupGeometry(f.ring_slots, static_cast<uint32_t>(f.slot_bytes - kShmSlotDataOffset));
  if (f.slot_bytes != g.slot_bytes || f.max_datagram_bytes != g.max_datagram_bytes ||
      f.header_bytes != g.header_bytes || f.total_bytes != g.total_bytes ||
      g.total_bytes > file_bytes) {
    return false;
  }
  *out = g;
  return true;
}

std::string GroupPath(const std::string& dir, const Endpoint& group) {
  return dir + "/group-" + Ipv4ToString(group.ipv4) + "-" + std::to_string(group.port);
}

// Points f->slots at the ring of f's mapping.
void MapSlots(GroupFile* f) {
  f->slots = ShmSlots(
      std::span<uint8_t>(f->map.get() + f->g.header_bytes, f->g.total_bytes - f->g.header_bytes),
      f->g.ring_slots, f->g.slot_bytes, f->g.max_datagram_bytes);
}

// Makes a new group file under a temporary name in dir, holding LOCK_SH on it; *tmp: its name.
Result<GroupFile> MakeGroupFile(const std::string& dir, const GroupGeometry& g, std::string* tmp) {
  GroupFile f;
  *tmp = dir + "/.group.XXXXXX";
  f.fd = Fd(::mkostemp(tmp->data(), O_CLOEXEC));
  if (f.fd.get() < 0) {
    return UnavailableError("cannot create a file in " + dir + " for a group: " + ErrnoText(errno));
  }
  if (::flock(f.fd.get(), LOCK_SH | LOCK_NB) != 0 ||
      ::ftruncate(f.fd.get(), static_cast<off_t>(g.total_bytes)) != 0) {
    ::unlink(tmp->c_str());
    return ResourceExhaustedError("cannot lock and size the group file " + *tmp + " (" +
                                  std::to_string(g.total_bytes) +
                                  " bytes, sparse): " + ErrnoText(errno));
  }
  f.g = g;
  f.map = Mapping::Map(f.fd.get(), g.total_bytes, 0);
  if (f.map.get() == nullptr) {
    ::unlink(tmp->c_str());
    return ResourceExhaustedError("cannot map the group file " + *tmp + ": " + ErrnoText(errno));
  }
  MapSlots(&f);
  GroupFixed fixed{};
  fixed.magic = kGroupMagic;
  fixed.version = kGroupVersion;
  fixed.max_members = kGroupMembers;
  fixed.ring_slots = g.ring_slots;
  fixed.slot_bytes = g.slot_bytes;
  fixed.max_datagram_bytes = g.max_datagram_bytes;
  fixed.header_bytes = g.header_bytes;
  fixed.total_bytes = g.total_bytes;
  std::memcpy(f.map.get(), &fixed, sizeof fixed);  // the rest is zero (ftruncate)
  std::atomic_thread_fence(std::memory_order_release);
  return f;
}

// Opens the group's file as a member (shm.h, "Groups"), holding LOCK_SH on it: the file that
// live members hold, else a new one (replacing one that no one holds: left by members that died,
// or of another geometry).
Result<GroupFile> OpenGroupAsMember(const std::string& dir, const Endpoint& group,
                                    const GroupGeometry& want) {
  const std::string path = GroupPath(dir, group);
  // Held while the file is made and named, against RemoveOwnShmFiles (shm_files.h).
  ShmCreationLock creation;
  RETURN_IF_ERROR(creation.Check("the group file " + path));
  for (int attempt = 0; attempt < 200; ++attempt) {
    Fd old(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (old.get() < 0 && errno != ENOENT) {
      return UnavailableError("cannot open the group file " + path + ": " + ErrnoText(errno));
    }
    if (old.get() >= 0 && ::flock(old.get(), LOCK_EX | LOCK_NB) != 0) {
      // Live members hold it (LOCK_SH), or one holds it alone for a moment (leaving): join it.
      if (::flock(old.get(), LOCK_SH | LOCK_NB) != 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      GroupFile f;
      f.path = path;
      f.fd = std::move(old);
      if (!MapGroupFile(&f)) {
        return FailedPreconditionError("the group file " + path +
                                       " held by live members is not one this build knows");
      }
      if (f.Closed() || !SameFile(path, f.fd.get())) continue;  // removed meanwhile
      return f;
    }
    // No file, or one that no one holds: a new one takes the name.
    std::string tmp;
    ASSIGN_OR_RETURN(GroupFile f, MakeGroupFile(dir, want, &tmp));
    f.path = path;
    if (old.get() < 0) {
      const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
      const int err = errno;
      ::unlink(tmp.c_str());
      if (linked) return f;
      if (err != EEXIST) {
        return UnavailableError("cannot name the group file " + path + ": " + ErrnoText(err));
      }
      continue;  // another member made it meanwhile
    }
    if (!SameFile(path, old.get())) {
      ::unlink(tmp.c_str());
      continue;
    }
    // (Held LOCK_EX: no member can join it meanwhile; a producer that maps it sees it closed.)
    GroupFile stale;
    stale.fd = std::move(old);
    if (MapGroupFile(&stale)) stale.MarkClosed();
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      return UnavailableError("cannot replace the group file " + path + ": " + ErrnoText(err));
    }
    return f;
  }
  return UnavailableError("the group file " + path + " keeps changing: try again");
}

uint64_t MemberWord(MemberKind kind, uint64_t state_or_pid) {
  return uint64_t{kind} << 32 | (state_or_pid & 0xffffffffu);
}

}  // namespace

GroupGeometry MakeGroupGeometry(uint32_t ring_slots, uint32_t max_datagram) {
  GroupGeometry g;
  g.ring_slots = ring_slots;
  g.slot_bytes = ShmSlotBytes(max_datagram);
  g.max_datagram_bytes = static_cast<uint32_t>(g.slot_bytes - kShmSlotDataOffset);
  g.header_bytes = ShmRoundUp(kGroupMembersOffset + size_t{kGroupMembers} * kShmLine, kShmPage);
  g.total_bytes = g.header_bytes + ShmRoundUp(uint64_t{ring_slots} * g.slot_bytes, kShmPage);
  return g;
}

std::atomic_ref<uint64_t> MemberState(uint8_t* header, uint32_t e) {
  return ShmRef<uint64_t>(header,
                          kGroupMembersOffset + e * kShmLine + offsetof(GroupMemberEntry, state));
}
std::atomic_ref<uint64_t> MemberCursor(uint8_t* header, uint32_t e) {
  return ShmRef<uint64_t>(header,
                          kGroupMembersOffset + e * kShmLine + offsetof(GroupMemberEntry, cursor));
}

bool MapGroupFile(GroupFile* f) {
  uint64_t bytes = 0;
  if (!OwnFileBytes(f->fd.get(), &bytes)) return false;
  Mapping first = Mapping::Map(f->fd.get(), kShmPage, 0);
  if (first.get() == nullptr || !ReadGroupGeometry(first.get(), bytes, &f->g)) {
    return false;
  }
  first.Reset();
  f->map = Mapping::Map(f->fd.get(), f->g.total_bytes, 0);
  if (f->map.get() == nullptr) return false;
  MapSlots(f);
  return true;
}

// ---- The producer's side.

ShmGroupProducer::Group* ShmGroupProducer::Find(const Endpoint& group) {
  if (last_group_ != nullptr && last_group_->group == group && !last_group_->file.Closed()) {
    return last_group_;
  }
  Group* found = nullptr;
  auto it = groups_.find(group);
  if (it != groups_.end() && !it->second->file.Closed()) {
    found = it->second.get();
  } else {
    if (it != groups_.end()) Drop(group);  // its last member left (or it was replaced)
    auto retry = retry_.find(group);
    const Clock::time_point now = Clock::now();
    if (retry != retry_.end() && now < retry->second) return nullptr;
    std::unique_ptr<Group> p = Open(group);
    if (p == nullptr) {
      if (retry_.size() > 4096) retry_.clear();
      retry_[group] = now + std::chrono::milliseconds(20);
      return nullptr;
    }
    retry_.erase(group);
    found = p.get();
    ForgetClosed();  // (as ShmPeers's: each job of a switch has a group of its own)
    groups_.emplace(group, std::move(p));
  }
  last_group_ = found;
  return found;
}

// Drops the groups whose last member left (or that were replaced): each held a descriptor and a
// mapping of its file, and with them the pages of its ring.
void ShmGroupProducer::ForgetClosed() {
  std::vector<Endpoint> closed;
  for (const auto& [group, p] : groups_) {
    if (p->file.Closed()) closed.push_back(group);
  }
  for (const Endpoint& group : closed) Drop(group);
}

void ShmGroupProducer::Drop(const Endpoint& group) {
  auto it = groups_.find(group);
  if (it == groups_.end()) return;
  Group* p = it->second.get();
  if (last_group_ == p) last_group_ = nullptr;
  sends_.Drop(std::move(it->second));
  groups_.erase(it);
}

// Opens the group's file as its producer; nullptr (logged at debug level) while no member made
// it, or when another live producer holds it.
std::unique_ptr<ShmGroupProducer::Group> ShmGroupProducer::Open(const Endpoint& group) {
  auto p = std::make_unique<Group>();
  p->group = group;
  p->file.path = GroupPath(dir_, group);
  p->file.fd = Fd(::open(p->file.path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  auto fail = [&](const std::string& why) -> std::unique_ptr<Group> {
    LOG(kDebug, kTransport) << "shm " << source_.ToString() << ": cannot send to group "
                            << group.ToString() << ": " << why;
    return nullptr;
  };
  if (p->file.fd.get() < 0) return fail(p->file.path + ": " + ErrnoText(errno));
  if (!MapGroupFile(&p->file)) return fail(p->file.path + " is not a group file of ours");
  if (p->file.Closed()) return fail(p->file.path + " is closed");
  if (!LockByte(p->file.fd.get(), kProducerLockByte)) {
    if (producer_warned_.size() < 64 && producer_warned_.insert(group).second) {
      LOG(kWarning, kTransport) << "shm " << source_.ToString() << ": another process sends to "
                                << "group " << group.ToString()
                                << "; datagrams to it are dropped and counted";
    }
    return fail("another live producer holds it");
  }
  uint8_t* h = p->file.header();
  // A producer that died left its last published head: continue from there.
  p->head = ShmRef<uint64_t>(h, kGroupHeadOffset).load(std::memory_order_acquire);
  ShmRef<uint32_t>(h, kGroupProducerOffset).store(source_.ipv4, std::memory_order_relaxed);
  ShmRef<uint32_t>(h, kGroupProducerOffset + 4).store(source_.port, std::memory_order_release);
  return p;
}

// Takes in members that joined (their cursor: the head) and forgets those that left, when the
// member table changed.
void ShmGroupProducer::RescanMembers(Group& p) {
  uint8_t* h = p.file.header();
  const uint32_t v = ShmRef<uint32_t>(h, kGroupVersionOffset).load(std::memory_order_acquire);
  if (!p.rescan && v == p.version_seen) return;
  p.rescan = false;
  p.version_seen = v;
  std::vector<Member> old = std::move(p.members);
  p.members.clear();
  for (uint32_t e = 0; e < kGroupMembers; ++e) {
    auto state = MemberState(h, e);
    uint64_t s = state.load(std::memory_order_acquire);
    if (s >> 32 == kMemberJoining) {
      MemberCursor(h, e).store(p.head, std::memory_order_relaxed);
      const uint64_t active = MemberWord(kMemberActive, s);
      if (!state.compare_exchange_strong(s, active, std::memory_order_acq_rel)) continue;
      s = active;
    }
    if (s >> 32 != kMemberActive) continue;
    Member m;
    m.entry = e;
    m.state = s;
    for (Member& o : old) {  // the doorbell of a member already known, unless its inbox closed
      // meanwhile: then the same state (kind and pid) is another transport of the same process
      // that took the freed entry, with an inbox of its own
      if (o.entry == e && o.state == s && o.bell.valid() && !o.bell.Closed()) {
        m.bell = std::move(o.bell);
      }
    }
    if (!m.bell.valid()) {
      const uint32_t port =
          ShmRef<uint32_t>(h, kGroupMembersOffset + e * kShmLine + offsetof(GroupMemberEntry, port))
              .load(std::memory_order_relaxed);
      m.bell = ShmDoorbell::Map(dir_, port);
    }
    p.members.push_back(std::move(m));
  }
  RefreshCursors(p);
}

// Reads the members' cursors (untrusted: one beyond the head, or more than a ring behind it,
// drops the member, which then joins again).
void ShmGroupProducer::RefreshCursors(Group& p) {
  uint8_t* h = p.file.header();
  uint64_t least = p.head;
  for (size_t k = 0; k < p.members.size();) {
    Member& m = p.members[k];
    const uint64_t c = MemberCursor(h, m.entry).load(std::memory_order_acquire);
    if (c > p.head || p.head - c > p.file.g.ring_slots) {
      uint64_t expected = m.state;
      MemberState(h, m.entry)
          .compare_exchange_strong(expected, MemberWord(kMemberDropped, m.state),
                                   std::memory_order_acq_rel);
      counters_->malformed.Add(1);
      LOG(kWarning, kTransport) << "shm " << source_.ToString() << ": member " << m.entry
                                << " of group " << p.group.ToString()
                                << " has a cursor that makes no sense; dropped";
      p.members[k] = std::move(p.members.back());
      p.members.pop_back();
      continue;
    }
    least = std::min(least, c);
    ++k;
  }
  p.min_cursor = least;
}

// Frees the entries of members that hold back the ring and are gone (their lock released). At
// most once per 10 ms per group: each look is a system call per member.
void ShmGroupProducer::ReclaimDeadMembers(Group& p, uint64_t slots) {
  const Clock::time_point now = Clock::now();
  if (now - p.last_reclaim < std::chrono::milliseconds(10)) return;
  p.last_reclaim = now;
  uint8_t* h = p.file.header();
  for (size_t k = 0; k < p.members.size();) {
    Member& m = p.members[k];
    const uint64_t c = MemberCursor(h, m.entry).load(std::memory_order_acquire);
    if (p.head - c + slots > p.file.g.ring_slots &&
        !ByteLocked(p.file.fd.get(), MemberLockByte(m.entry))) {
      uint64_t expected = m.state;
      MemberState(h, m.entry).compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
      LOG(kInfo, kTransport) << "shm " << source_.ToString() << ": member " << m.entry
                             << " of group " << p.group.ToString() << " is gone; dropped";
      p.members[k] = std::move(p.members.back());
      p.members.pop_back();
      continue;
    }
    ++k;
  }
  RefreshCursors(p);
}

// Whether the next `slots` slots of the group's ring are free: every live member has read what
// they held. reclaim: also look for members that are gone.
bool ShmGroupProducer::Room(Group& p, uint64_t slots, bool reclaim) {
  const uint64_t ring = p.file.g.ring_slots;
  if (p.head - p.min_cursor + slots <= ring) return true;
  RefreshCursors(p);
  if (p.head - p.min_cursor + slots <= ring) return true;
  if (!reclaim) return false;
  ReclaimDeadMembers(p, slots);
  return p.head - p.min_cursor + slots <= ring;
}

std::span<uint8_t> ShmGroupProducer::Lend(const Endpoint& group, size_t index, size_t bytes) {
  Group* p = Find(group);
  if (p == nullptr || p->file.g.max_datagram_bytes < bytes) return {};
  RescanMembers(*p);
  if (!Room(*p, index + 1, /*reclaim=*/false)) return {};
  sends_.Lent(p);
  return {p->file.slots.Data(p->head + index), bytes};
}

bool ShmGroupProducer::Send(const Endpoint& group, std::span<const uint8_t> data,
                            uint64_t* in_place) {
  Group* p = Find(group);
  if (p == nullptr) return false;
  RescanMembers(*p);
  if (!Room(*p, 1, /*reclaim=*/true)) {
    if (!p->full_warned) {
      p->full_warned = true;
      LOG(kWarning, kTransport) << "shm " << source_.ToString() << ": group " << p->group.ToString()
                                << " is full: a live member does not "
                                << "read it; its datagrams are dropped and counted";
    }
    return false;
  }
  *in_place += p->file.slots.Write(p->head++, data) ? 1 : 0;
  sends_.Touch(p);
  return true;
}

size_t ShmGroupProducer::PublishRings() {
  for (Group* p : sends_.touched_list()) {
    ShmRef<uint64_t>(p->file.header(), kGroupHeadOffset).store(p->head, std::memory_order_release);
  }
  return sends_.touched_list().size();
}

size_t ShmGroupProducer::RingDoorbells() {
  size_t rang = 0;
  for (Group* p : sends_.touched_list()) {
    for (const Member& m : p->members) {
      if (m.bell.valid() && m.bell.RingIfSleeping()) ++rang;
    }
  }
  sends_.ClearTouched();
  return rang;
}

// ---- A member's side.

Result<std::unique_ptr<ShmGroupMember>> ShmGroupMember::Join(const std::string& dir,
                                                             const Endpoint& group,
                                                             const GroupGeometry& want,
                                                             const Endpoint& self, uint32_t pid,
                                                             ShmCounters* counters) {
  ASSIGN_OR_RETURN(GroupFile file, OpenGroupAsMember(dir, group, want));
  std::unique_ptr<ShmGroupMember> m(
      new ShmGroupMember(group, std::move(file), self, pid, counters));
  if (!m->Claim()) {
    // (Leaves as any member does: the last one removes the file.)
    return ResourceExhaustedError("shm: group " + group.ToString() + " has " +
                                  std::to_string(kGroupMembers) + " members already");
  }
  return m;
}

// Claims a free entry of the member table, locks it, and asks the producer to take us in.
bool ShmGroupMember::Claim() {
  uint8_t* h = file_.header();
  for (uint32_t e = 0; e < kGroupMembers; ++e) {
    auto state = MemberState(h, e);
    uint64_t expected = 0;
    if (state.load(std::memory_order_relaxed) != 0) continue;
    if (!state.compare_exchange_strong(expected, MemberWord(kMemberClaimed, pid_),
                                       std::memory_order_acquire)) {
      continue;
    }
    if (!LockByte(file_.fd.get(), MemberLockByte(e))) {  // (a table someone else wrote)
      state.store(0, std::memory_order_release);
      continue;
    }
    const size_t entry = kGroupMembersOffset + e * kShmLine;
    ShmRef<uint32_t>(h, entry + offsetof(GroupMemberEntry, ipv4))
        .store(self_.ipv4, std::memory_order_relaxed);
    ShmRef<uint32_t>(h, entry + offsetof(GroupMemberEntry, port))
        .store(self_.port, std::memory_order_relaxed);
    state.store(MemberWord(kMemberJoining, pid_), std::memory_order_release);
    file_.BumpVersion();
    entry_ = e;
    active_ = false;
    return true;
  }
  return false;
}

// Gives our entry back (if it is still ours).
void ShmGroupMember::Release() {
  if (entry_ == UINT32_MAX) return;
  auto state = MemberState(file_.header(), entry_);
  uint64_t s = state.load(std::memory_order_acquire);
  // The producer may move the entry on (joining -> active, active -> dropped) between the load
  // and the exchange: try again with what it wrote, a bounded number of times (the word is shared
  // memory another process could keep changing).
  for (int tries = 0; tries < 16 && (s & 0xffffffffu) == pid_ && s >> 32 != kMemberFree; ++tries) {
    if (state.compare_exchange_strong(s, 0, std::memory_order_acq_rel)) break;
  }
  UnlockByte(file_.fd.get(), MemberLockByte(entry_));
  file_.BumpVersion();
  entry_ = UINT32_MAX;
  active_ = false;
}

// Joins again (dropped by the producer, or a ring that made no sense): from the head.
void ShmGroupMember::Rejoin() {
  Release();
  if (!Claim() && !full_warned_) {
    full_warned_ = true;
    LOG(kWarning, kTransport) << "shm " << self_.ToString() << ": group " << group_.ToString()
                              << " has no free entry; results come through retransmissions";
  }
}

size_t ShmGroupMember::Take(std::span<RxDatagram> out, size_t limit) {
  if (entry_ == UINT32_MAX) {
    Rejoin();
    return 0;
  }
  uint8_t* h = file_.header();
  const uint64_t s = MemberState(h, entry_).load(std::memory_order_acquire);
  if (s != MemberWord(kMemberActive, pid_)) {
    if (s != MemberWord(kMemberJoining, pid_)) Rejoin();  // dropped
    return 0;
  }
  if (!active_) {
    active_ = true;
    cursor_ = published_ = MemberCursor(h, entry_).load(std::memory_order_acquire);
  }
  const uint64_t head = ShmRef<uint64_t>(h, kGroupHeadOffset).load(std::memory_order_acquire);
  switch (ClassifyShmCursor(head, cursor_, file_.g.ring_slots)) {
    case ShmCursor::kEmpty:
    case ShmCursor::kUnpublished:
      return 0;
    case ShmCursor::kCorrupt:
      counters_->malformed.Add(1);
      LOG(kWarning, kTransport) << "shm " << self_.ToString() << ": the ring of group "
                                << group_.ToString() << " is corrupt; joining it again";
      Rejoin();
      return 0;
    case ShmCursor::kWaiting:
      break;
  }
  Endpoint source;
  source.ipv4 = ShmRef<uint32_t>(h, kGroupProducerOffset).load(std::memory_order_relaxed);
  source.port = static_cast<uint16_t>(
      ShmRef<uint32_t>(h, kGroupProducerOffset + 4).load(std::memory_order_relaxed));
  const ShmRead r = file_.slots.Read(&cursor_, std::min<uint64_t>(head - cursor_, out.size()),
                                     limit, source, out);
  if (r.truncated > 0) counters_->io.truncated.Add(r.truncated);
  if (r.malformed > 0) counters_->malformed.Add(r.malformed);
  if (r.filled > 0) counters_->group_received.Add(r.filled);
  return r.filled;
}

void ShmGroupMember::ReturnLent() {
  if (active_ && cursor_ != published_) {
    MemberCursor(file_.header(), entry_).store(cursor_, std::memory_order_release);
    published_ = cursor_;
  }
}

// Leaves the group; the last member to leave removes its file.
ShmGroupMember::~ShmGroupMember() {
  if (active_ && cursor_ != published_) {
    MemberCursor(file_.header(), entry_).store(cursor_, std::memory_order_release);
  }
  Release();
  std::atomic_thread_fence(std::memory_order_seq_cst);  // (RemoveOwnShmFiles: one of us sees)
  if (TakeAlone(file_) && SameFile(file_.path, file_.fd.get())) {
    file_.MarkClosed();
    ::unlink(file_.path.c_str());
  }
}

// Whether this member, having given its entry back, is the group's last: LOCK_EX on the file
// (every member holds LOCK_SH). A process stopped by a signal (`switchml worker`) gives its
// entries back first (RemoveOwnShmFiles) and holds LOCK_SH until it exits a moment later: while
// no entry is claimed, the lock is tried again for up to a second, so that the member that leaves
// after it removes the file instead of leaving it behind. (A joiner holds LOCK_SH until it claims
// an entry, microseconds later; that stops the wait.)
bool ShmGroupMember::TakeAlone(const GroupFile& f) {
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
  while (::flock(f.fd.get(), LOCK_EX | LOCK_NB) != 0) {
    for (uint32_t e = 0; e < kGroupMembers; ++e) {
      if (MemberState(f.header(), e).load(std::memory_order_acquire) != 0) return false;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace switchml::transport
