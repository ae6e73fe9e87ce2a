#include "transport/shm_inbox.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

#include "base/logging.h"
#include "base/status_macros.h"

namespace switchml::transport {

InboxGeometry MakeInboxGeometry(uint32_t max_senders, uint32_t ring_slots, uint32_t max_datagram) {
  InboxGeometry g;
  g.max_senders = max_senders;
  g.ring_slots = ring_slots;
  g.max_datagram_bytes = max_datagram;
  g.slot_bytes = ShmSlotBytes(max_datagram);
  g.header_bytes = ShmRoundUp(kEntriesOffset + size_t{max_senders} * sizeof(InboxEntry), kShmPage);
  g.ring_bytes = ShmRoundUp(ShmRingBytes(ring_slots, g.slot_bytes), kShmPage);
  g.total_bytes = g.header_bytes + uint64_t{max_senders} * g.ring_bytes;
  return g;
}

bool ReadInboxGeometry(const uint8_t* header, uint64_t file_bytes, InboxGeometry* out) {
  InboxFixed f;
  std::memcpy(&f, header, sizeof f);
  if (f.magic != kInboxMagic || f.version != kInboxVersion) return false;
  if (f.max_senders == 0 || f.max_senders > kMaxSenders) return false;
  if (!ShmPowerOfTwo(f.ring_slots) || f.ring_slots > kShmMaxRingSlots) return false;
  if (f.max_datagram_bytes == 0 || f.max_datagram_bytes > kShmMaxDatagram) return false;
  const InboxGeometry g = MakeInboxGeometry(f.max_senders, f.ring_slots, f.max_datagram_bytes);
  if (f.slot_bytes != g.slot_bytes || f.header_bytes != g.header_bytes ||
      f.ring_bytes != g.ring_bytes || f.total_bytes != g.total_bytes ||
      g.total_bytes > file_bytes) {
    return false;
  }
  *out = g;
  return true;
}

std::string InboxPath(const std::string& dir, uint16_t port) {
  return dir + "/inbox-" + std::to_string(port);
}

void MarkInboxClosed(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < kShmPage) return;
  Mapping m = Mapping::Map(fd, kShmPage, 0);
  if (m.get() == nullptr) return;
  uint64_t magic;
  std::memcpy(&magic, m.get(), sizeof magic);
  if (magic == kInboxMagic) {
    ShmRef<uint32_t>(m.get(), kDoorbellOffset + offsetof(InboxDoorbell, closed))
        .store(1, std::memory_order_release);
  }
}

ShmDoorbell ShmDoorbell::Map(const std::string& dir, uint32_t port) {
  if (port == 0 || port > 65535) return ShmDoorbell();
  uint64_t bytes = 0;
  Fd fd = OpenOwnFile(InboxPath(dir, static_cast<uint16_t>(port)), &bytes);
  if (fd.get() < 0) return ShmDoorbell();
  ShmDoorbell d;
  d.page_ = Mapping::Map(fd.get(), kShmPage, 0);
  uint64_t magic = 0;
  if (d.page_.get() != nullptr) std::memcpy(&magic, d.page_.get(), sizeof magic);
  if (magic != kInboxMagic) return ShmDoorbell();
  d.header_ = d.page_.get();
  return d;
}

bool ShmDoorbell::RingIfSleeping() const {
  auto sleeping = ShmRef<uint32_t>(header_, kDoorbellOffset + offsetof(InboxDoorbell, sleeping));
  if (sleeping.load(std::memory_order_relaxed) == 0) return false;
  if (sleeping.exchange(0, std::memory_order_acq_rel) == 0) return false;  // another rang it
  uint32_t* bell =
      reinterpret_cast<uint32_t*>(header_ + kDoorbellOffset + offsetof(InboxDoorbell, bell));
  std::atomic_ref<uint32_t>(*bell).fetch_add(1, std::memory_order_release);
  FutexWake(bell, 1);
  return true;
}

