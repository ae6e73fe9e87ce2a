// What the pieces of the shm transport (shm.h) share: owned descriptors and mappings, the checks
// every file of the directory passes before it is mapped, byte locks, the futex, and the
// transport's counters. Internal to src/transport.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "switchml/status.h"
#include "transport/transport.h"

namespace switchml::transport {

inline constexpr size_t kShmPage = 4096;
inline constexpr size_t kShmMaxDatagram = 65507;  // as UDP's

std::string ErrnoText(int err);

// An owned file descriptor (closed on destruction).
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) Close(fd_);
    fd_ = -1;
  }

 private:
  static void Close(int fd);
  int fd_;
};

// An owned shared read-write mapping (unmapped on destruction).
class Mapping {
 public:
  Mapping() = default;
  Mapping(uint8_t* base, size_t bytes) : base_(base), bytes_(bytes) {}
  Mapping(Mapping&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept;
  ~Mapping() { Reset(); }
  uint8_t* get() const { return base_; }
  void Reset() {
    if (base_ != nullptr) Unmap(base_, bytes_);
    base_ = nullptr;
  }

  // `bytes` of fd from `offset`, shared; a null mapping when mmap fails.
  static Mapping Map(int fd, size_t bytes, off_t offset);

 private:
  static void Unmap(uint8_t* base, size_t bytes);
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
};

// Makes dir (0700) if it is missing; refuses one that is not a directory of ours closed to others.
Status EnsureDirectory(const std::string& dir);

// Whether path names the file open as fd.
bool SameFile(const std::string& path, int fd);

// Whether fd is a regular file of this user of at least a page; *bytes: its size.
bool OwnFileBytes(int fd, uint64_t* bytes);

// Opens path read-write without following a link; the descriptor, if it is a regular file of
// this user of at least a page (*bytes: its size), else an invalid one (errno from open when it
// failed there, else 0).
Fd OpenOwnFile(const std::string& path, uint64_t* bytes);

// This process makes its shm files (inboxes, group files) under one lock, which
// RemoveOwnShmFiles takes too: a process stopped by a signal then removes every file it made,
// none of them half made (still under its temporary name, which the removal does not look for,
// or named just after the removal looked), and makes none afterwards. Process-wide, as that
// removal is. Hold one from before the temporary file is made until it is gone (named or
// removed).
class ShmCreationLock {
 public:
  // Waits until no other thread of this process is making a shm file.
  ShmCreationLock();
  // Whether this process's files were removed (RemoveOwnShmFiles): it makes no more.
  bool stopped() const;
  // Makes stopped() true for good (RemoveOwnShmFiles).
  void Stop();
  // UNAVAILABLE naming `what` when stopped(), else OK.
  Status Check(const std::string& what) const;

 private:
  std::unique_lock<std::mutex> lock_;
};

// One-byte OFD locks (fcntl F_OFD_*: per open file description, released when the holder closes
// the file or dies). ByteLocked: whether another description holds the byte (yes when the
// question cannot be answered: the cautious answer).
bool LockByte(int fd, off_t byte);
void UnlockByte(int fd, off_t byte);
bool ByteLocked(int fd, off_t byte);

// FUTEX_WAIT (timeout null: forever) and FUTEX_WAKE on a shared word (not FUTEX_PRIVATE).
void FutexWait(uint32_t* word, uint32_t expected, const struct timespec* timeout);
void FutexWake(uint32_t* word, int waiters);

// Whether a process of that pid exists (in our pid namespace).
bool ProcessAlive(uint32_t pid);

// Whether the inbox open as fd has a live owner: its transport holds LOCK_EX on it (flock) from
// creation until it closes or dies, so a shared lock cannot be had (one that can is let go).
bool InboxHeld(int fd);

// The destinations of one kind (inboxes, groups) that a transport sends to, as Send and lending
// see them: those the current Send wrote to (touched: to publish), and those dropped while slots of
// theirs were lent in the current lending batch (kept, mapped, until the next one: the caller may
// still hold that memory). T has `bool touched` and `uint64_t lent_batch`.
template <class T>
class ShmSendSet {
 public:
  bool touched() const { return !touched_.empty(); }
  const std::vector<T*>& touched_list() const { return touched_; }
  void Touch(T* p) {
    if (p->touched) return;
    p->touched = true;
    touched_.push_back(p);
  }
  void ClearTouched() {
    for (T* p : touched_) p->touched = false;
    touched_.clear();
  }
  // Starts lending batch `batch`: those dropped while lent in the last one are let go now.
  void NewLendingBatch(uint64_t batch) {
    lending_batch_ = batch;
    retired_.clear();
  }
  void Lent(T* p) const { p->lent_batch = lending_batch_; }
  // Forgets a destination that was dropped: kept until the next batch if lent in this one.
  void Drop(std::unique_ptr<T> p) {
    touched_.erase(std::remove(touched_.begin(), touched_.end(), p.get()), touched_.end());
    if (p->lent_batch == lending_batch_ && lending_batch_ != 0) retired_.push_back(std::move(p));
  }

 private:
  std::vector<T*> touched_;
  uint64_t lending_batch_ = 0;
  std::vector<std::unique_ptr<T>> retired_;
};

// The counters of one shm transport, written by its thread (shm.h's Transport::counters()).
struct ShmCounters {
  SingleWriterTransportCounters io;
  SingleWriterCounter malformed, doorbells, sent_in_place, group_received;
  TransportCounters Snapshot() const;
};

}  // namespace switchml::transport
