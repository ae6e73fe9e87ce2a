// Streams: the worker streams (Session.Attach, docs/protocol.md 4.2) the registry holds. A stream
// is opened (counted as a stranger's call until its first message), then attached as one rank of
// a job (a member's), and ends once: with the job (failed, closed, removed), when it is evicted
// or sends no first message in time, or when the registry shuts down; a confirmed all-reduce
// check is fanned out to the attached streams of its job.
//
// Not thread-safe: the Registry calls it under its lock. Callbacks are never run here: they go to
// the caller's `deferred`. Each stream holds its charge (CallLimits), released when it leaves.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/call_limits.h"
#include "control/deferred.h"
#include "switchml/status.h"

namespace switchml::control {

class Streams {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // The end of a stream (always an error status: why the job ended for its worker).
  using End = std::function<void(const Status&)>;
  // A confirmed all-reduce check.
  using Checked = std::function<void(uint64_t allreduce)>;
  struct Attached {
    uint64_t job_id = 0;
    uint32_t rank = 0;
    std::string name;  // how errors name its worker
    CallLimits::Charge charge;
    End end;
    Checked checked;
  };

  // `limits`: where the streams' charges are released; not owned, outlives this.
  explicit Streams(CallLimits* limits) : limits_(limits) {}

  // The stream `ticket` was opened at `now` (admitted under `charge`), before its first message.
  void Open(uint64_t ticket, const CallLimits::Charge& charge, End end, TimePoint now);
  // Drops the opened stream `ticket` (its end does not run): whether it was waiting for its
  // first message.
  bool DropOpened(uint64_t ticket);
  // Ends the opened stream `ticket` with `why` (evicted), if it is one.
  void EndOpened(uint64_t ticket, const Status& why, Deferred& deferred);
  // Ends the opened streams that sent no first message within `timeout` of `now`.
  void EndSilent(TimePoint now, std::chrono::milliseconds timeout, Deferred& deferred);

  // The stream `ticket` is attached (its charge a member's now).
  void Attach(uint64_t ticket, Attached stream);
  const Attached* Find(uint64_t ticket) const;
  // Removes the attached stream `ticket` (the worker's side ended it: its end does not run).
  std::optional<Attached> Detach(uint64_t ticket);
  // Ends the attached streams `tickets` with `why`.
  void EndAttached(const std::vector<uint64_t>& tickets, const Status& why, Deferred& deferred);
  // Confirms all-reduce `allreduce` to the attached streams `tickets`.
  void Confirm(const std::vector<uint64_t>& tickets, uint64_t allreduce, Deferred& deferred) const;
  // Ends every stream, opened or attached, with `why` (shutdown; the charges are left to the
  // caller, who clears the limits).
  void EndAll(const Status& why, Deferred& deferred);

  size_t attached() const { return attached_.size(); }
  size_t opened() const { return opened_.size(); }

 private:
  struct Opened {
    CallLimits::Charge charge;
    End end;
    TimePoint since;
  };
  CallLimits* const limits_;
  std::unordered_map<uint64_t, Attached> attached_;
  std::unordered_map<uint64_t, Opened> opened_;
};

}  // namespace switchml::control
