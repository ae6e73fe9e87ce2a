#include "transport/shm_peers.h"

#include <algorithm>
#include <cerrno>

#include "base/logging.h"

namespace switchml::transport {

ShmPeers::Peer::~Peer() {
  if (!claimed) return;
  ShmRef<uint64_t>(header.get(), EntryOffset(entry))
      .store(StateOf(kClosed, pid), std::memory_order_release);
  ShmRef<uint32_t>(header.get(), kTableVersionOffset).fetch_add(1, std::memory_order_acq_rel);
}

bool ShmPeers::Peer::Alive() const { return !Closed() && InboxHeld(fd.get()); }

ShmPeers::Peer* ShmPeers::Find(uint16_t port) {
  // (A worker sends to one port: the last one found is remembered.)
  if (last_peer_ != nullptr && last_port_ == port && !last_peer_->Closed()) return last_peer_;
  auto it = peers_.find(port);
  Peer* found = nullptr;
  if (it != peers_.end() && !it->second->Closed()) {
    found = it->second.get();
  } else {
    if (it != peers_.end()) Drop(port);  // the receiver closed (or was replaced)
    std::unique_ptr<Peer> p = Open(port);
    if (p == nullptr) return nullptr;
    found = p.get();
    ForgetGone();
    peers_.emplace(port, std::move(p));
  }
  last_peer_ = found;
  last_port_ = port;
  return found;
}

// Drops the destinations whose receiver closed or died, each holding a descriptor of its
// (unlinked) inbox and with it the pages of our ring there. Called when a new destination is
// opened: a long-lived sender (the switch daemon) meets new workers' inboxes with every job and
// never sends to the earlier ones again, so it would otherwise keep them all (a descriptor each,
// and up to a ring's pages) until it ran out of descriptors. A system call or two per
// destination, once per new destination.
void ShmPeers::ForgetGone() {
  std::vector<uint16_t> gone;
  for (const auto& [port, p] : peers_) {
    if (!p->Alive()) gone.push_back(port);
  }
  for (uint16_t port : gone) Drop(port);
}

void ShmPeers::Drop(uint16_t port) {
  auto it = peers_.find(port);
  if (it == peers_.end()) return;
  if (last_peer_ == it->second.get()) last_peer_ = nullptr;
  // Lent in this batch: the caller may still hold its memory, so it stays mapped until the next
  // batch (its entry is marked closed then, which a closed receiver no longer reads).
  sends_.Drop(std::move(it->second));
  peers_.erase(it);
}

// Opens port's inbox and registers a ring in it; nullptr (logged at debug level) when there is
// no live inbox to use.
std::unique_ptr<ShmPeers::Peer> ShmPeers::Open(uint16_t port) {
  const std::string path = InboxPath(dir_, port);
  auto fail = [&](const std::string& why) -> std::unique_ptr<Peer> {
    LOG(kDebug, kTransport) << "shm " << source_.ToString() << ": cannot send to port " << port
                            << ": " << why;
    return nullptr;
  };
  auto p = std::make_unique<Peer>();
  uint64_t file_bytes = 0;
  p->fd = OpenOwnFile(path, &file_bytes);
  if (p->fd.get() < 0) {
    const int err = errno;
    if (err == 0) return fail(path + " is not an inbox of ours");
    // Once per port: most likely the peer is not an shm transport of this host.
    if (err == ENOENT && missing_warned_.size() < 64 && missing_warned_.insert(port).second) {
      LOG(kWarning, kTransport)
          << "shm " << source_.ToString() << ": no inbox " << path << ": nothing listens on port "
          << port << " with --transport shm on this host "
          << "(same user, same SWITCHML_SHM_DIR); datagrams to it are dropped and counted";
    }
    return fail(path + ": " + ErrnoText(err));
  }
  if (!p->Alive()) return fail(path + " is stale (no transport holds it)");
  Mapping first = Mapping::Map(p->fd.get(), kShmPage, 0);
  if (first.get() == nullptr) return fail("cannot map " + path);
  if (!ReadInboxGeometry(first.get(), file_bytes, &p->g)) {
    return fail(path + " has a header this build does not know");
  }
  if (p->g.header_bytes == kShmPage) {
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
    auto state = ShmRef<uint64_t>(p->header.get(), EntryOffset(e));
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
  const size_t entry = EntryOffset(p->entry);
  p->ring_map = Mapping::Map(p->fd.get(), p->g.ring_bytes,
                             static_cast<off_t>(p->g.header_bytes + p->entry * p->g.ring_bytes));
  if (p->ring_map.get() == nullptr) return fail("cannot map a ring of " + path);  // (~Peer closes)
  // The receiver freed the entry with both indices at 0 (or the file is new): we start at 0.
  p->ring = ShmRingProducer(std::span<uint8_t>(p->ring_map.get(), p->g.ring_bytes), p->g.ring_slots,
                            p->g.slot_bytes, p->g.max_datagram_bytes);
  ShmRef<uint32_t>(p->header.get(), entry + offsetof(InboxEntry, ipv4))
      .store(source_.ipv4, std::memory_order_relaxed);
  ShmRef<uint32_t>(p->header.get(), entry + offsetof(InboxEntry, port))
      .store(source_.port, std::memory_order_relaxed);
  ShmRef<uint64_t>(p->header.get(), entry).store(StateOf(kActive, pid_), std::memory_order_release);
  ShmRef<uint32_t>(p->header.get(), kTableVersionOffset).fetch_add(1, std::memory_order_acq_rel);
  return p;
}

std::span<uint8_t> ShmPeers::Lend(uint16_t port, size_t index, size_t bytes) {
  Peer* p = Find(port);
  if (p == nullptr || p->g.max_datagram_bytes < bytes || !p->ring.HasRoom(index + 1)) return {};
  sends_.Lent(p);
  return p->ring.Lend(index).first(bytes);
}

size_t ShmPeers::PublishRings() {
  for (Peer* p : sends_.touched_list()) p->ring.Publish();
  return sends_.touched_list().size();
}

size_t ShmPeers::RingDoorbells() {
  size_t rang = 0;
  for (Peer* p : sends_.touched_list()) rang += p->doorbell().RingIfSleeping() ? 1 : 0;
  sends_.ClearTouched();
  return rang;
}

}  // namespace switchml::transport
