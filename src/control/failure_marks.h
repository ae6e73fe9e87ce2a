// FailureMarks: the sessions marked failed (docs/protocol.md 4.5), so that their sync calls fail
// fast, for failure_memory, with the first reason. A mark holds for callers with its secret only:
// a stranger's mark (another secret than the job's) never takes the place of the job's own and
// only its own calls see it. Marks without a job of their own are bounded (kMaxMarks).
//
// Not thread-safe: the Registry calls it under its lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "switchml/status.h"

namespace switchml::control {

class FailureMarks {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // Marks kept besides the jobs' own (they only affect callers with the same secret, so they are
  // bounded, not needed).
  static constexpr size_t kMaxMarks = 4096;

  explicit FailureMarks(std::chrono::milliseconds memory) : memory_(memory) {}

  // The failure a caller with `secret` sees for `job_id` at `now`, or null.
  const Status* Find(uint64_t job_id, const std::string& secret, TimePoint now);
  // Marks `job_id` failed with `why` (as FAILED_PRECONDITION) for callers with `secret`,
  // unless it is marked for them already. `job_owner`: the mark of the session's job (its
  // secret), always kept; any other only within kMaxMarks.
  void Mark(uint64_t job_id, const std::string& secret, const Status& why, bool job_owner,
            TimePoint now);
  // Forgets the session's marks (rank 0 opened it again).
  void Forget(uint64_t job_id);

 private:
  struct Entry {
    Status status;
    std::string secret;
    TimePoint at;
  };
  // Drops a session's marks older than memory_; whether any is left.
  bool Prune(std::vector<Entry>& entries, TimePoint now);

  const std::chrono::milliseconds memory_;
  std::unordered_map<uint64_t, std::vector<Entry>> marks_;
  size_t count_ = 0;
};

}  // namespace switchml::control
