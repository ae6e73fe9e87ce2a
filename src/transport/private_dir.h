// Directories for a transport's lock and doorbell files that only this process's user can write
// (docs/security.md 5, "Lock and doorbell files"; issue 28, found 2 and 3).
//
// The DPDK memif doorbells and id locks and the AF_XDP interface locks lived in /tmp/switchml-dpdk
// and /tmp/switchml-xdp, mode 1777: a user who made the directory first, or planted symbolic
// links named like the files, had a root switch extend and overwrite the links' targets and
// create root files where the user chose; and a user who opened the lock files (0644) read-only
// and held flock on them kept every worker (or the switch) from starting. Now each user has a
// directory of its own: root's under /run (which only root can write), another user's under
// /tmp with the user id in its name; created 0700, then checked (through the descriptor that
// opened it) to be a directory, not a link, owned by this user and closed to everyone else, and
// refused, saying what to do, otherwise. Files are opened relative to that descriptor, never
// following a link, 0600, and refused unless they are regular files of this user. So other users
// can neither redirect nor lock them; processes of one host share them only when they run as one
// user (a switch and its workers under different users each sleep in capped naps instead of being
// rung, and their memif ids may collide: a worker then fails to connect, saying so).
#pragma once

#include <string>

#include "switchml/status.h"

namespace switchml::transport {

// The directory for `kind`'s files ("dpdk", "xdp"): `override_path` when not empty (from an
// environment variable the caller reads), else /run/switchml-KIND for root (when /run exists),
// else /tmp/switchml-KIND-UID.
std::string PrivateDirectoryPath(const std::string& kind, const std::string& override_path);

// An open directory (O_DIRECTORY | O_NOFOLLOW) that passed the checks above; closes it.
class PrivateDirectory {
 public:
  // Makes `path` (0700; its parent must exist) unless it exists, and opens and checks it.
  // `what` names the files in errors ("DPDK memif doorbell and id-lock files"); `variable` is the
  // environment variable that chooses another directory.
  static Result<PrivateDirectory> Open(const std::string& path, const std::string& what,
                                       const std::string& variable);
  PrivateDirectory(PrivateDirectory&& o) noexcept;
  PrivateDirectory& operator=(PrivateDirectory&& o) noexcept;
  PrivateDirectory(const PrivateDirectory&) = delete;
  PrivateDirectory& operator=(const PrivateDirectory&) = delete;
  ~PrivateDirectory();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  // Opens (or creates, 0600) the regular file `name` in the directory: never through a link,
  // and refused unless it is a regular file of this user. `flags`: O_RDONLY or O_RDWR (O_CREAT,
  // O_NOFOLLOW and O_CLOEXEC are added). Returns the descriptor (the caller closes it).
  Result<int> OpenFile(const std::string& name, int flags) const;

 private:
  PrivateDirectory(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace switchml::transport
