#include "control/meetings.h"

#include <algorithm>
#include <utility>

#include "control/duration_text.h"
#include "control/rank_set.h"
#include "control/registry.h"

namespace switchml::control {
namespace {

// "300 ms", "2.5 s": FormatTimeout of the time, to a tenth of a second from 1 s on.
std::string WaitedText(std::chrono::steady_clock::duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d);
  return FormatTimeout(ms < std::chrono::seconds(1) ? ms : ms - ms % 100);
}

}  // namespace

struct Meetings::Meeting {
  uint32_t num_workers = 0;
  uint32_t arrived = 0;
  RankSet ranks;  // the ranks waiting (of the calls that sent one)
  // Ranks that waited in this meeting and timed out (Expire) while others still wait: they did
  // arrive, so a later expiry does not call them missing.
  RankSet gave_up;
  uint32_t root = 0;
  uint64_t value = 0;
  std::vector<uint64_t> waiters;  // tickets
};

struct Meetings::Wait {
  Key key;
  std::shared_ptr<Meeting> meeting;
  bool has_rank = false;
  uint32_t rank = 0;
  CallLimits::Charge charge;
  Done done;
  std::string scope;  // "barrier of session 7", as the registry's errors name the meeting
  TimePoint since;
};

Meetings::Meetings(CallLimits* limits) : limits_(limits) {}
Meetings::~Meetings() = default;

Meetings::Key Meetings::KeyOf(const SyncRequest& q) {
  return Key{q.broadcast, q.job_id, q.job_id == 0 ? q.num_workers : 0, q.secret};
}

Status Meetings::Join(uint64_t ticket, const SyncRequest& q, const std::string& scope,
                      const CallLimits::Charge& charge, Done& done, TimePoint now,
                      Deferred& deferred, bool* whole_meeting) {
  const Key key = KeyOf(q);
  std::shared_ptr<Meeting>& slot = meetings_[key];
  if (!slot) {
    slot = std::make_shared<Meeting>();
    slot->num_workers = q.num_workers;
    slot->root = q.root;
  }
  const std::shared_ptr<Meeting> meeting = slot;
  const bool ranked = q.broadcast || q.has_rank;
  // A refusal that means the job cannot come together fails the whole meeting (and session);
  // another refuses only this call.
  *whole_meeting = false;
  Status st;
  if (meeting->num_workers != q.num_workers) {
    *whole_meeting = true;
    // The job cannot come together: fail the waiting workers too (and, for a session, every
    // later call of it), instead of leaving them to time out.
    st = InvalidArgumentError(scope + ": num_workers " + std::to_string(q.num_workers) +
                              " of one worker does not match the " +
                              std::to_string(meeting->num_workers) +
                              " of another: start every worker with the same --workers");
  } else if (q.broadcast && meeting->root != q.root) {
    st = InvalidArgumentError(scope + ": root " + std::to_string(q.root) + " does not match the " +
                              std::to_string(meeting->root) + " of the workers already waiting");
  } else if (ranked && meeting->ranks.test(q.rank)) {
    *whole_meeting = true;
    st = InvalidArgumentError(scope + ": rank " + std::to_string(q.rank) +
                              " is already waiting in this round: two workers have the same "
                              "rank");
  }
  if (!st.ok()) {
    limits_->Release(charge, ticket);
    if (!*whole_meeting && meeting->arrived == 0) meetings_.erase(key);
    return st;
  }
  if (ranked) {
    meeting->ranks.set(q.rank);
    meeting->gave_up.reset(q.rank);
  }
  if (q.broadcast && q.rank == q.root) meeting->value = q.value;
  if (++meeting->arrived == meeting->num_workers) {
    meetings_.erase(key);
    for (uint64_t t : meeting->waiters) {
      auto w = waits_.find(t);
      if (w == waits_.end()) continue;
      limits_->Release(w->second->charge, t);
      deferred.push_back([d = std::move(w->second->done), v = meeting->value] {
        d(Status::Ok(), ErrorReason::kNone, v);
      });
      waits_.erase(w);
    }
    limits_->Release(charge, ticket);
    deferred.push_back(
        [d = std::move(done), v = meeting->value] { d(Status::Ok(), ErrorReason::kNone, v); });
    return Status::Ok();
  }
  auto wait = std::make_unique<Wait>();
  wait->key = key;
  wait->meeting = meeting;
  wait->has_rank = ranked;
  wait->rank = q.rank;
  wait->charge = charge;
  wait->done = std::move(done);
  wait->scope = scope;
  wait->since = now;
  waits_[ticket] = std::move(wait);
  meeting->waiters.push_back(ticket);
  return Status::Ok();
}

