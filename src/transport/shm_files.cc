#include "transport/shm_files.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

namespace switchml::transport {

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void Fd::Close(int fd) { ::close(fd); }

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    Reset();
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void Mapping::Unmap(uint8_t* base, size_t bytes) { ::munmap(base, bytes); }

Mapping Mapping::Map(int fd, size_t bytes, off_t offset) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
  if (p == MAP_FAILED) return Mapping();
  return Mapping(static_cast<uint8_t*>(p), bytes);
}

namespace {
struct Creation {
  std::mutex mu;
  bool stopped = false;  // guarded by mu
};
Creation& TheCreation() {
  static Creation c;
  return c;
}
}  // namespace

ShmCreationLock::ShmCreationLock() : lock_(TheCreation().mu) {}

bool ShmCreationLock::stopped() const { return TheCreation().stopped; }

void ShmCreationLock::Stop() { TheCreation().stopped = true; }

Status ShmCreationLock::Check(const std::string& what) const {
  if (!stopped()) return Status();
  return UnavailableError("cannot make " + what +
                          ": this process is stopping (its shm files were removed)");
}

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

bool OwnFileBytes(int fd, uint64_t* bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      static_cast<uint64_t>(st.st_size) < kShmPage) {
    return false;
  }
  *bytes = static_cast<uint64_t>(st.st_size);
  return true;
}

Fd OpenOwnFile(const std::string& path, uint64_t* bytes) {
  Fd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return fd;
  if (!OwnFileBytes(fd.get(), bytes)) {
    fd.Reset();
    errno = 0;
  }
  return fd;
}

namespace {

// A one-byte OFD lock request of type `type` on `byte`.
struct flock ByteLock(short type, off_t byte) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = byte;
  l.l_len = 1;
  return l;
}

}  // namespace

bool LockByte(int fd, off_t byte) {
  struct flock l = ByteLock(F_WRLCK, byte);
  return ::fcntl(fd, F_OFD_SETLK, &l) == 0;
}

void UnlockByte(int fd, off_t byte) {
  struct flock l = ByteLock(F_UNLCK, byte);
  ::fcntl(fd, F_OFD_SETLK, &l);
}

bool ByteLocked(int fd, off_t byte) {
  struct flock l = ByteLock(F_WRLCK, byte);
  if (::fcntl(fd, F_OFD_GETLK, &l) != 0) return true;
  return l.l_type != F_UNLCK;
}

void FutexWait(uint32_t* word, uint32_t expected, const struct timespec* timeout) {
  ::syscall(SYS_futex, word, FUTEX_WAIT, expected, timeout, nullptr, 0);
}

void FutexWake(uint32_t* word, int waiters) {
  ::syscall(SYS_futex, word, FUTEX_WAKE, waiters, nullptr, nullptr, 0);
}

bool ProcessAlive(uint32_t pid) {
  if (pid == 0 || pid > static_cast<uint32_t>(INT_MAX)) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

bool InboxHeld(int fd) {
  if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {  // nobody holds LOCK_EX
    ::flock(fd, LOCK_UN);
    return false;
  }
  return true;
}

TransportCounters ShmCounters::Snapshot() const {
  TransportCounters c = io.Snapshot();
  c.malformed = malformed.Get();
  c.doorbells = doorbells.Get();
  c.sent_in_place = sent_in_place.Get();
  c.group_datagrams_received = group_received.Get();
  return c;
}

}  // namespace switchml::transport
