#include "transport/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "base/check.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace switchml::transport {
namespace {

using Clock = std::chrono::steady_clock;

// ---- The inbox file's layout (shm.h). Every multi-byte field is the host's byte order: the
// file never leaves the host. Shared fields are plain integers accessed through atomic_ref.

constexpr uint64_t kMagic = 0x314d48534c4d5753ULL;  // "SWMLSHM1" read little-endian
constexpr uint32_t kVersion = 1;
constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;
constexpr uint32_t kMaxLength = 65535;  // a length word beyond this is malformed
constexpr size_t kMaxDatagram = 65507;  // as UDP's
constexpr uint32_t kMaxRingSlots = 65536;
constexpr uint32_t kMaxSenders = 4096;

struct Fixed {  // offset 0; written once by the receiver before the file gets its name
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
static_assert(sizeof(Fixed) <= kLine);

struct Doorbell {     // offset 64
  uint32_t bell;      // the futex word: bumped by every ring of the doorbell
  uint32_t sleeping;  // 1: the receiver announced that it is about to sleep
  uint32_t closed;    // 1: the receiver is gone (or was replaced): senders forget this inbox
};
constexpr size_t kDoorbellOffset = kLine;
constexpr size_t kTableVersionOffset = 2 * kLine;  // a uint32_t bumped on every (un)registration

struct Entry {     // one per ring, from kEntriesOffset
  uint64_t state;  // kind << 32 | pid
  uint32_t ipv4;   // the sender's endpoint
  uint32_t port;
  uint64_t reserved[2];
};
static_assert(sizeof(Entry) == 32);
constexpr size_t kEntriesOffset = 4 * kLine;

enum EntryKind : uint64_t { kFree = 0, kClaimed = 1, kActive = 2, kClosed = 3 };
uint64_t StateOf(EntryKind kind, uint32_t pid) { return uint64_t{kind} << 32 | pid; }

// A ring: the producer index, the consumer index (each on a line of its own), then the slots.
constexpr size_t kHeadOffset = 0;
constexpr size_t kTailOffset = kLine;
constexpr size_t kSlotsOffset = 2 * kLine;
constexpr size_t kSlotDataOffset = 8;  // a slot: uint32_t length, 4 bytes unused, the data

template <class T>
std::atomic_ref<T> Ref(uint8_t* base, size_t offset) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(base + offset));
}

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

struct Geometry {
  uint32_t max_senders = 0;
  uint32_t ring_slots = 0;
  uint32_t slot_bytes = 0;
  uint32_t max_datagram_bytes = 0;
  uint64_t header_bytes = 0;
  uint64_t ring_bytes = 0;
  uint64_t total_bytes = 0;
};

Geometry MakeGeometry(uint32_t max_senders, uint32_t ring_slots, uint32_t max_datagram) {
  Geometry g;
  g.max_senders = max_senders;
  g.ring_slots = ring_slots;
  g.max_datagram_bytes = max_datagram;
  g.slot_bytes = static_cast<uint32_t>(RoundUp(kSlotDataOffset + max_datagram, kLine));
  g.header_bytes = RoundUp(kEntriesOffset + size_t{max_senders} * sizeof(Entry), kPage);
  g.ring_bytes = RoundUp(kSlotsOffset + uint64_t{ring_slots} * g.slot_bytes, kPage);
  g.total_bytes = g.header_bytes + uint64_t{max_senders} * g.ring_bytes;
  return g;
}

bool PowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The geometry a file's header claims, if it is one this code would have made; read once.
bool ReadGeometry(const uint8_t* header, uint64_t file_bytes, Geometry* out) {
  Fixed f;
  std::memcpy(&f, header, sizeof f);
  if (f.magic != kMagic || f.version != kVersion) return false;
  if (f.max_senders == 0 || f.max_senders > kMaxSenders) return false;
  if (!PowerOfTwo(f.ring_slots) || f.ring_slots > kMaxRingSlots) return false;
  if (f.max_datagram_bytes == 0 || f.max_datagram_bytes > kMaxDatagram) return false;
  const Geometry g = MakeGeometry(f.max_senders, f.ring_slots, f.max_datagram_bytes);
  if (f.slot_bytes != g.slot_bytes || f.header_bytes != g.header_bytes ||
      f.ring_bytes != g.ring_bytes || f.total_bytes != g.total_bytes ||
      g.total_bytes > file_bytes) {
    return false;
  }
  *out = g;
  return true;
}

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

long Futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

bool ProcessAlive(uint32_t pid) {
  if (pid == 0 || pid > static_cast<uint32_t>(INT_MAX)) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::string InboxPath(const std::string& dir, uint16_t port) {
  return dir + "/inbox-" + std::to_string(port);
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

class Mapping {
 public:
  Mapping() = default;
  Mapping(uint8_t* base, size_t bytes) : base_(base), bytes_(bytes) {}
  Mapping(Mapping&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      Reset();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~Mapping() { Reset(); }
  uint8_t* get() const { return base_; }
  void Reset() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = nullptr;
  }

  static Mapping Map(int fd, size_t bytes, off_t offset) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
    if (p == MAP_FAILED) return Mapping();
    return Mapping(static_cast<uint8_t*>(p), bytes);
  }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
};

Status EnsureDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return FailedPreconditionError("cannot create the shm transport directory " + dir + ": " +
                                   ErrnoText(errno) +
                                   "; set SWITCHML_SHM_DIR to a directory of tmpfs you own");
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError("the shm transport directory " + dir +
                                   " is not a directory (a symbolic link is refused)");
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return FailedPreconditionError("the shm transport directory " + dir +
                                   " must belong to this user with mode 0700 (other users could "
                                   "read or forge datagrams): chmod 700 it, or set "
                                   "SWITCHML_SHM_DIR to another directory");
  }
  return Status();
}