Result<std::unique_ptr<ShmInbox>> ShmInbox::Create(const TransportOptions& o,
                                                   const std::string& dir, ShmCounters* counters,
                                                   bool* in_use) {
  *in_use = false;
  const std::string where = "shm transport on port " + std::to_string(o.port);
  const InboxGeometry g = MakeInboxGeometry(o.shm.max_senders, o.shm.ring_slots,
                                            static_cast<uint32_t>(o.max_datagram_bytes));
  const std::string path = InboxPath(dir, o.port);
  // Held until the temporary file is gone (destroyed after tmp_file), against RemoveOwnShmFiles.
  ShmCreationLock creation;
  RETURN_IF_ERROR(creation.Check("the inbox of the " + where));
  std::string tmp = dir + "/.inbox-" + std::to_string(o.port) + ".XXXXXX";
  Fd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (fd.get() < 0) {
    return UnavailableError("cannot create a file in " + dir + " for the " + where + ": " +
                            ErrnoText(errno));
  }
  struct TmpFile {
    std::string path;
    ~TmpFile() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } tmp_file{tmp};
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    return InternalError("cannot lock " + tmp + ": " + ErrnoText(errno));
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(g.total_bytes)) != 0) {
    return ResourceExhaustedError("cannot size the inbox " + tmp + " (" +
                                  std::to_string(g.total_bytes) +
                                  " bytes, sparse): " + ErrnoText(errno));
  }
  Mapping map = Mapping::Map(fd.get(), g.total_bytes, 0);
  if (map.get() == nullptr) {
    return ResourceExhaustedError("cannot map the inbox " + tmp + ": " + ErrnoText(errno));
  }
  InboxFixed f{};
  f.magic = kInboxMagic;
  f.version = kInboxVersion;
  f.max_senders = g.max_senders;
  f.ring_slots = g.ring_slots;
  f.slot_bytes = g.slot_bytes;
  f.max_datagram_bytes = g.max_datagram_bytes;
  f.owner_pid = static_cast<uint32_t>(::getpid());
  f.header_bytes = g.header_bytes;
  f.ring_bytes = g.ring_bytes;
  f.total_bytes = g.total_bytes;
  std::memcpy(map.get(), &f, sizeof f);  // the rest is zero (ftruncate)
  std::atomic_thread_fence(std::memory_order_release);
  const Endpoint self{o.bind_ipv4 != 0 ? o.bind_ipv4 : kLoopbackIpv4, o.port};
  auto made = [&] {
    return std::unique_ptr<ShmInbox>(
        new ShmInbox(path, std::move(fd), std::move(map), g, self, counters));
  };
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (::link(tmp.c_str(), path.c_str()) == 0) return made();  // (tmp_file unlinks tmp)
    if (errno != EEXIST) {
      return UnavailableError("cannot name the inbox " + path + ": " + ErrnoText(errno));
    }
    Fd old(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (old.get() < 0) {
      if (errno == ENOENT) continue;  // removed meanwhile: try again
      return UnavailableError("cannot open the existing " + path + ": " + ErrnoText(errno));
    }
    if (::flock(old.get(), LOCK_EX | LOCK_NB) != 0) {
      *in_use = true;
      return UnavailableError("the " + where + " is in use (" + path +
                              " belongs to a live transport): stop it, choose another port, or "
                              "use port 0");
    }
    if (!SameFile(path, old.get())) continue;  // replaced meanwhile: look again
    // Stale (its owner died): senders that still map it are told, and it is replaced.
    LOG(kInfo, kTransport) << "replacing the stale shm inbox " << path;
    MarkInboxClosed(old.get());
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      return UnavailableError("cannot replace the stale " + path + ": " + ErrnoText(errno));
    }
    tmp_file.path.clear();
    return made();
  }
  *in_use = true;
  return UnavailableError("the " + where + " is contended (" + path +
                          " keeps changing): choose another port");
}

ShmInbox::ShmInbox(std::string path, Fd fd, Mapping map, const InboxGeometry& g,
                   const Endpoint& self, ShmCounters* counters)
    : path_(std::move(path)),
      fd_(std::move(fd)),
      map_(std::move(map)),
      g_(g),
      self_(self),
      counters_(counters),
      base_(map_.get()),
      bell_(reinterpret_cast<uint32_t*>(base_ + kDoorbellOffset + offsetof(InboxDoorbell, bell))) {}

ShmInbox::~ShmInbox() {
  ShmRef<uint32_t>(base_, kDoorbellOffset + offsetof(InboxDoorbell, closed))
      .store(1, std::memory_order_release);
  if (SameFile(path_, fd_.get())) ::unlink(path_.c_str());
}

