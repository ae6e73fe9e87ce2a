// CallLimits: the Registry's accounting of the calls and streams it holds, by who makes them
// (RegistryOptions, docs/security.md 2, "Limits"): a job's members against their job's own
// allowance (kMemberCallsPerWorker per worker, plus as many), everyone else (strangers) per
// client address and in total, and of the strangers' calls those a top-of-rack switch passes on
// upstream, per client and in total. When the strangers' total is full, a stranger's new call
// makes room at the expense of the client that holds the most, if that client would still hold
// more: its oldest evictable call (a wait, a stream before its first message) is evicted.
//
// Not thread-safe: the Registry calls it under its lock. It holds counts and tickets only: what
// a ticket stands for (a wait, a stream) is the Registry's, which ends an evicted one.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "switchml/status.h"

namespace switchml::control {

struct RegistryOptions;

// A job's allowance of waiting calls, attached streams and forwarded calls of its members:
// this many per worker, plus this many (a worker makes one Barrier or Broadcast at a time and has
// one stream; the rest is slack for retries and a top-of-rack switch's forwarded calls).
inline constexpr uint32_t kMemberCallsPerWorker = 4;

class CallLimits {
 public:
  // What a call or stream is counted against: a job's allowance (job_id != 0, a member's) or
  // a stranger's client address.
  struct Charge {
    uint64_t job_id = 0;
    std::string client;
  };
  // A member's job: its job id and its number of workers (the allowance's size).
  struct Member {
    uint64_t job_id = 0;
    uint32_t num_workers = 0;
  };
  // Ends the call `ticket` to make room (RESOURCE_EXHAUSTED, `why`) and releases it here
  // (Release), before Admit returns.
  using Evict = std::function<void(uint64_t ticket, const std::string& why)>;

  // Reads the limits from `options` (not kept).
  explicit CallLimits(const RegistryOptions& options);

  // Admits the call or stream `ticket` of `client` (its IPv4 text, or the peer string): as a
  // member's of `member` when its job_id is not 0, else as a stranger's. `evictable`: a
  // stranger's wait or unattached stream, which a later stranger may evict when the total is
  // full. On success *charge says what to Release it against.
  Status Admit(const std::string& client, const Member& member, uint64_t ticket, bool evictable,
               const Evict& evict, Charge* charge);
  void Release(const Charge& charge, uint64_t ticket);

  // A call run on a thread of its own (Registry::AdmitForwarded): admitted as Admit does (never
  // evictable), and, when it is a stranger's passed `upstream`, within the forwarded strangers'
  // limits too. Released by ReleaseForwarded(ticket).
  Status AdmitForwarded(const std::string& client, const Member& member, uint64_t ticket,
                        bool upstream, const Evict& evict);
  void ReleaseForwarded(uint64_t ticket);

  // Forgets every count (the registry shut down).
  void Clear();

  uint32_t stranger_calls() const { return stranger_calls_; }
  uint32_t member_calls(uint64_t job_id) const;
  uint32_t forwarded_calls() const { return static_cast<uint32_t>(forwarded_.size()); }

 private:
  void SetStrangerCount(const std::string& client, uint32_t from, uint32_t to);

  const uint32_t max_calls_per_client_;
  const uint32_t max_calls_total_;
  const uint32_t max_forwarded_per_client_;
  const uint32_t max_forwarded_total_;
  // Strangers' calls per client, with the tickets of the ones that may be evicted (oldest
  // first: tickets only grow), the clients by how many they hold, and the total.
  struct Client {
    uint32_t calls = 0;
    std::set<uint64_t> evictable;
  };
  std::unordered_map<std::string, Client> strangers_;
  std::set<std::pair<uint32_t, std::string>> clients_by_calls_;
  uint32_t stranger_calls_ = 0;
  // Members' calls per session.
  std::unordered_map<uint64_t, uint32_t> member_calls_;
  // Calls run on threads of their own, and whether they count as passed upstream; strangers'
  // calls passed upstream, per client and in all.
  struct Forwarded {
    Charge charge;
    bool upstream = false;
  };
  std::unordered_map<uint64_t, Forwarded> forwarded_;
  std::unordered_map<std::string, uint32_t> forwarded_per_client_;
  uint32_t forwarded_strangers_ = 0;
};

}  // namespace switchml::control
