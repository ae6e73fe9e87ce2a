// AllReduceChecks: one job's per-all-reduce tensor check (docs/protocol.md 4.2, Attach). Each rank
// announces all-reduce `allreduce` on its stream with its element count and data type; the check is
// agreed once every rank announced it alike, and fails the job on the first disagreement, or
// when one rank runs max_open all-reduces ahead of another. Also says, for a stuck all-reduce,
// which ranks have not started it (Session.Diagnose).
//
// A pure core: no lock, no clock, no I/O. The Registry keeps one per job, under its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "control/rank_set.h"

namespace switchml::control {

class AllReduceChecks {
 public:
  // `session_name` ("session 7") starts the texts.
  AllReduceChecks(std::string session_name, uint32_t num_workers, uint32_t max_open);

  // What an announcement did.
  struct Verdict {
    enum class Kind { kPending, kAgreed, kFailed };
    Kind kind = Kind::kPending;
    uint64_t count = 0;  // kAgreed: what every rank passed
    uint32_t dtype = 0;
    std::string failure;  // kFailed: why the job fails
  };
  // Rank `rank` (named `name` in errors: "rank 2") announced all-reduce `allreduce` (not 0) of
  // `count` elements of `dtype`. An agreed all-reduce is forgotten (newest_agreed_allreduce keeps
  // the highest).
  Verdict Announce(uint64_t allreduce, uint64_t count, uint32_t dtype, uint32_t rank,
                   const std::string& name);

  // One sentence on why all-reduce `allreduce` may be stuck: the ranks that have not announced it
  // (`closed(rank)`: those that closed the session), or that every rank has.
  std::string Describe(uint64_t allreduce, const std::function<bool(uint32_t rank)>& closed) const;

  // The highest all-reduce every rank announced alike (0: none yet).
  uint64_t newest_agreed_allreduce() const { return newest_agreed_allreduce_; }

 private:
  struct Check {
    uint64_t count = 0;
    uint32_t dtype = 0;
    std::string first;  // the rank that announced it first, named as in errors
    RankSet ranks;      // the ranks that announced it
  };
  const std::string session_name_;
  const uint32_t num_workers_;
  const uint32_t max_open_;
  std::map<uint64_t, Check> open_;  // announced by some ranks, not by all yet
  uint64_t newest_agreed_allreduce_ = 0;
};

}  // namespace switchml::control