void Meetings::FailMeeting(MeetingsByKey::iterator it, const Status& why, Deferred& deferred) {
  for (uint64_t ticket : it->second->waiters) {
    auto w = waits_.find(ticket);
    if (w == waits_.end()) continue;
    limits_->Release(w->second->charge, ticket);
    deferred.push_back(
        [done = std::move(w->second->done), why] { done(why, ErrorReason::kNone, 0); });
    waits_.erase(w);
  }
  meetings_.erase(it);
}

void Meetings::FailMeetingOf(const SyncRequest& q, const Status& why, Deferred& deferred) {
  if (auto it = meetings_.find(KeyOf(q)); it != meetings_.end()) FailMeeting(it, why, deferred);
}

void Meetings::FailSession(uint64_t job_id, const std::string& secret, const Status& why,
                           Deferred& deferred) {
  for (auto it = meetings_.begin(); it != meetings_.end();) {
    auto next = std::next(it);
    if (it->first.job_id == job_id && SameSecret(it->first.secret, secret)) {
      FailMeeting(it, why, deferred);
    }
    it = next;
  }
}

void Meetings::FailAll(const Status& why, Deferred& deferred) {
  while (!meetings_.empty()) FailMeeting(meetings_.begin(), why, deferred);
}

Meetings::Done Meetings::Leave(uint64_t ticket) {
  auto w = waits_.find(ticket);
  if (w == waits_.end()) return nullptr;
  Wait& wait = *w->second;
  Meeting& meeting = *wait.meeting;
  --meeting.arrived;
  if (wait.has_rank) meeting.ranks.reset(wait.rank);
  std::erase(meeting.waiters, ticket);
  if (meeting.arrived == 0) {
    if (auto it = meetings_.find(wait.key); it != meetings_.end() && it->second == wait.meeting) {
      meetings_.erase(it);
    }
  }
  limits_->Release(wait.charge, ticket);
  Done done = std::move(wait.done);
  waits_.erase(w);
  return done;
}

Meetings::Done Meetings::Expire(uint64_t ticket, TimePoint now, Status* why) {
  auto w = waits_.find(ticket);
  if (w == waits_.end()) return nullptr;
  *why = DeadlineExceededError(MissingText(*w->second, now));
  if (w->second->has_rank) w->second->meeting->gave_up.set(w->second->rank);
  return Leave(ticket);
}

std::string Meetings::MissingText(const Wait& wait, TimePoint now) {
  const Meeting& meeting = *wait.meeting;
  const std::string waited = WaitedText(now - wait.since);
  const uint32_t n = meeting.num_workers;
  // (An unscoped meeting's name already says how many workers: "unscoped barrier of 4 workers".)
  std::string text =
      wait.scope + (wait.key.job_id == 0 ? "" : " (" + std::to_string(n) + " workers)") + ": ";
  // (The whole sentence is the switch's: a client passes it on as it is, ErrorReason
  // kRoundExpired, and so does a top-of-rack switch on its way.)
  constexpr const char* kAskWhy = ": did it fail or start with other arguments?";
  if (meeting.ranks.count() != meeting.arrived) {
    // A call without its rank (a reference client's Barrier): only the count is known.
    return text + std::to_string(n - meeting.arrived) + " of " + std::to_string(n) +
           " workers did not arrive within " + waited + kAskWhy;
  }
  std::vector<uint32_t> missing, waiting, gave_up;
  for (uint32_t r = 0; r < n; ++r) {
    if (meeting.ranks.test(r)) {
      waiting.push_back(r);
    } else if (meeting.gave_up.test(r)) {
      gave_up.push_back(r);
    } else {
      missing.push_back(r);
    }
  }
  if (missing.empty()) {
    // Every rank came, but not within one another's timeouts.
    return text + "every rank arrived, but not together: " + RankList(gave_up) +
           " timed out before " + RankList(waiting) + " came (waited " + waited +
           "): start the workers within each other's timeout";
  }
  text +=
      RankList(missing) + " did not arrive within " + waited + " (waiting: " + RankList(waiting);
  if (!gave_up.empty()) text += "; arrived and timed out: " + RankList(gave_up);
  return text + ")" + kAskWhy;
}

}  // namespace switchml::control
