#include "control/streams.h"

#include <utility>

#include "control/duration_text.h"

namespace switchml::control {

void Streams::Open(uint64_t ticket, const CallLimits::Charge& charge, End end, TimePoint now) {
  opened_[ticket] = Opened{charge, std::move(end), now};
}

bool Streams::DropOpened(uint64_t ticket) {
  auto it = opened_.find(ticket);
  if (it == opened_.end()) return false;
  limits_->Release(it->second.charge, ticket);
  opened_.erase(it);
  return true;
}

void Streams::EndOpened(uint64_t ticket, const Status& why, Deferred& deferred) {
  auto it = opened_.find(ticket);
  if (it == opened_.end()) return;
  limits_->Release(it->second.charge, ticket);
  deferred.push_back([end = std::move(it->second.end), why] { end(why); });
  opened_.erase(it);
}

void Streams::EndSilent(TimePoint now, std::chrono::milliseconds timeout, Deferred& deferred) {
  const Status why = DeadlineExceededError("no first message (AttachRequest) within " +
                                           FormatTimeout(timeout) + " of opening the stream");
  for (auto it = opened_.begin(); it != opened_.end();) {
    auto next = std::next(it);
    if (now - it->second.since >= timeout) EndOpened(it->first, why, deferred);
    it = next;
  }
}

void Streams::Attach(uint64_t ticket, Attached stream) { attached_[ticket] = std::move(stream); }

const Streams::Attached* Streams::Find(uint64_t ticket) const {
  auto it = attached_.find(ticket);
  return it == attached_.end() ? nullptr : &it->second;
}

std::optional<Streams::Attached> Streams::Detach(uint64_t ticket) {
  auto it = attached_.find(ticket);
  if (it == attached_.end()) return std::nullopt;
  limits_->Release(it->second.charge, ticket);
  Attached stream = std::move(it->second);
  attached_.erase(it);
  return stream;
}

void Streams::EndAttached(const std::vector<uint64_t>& tickets, const Status& why,
                          Deferred& deferred) {
  for (uint64_t ticket : tickets) {
    std::optional<Attached> stream = Detach(ticket);
    if (!stream) continue;
    deferred.push_back([end = std::move(stream->end), why] { end(why); });
  }
}

void Streams::Confirm(const std::vector<uint64_t>& tickets, uint64_t allreduce,
                      Deferred& deferred) const {
  for (uint64_t ticket : tickets) {
    const Attached* stream = Find(ticket);
    if (stream == nullptr || !stream->checked) continue;
    deferred.push_back([f = stream->checked, allreduce] { f(allreduce); });
  }
}

void Streams::EndAll(const Status& why, Deferred& deferred) {
  for (auto& [ticket, s] : attached_) {
    deferred.push_back([end = std::move(s.end), why] { end(why); });
  }
  attached_.clear();
  for (auto& [ticket, p] : opened_) {
    deferred.push_back([end = std::move(p.end), why] { end(why); });
  }
  opened_.clear();
}

}  // namespace switchml::control
