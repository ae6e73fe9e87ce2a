#include "control/allreduce_checks.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "switchml/types.h"

namespace switchml::control {
namespace {

std::string TypeName(uint32_t dtype) {
  return dtype <= static_cast<uint32_t>(DataType::kFloat32)
             ? DataTypeName(static_cast<DataType>(dtype))
             : "type " + std::to_string(dtype);
}

}  // namespace

AllReduceChecks::AllReduceChecks(std::string session_name, uint32_t num_workers, uint32_t max_open)
    : session_name_(std::move(session_name)), num_workers_(num_workers), max_open_(max_open) {}

AllReduceChecks::Verdict AllReduceChecks::Announce(uint64_t allreduce, uint64_t count,
                                                   uint32_t dtype, uint32_t rank,
                                                   const std::string& name) {
  Verdict v;
  auto c = open_.find(allreduce);
  if (c == open_.end()) {
    if (open_.size() >= max_open_) {
      v.kind = Verdict::Kind::kFailed;
      v.failure = session_name_ + " failed: " + name + " is " + std::to_string(max_open_) +
                  " all-reduces ahead of another rank";
      return v;
    }
    c = open_.emplace(allreduce, Check{count, dtype, name, {}}).first;
  } else if (c->second.count != count || c->second.dtype != dtype) {
    const Check& first = c->second;
    v.kind = Verdict::Kind::kFailed;
    v.failure = session_name_ + " failed: all-reduce " + std::to_string(allreduce) +
                " does not match across workers: " + first.first + " passed " +
                std::to_string(first.count) + " " + TypeName(first.dtype) + " elements, " + name +
                " " + std::to_string(count) + " " + TypeName(dtype) +
                " elements; every worker must all-reduce the same count and data type, in the "
                "same order";
    return v;
  }
  c->second.ranks.set(rank);
  if (c->second.ranks.count() == num_workers_) {
    v.kind = Verdict::Kind::kAgreed;
    v.count = c->second.count;
    v.dtype = c->second.dtype;
    open_.erase(c);
    newest_agreed_allreduce_ = std::max(newest_agreed_allreduce_, allreduce);
  }
  return v;
}

std::string AllReduceChecks::Describe(uint64_t allreduce,
                                      const std::function<bool(uint32_t rank)>& closed) const {
  const std::string what = "all-reduce " + std::to_string(allreduce) + " of " + session_name_;
  auto c = open_.find(allreduce);
  if (c == open_.end()) {
    if (allreduce != 0 && allreduce <= newest_agreed_allreduce_) {
      return "every rank started " + what +
             ", so its packets or results are being lost: check that every worker reaches the "
             "switch's data port and back (addresses, firewalls, MTU)";
    }
    return "no rank announced " + what +
           " to the switch (tensor checks off?): it cannot tell which rank is missing";
  }
  std::vector<uint32_t> started, missing, gone;
  for (uint32_t r = 0; r < num_workers_; ++r) {
    if (c->second.ranks.test(r)) {
      started.push_back(r);
    } else if (closed(r)) {
      gone.push_back(r);
    } else {
      missing.push_back(r);
    }
  }
  std::string text = what + ": ";
  if (!missing.empty()) {
    text += RankList(missing) + (missing.size() == 1 ? " has" : " have") + " not started it";
  }
  if (!gone.empty()) {
    text += std::string(missing.empty() ? "" : "; ") + RankList(gone) +
            " closed the session without starting it";
  }
  return text + " (" + RankList(started) + (started.size() == 1 ? " has" : " have") + ")";
}

}  // namespace switchml::control