void ShmInbox::ReturnLent() {
  bool freed = false;
  for (SenderRing& r : rings_) {
    r.ring.Return();
    if (r.closing && r.ring.Drained()) {
      FreeEntry(r.entry);
      r.entry = UINT32_MAX;
      freed = true;
    }
  }
  if (freed) {
    std::erase_if(rings_, [](const SenderRing& r) { return r.entry == UINT32_MAX; });
  }
}

void ShmInbox::FreeEntry(uint32_t e) {
  ShmRingConsumer(std::span<uint8_t>(RingBase(e), g_.ring_bytes), g_.ring_slots, g_.slot_bytes,
                  g_.max_datagram_bytes)
      .Reset();
  EntryState(e).store(StateOf(kFree, 0), std::memory_order_release);
}

ShmInbox::SenderRing* ShmInbox::FindRing(uint32_t e) {
  for (SenderRing& r : rings_) {
    if (r.entry == e) return &r;
  }
  return nullptr;
}

ShmInbox::SenderRing& ShmInbox::AddRing(uint32_t e) {
  const size_t entry = EntryOffset(e);
  SenderRing r;
  r.entry = e;
  r.source.ipv4 =
      ShmRef<uint32_t>(base_, entry + offsetof(InboxEntry, ipv4)).load(std::memory_order_relaxed);
  r.source.port = static_cast<uint16_t>(
      ShmRef<uint32_t>(base_, entry + offsetof(InboxEntry, port)).load(std::memory_order_relaxed));
  // Consumer index 0: FreeEntry (or the new file) left both indices at 0.
  r.ring = ShmRingConsumer(std::span<uint8_t>(RingBase(e), g_.ring_bytes), g_.ring_slots,
                           g_.slot_bytes, g_.max_datagram_bytes);
  rings_.push_back(r);
  return rings_.back();
}

void ShmInbox::Rescan() {
  auto version = ShmRef<uint32_t>(base_, kTableVersionOffset);
  const uint32_t v = version.load(std::memory_order_acquire);
  if (v == table_version_) return;
  table_version_ = v;
  for (uint32_t e = 0; e < g_.max_senders; ++e) {
    const uint64_t kind = EntryState(e).load(std::memory_order_acquire) >> 32;
    if (kind != kActive && kind != kClosed) continue;
    SenderRing* r = FindRing(e);
    if (r == nullptr) r = &AddRing(e);
    if (kind == kClosed) r->closing = true;
  }
}

void ShmInbox::ReclaimDeadSenders(std::chrono::steady_clock::time_point now) {
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
    SenderRing* r = FindRing(e);
    if (r == nullptr) r = &AddRing(e);
    r->closing = true;
  }
}

size_t ShmInbox::Take(std::span<RxDatagram> out) {
  size_t n = 0;
  uint64_t truncated = 0, malformed = 0;
  const size_t count = rings_.size();
  for (size_t k = 0; k < count && n < out.size(); ++k) {
    SenderRing& r = rings_[(next_ring_ + k) % count];
    const bool was_broken = r.ring.broken();
    const ShmRead read = r.ring.Take(out.subspan(n), r.source);
    if (!was_broken && r.ring.broken()) {
      LOG(kWarning, kTransport) << "shm " << self_.ToString() << ": the ring of sender "
                                << r.source.ToString() << " is corrupt; ignoring it";
    }
    n += read.filled;
    truncated += read.truncated;
    malformed += read.malformed;
  }
  if (count > 0) next_ring_ = (next_ring_ + 1) % count;
  if (truncated > 0) counters_->io.truncated.Add(truncated);
  if (malformed > 0) counters_->malformed.Add(malformed);
  return n;
}

uint32_t ShmInbox::AnnounceSleep() {
  ShmRef<uint32_t>(base_, kDoorbellOffset + offsetof(InboxDoorbell, sleeping))
      .store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return std::atomic_ref<uint32_t>(*bell_).load(std::memory_order_acquire);
}

void ShmInbox::CancelSleep() {
  ShmRef<uint32_t>(base_, kDoorbellOffset + offsetof(InboxDoorbell, sleeping))
      .store(0, std::memory_order_relaxed);
}

void ShmInbox::Wait(uint32_t seen, const struct timespec* timeout) {
  FutexWait(bell_, seen, timeout);
}

void ShmInbox::Ring() {
  std::atomic_ref<uint32_t>(*bell_).fetch_add(1, std::memory_order_seq_cst);
  FutexWake(bell_, INT_MAX);
}

}  // namespace switchml::transport
