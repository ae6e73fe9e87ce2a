#include "worker/striped_session.h"

#include <algorithm>

#include "base/check.h"
#include "base/status_macros.h"
#include "worker/striping.h"

namespace switchml::worker {
namespace {

void AddCounters(const SessionCounters& c, SessionCounters* sum) {
  sum->sent += c.sent;
  sum->retransmitted += c.retransmitted;
  sum->timeouts += c.timeouts;
  sum->results += c.results;
  sum->duplicates += c.duplicates;
  sum->stale += c.stale;
  sum->foreign_slot += c.foreign_slot;
  sum->malformed += c.malformed;
  sum->rtt_samples += c.rtt_samples;
  sum->backoffs += c.backoffs;
  sum->early_retransmits += c.early_retransmits;
  sum->rtt_out_of_order += c.rtt_out_of_order;
}

}  // namespace

Status StripedSessionConfig::Validate() const {
  RETURN_IF_ERROR(session.Validate());
  if (num_hosts == 0) return InvalidArgumentError("a job needs at least one switch host");
  if (num_hosts > session.window) {
    return InvalidArgumentError(
        "a worker thread's window of " + std::to_string(session.window) +
        " slots cannot be striped over " + std::to_string(num_hosts) +
        " switch hosts: each host needs at least one slot of every thread (raise the window, or "
        "use fewer threads)");
  }
  if (generations == 0) return InvalidArgumentError("generations must be at least 1");
  if (generations > 1) {
    if (generation_stride < session.window) {
      return InvalidArgumentError("generation_stride must cover the window");
    }
    const uint64_t last = uint64_t{session.slot_start} +
                          uint64_t{generation_stride} * (generations - 1) + session.window;
    if (last > proto::kMaxSlots) {
      return InvalidArgumentError("the failover slot ranges exceed the format's slot indices");
    }
  }
  return Status();
}

StripedSession::StripedSession(const StripedSessionConfig& config) : config_(config) {
  Status st = config_.Validate();
  CHECK(st.ok()) << st.ToString();
  config_.session.keep_last_inputs = config_.generations > 1;
  for (uint32_t h = 0; h < config_.num_hosts; ++h) live_.push_back(h);
  MakeInner();
}

void StripedSession::MakeInner() {
  SessionConfig sc = config_.session;
  sc.slot_start += generation_ * config_.generation_stride;
  sc.stripes = static_cast<uint32_t>(live_.size());
  inner_ = std::make_unique<WorkerSession>(sc);
}

void StripedSession::Run(const Slice& slice, Nanos now) {
  state_ = State::kRunning;
  inner_->Start(slice, now);
  if (inner_->state() == WorkerSession::State::kDone) Advance(now);
}

void StripedSession::Start(const Slice& slice, Nanos now) {
  CHECK(state_ != State::kRunning) << "Start() while running";
  status_ = Status();
  user_slice_ = slice;
  user_active_ = true;
  non_finite_ = false;
  phase_ = Phase::kUser;
  Run(slice, now);
}

void StripedSession::HandleDatagram(std::span<const uint8_t> datagram, Nanos now) {
  inner_->HandleDatagram(datagram, now);
  if (state_ == State::kRunning && inner_->state() == WorkerSession::State::kDone) Advance(now);
}

void StripedSession::HandleTimeout(Nanos now) {
  inner_->HandleTimeout(now);
  if (state_ == State::kRunning && inner_->state() == WorkerSession::State::kDone) Advance(now);
}

void StripedSession::Abort(Status status) {
  if (state_ != State::kRunning) return;
  inner_->Abort(status);
  Fail(std::move(status));
}

void StripedSession::Fail(Status status) {
  state_ = State::kDone;
  status_ = std::move(status);
  phase_ = Phase::kUser;
  user_active_ = false;
  progress_ = LaneProgress{};
  staging_.clear();
}

std::optional<uint32_t> StripedSession::NextTransmitHost() {
  const std::optional<uint32_t> slot = inner_->NextTransmitSlot();
  if (!slot) return std::nullopt;
  if (live_.size() == 1) return live_[0];
  const uint32_t k = static_cast<uint32_t>(live_.size());
  return live_[StripeOfSlot(*slot, inner_->config().window, k)];
}

size_t StripedSession::PollTransmit(Nanos now, std::span<uint8_t> buf) {
  return inner_->PollTransmit(now, buf);
}

SessionCounters StripedSession::counters() const {
  SessionCounters c = inner_->counters();
  AddCounters(past_, &c);
  return c;
}

Status StripedSession::Failover(uint32_t host, Nanos now) {
  auto it = std::find(live_.begin(), live_.end(), host);
  if (it == live_.end()) return Status();  // moved off it already
  const std::string which = "switch host " + std::to_string(host);
  auto refuse = [&](Status why) {
    if (state_ == State::kRunning) {
      inner_->Abort(why);
      Fail(why);
    }
    return why;
  };
  if (phase_ != Phase::kUser) {
    return refuse(UnavailableError(which + " died while this worker thread was still moving off " +
                                   failed_host_ +
                                   ": the job cannot recover from two failures this "
                                   "close together"));
  }
  if (live_.size() == 1) {
    return refuse(UnavailableError(which + " died and it was the job's last switch host"));
  }
  if (generation_ + 1 >= config_.generations) {
    return refuse(UnavailableError(
        which +
        " died and the job has no unused slot range left to move to (each failover "
        "takes a fresh range of the job's window on every host: a smaller window leaves "
        "room for more)"));
  }
  live_.erase(it);
  failed_host_ = which;
  // What this worker has, then a fresh session on the next generation's slots.
  progress_ = inner_->Progress();
  if (!user_active_ || state_ != State::kRunning) {
    progress_.current.reset();  // a finished slice is `previous`, not under way
    progress_.current_done.clear();
    user_active_ = false;
  }
  if (progress_.current_non_finite) non_finite_ = true;
  AddCounters(inner_->counters(), &past_);
  ++generation_;
  MakeInner();
  ++failover_counters_.failovers;
  status_ = Status();
  agreement_ = EncodeAgreement(progress_);
  phase_ = Phase::kAgreement;
  Slice slice;
  slice.allreduce = kAgreementAllReduce;
  slice.dtype = DataType::kInt32;
  slice.in = slice.out = agreement_.data();
  slice.count = agreement_.size();
  Run(slice, now);
  return Status();
}

void StripedSession::Advance(Nanos now) {
  const Status st = inner_->status();
  // Non-finite float values are the caller's, not a protocol failure: the slice completed.
  if (!st.ok() && !(st.code() == StatusCode::kInvalidArgument && phase_ != Phase::kAgreement)) {
    Fail(phase_ == Phase::kUser
             ? st
             : Status(st.code(), "moving off " + failed_host_ + " failed: " + st.message()));
    return;
  }
  if (!st.ok()) non_finite_ = true;
  switch (phase_) {
    case Phase::kUser:
      state_ = State::kDone;
      status_ = st;
      user_active_ = false;
      return;
    case Phase::kAgreement: {
      Result<RepairPlan> plan = PlanRepair(progress_, agreement_, config_.session.num_workers);
      if (!plan.ok()) {
        Fail(plan.status());
        return;
      }
      plan_ = std::move(*plan);
      if (plan_.staged.empty()) {
        AfterStaging(now);
        return;
      }
      staging_.resize(StagingBytes(plan_, progress_));
      FillStaging(plan_, progress_, staging_);
      failover_counters_.blocks_staged += plan_.staged.size();
      const SliceLayout& s =
          plan_.slice == RepairPlan::Slice::kCurrent ? *progress_.current : *progress_.previous;
      Slice slice;
      slice.allreduce = kStagingAllReduce;
      slice.dtype = s.dtype;
      slice.in = slice.out = staging_.data();
      slice.count = plan_.staged.size() * progress_.numel;
      slice.element_offset = s.element_offset;
      phase_ = Phase::kStaging;
      Run(slice, now);
      return;
    }
    case Phase::kStaging:
      ScatterStaging(plan_, progress_, staging_);
      staging_.clear();
      staging_.shrink_to_fit();
      AfterStaging(now);
      return;
    case Phase::kTail:
      AfterRepair(now);
      return;
  }
}

void StripedSession::AfterStaging(Nanos now) {
  if (plan_.slice == RepairPlan::Slice::kCurrent && plan_.tail_start < progress_.current->blocks) {
    const SliceLayout& s = *progress_.current;
    const size_t first = plan_.tail_start * progress_.numel;
    Slice slice;
    slice.allreduce = s.allreduce;
    slice.dtype = s.dtype;
    slice.in = static_cast<const uint8_t*>(s.in) + 4 * first;
    slice.out = static_cast<uint8_t*>(s.out) + 4 * first;
    slice.count = s.count - first;
    slice.element_offset = s.element_offset + first;
    failover_counters_.blocks_tail += s.blocks - plan_.tail_start;
    phase_ = Phase::kTail;
    Run(slice, now);
    return;
  }
  AfterRepair(now);
}

void StripedSession::AfterRepair(Nanos now) {
  phase_ = Phase::kUser;
  const bool completes = plan_.current_completes;
  progress_ = LaneProgress{};
  plan_ = RepairPlan{};
  if (!user_active_) {  // a failover while idle, or of a slice finished already
    state_ = State::kDone;
    status_ = Status();
    return;
  }
  if (completes) {
    state_ = State::kDone;
    user_active_ = false;
    status_ =
        non_finite_
            ? InvalidArgumentError("input contains inf or NaN in elements [" +
                                   std::to_string(user_slice_.element_offset) + ", " +
                                   std::to_string(user_slice_.element_offset + user_slice_.count) +
                                   ") on at least one worker; the affected outputs are set to NaN")
            : Status();
    return;
  }
  ++failover_counters_.slices_restarted;
  non_finite_ = false;
  Run(user_slice_, now);
}

}  // namespace switchml::worker
