// The removal of the files that dead processes left (shm.h: RemoveShmFilesLeftBy and
// RemoveOwnShmFiles). Inboxes (shm_inbox.h) and group files (shm_group.h) are told apart by
// their names and checked by their headers; every file is marked closed before it is unlinked.
#include <dirent.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "transport/shm.h"
#include "transport/shm_files.h"
#include "transport/shm_group.h"
#include "transport/shm_inbox.h"

namespace switchml::transport {
namespace {

// The names of the inboxes and group files in dir.
std::vector<std::string> ShmFileNames(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("inbox-", 0) == 0 || n.rfind("group-", 0) == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  return names;
}

// Whether the inbox open as fd was made by one of `ours` (its owner pid); if so, marks it
// closed.
template <typename Ours>
bool CloseInboxOf(int fd, Ours ours) {
  Mapping m = Mapping::Map(fd, kShmPage, 0);
  if (m.get() == nullptr) return false;
  InboxFixed f;
  std::memcpy(&f, m.get(), sizeof f);
  if (f.magic != kInboxMagic || !ours(f.owner_pid)) return false;
  m.Reset();
  MarkInboxClosed(fd);
  return true;
}

// Whether every member of the group file open as g.fd is one of `ours`; if so, marks it closed.
// live_ours: our entries are given back first.
template <typename Ours>
bool CloseGroupOf(GroupFile& g, Ours ours, bool live_ours) {
  if (!MapGroupFile(&g)) return false;
  if (live_ours) {
    // This process's transports are not used again: give their entries back first, so that a
    // member leaving meanwhile sees them gone and removes the file if this does not
    // (ShmGroupMember::TakeAlone; one of the two sees the other's release).
    bool gave_back = false;
    for (uint32_t e = 0; e < kGroupMembers; ++e) {
      auto state = MemberState(g.header(), e);
      uint64_t word = state.load(std::memory_order_acquire);
      if (word != 0 && ours(static_cast<uint32_t>(word)) &&
          state.compare_exchange_strong(word, 0, std::memory_order_acq_rel)) {
        gave_back = true;
      }
    }
    if (gave_back) g.BumpVersion();
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  for (uint32_t e = 0; e < kGroupMembers; ++e) {
    const uint64_t s = MemberState(g.header(), e).load(std::memory_order_acquire);
    if (s != 0 && !ours(static_cast<uint32_t>(s))) return false;
  }
  g.MarkClosed();
  return true;
}

// RemoveShmFilesLeftBy and RemoveOwnShmFiles. live_ours: the files may be held by live
// transports of this process (pids is this process), which the lock test would take for others'.
size_t RemoveShmFilesOf(const std::string& dir, const std::vector<uint32_t>& pids, bool live_ours) {
  auto ours = [&](uint32_t pid) { return std::find(pids.begin(), pids.end(), pid) != pids.end(); };
  size_t removed = 0;
  for (const std::string& name : ShmFileNames(dir)) {
    const std::string path = dir + "/" + name;
    uint64_t bytes = 0;
    Fd fd = OpenOwnFile(path, &bytes);
    if (fd.get() < 0) continue;
    // Held by a live transport (an inbox's owner holds LOCK_EX, a group's members LOCK_SH), or
    // replaced meanwhile: not ours to remove. (Released when fd closes.)
    if (!live_ours && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;
    if (!SameFile(path, fd.get())) continue;
    GroupFile group;  // (holds the descriptor, and with it the lock, until the unlink)
    bool closed = false;
    if (name[0] == 'i') {
      closed = CloseInboxOf(fd.get(), ours);
    } else {
      group.fd = std::move(fd);
      closed = CloseGroupOf(group, ours, live_ours);
    }
    if (closed && ::unlink(path.c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace

size_t RemoveShmFilesLeftBy(const std::string& dir, const std::vector<uint32_t>& pids) {
  return RemoveShmFilesOf(dir, pids, /*live_ours=*/false);
}

size_t RemoveOwnShmFiles(const std::string& dir) {
  // Waits for the files being made (named by now, or gone) and stops any more.
  ShmCreationLock creation;
  creation.Stop();
  return RemoveShmFilesOf(dir, {static_cast<uint32_t>(::getpid())}, /*live_ours=*/true);
}

}  // namespace switchml::transport