bool SameFile(const std::string& path, int fd) {
  struct stat a {
  }, b{};
  return ::stat(path.c_str(), &a) == 0 && ::fstat(fd, &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// Marks the inbox behind fd closed (a stale one being replaced), if it looks like an inbox.
void MarkStaleClosed(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < kPage) return;
  Mapping m = Mapping::Map(fd, kPage, 0);
  if (m.get() == nullptr) return;
  uint64_t magic;
  std::memcpy(&magic, m.get(), sizeof magic);
  if (magic == kMagic) {
    Ref<uint32_t>(m.get(), kDoorbellOffset + offsetof(Doorbell, closed))
        .store(1, std::memory_order_release);
  }
}

// The receiver's side: the inbox file, locked and mapped.
struct Inbox {
  std::string path;
  Fd fd;
  Mapping map;
  Geometry geometry;
};

// Creates the inbox of options.port (shm.h, "Open"). *in_use: failed only because a live
// transport holds the port.
Result<Inbox> CreateInbox(const TransportOptions& o, const std::string& dir, bool* in_use) {
  *in_use = false;
  const std::string where = "shm transport on port " + std::to_string(o.port);
  Inbox inbox;
  inbox.geometry = MakeGeometry(o.shm.max_senders, o.shm.ring_slots,
                                static_cast<uint32_t>(o.max_datagram_bytes));
  const Geometry& g = inbox.geometry;
  inbox.path = InboxPath(dir, o.port);
  std::string tmp = dir + "/.inbox-" + std::to_string(o.port) + ".XXXXXX";
  inbox.fd = Fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (inbox.fd.get() < 0) {
    return UnavailableError("cannot create a file in " + dir + " for the " + where + ": " +
                            ErrnoText(errno));
  }
  struct TmpFile {
    std::string path;
    ~TmpFile() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } tmp_file{tmp};
  if (::flock(inbox.fd.get(), LOCK_EX | LOCK_NB) != 0) {
    return InternalError("cannot lock " + tmp + ": " + ErrnoText(errno));
  }
  if (::ftruncate(inbox.fd.get(), static_cast<off_t>(g.total_bytes)) != 0) {
    return ResourceExhaustedError("cannot size the inbox " + tmp + " (" +
                                  std::to_string(g.total_bytes) +
                                  " bytes, sparse): " + ErrnoText(errno));
  }
  inbox.map = Mapping::Map(inbox.fd.get(), g.total_bytes, 0);
  if (inbox.map.get() == nullptr) {
    return ResourceExhaustedError("cannot map the inbox " + tmp + ": " + ErrnoText(errno));
  }
  Fixed f{};
  f.magic = kMagic;
  f.version = kVersion;
  f.max_senders = g.max_senders;
  f.ring_slots = g.ring_slots;
  f.slot_bytes = g.slot_bytes;
  f.max_datagram_bytes = g.max_datagram_bytes;
  f.owner_pid = static_cast<uint32_t>(::getpid());
  f.header_bytes = g.header_bytes;
  f.ring_bytes = g.ring_bytes;
  f.total_bytes = g.total_bytes;
  std::memcpy(inbox.map.get(), &f, sizeof f);  // the rest is zero (ftruncate)
  std::atomic_thread_fence(std::memory_order_release);
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (::link(tmp.c_str(), inbox.path.c_str()) == 0) return inbox;  // (tmp_file unlinks tmp)
    if (errno != EEXIST) {
      return UnavailableError("cannot name the inbox " + inbox.path + ": " + ErrnoText(errno));
    }
    Fd old(::open(inbox.path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (old.get() < 0) {
      if (errno == ENOENT) continue;  // removed meanwhile: try again
      return UnavailableError("cannot open the existing " + inbox.path + ": " + ErrnoText(errno));
    }
    if (::flock(old.get(), LOCK_EX | LOCK_NB) != 0) {
      *in_use = true;
      return UnavailableError("the " + where + " is in use (" + inbox.path +
                              " belongs to a live transport): stop it, choose another port, or "
                              "use port 0");
    }
    if (!SameFile(inbox.path, old.get())) continue;  // replaced meanwhile: look again
    // Stale (its owner died): senders that still map it are told, and it is replaced.
    LOG(kInfo, kTransport) << "replacing the stale shm inbox " << inbox.path;
    MarkStaleClosed(old.get());
    if (::rename(tmp.c_str(), inbox.path.c_str()) != 0) {
      return UnavailableError("cannot replace the stale " + inbox.path + ": " + ErrnoText(errno));
    }
    tmp_file.path.clear();
    return inbox;
  }
  *in_use = true;
  return UnavailableError("the " + where + " is contended (" + inbox.path +
                          " keeps changing): choose another port");
}

// ---- Group files (shm.h, "Groups"): one producer (a switch thread) writes each datagram once;
// every member reads it with a cursor of its own.

constexpr uint64_t kGroupMagic = 0x315052474c4d5753ULL;  // "SWMLGRP1" read little-endian
constexpr uint32_t kGroupVersion = 1;
constexpr uint32_t kGroupMembers = 128;

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
static_assert(sizeof(GroupFixed) <= kLine);
constexpr size_t kGroupClosedOffset = kLine;        // uint32_t: 1 once removed or replaced
constexpr size_t kGroupVersionOffset = kLine + 4;   // uint32_t: bumped on every member change
constexpr size_t kGroupHeadOffset = 2 * kLine;      // uint64_t: the producer index
constexpr size_t kGroupProducerOffset = 3 * kLine;  // uint32_t ipv4, port: the producer's endpoint
constexpr size_t kGroupMembersOffset = 4 * kLine;   // kGroupMembers entries, one line each

struct Member {     // a member's entry: written by the member, but cursor set by the producer
  uint64_t state;   // kind << 32 | pid
  uint64_t cursor;  // the next slot the member reads
  uint32_t ipv4;    // the member's endpoint (its inbox: where its doorbell is)
  uint32_t port;
};
static_assert(sizeof(Member) <= kLine);

enum MemberKind : uint64_t {
  kMemberFree = 0,
  kMemberClaimed = 1,  // being set up by a member
  kMemberJoining = 2,  // waits for the producer to set its cursor to the head
  kMemberActive = 3,  // reads from its cursor; the producer does not overwrite what it has not read
  kMemberDropped = 4,  // its cursor made no sense to the producer: it must join again
};

// The byte of the file that a live producer, or member e, holds an OFD lock on (fcntl locks
// per open file description: released when the holder closes the file or dies).
constexpr off_t kProducerLockByte = 0;
off_t MemberLockByte(uint32_t e) { return 1 + static_cast<off_t>(e); }

// A one-byte OFD lock request of type `type` on `byte`.
struct flock ByteLock(short type, off_t byte) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = byte;
  l.l_len = 1;
  return l;
}

bool LockByte(int fd, off_t byte) {
  struct flock l = ByteLock(F_WRLCK, byte);
  return ::fcntl(fd, F_OFD_SETLK, &l) == 0;
}

void UnlockByte(int fd, off_t byte) {
  struct flock l = ByteLock(F_UNLCK, byte);
  ::fcntl(fd, F_OFD_SETLK, &l);
}

// Whether another open file description holds a lock on the byte (when the question cannot be
// answered: yes, the cautious answer).
bool ByteLocked(int fd, off_t byte) {
  struct flock l = ByteLock(F_WRLCK, byte);
  if (::fcntl(fd, F_OFD_GETLK, &l) != 0) return true;
  return l.l_type != F_UNLCK;
}

struct GroupGeometry {
  uint32_t ring_slots = 0;
  uint32_t slot_bytes = 0;
  uint32_t max_datagram_bytes = 0;  // the whole slot after its length word
  uint64_t header_bytes = 0;
  uint64_t total_bytes = 0;
};

GroupGeometry MakeGroupGeometry(uint32_t ring_slots, uint32_t max_datagram) {
  GroupGeometry g;
  g.ring_slots = ring_slots;
  g.slot_bytes = static_cast<uint32_t>(RoundUp(kSlotDataOffset + max_datagram, kLine));
  g.max_datagram_bytes = static_cast<uint32_t>(g.slot_bytes - kSlotDataOffset);
  g.header_bytes = RoundUp(kGroupMembersOffset + size_t{kGroupMembers} * kLine, kPage);
  g.total_bytes = g.header_bytes + RoundUp(uint64_t{ring_slots} * g.slot_bytes, kPage);
  return g;
}

// The geometry a group file's header claims, if it is one this code would have made; read once.
bool ReadGroupGeometry(const uint8_t* header, uint64_t file_bytes, GroupGeometry* out) {
  GroupFixed f;
  std::memcpy(&f, header, sizeof f);
  if (f.magic != kGroupMagic || f.version != kGroupVersion || f.max_members != kGroupMembers) {
    return false;
  }
  if (!PowerOfTwo(f.ring_slots) || f.ring_slots < 2 || f.ring_slots > kMaxRingSlots) return false;
  if (f.slot_bytes < kSlotDataOffset + 1 || f.slot_bytes > kSlotDataOffset + kMaxDatagram + kLine) {
    return false;
  }
  const GroupGeometry g =
      MakeGroupGeometry(f.ring_slots, static_cast<uint32_t>(f.slot_bytes - kSlotDataOffset));
  if (f.slot_bytes != g.slot_bytes || f.max_datagram_bytes != g.max_datagram_bytes ||
      f.header_bytes != g.header_bytes || f.total_bytes != g.total_bytes ||
      g.total_bytes > file_bytes) {
    return false;
  }
  *out = g;
  return true;
}

bool IsGroupAddress(const Endpoint& e) { return (e.ipv4 & 0xf0000000u) == 0xe0000000u; }

std::string GroupPath(const std::string& dir, const Endpoint& group) {
  return dir + "/group-" + Ipv4ToString(group.ipv4) + "-" + std::to_string(group.port);
}

std::atomic_ref<uint64_t> MemberState(uint8_t* header, uint32_t e) {
  return Ref<uint64_t>(header, kGroupMembersOffset + e * kLine + offsetof(Member, state));
}
std::atomic_ref<uint64_t> MemberCursor(uint8_t* header, uint32_t e) {
  return Ref<uint64_t>(header, kGroupMembersOffset + e * kLine + offsetof(Member, cursor));
}

// A group file mapped whole (header, member table, ring).
struct GroupFile {
  std::string path;
  Fd fd;
  Mapping map;
  GroupGeometry g;
  uint8_t* Slot(uint64_t index) const {
    return map.get() + g.header_bytes + (index & (g.ring_slots - 1)) * size_t{g.slot_bytes};
  }
  bool Closed() const {
    return Ref<uint32_t>(map.get(), kGroupClosedOffset).load(std::memory_order_acquire) != 0;
  }
};

// Maps an open group file after checking that it is ours and has a header this code knows;
// false otherwise.
bool MapGroupFile(GroupFile* f) {
  struct stat st {};
  if (::fstat(f->fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      static_cast<uint64_t>(st.st_size) < kPage) {
    return false;
  }
  Mapping first = Mapping::Map(f->fd.get(), kPage, 0);
  if (first.get() == nullptr ||
      !ReadGroupGeometry(first.get(), static_cast<uint64_t>(st.st_size), &f->g)) {
    return false;
  }
  first.Reset();
  f->map = Mapping::Map(f->fd.get(), f->g.total_bytes, 0);
  return f->map.get() != nullptr;
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
    if (MapGroupFile(&stale)) {
      Ref<uint32_t>(stale.map.get(), kGroupClosedOffset).store(1, std::memory_order_release);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      return UnavailableError("cannot replace the group file " + path + ": " + ErrnoText(err));
    }
    return f;
  }
  return UnavailableError("the group file " + path + " keeps changing: try again");
}

class ShmTransport final : public Transport {
 public:
  ShmTransport(Inbox inbox, const TransportOptions& o, std::string dir)
      : inbox_(std::move(inbox)),
        dir_(std::move(dir)),
        local_{o.bind_ipv4, o.port},
        source_{o.bind_ipv4 != 0 ? o.bind_ipv4 : kLoopbackIpv4, o.port},
        spin_(o.shm.spin),
        pid_(static_cast<uint32_t>(::getpid())),
        base_(inbox_.map.get()),
        g_(inbox_.geometry),
        mask_(g_.ring_slots - 1),
        bell_(reinterpret_cast<uint32_t*>(base_ + kDoorbellOffset + offsetof(Doorbell, bell))) {}

  ~ShmTransport() override {
    LeaveJoined();
    groups_.clear();
    retired_groups_.clear();
    peers_.clear();  // each marks its entry closed
    retired_.clear();
    Ref<uint32_t>(base_, kDoorbellOffset + offsetof(Doorbell, closed))
        .store(1, std::memory_order_release);
    if (SameFile(inbox_.path, inbox_.fd.get())) ::unlink(inbox_.path.c_str());
  }

  Endpoint local_endpoint() const override { return local_; }
  size_t max_datagram_bytes() const override { return g_.max_datagram_bytes; }
  std::string name() const override { return "shm"; }

  std::span<uint8_t> TxBuffer(size_t index) override {
    if (index == 0) NewLendingBatch();
    return Transport::TxBuffer(index);
  }

  // A slot of the destination's ring (shm.h, "Lending"), else TxBuffer's memory.
  std::span<uint8_t> TxBufferTo(size_t index, const Endpoint& destination) override {
    if (index == 0) NewLendingBatch();
    CHECK_LT(index, kTxBuffers) << "TxBufferTo index out of range";
    if (IsGroupAddress(destination)) {
      GroupPeer* gp = FindGroup(destination);
      if (gp == nullptr || gp->file.g.max_datagram_bytes < g_.max_datagram_bytes) {
        return Transport::TxBuffer(index);
      }
      RescanMembers(*gp);
      if (!GroupRoom(*gp, index + 1, /*reclaim=*/false)) return Transport::TxBuffer(index);
      gp->lent_batch = lending_batch_;
      return {gp->file.Slot(gp->head + index) + kSlotDataOffset, g_.max_datagram_bytes};
    }
    Peer* p = FindPeer(destination.port);
    if (p == nullptr || p->g.max_datagram_bytes < g_.max_datagram_bytes ||
        !HasRoom(*p, index + 1)) {
      return Transport::TxBuffer(index);
    }
    p->lent_batch = lending_batch_;
    return {p->SlotData(p->head + index), g_.max_datagram_bytes};
  }

  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    size_t taken = 0;
    uint64_t copied = 0, errors = 0, in_place = 0;
    Peer* peer = nullptr;
    bool have_port = false;
    uint16_t port = 0;
    for (; taken < batch.size(); ++taken) {
      const TxDatagram& d = batch[taken];
      if (IsGroupAddress(d.destination)) {  // (never stops the batch: dropped when full)
        if (d.data.size() <= kMaxDatagram && SendToGroup(d.destination, d.data, &in_place)) {
          ++copied;
        } else {
          ++errors;
        }
        continue;
      }
      if (!have_port || d.destination.port != port) {
        port = d.destination.port;
        have_port = true;
        peer = FindPeer(port);
      }
      if (peer == nullptr || d.data.size() > kMaxDatagram) {
        ++errors;
        continue;
      }
      if (!HasRoom(*peer, 1)) {
        if (!peer->Alive()) {
          DropPeer(port);
          peer = nullptr;
          ++errors;
          continue;
        }
        counts_.send_buffer_full.Add(1);
        break;
      }
      in_place += peer->Copy(d.data) ? 1 : 0;
      if (!peer->touched) {
        peer->touched = true;
        touched_.push_back(peer);
      }
      ++copied;
    }
    Publish();
    if (copied > 0) counts_.datagrams_sent.Add(copied);
    if (in_place > 0) sent_in_place_.Add(in_place);
    if (errors > 0) counts_.send_errors.Add(errors);
    return taken;
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    if (batch.empty()) return size_t{0};
    ReturnLent();
    // Here, not only before sleeping: a receiver that never sleeps (busy polling, or traffic
    // without a pause) must free dead senders' rings too. (At most once a second.)
    ReclaimDeadSenders(Clock::now());
    size_t n = Poll(batch);
    if (n > 0 || timeout <= timeout.zero()) return n;
    const bool forever = timeout > std::chrono::hours(24);
    const Clock::time_point deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
    auto sleeping = Ref<uint32_t>(base_, kDoorbellOffset + offsetof(Doorbell, sleeping));
    std::atomic_ref<uint32_t> bell(*bell_);
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
      ReclaimDeadSenders(now);
      // Announce the sleep, then look once more (shm.h, "Sleeping").
      sleeping.store(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const uint32_t seen = bell.load(std::memory_order_acquire);
      if ((n = Poll(batch)) > 0 || wake_.load(std::memory_order_acquire)) {
        sleeping.store(0, std::memory_order_relaxed);
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
      Futex(bell_, FUTEX_WAIT, seen, forever ? nullptr : &ts);
      sleeping.store(0, std::memory_order_relaxed);
      if ((n = Poll(batch)) > 0) return n;
    }
  }

  void Wake() override {
    wake_.store(true, std::memory_order_release);
    std::atomic_ref<uint32_t>(*bell_).fetch_add(1, std::memory_order_seq_cst);
    Futex(bell_, FUTEX_WAKE, INT_MAX, nullptr);
  }

  TransportCounters counters() const override {
    TransportCounters c = counts_.Snapshot();
    c.malformed = malformed_.Get();
    c.doorbells = doorbells_.Get();
    c.sent_in_place = sent_in_place_.Get();
    c.group_datagrams_received = group_received_.Get();
    return c;
  }

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
    auto j = std::make_unique<Joined>();
    j->group = group;
    ASSIGN_OR_RETURN(
        j->file,
        OpenGroupAsMember(dir_, group, MakeGroupGeometry(g_.ring_slots, g_.max_datagram_bytes)));
    if (!ClaimMember(*j)) {
      return ResourceExhaustedError("shm: group " + group.ToString() + " has " +
                                    std::to_string(kGroupMembers) + " members already");
    }
    joined_ = std::move(j);
    return Status();
  }

  void LeaveGroup() override { LeaveJoined(); }

 private:
  // A destination: its inbox's header and our ring in it (the sender's side).
  struct Peer {
    Fd fd;  // kept open: its lock tells whether the receiver lives
    Mapping header, ring;
    Geometry g;
    uint32_t entry = 0;
    uint32_t pid = 0;
    uint64_t head = 0;        // the next slot to fill (ours alone)
    uint64_t tail_seen = 0;   // the consumer index last read
    bool claimed = false;     // entry is ours: marked closed when this is destroyed
    bool touched = false;     // holds datagrams of the current Send
    uint64_t lent_batch = 0;  // the lending batch that last lent a slot of its ring (0: none)
    uint8_t* slots = nullptr;

    ~Peer() {
      if (!claimed) return;
      Ref<uint64_t>(header.get(), kEntriesOffset + entry * sizeof(Entry))
          .store(StateOf(kClosed, pid), std::memory_order_release);
      Ref<uint32_t>(header.get(), kTableVersionOffset).fetch_add(1, std::memory_order_acq_rel);
    }
    uint32_t* bell() const {
      return reinterpret_cast<uint32_t*>(header.get() + kDoorbellOffset + offsetof(Doorbell, bell));
    }
    bool Closed() const {
      if (header.get() == nullptr) return false;
      return Ref<uint32_t>(header.get(), kDoorbellOffset + offsetof(Doorbell, closed))
                 .load(std::memory_order_acquire) != 0;
    }
    // Whether the receiver still holds its inbox (a system call: only when its ring is full).
    bool Alive() const {
      if (Closed()) return false;
      if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) {
        ::flock(fd.get(), LOCK_UN);
        return false;
      }
      return true;
    }
    uint8_t* Slot(uint64_t index) const {
      return slots + (index & (g.ring_slots - 1)) * size_t{g.slot_bytes};
    }
    uint8_t* SlotData(uint64_t index) const { return Slot(index) + kSlotDataOffset; }
    // Writes data into the next slot; true when it was already there (built in a lent slot).
    // memmove: data may be another lent slot of this ring (one left out shifts the rest down).
    bool Copy(std::span<const uint8_t> data) {
      uint8_t* slot = Slot(head);
      const size_t n = std::min<size_t>(data.size(), g.max_datagram_bytes);
      const bool in_place = data.data() == slot + kSlotDataOffset;
      if (n > 0 && !in_place) std::memmove(slot + kSlotDataOffset, data.data(), n);
      Ref<uint32_t>(slot, 0).store(static_cast<uint32_t>(data.size()), std::memory_order_relaxed);
      ++head;
      return in_place;
    }
  };

  // A sender's ring in our inbox (the receiver's side).
  struct Ring {
    uint32_t entry = 0;
    Endpoint source;
    uint8_t* base = nullptr;
    uint64_t tail = 0;       // the next slot to read
    uint64_t published = 0;  // tail last stored (slots before it are the sender's again)
    bool closing = false;    // the sender is gone: free the entry once drained
    bool broken = false;     // its producer index made no sense: ignored from then on
  };

  // ---- Groups, the producer's side (shm.h, "Groups").

  // A member of a group as the producer knows it: its entry, the state it saw there, and its
  // inbox's doorbell.
  struct GroupMember {
    uint32_t entry = 0;
    uint64_t state = 0;
    Mapping bell_page;  // the first page of the member's inbox (null: no doorbell to ring)
  };

  // A group this transport sends to (it holds the producer's lock of the group's file).
  struct GroupPeer {
    Endpoint group;
    GroupFile file;
    uint64_t head = 0;          // the next slot to fill (ours alone)
    uint64_t min_cursor = 0;    // the members' least cursor as last read
    uint32_t version_seen = 0;  // the member table's version the members reflect
    bool rescan = true;
    bool touched = false;
    bool full_warned = false;
    uint64_t lent_batch = 0;
    Clock::time_point last_reclaim{};
    std::vector<GroupMember> members;
    uint8_t* header() const { return file.map.get(); }
    // Writes data into the next slot; true when it was already there (built in a lent slot).
    bool Copy(std::span<const uint8_t> data) {
      uint8_t* slot = file.Slot(head);
      const size_t n = std::min<size_t>(data.size(), file.g.max_datagram_bytes);
      const bool in_place = data.data() == slot + kSlotDataOffset;
      if (n > 0 && !in_place) std::memmove(slot + kSlotDataOffset, data.data(), n);
      Ref<uint32_t>(slot, 0).store(static_cast<uint32_t>(data.size()), std::memory_order_relaxed);
      ++head;
      return in_place;
    }
  };

  GroupPeer* FindGroup(const Endpoint& group) {
    if (last_group_ != nullptr && last_group_->group == group && !last_group_->file.Closed()) {
      return last_group_;
    }
    GroupPeer* found = nullptr;
    auto it = groups_.find(group);
    if (it != groups_.end() && !it->second->file.Closed()) {
      found = it->second.get();
    } else {
      if (it != groups_.end()) DropGroup(group);  // its last member left (or it was replaced)
      auto retry = group_retry_.find(group);
      const Clock::time_point now = Clock::now();
      if (retry != group_retry_.end() && now < retry->second) return nullptr;
      std::unique_ptr<GroupPeer> p = OpenGroup(group);
      if (p == nullptr) {
        if (group_retry_.size() > 4096) group_retry_.clear();
        group_retry_[group] = now + std::chrono::milliseconds(20);
        return nullptr;
      }
      group_retry_.erase(group);
      found = p.get();
      ForgetClosedGroups();  // (as ForgetGonePeers: each job of a switch has a group of its own)
      groups_.emplace(group, std::move(p));
    }
    last_group_ = found;
    return found;
  }

  // Drops the groups whose last member left (or that were replaced): each held a descriptor
  // and a mapping of its file, and with them the pages of its ring.
  void ForgetClosedGroups() {
    std::vector<Endpoint> closed;
    for (const auto& [group, p] : groups_) {
      if (p->file.Closed()) closed.push_back(group);
    }
    for (const Endpoint& group : closed) DropGroup(group);
  }

  void DropGroup(const Endpoint& group) {
    auto it = groups_.find(group);
    if (it == groups_.end()) return;
    GroupPeer* p = it->second.get();
    touched_groups_.erase(std::remove(touched_groups_.begin(), touched_groups_.end(), p),
                          touched_groups_.end());
    if (last_group_ == p) last_group_ = nullptr;
    if (p->lent_batch == lending_batch_ && lending_batch_ != 0) {
      retired_groups_.push_back(std::move(it->second));
    }
    groups_.erase(it);
  }

  // Opens the group's file as its producer; nullptr (logged at debug level) while no member
  // made it, or when another live producer holds it.
  std::unique_ptr<GroupPeer> OpenGroup(const Endpoint& group) {
    auto p = std::make_unique<GroupPeer>();
    p->group = group;
    p->file.path = GroupPath(dir_, group);
    p->file.fd = Fd(::open(p->file.path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    auto fail = [&](const std::string& why) -> std::unique_ptr<GroupPeer> {
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
    // A producer that died left its last published head: continue from there.
    p->head = Ref<uint64_t>(p->header(), kGroupHeadOffset).load(std::memory_order_acquire);
    Ref<uint32_t>(p->header(), kGroupProducerOffset).store(source_.ipv4, std::memory_order_relaxed);
    Ref<uint32_t>(p->header(), kGroupProducerOffset + 4)
        .store(source_.port, std::memory_order_release);
    return p;
  }

  // Takes in members that joined (their cursor: the head) and forgets those that left, when the
  // member table changed.
  void RescanMembers(GroupPeer& p) {
    auto version = Ref<uint32_t>(p.header(), kGroupVersionOffset);
    const uint32_t v = version.load(std::memory_order_acquire);
    if (!p.rescan && v == p.version_seen) return;
    p.rescan = false;
    p.version_seen = v;
    std::vector<GroupMember> old = std::move(p.members);
    p.members.clear();
    for (uint32_t e = 0; e < kGroupMembers; ++e) {
      auto state = MemberState(p.header(), e);
      uint64_t s = state.load(std::memory_order_acquire);
      if (s >> 32 == kMemberJoining) {
        MemberCursor(p.header(), e).store(p.head, std::memory_order_relaxed);
        const uint64_t active = uint64_t{kMemberActive} << 32 | (s & 0xffffffffu);
        if (!state.compare_exchange_strong(s, active, std::memory_order_acq_rel)) continue;
        s = active;
      }
      if (s >> 32 != kMemberActive) continue;
      GroupMember m;
      m.entry = e;
      m.state = s;
      for (GroupMember& o : old) {  // the doorbell of a member already known, unless its
        // inbox closed meanwhile: then the same state (kind and pid) is another transport of
        // the same process that took the freed entry, with an inbox of its own
        if (o.entry == e && o.state == s && o.bell_page.get() != nullptr &&
            Ref<uint32_t>(o.bell_page.get(), kDoorbellOffset + offsetof(Doorbell, closed))
                    .load(std::memory_order_acquire) == 0) {
          m.bell_page = std::move(o.bell_page);
        }
      }
      if (m.bell_page.get() == nullptr) {
        const uint32_t port =
            Ref<uint32_t>(p.header(), kGroupMembersOffset + e * kLine + offsetof(Member, port))
                .load(std::memory_order_relaxed);
        m.bell_page = MapDoorbell(port);
      }
      p.members.push_back(std::move(m));
    }
    RefreshCursors(p);
  }

  // The first page of the inbox of port (for its doorbell), if it is an inbox of ours.
  Mapping MapDoorbell(uint32_t port) {
    if (port == 0 || port > 65535) return Mapping();
    Fd fd(::open(InboxPath(dir_, static_cast<uint16_t>(port)).c_str(),
                 O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid() || static_cast<uint64_t>(st.st_size) < kPage) {
      return Mapping();
    }
    Mapping m = Mapping::Map(fd.get(), kPage, 0);
    uint64_t magic = 0;
    if (m.get() != nullptr) std::memcpy(&magic, m.get(), sizeof magic);
    return magic == kMagic ? std::move(m) : Mapping();
  }

  // Reads the members' cursors (untrusted: one beyond the head, or more than a ring behind it,
  // drops the member, which then joins again).
  void RefreshCursors(GroupPeer& p) {
    uint64_t least = p.head;
    for (size_t k = 0; k < p.members.size();) {
      GroupMember& m = p.members[k];
      const uint64_t c = MemberCursor(p.header(), m.entry).load(std::memory_order_acquire);
      if (c > p.head || p.head - c > p.file.g.ring_slots) {
        uint64_t expected = m.state;
        MemberState(p.header(), m.entry)
            .compare_exchange_strong(expected,
                                     uint64_t{kMemberDropped} << 32 | (m.state & 0xffffffffu),
                                     std::memory_order_acq_rel);
        malformed_.Add(1);
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

  // Frees the entries of members that hold back the ring and are gone (their lock released).
  // At most once per 10 ms per group: each look is a system call per member.
  void ReclaimDeadMembers(GroupPeer& p, uint64_t slots) {
    const Clock::time_point now = Clock::now();
    if (now - p.last_reclaim < std::chrono::milliseconds(10)) return;
    p.last_reclaim = now;
    for (size_t k = 0; k < p.members.size();) {
      GroupMember& m = p.members[k];
      const uint64_t c = MemberCursor(p.header(), m.entry).load(std::memory_order_acquire);
      if (p.head - c + slots > p.file.g.ring_slots &&
          !ByteLocked(p.file.fd.get(), MemberLockByte(m.entry))) {
        uint64_t expected = m.state;
        MemberState(p.header(), m.entry)
            .compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
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

  // Whether the next `slots` slots of the group's ring are free: every live member has read
  // what they held. reclaim: also look for members that are gone.
  bool GroupRoom(GroupPeer& p, uint64_t slots, bool reclaim) {
    const uint64_t ring = p.file.g.ring_slots;
    if (p.head - p.min_cursor + slots <= ring) return true;
    RefreshCursors(p);
    if (p.head - p.min_cursor + slots <= ring) return true;
    if (!reclaim) return false;
    ReclaimDeadMembers(p, slots);
    return p.head - p.min_cursor + slots <= ring;
  }

  // Copies (or publishes in place) one datagram to a group; false when it was dropped: no
  // group file, or a live member has not read the ring's oldest slot.
  bool SendToGroup(const Endpoint& group, std::span<const uint8_t> data, uint64_t* in_place) {
    GroupPeer* p = FindGroup(group);
    if (p == nullptr) return false;
    RescanMembers(*p);
    if (!GroupRoom(*p, 1, /*reclaim=*/true)) {
      if (!p->full_warned) {
        p->full_warned = true;
        LOG(kWarning, kTransport) << "shm " << source_.ToString() << ": group "
                                  << p->group.ToString() << " is full: a live member does not "
                                  << "read it; its datagrams are dropped and counted";
      }
      return false;
    }
    *in_place += p->Copy(data) ? 1 : 0;
    if (!p->touched) {
      p->touched = true;
      touched_groups_.push_back(p);
    }
    return true;
  }

  // Rings the doorbells of the members of the touched groups that sleep (after the fence).
  void RingGroupDoorbells() {
    for (GroupPeer* p : touched_groups_) {
      for (const GroupMember& m : p->members) {
        if (m.bell_page.get() == nullptr) continue;
        auto sleeping =
            Ref<uint32_t>(m.bell_page.get(), kDoorbellOffset + offsetof(Doorbell, sleeping));
        if (sleeping.load(std::memory_order_relaxed) == 0) continue;
        if (sleeping.exchange(0, std::memory_order_acq_rel) == 0) continue;
        uint32_t* bell = reinterpret_cast<uint32_t*>(m.bell_page.get() + kDoorbellOffset +
                                                     offsetof(Doorbell, bell));
        std::atomic_ref<uint32_t>(*bell).fetch_add(1, std::memory_order_release);
        Futex(bell, FUTEX_WAKE, 1, nullptr);
        doorbells_.Add(1);
      }
      p->touched = false;
    }
    touched_groups_.clear();
  }

  // ---- Groups, a member's side.

  // The group this transport joined.
  struct Joined {
    Endpoint group;
    GroupFile file;
    uint32_t entry = UINT32_MAX;  // our entry (UINT32_MAX: none; claimed again on the next poll)
    bool active = false;          // the producer set our cursor
    uint64_t cursor = 0;          // the next slot to read
    uint64_t published = 0;       // cursor last stored
  };

  // Claims a free entry of the member table, locks it, and asks the producer to take us in.
  bool ClaimMember(Joined& j) {
    uint8_t* h = j.file.map.get();
    for (uint32_t e = 0; e < kGroupMembers; ++e) {
      auto state = MemberState(h, e);
      uint64_t expected = 0;
      if (state.load(std::memory_order_relaxed) != 0) continue;
      if (!state.compare_exchange_strong(expected, uint64_t{kMemberClaimed} << 32 | pid_,
                                         std::memory_order_acquire)) {
        continue;
      }
      if (!LockByte(j.file.fd.get(), MemberLockByte(e))) {  // (a table someone else wrote)
        state.store(0, std::memory_order_release);
        continue;
      }
      const size_t entry = kGroupMembersOffset + e * kLine;
      Ref<uint32_t>(h, entry + offsetof(Member, ipv4))
          .store(source_.ipv4, std::memory_order_relaxed);
      Ref<uint32_t>(h, entry + offsetof(Member, port))
          .store(source_.port, std::memory_order_relaxed);
      state.store(uint64_t{kMemberJoining} << 32 | pid_, std::memory_order_release);
      Ref<uint32_t>(h, kGroupVersionOffset).fetch_add(1, std::memory_order_acq_rel);
      j.entry = e;
      j.active = false;
      return true;
    }
    return false;
  }

  // Gives our entry back (if it is still ours).
  void ReleaseMember(Joined& j) {
    if (j.entry == UINT32_MAX) return;
    uint8_t* h = j.file.map.get();
    auto state = MemberState(h, j.entry);
    uint64_t s = state.load(std::memory_order_acquire);
    // The producer may move the entry on (joining -> active, active -> dropped) between the load
    // and the exchange: try again with what it wrote, a bounded number of times (the word is
    // shared memory another process could keep changing).
    for (int tries = 0; tries < 16 && (s & 0xffffffffu) == pid_ && s >> 32 != kMemberFree;
         ++tries) {
      if (state.compare_exchange_strong(s, 0, std::memory_order_acq_rel)) break;
    }
    UnlockByte(j.file.fd.get(), MemberLockByte(j.entry));
    Ref<uint32_t>(h, kGroupVersionOffset).fetch_add(1, std::memory_order_acq_rel);
    j.entry = UINT32_MAX;
    j.active = false;
  }

  // Joins again (dropped by the producer, or a ring that made no sense): from the head.
  void Rejoin(Joined& j) {
    ReleaseMember(j);
    if (!ClaimMember(j) && !group_full_warned_) {
      group_full_warned_ = true;
      LOG(kWarning, kTransport) << "shm " << source_.ToString() << ": group " << j.group.ToString()
                                << " has no free entry; results come "
                                << "through retransmissions";
    }
  }

  // Takes what waits in the joined group's ring into out (the rules of Take).
  size_t TakeGroup(std::span<RxDatagram> out) {
    Joined& j = *joined_;
    if (j.entry == UINT32_MAX) {
      Rejoin(j);
      return 0;
    }
    uint8_t* h = j.file.map.get();
    const uint64_t s = MemberState(h, j.entry).load(std::memory_order_acquire);
    if (s != (uint64_t{kMemberActive} << 32 | pid_)) {
      if (s != (uint64_t{kMemberJoining} << 32 | pid_)) Rejoin(j);  // dropped
      return 0;
    }
    if (!j.active) {
      j.active = true;
      j.cursor = j.published = MemberCursor(h, j.entry).load(std::memory_order_acquire);
    }
    const uint64_t head = Ref<uint64_t>(h, kGroupHeadOffset).load(std::memory_order_acquire);
    const uint64_t waiting = head - j.cursor;
    if (waiting == 0) return 0;
    // A cursor up to a ring ahead of the index: the producer took us in while it wrote a batch
    // (our cursor: its next slot) and has not published the batch yet.
    if (j.cursor - head <= j.file.g.ring_slots) return 0;
    if (waiting > j.file.g.ring_slots) {
      malformed_.Add(1);
      LOG(kWarning, kTransport) << "shm " << source_.ToString() << ": the ring of group "
                                << j.group.ToString() << " is corrupt; joining it again";
      Rejoin(j);
      return 0;
    }
    Endpoint source;
    source.ipv4 = Ref<uint32_t>(h, kGroupProducerOffset).load(std::memory_order_relaxed);
    source.port = static_cast<uint16_t>(
        Ref<uint32_t>(h, kGroupProducerOffset + 4).load(std::memory_order_relaxed));
    const size_t limit = std::min<size_t>(g_.max_datagram_bytes, j.file.g.max_datagram_bytes);
    const size_t n = ReadSlots([&](uint64_t at) { return j.file.Slot(at); }, &j.cursor,
                               std::min<uint64_t>(waiting, out.size()), limit, source, out);
    if (n > 0) group_received_.Add(n);
    return n;
  }

  // Reads `take` published slots from *cursor on (slot_at gives the slot of a position) into
  // out, advancing *cursor past each. Each slot's length is read once: one past any datagram is
  // counted malformed and skipped, one past `limit` is cut and marked truncated. Returns how
  // many entries of out it filled. Shared by the sender rings and the group ring.
  template <typename SlotAt>
  size_t ReadSlots(SlotAt slot_at, uint64_t* cursor, uint64_t take, size_t limit,
                   const Endpoint& source, std::span<RxDatagram> out) {
    size_t n = 0;
    uint64_t truncated = 0, malformed = 0;
    for (uint64_t i = 0; i < take; ++i, ++*cursor) {
      const uint8_t* slot = slot_at(*cursor);
      const uint32_t length =
          Ref<uint32_t>(const_cast<uint8_t*>(slot), 0).load(std::memory_order_relaxed);
      if (length > kMaxLength) {
        ++malformed;
        continue;
      }
      RxDatagram& d = out[n++];
      const bool cut = length > limit;
      d.data = {slot + kSlotDataOffset, std::min<size_t>(length, limit)};
      d.source = source;
      d.truncated = cut;
      truncated += cut ? 1 : 0;
    }
    if (truncated > 0) counts_.truncated.Add(truncated);
    if (malformed > 0) malformed_.Add(malformed);
    return n;
  }

  // Leaves the joined group; the last member to leave removes its file.
  void LeaveJoined() {
    if (!joined_) return;
    Joined& j = *joined_;
    if (j.active && j.cursor != j.published) {
      MemberCursor(j.file.map.get(), j.entry).store(j.cursor, std::memory_order_release);
    }
    ReleaseMember(j);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // (RemoveOwnShmFiles: one of us sees)
    if (TakeGroupAlone(j.file) && SameFile(j.file.path, j.file.fd.get())) {
      Ref<uint32_t>(j.file.map.get(), kGroupClosedOffset).store(1, std::memory_order_release);
      ::unlink(j.file.path.c_str());
    }
    joined_.reset();
  }

  // Whether this member, having given its entry back, is the group's last: LOCK_EX on the file
  // (every member holds LOCK_SH). A process stopped by a signal (`switchml worker`) gives its
  // entries back first (RemoveOwnShmFiles) and holds LOCK_SH until it exits a moment later:
  // while no entry is claimed, the lock is tried again for up to a second, so that the member
  // that leaves after it removes the file instead of leaving it behind. (A joiner holds
  // LOCK_SH until it claims an entry, microseconds later; that stops the wait.)
  static bool TakeGroupAlone(const GroupFile& f) {
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
    while (::flock(f.fd.get(), LOCK_EX | LOCK_NB) != 0) {
      for (uint32_t e = 0; e < kGroupMembers; ++e) {
        if (MemberState(f.map.get(), e).load(std::memory_order_acquire) != 0) return false;
      }
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  // Whether the next `slots` slots of p's ring are free. The consumer index is untrusted: one
  // beyond head counts as a full ring.
  static bool Room(const Peer& p, uint64_t slots) {
    const uint64_t used = p.head - p.tail_seen;
    return used <= p.g.ring_slots && p.g.ring_slots - used >= slots;
  }
  bool HasRoom(Peer& p, uint64_t slots) {
    if (Room(p, slots)) return true;
    p.tail_seen = Ref<uint64_t>(p.ring.get(), kTailOffset).load(std::memory_order_acquire);
    return Room(p, slots);
  }

  // Starts another batch of lent transmit memory: destinations dropped while lent in the last
  // one are unmapped now (their slots were the caller's until this call).
  void NewLendingBatch() {
    ++lending_batch_;
    retired_.clear();
    retired_groups_.clear();
  }

  Peer* FindPeer(uint16_t port) {
    // (A worker sends to one port: the last one found is remembered.)
    if (last_peer_ != nullptr && last_port_ == port && !last_peer_->Closed()) return last_peer_;
    auto it = peers_.find(port);
    Peer* found = nullptr;
    if (it != peers_.end() && !it->second->Closed()) {
      found = it->second.get();
    } else {
      if (it != peers_.end()) DropPeer(port);  // the receiver closed (or was replaced)
      std::unique_ptr<Peer> p = OpenPeer(port);
      if (p == nullptr) return nullptr;
      found = p.get();
      ForgetGonePeers();
      peers_.emplace(port, std::move(p));
    }
    last_peer_ = found;
    last_port_ = port;
    return found;
  }

  // Drops the destinations whose receiver closed or died, each holding a descriptor of its
  // (unlinked) inbox and with it the pages of our ring there. Called when a new destination
  // is opened: a long-lived sender (the switch daemon) meets new workers' inboxes with every
  // job and never sends to the earlier ones again, so it would otherwise keep them all (a
  // descriptor each, and up to a ring's pages: 0.54 MiB with the data plane's 512 slots) until
  // it ran out of descriptors. A system call or two per destination, once per new destination.
  void ForgetGonePeers() {
    std::vector<uint16_t> gone;
    for (const auto& [port, p] : peers_) {
      if (!p->Alive()) gone.push_back(port);
    }
    for (uint16_t port : gone) DropPeer(port);
  }

  void DropPeer(uint16_t port) {
    auto it = peers_.find(port);
    if (it == peers_.end()) return;
    touched_.erase(std::remove(touched_.begin(), touched_.end(), it->second.get()), touched_.end());
    if (last_peer_ == it->second.get()) last_peer_ = nullptr;
    // Lent in this batch: the caller may still hold its memory, so it stays mapped until the
    // next batch (its entry is marked closed then, which a closed receiver no longer reads).
    if (it->second->lent_batch == lending_batch_ && lending_batch_ != 0) {
      retired_.push_back(std::move(it->second));
    }
    peers_.erase(it);
  }

  // Opens port's inbox and registers a ring in it; nullptr (logged at debug level) when there
  // is no live inbox to use.
  std::unique_ptr<Peer> OpenPeer(uint16_t port) {
    const std::string path = InboxPath(dir_, port);
    auto fail = [&](const std::string& why) -> std::unique_ptr<Peer> {
      LOG(kDebug, kTransport) << "shm " << source_.ToString() << ": cannot send to port " << port
                              << ": " << why;
      return nullptr;
    };
    auto p = std::make_unique<Peer>();
    p->fd = Fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (p->fd.get() < 0) {
      const int err = errno;
      // Once per port: most likely the peer is not an shm transport of this host.
      if (err == ENOENT && missing_warned_.size() < 64 && missing_warned_.insert(port).second) {
        LOG(kWarning, kTransport)
            << "shm " << source_.ToString() << ": no inbox " << path << ": nothing listens on port "
            << port << " with --transport shm on this host "
            << "(same user, same SWITCHML_SHM_DIR); datagrams to it are dropped and counted";
      }
      return fail(path + ": " + ErrnoText(err));
    }
    struct stat st {};
    if (::fstat(p->fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
        static_cast<uint64_t>(st.st_size) < kPage) {
      return fail(path + " is not an inbox of ours");
    }
    if (!p->Alive()) return fail(path + " is stale (no transport holds it)");
    Mapping first = Mapping::Map(p->fd.get(), kPage, 0);
    if (first.get() == nullptr) return fail("cannot map " + path);
    if (!ReadGeometry(first.get(), static_cast<uint64_t>(st.st_size), &p->g)) {
      return fail(path + " has a header this build does not know");
    }
    if (p->g.header_bytes == kPage) {
      p->header = std::move(first);
    } else {
      first.Reset();
      p->header = Mapping::Map(p->fd.get(), p->g.header_bytes, 0);
      if (p->header.get() == nullptr) return fail("cannot map " + path);
    }
    if (p->Closed()) {
      p->header.Reset();
      return fail(path + " is closed");
    }
    // Claim a free entry.
    p->pid = pid_;
    bool claimed = false;
    for (uint32_t e = 0; e < p->g.max_senders && !claimed; ++e) {
      auto state = Ref<uint64_t>(p->header.get(), kEntriesOffset + e * sizeof(Entry));
      uint64_t expected = StateOf(kFree, 0);
      if (state.load(std::memory_order_relaxed) != expected) continue;
      if (state.compare_exchange_strong(expected, StateOf(kClaimed, pid_),
                                        std::memory_order_acquire)) {
        p->entry = e;
        p->claimed = claimed = true;
      }
    }
    if (!claimed) {
      p->header.Reset();
      return fail(path + " has no free ring (" + std::to_string(p->g.max_senders) + " senders)");
    }
    const size_t entry = kEntriesOffset + p->entry * sizeof(Entry);
    p->ring = Mapping::Map(p->fd.get(), p->g.ring_bytes,
                           static_cast<off_t>(p->g.header_bytes + p->entry * p->g.ring_bytes));
    if (p->ring.get() == nullptr) return fail("cannot map a ring of " + path);  // (~Peer closes)
    p->slots = p->ring.get() + kSlotsOffset;
    Ref<uint32_t>(p->header.get(), entry + offsetof(Entry, ipv4))
        .store(source_.ipv4, std::memory_order_relaxed);
    Ref<uint32_t>(p->header.get(), entry + offsetof(Entry, port))
        .store(source_.port, std::memory_order_relaxed);
    Ref<uint64_t>(p->header.get(), entry).store(StateOf(kActive, pid_), std::memory_order_release);
    Ref<uint32_t>(p->header.get(), kTableVersionOffset).fetch_add(1, std::memory_order_acq_rel);
    return p;
  }

  // Publishes the rings this Send filled, then rings the doorbells of receivers that sleep.
  void Publish() {
    if (touched_.empty() && touched_groups_.empty()) return;
    for (Peer* p : touched_) {
      Ref<uint64_t>(p->ring.get(), kHeadOffset).store(p->head, std::memory_order_release);
      p->touched = false;
    }
    for (GroupPeer* p : touched_groups_) {
      Ref<uint64_t>(p->header(), kGroupHeadOffset).store(p->head, std::memory_order_release);
    }
    counts_.send_calls.Add(touched_.size() + touched_groups_.size());
    std::atomic_thread_fence(std::memory_order_seq_cst);
    RingGroupDoorbells();
    for (Peer* p : touched_) {
      auto sleeping =
          Ref<uint32_t>(p->header.get(), kDoorbellOffset + offsetof(Doorbell, sleeping));
      if (sleeping.load(std::memory_order_relaxed) == 0) continue;
      if (sleeping.exchange(0, std::memory_order_acq_rel) == 0) continue;  // another rang it
      std::atomic_ref<uint32_t>(*p->bell()).fetch_add(1, std::memory_order_release);
      Futex(p->bell(), FUTEX_WAKE, 1, nullptr);
      doorbells_.Add(1);
    }
    touched_.clear();
  }

  // Gives back the slots lent by the previous Receive, and frees the entries of senders that
  // are gone once their rings are drained.
  void ReturnLent() {
    if (joined_ && joined_->active && joined_->cursor != joined_->published) {
      MemberCursor(joined_->file.map.get(), joined_->entry)
          .store(joined_->cursor, std::memory_order_release);
      joined_->published = joined_->cursor;
    }
    bool freed = false;
    for (Ring& r : rings_) {
      if (r.tail != r.published) {
        Ref<uint64_t>(r.base, kTailOffset).store(r.tail, std::memory_order_release);
        r.published = r.tail;
      }
      if (r.closing &&
          (r.broken ||
           Ref<uint64_t>(r.base, kHeadOffset).load(std::memory_order_acquire) == r.tail)) {
        FreeEntry(r.entry);
        r.entry = UINT32_MAX;
        freed = true;
      }
    }
    if (freed) {
      std::erase_if(rings_, [](const Ring& r) { return r.entry == UINT32_MAX; });
    }
  }

  void FreeEntry(uint32_t e) {
    uint8_t* ring = RingBase(e);
    Ref<uint64_t>(ring, kHeadOffset).store(0, std::memory_order_relaxed);
    Ref<uint64_t>(ring, kTailOffset).store(0, std::memory_order_relaxed);
    EntryState(e).store(StateOf(kFree, 0), std::memory_order_release);
  }

  uint8_t* RingBase(uint32_t e) const { return base_ + g_.header_bytes + e * g_.ring_bytes; }
  std::atomic_ref<uint64_t> EntryState(uint32_t e) const {
    return Ref<uint64_t>(base_, kEntriesOffset + e * sizeof(Entry));
  }

  Ring* FindRing(uint32_t e) {
    for (Ring& r : rings_) {
      if (r.entry == e) return &r;
    }
    return nullptr;
  }

  Ring& AddRing(uint32_t e) {
    const size_t entry = kEntriesOffset + e * sizeof(Entry);
    Ring r;
    r.entry = e;
    r.source.ipv4 =
        Ref<uint32_t>(base_, entry + offsetof(Entry, ipv4)).load(std::memory_order_relaxed);
    r.source.port = static_cast<uint16_t>(
        Ref<uint32_t>(base_, entry + offsetof(Entry, port)).load(std::memory_order_relaxed));
    r.base = RingBase(e);
    rings_.push_back(r);  // tail 0: FreeEntry (or the new file) left both indices at 0
    return rings_.back();
  }

  // Looks for senders that registered or closed since the last look.
  void Rescan() {
    auto version = Ref<uint32_t>(base_, kTableVersionOffset);
    const uint32_t v = version.load(std::memory_order_acquire);
    if (v == table_version_) return;
    table_version_ = v;
    for (uint32_t e = 0; e < g_.max_senders; ++e) {
      const uint64_t kind = EntryState(e).load(std::memory_order_acquire) >> 32;
      if (kind != kActive && kind != kClosed) continue;
      Ring* r = FindRing(e);
      if (r == nullptr) r = &AddRing(e);
      if (kind == kClosed) r->closing = true;
    }
  }

  // Entries of senders whose process is gone: claimed ones are freed, active ones drained first.
  // At most once a second.
  void ReclaimDeadSenders(Clock::time_point now) {
    if (now - last_reclaim_ < std::chrono::seconds(1)) return;
    last_reclaim_ = now;
    for (uint32_t e = 0; e < g_.max_senders; ++e) {
      const uint64_t state = EntryState(e).load(std::memory_order_acquire);
      const uint64_t kind = state >> 32;
      if (kind != kClaimed && kind != kActive) continue;
      if (ProcessAlive(static_cast<uint32_t>(state))) continue;
      if (kind == kClaimed) {
        FreeEntry(e);
        continue;
      }
      Ring* r = FindRing(e);
      if (r == nullptr) r = &AddRing(e);
      r->closing = true;
    }
  }

  // Takes what waits in the rings, round robin, into batch.
  size_t Poll(std::span<RxDatagram> batch) {
    Rescan();
    size_t n = 0;
    // The joined group's ring first every other poll (as UDP's group socket).
    group_first_ = !group_first_;
    if (joined_ && group_first_) n += TakeGroup(batch);
    const size_t count = rings_.size();
    for (size_t k = 0; k < count && n < batch.size(); ++k) {
      n += Take(rings_[(next_ring_ + k) % count], batch.subspan(n));
    }
    if (count > 0) next_ring_ = (next_ring_ + 1) % count;
    if (joined_ && !group_first_ && n < batch.size()) n += TakeGroup(batch.subspan(n));
    if (n > 0) {
      counts_.datagrams_received.Add(n);
      counts_.receive_calls.Add(1);
    }
    return n;
  }

  size_t Take(Ring& r, std::span<RxDatagram> out) {
    if (r.broken) return 0;
    const uint64_t head = Ref<uint64_t>(r.base, kHeadOffset).load(std::memory_order_acquire);
    const uint64_t waiting = head - r.tail;
    if (waiting == 0) return 0;
    if (waiting > g_.ring_slots) {
      r.broken = true;
      malformed_.Add(1);
      LOG(kWarning, kTransport) << "shm " << source_.ToString() << ": the ring of sender "
                                << r.source.ToString() << " is corrupt; ignoring it";
      return 0;
    }
    return ReadSlots(
        [&](uint64_t at) { return r.base + kSlotsOffset + (at & mask_) * size_t{g_.slot_bytes}; },
        &r.tail, std::min<uint64_t>(waiting, out.size()), g_.max_datagram_bytes, r.source, out);
  }

  Inbox inbox_;
  const std::string dir_;
  const Endpoint local_;   // as bound (ipv4 0 when bound to any)
  const Endpoint source_;  // as receivers see us
  const std::chrono::nanoseconds spin_;
  const uint32_t pid_;
  uint8_t* const base_;
  const Geometry g_;
  const uint64_t mask_;
  uint32_t* const bell_;
  std::atomic<bool> wake_{false};
  // Sender side.
  std::unordered_map<uint16_t, std::unique_ptr<Peer>> peers_;
  std::vector<Peer*> touched_;
  Peer* last_peer_ = nullptr;  // FindPeer's last answer, and its port
  uint16_t last_port_ = 0;
  uint64_t lending_batch_ = 0;                   // batches of lent transmit memory so far
  std::vector<std::unique_ptr<Peer>> retired_;   // dropped while lent in the current batch
  std::unordered_set<uint16_t> missing_warned_;  // ports without an inbox already logged
  std::unordered_map<Endpoint, std::unique_ptr<GroupPeer>> groups_;  // groups we produce for
  GroupPeer* last_group_ = nullptr;                                  // FindGroup's last answer
  std::vector<GroupPeer*> touched_groups_;                  // hold datagrams of the current Send
  std::vector<std::unique_ptr<GroupPeer>> retired_groups_;  // closed while lent in this batch
  std::unordered_map<Endpoint, Clock::time_point> group_retry_;  // no group file until then
  std::unordered_set<Endpoint> producer_warned_;  // groups another producer held, logged
  // Receiver side.
  std::vector<Ring> rings_;
  size_t next_ring_ = 0;
  uint32_t table_version_ = 0;
  Clock::time_point last_reclaim_{};
  std::unique_ptr<Joined> joined_;  // the group we receive from, if any
  bool group_first_ = false;        // whether this poll takes the group's ring first
  bool group_full_warned_ = false;
  SingleWriterTransportCounters counts_;
  SingleWriterCounter malformed_, doorbells_, sent_in_place_, group_received_;
};

Status ValidateOptions(const TransportOptions& o) {
  const std::string where = "shm transport on port " + std::to_string(o.port);
  if (o.max_datagram_bytes == 0 || o.max_datagram_bytes > kMaxDatagram) {
    return InvalidArgumentError(where + ": max_datagram_bytes must be in 1..65507");
  }
  if (!PowerOfTwo(o.shm.ring_slots) || o.shm.ring_slots < 2 || o.shm.ring_slots > kMaxRingSlots) {
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
  ASSIGN_OR_RETURN(Inbox inbox, CreateInbox(o, dir, in_use));
  return std::unique_ptr<Transport>(std::make_unique<ShmTransport>(std::move(inbox), o, dir));
}

}  // namespace

std::string ShmDirectory(const ShmOptions& options) {
  if (!options.directory.empty()) return options.directory;
  return "/dev/shm/switchml-" + std::to_string(::geteuid());
}

namespace {

// RemoveShmFilesLeftBy and RemoveOwnShmFiles. live_ours: the files may be held by live
// transports of this process (pids is this process), which the lock test would take for others'.
size_t RemoveShmFilesOf(const std::string& dir, const std::vector<uint32_t>& pids, bool live_ours) {
  auto ours = [&](uint32_t pid) { return std::find(pids.begin(), pids.end(), pid) != pids.end(); };
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("inbox-", 0) == 0 || n.rfind("group-", 0) == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  size_t removed = 0;
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    Fd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid() || static_cast<uint64_t>(st.st_size) < kPage) {
      continue;
    }
    // Held by a live transport (an inbox's owner holds LOCK_EX, a group's members LOCK_SH), or
    // replaced meanwhile: not ours to remove. (Released when fd closes.)
    if (!live_ours && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;
    if (!SameFile(path, fd.get())) continue;
    if (name[0] == 'i') {
      Mapping m = Mapping::Map(fd.get(), kPage, 0);
      if (m.get() == nullptr) continue;
      Fixed f;
      std::memcpy(&f, m.get(), sizeof f);
      if (f.magic != kMagic || !ours(f.owner_pid)) continue;
      m.Reset();
      MarkStaleClosed(fd.get());
    } else {
      GroupFile g;
      g.fd = std::move(fd);
      if (!MapGroupFile(&g)) continue;
      if (live_ours) {
        // This process's transports are not used again: give their entries back first, so
        // that a member leaving meanwhile sees them gone and removes the file if this does
        // not (ShmTransport::TakeGroupAlone; one of the two sees the other's release).
        bool gave_back = false;
        for (uint32_t e = 0; e < kGroupMembers; ++e) {
          auto state = MemberState(g.map.get(), e);
          uint64_t word = state.load(std::memory_order_acquire);
          if (word != 0 && ours(static_cast<uint32_t>(word)) &&
              state.compare_exchange_strong(word, 0, std::memory_order_acq_rel)) {
            gave_back = true;
          }
        }
        if (gave_back) {
          Ref<uint32_t>(g.map.get(), kGroupVersionOffset).fetch_add(1, std::memory_order_acq_rel);
        }
        std::atomic_thread_fence(std::memory_order_seq_cst);
      }
      bool all_ours = true;
      for (uint32_t e = 0; e < kGroupMembers; ++e) {
        const uint64_t s = MemberState(g.map.get(), e).load(std::memory_order_acquire);
        all_ours = all_ours && (s == 0 || ours(static_cast<uint32_t>(s)));
      }
      if (!all_ours) continue;
      Ref<uint32_t>(g.map.get(), kGroupClosedOffset).store(1, std::memory_order_release);
    }
    if (::unlink(path.c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace

size_t RemoveShmFilesLeftBy(const std::string& dir, const std::vector<uint32_t>& pids) {
  return RemoveShmFilesOf(dir, pids, /*live_ours=*/false);
}

size_t RemoveOwnShmFiles(const std::string& dir) {
  return RemoveShmFilesOf(dir, {static_cast<uint32_t>(::getpid())}, /*live_ours=*/true);
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
