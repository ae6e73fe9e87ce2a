#include "control/call_limits.h"

#include "control/registry.h"

namespace switchml::control {

CallLimits::CallLimits(const RegistryOptions& options)
    : max_calls_per_client_(options.max_calls_per_client),
      max_calls_total_(options.max_calls_total),
      max_forwarded_per_client_(options.max_forwarded_stranger_calls_per_client),
      max_forwarded_total_(options.max_forwarded_stranger_calls) {}

uint32_t CallLimits::member_calls(uint64_t job_id) const {
  auto it = member_calls_.find(job_id);
  return it == member_calls_.end() ? 0 : it->second;
}

void CallLimits::SetStrangerCount(const std::string& client, uint32_t from, uint32_t to) {
  if (from > 0) clients_by_calls_.erase({from, client});
  if (to > 0) clients_by_calls_.insert({to, client});
}

Status CallLimits::Admit(const std::string& client, const Member& member, uint64_t ticket,
                         bool evictable, const Evict& evict, Charge* charge) {
  if (member.job_id != 0) {
    const uint32_t allowance = kMemberCallsPerWorker * (member.num_workers + 1);
    uint32_t& mine = member_calls_[member.job_id];
    if (mine >= allowance) {
      return ResourceExhaustedError(
          "session " + std::to_string(member.job_id) + " already has " + std::to_string(mine) +
          " calls waiting or streams attached, the most a job of " +
          std::to_string(member.num_workers) + " workers may have (" +
          std::to_string(kMemberCallsPerWorker) +
          " per worker): its workers make more calls at once than the protocol does");
    }
    ++mine;
    *charge = Charge{member.job_id, {}};
    return Status::Ok();
  }
  Client& mine = strangers_[client];
  auto refuse = [&](Status why) {
    if (mine.calls == 0) strangers_.erase(client);
    return why;
  };
  if (mine.calls >= max_calls_per_client_) {
    return refuse(ResourceExhaustedError(
        "client " + client + " already has " + std::to_string(mine.calls) +
        " calls waiting or streams attached that belong to no job of its own, the most this "
        "switch allows per client"));
  }
  if (stranger_calls_ >= max_calls_total_) {
    // Make room at the expense of the client that holds the most, if it would still hold more
    // than this one: a flood from many addresses cannot keep out a client with few calls.
    bool evicted = false;
    if (!clients_by_calls_.empty()) {
      const auto& [most, biggest] = *clients_by_calls_.rbegin();
      Client& big = strangers_.at(biggest);
      if (most > mine.calls + 1 && !big.evictable.empty()) {
        evict(*big.evictable.begin(),
              "the switch holds its maximum of " + std::to_string(max_calls_total_) +
                  " calls waiting or streams attached that belong to no job of their "
                  "clients, and client " +
                  biggest + " the most of them (" + std::to_string(most) +
                  "): its oldest made room for a newer client's");
        evicted = true;
      }
    }
    if (!evicted) {
      return refuse(ResourceExhaustedError(
          "the switch already has " + std::to_string(stranger_calls_) +
          " calls waiting or streams attached that belong to no job of their clients, its "
          "limit"));
    }
  }
  SetStrangerCount(client, mine.calls, mine.calls + 1);
  ++mine.calls;
  if (evictable) mine.evictable.insert(ticket);
  ++stranger_calls_;
  *charge = Charge{0, client};
  return Status::Ok();
}

void CallLimits::Release(const Charge& charge, uint64_t ticket) {
  if (charge.job_id != 0) {
    auto it = member_calls_.find(charge.job_id);
    if (it != member_calls_.end() && --it->second == 0) member_calls_.erase(it);
    return;
  }
  auto it = strangers_.find(charge.client);
  if (it == strangers_.end()) return;
  Client& c = it->second;
  SetStrangerCount(charge.client, c.calls, c.calls - 1);
  --c.calls;
  c.evictable.erase(ticket);
  --stranger_calls_;
  if (c.calls == 0) strangers_.erase(it);
}

Status CallLimits::AdmitForwarded(const std::string& client, const Member& member, uint64_t ticket,
                                  bool upstream, const Evict& evict) {
  const bool counted = upstream && member.job_id == 0;  // within the forwarded limits
  Status st;
  Charge charge;
  if (counted && forwarded_strangers_ >= max_forwarded_total_) {
    st = ResourceExhaustedError(
        "the switch already passes " + std::to_string(forwarded_strangers_) +
        " calls that belong to no job of their clients on to its upstream switch, its limit");
  } else if (counted && forwarded_per_client_[client] >= max_forwarded_per_client_) {
    st = ResourceExhaustedError("client " + client + " already has " +
                                std::to_string(forwarded_per_client_[client]) +
                                " calls that belong to no job of its own passed on to the "
                                "upstream switch, the most this switch allows per client");
  } else {
    st = Admit(client, member, ticket, /*evictable=*/false, evict, &charge);
  }
  if (st.ok()) {
    if (counted) {
      ++forwarded_strangers_;
      ++forwarded_per_client_[client];
    }
    forwarded_[ticket] = Forwarded{std::move(charge), counted};
  } else if (auto it = forwarded_per_client_.find(client);
             it != forwarded_per_client_.end() && it->second == 0) {
    forwarded_per_client_.erase(it);
  }
  return st;
}

void CallLimits::ReleaseForwarded(uint64_t ticket) {
  auto it = forwarded_.find(ticket);
  if (it == forwarded_.end()) return;
  if (it->second.upstream) {
    --forwarded_strangers_;
    auto c = forwarded_per_client_.find(it->second.charge.client);
    if (c != forwarded_per_client_.end() && --c->second == 0) forwarded_per_client_.erase(c);
  }
  Release(it->second.charge, ticket);
  forwarded_.erase(it);
}

void CallLimits::Clear() {
  forwarded_.clear();
  forwarded_per_client_.clear();
  strangers_.clear();
  clients_by_calls_.clear();
  stranger_calls_ = 0;
  forwarded_strangers_ = 0;
  member_calls_.clear();
}

}  // namespace switchml::control
