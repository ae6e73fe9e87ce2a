#include "control/failure_marks.h"

#include <algorithm>

#include "control/registry.h"

namespace switchml::control {

bool FailureMarks::Prune(std::vector<Entry>& entries, TimePoint now) {
  const size_t before = entries.size();
  std::erase_if(entries, [&](const Entry& e) { return now - e.at > memory_; });
  count_ -= before - entries.size();
  return !entries.empty();
}

const Status* FailureMarks::Find(uint64_t job_id, const std::string& secret, TimePoint now) {
  auto it = marks_.find(job_id);
  if (it == marks_.end()) return nullptr;
  if (!Prune(it->second, now)) {
    marks_.erase(it);
    return nullptr;
  }
  for (const Entry& e : it->second) {
    if (SameSecret(e.secret, secret)) return &e.status;
  }
  return nullptr;
}

void FailureMarks::Mark(uint64_t job_id, const std::string& secret, const Status& why,
                        bool job_owner, TimePoint now) {
  for (auto it = marks_.begin(); it != marks_.end();) {
    it = Prune(it->second, now) ? std::next(it) : marks_.erase(it);
  }
  std::vector<Entry>& mine = marks_[job_id];
  const bool marked = std::any_of(mine.begin(), mine.end(),
                                  [&](const Entry& e) { return SameSecret(e.secret, secret); });
  if (!marked && (job_owner || count_ < kMaxMarks)) {
    mine.push_back(Entry{FailedPreconditionError(why.message()), secret, now});
    ++count_;
  }
  if (mine.empty()) marks_.erase(job_id);
}

void FailureMarks::Forget(uint64_t job_id) {
  auto it = marks_.find(job_id);
  if (it == marks_.end()) return;
  count_ -= it->second.size();
  marks_.erase(it);
}

}  // namespace switchml::control
