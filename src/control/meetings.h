// Meetings: the rendezvous of Barrier and Broadcast calls (docs/protocol.md 4.6). A scope
// (kind, job id and secret; an unscoped one by its worker count) has at most one meeting
// filling at a time; a meeting completes when num_workers calls arrived, and every call of it
// returns (Broadcast: with the root's value). Calls that mean the job cannot come together (a
// num_workers mismatch, a rank twice) fail the whole meeting; a call that leaves (its client went
// away, its deadline came) withdraws its arrival, and one whose deadline came is told which ranks
// did not arrive.
//
// Not thread-safe: the Registry calls it under its lock. Callbacks are never run here: they go
// to the caller's `deferred`, or are returned, to be run once the lock is released. Each waiting
// call holds its charge (CallLimits), released when it stops waiting.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/call_limits.h"
#include "control/deferred.h"
#include "control/error_reason.h"
#include "switchml/status.h"

namespace switchml::control {

struct SyncRequest;  // registry.h

class Meetings {
 public:
  // A call's completion (Registry::SyncDone): its status, the reason beside it, a Broadcast's
  // value.
  using Done = std::function<void(const Status&, ErrorReason reason, uint64_t value)>;
  using Deferred = control::Deferred;
  using TimePoint = std::chrono::steady_clock::time_point;

  // `limits`: where the waiting calls' charges are released; not owned, outlives this.
  explicit Meetings(CallLimits* limits);
  ~Meetings();

  // The call `ticket` (a valid request, admitted under `charge`; `scope` names its meeting in
  // errors) joins the meeting of its scope at `now`. OK: it waits (`done` moved in), or it
  // completed the meeting (every call's completion, its own included, goes to `deferred`). Else
  // the refusal: its charge is released and `done` is left to the caller; *whole_meeting then says
  // that the job cannot come together, and the caller fails the meeting (FailMeetingOf) and the
  // session.
  Status Join(uint64_t ticket, const SyncRequest& request, const std::string& scope,
              const CallLimits::Charge& charge, Done& done, TimePoint now, Deferred& deferred,
              bool* whole_meeting);
  // Fails the meeting `request` would join, if there is one.
  void FailMeetingOf(const SyncRequest& request, const Status& why, Deferred& deferred);
  // Fails every meeting of `job_id` with `secret`.
  void FailSession(uint64_t job_id, const std::string& secret, const Status& why,
                   Deferred& deferred);
  // Fails every meeting (shutdown).
  void FailAll(const Status& why, Deferred& deferred);
  // The call `ticket` leaves its meeting (the meeting goes too once no call waits in it): its
  // completion, to be run by the caller; null when it does not wait.
  Done Leave(uint64_t ticket);
  // The call's deadline is about to pass (Registry::ExpireWait): it leaves as Leave does, and
  // *why is DEADLINE_EXCEEDED naming the ranks that did not arrive by `now`. A ranked call counts
  // as having come and gone for the meeting's later expiries.
  Done Expire(uint64_t ticket, TimePoint now, Status* why);

  size_t waiting() const { return waits_.size(); }

 private:
  struct Key {
    bool broadcast;
    uint64_t job_id;
    uint32_t unscoped_num_workers;
    std::string secret;
    auto operator<=>(const Key&) const = default;
  };
  struct Meeting;
  struct Wait;
  using MeetingsByKey = std::map<Key, std::shared_ptr<Meeting>>;

  static Key KeyOf(const SyncRequest& request);
  void FailMeeting(MeetingsByKey::iterator it, const Status& why, Deferred& deferred);
  // Why a waiting call's meeting did not come together: the ranks missing from it, when every
  // waiting call sent its rank, else how many workers are missing.
  static std::string MissingText(const Wait& wait, TimePoint now);

  CallLimits* const limits_;
  MeetingsByKey meetings_;
  std::unordered_map<uint64_t, std::unique_ptr<Wait>> waits_;
};

}  // namespace switchml::control
