// JobTable: the registry's jobs by job id (docs/protocol.md 4.1): each job's spec as rank 0
// registered it, its secret, its ranks (registered, attached, closed), its activity and its
// all-reduce check. It answers who owns a job, which jobs have expired (lease), which one has
// been idle longest, whether a worker's address is taken, and whether a later rank's
// registration matches the job rank 0 created.
//
// A pure core: no lock, no clock (times are arguments), no switch, no callbacks. The Registry
// keeps one under its lock and mirrors its jobs into the data plane (dataplane::Switch).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/allreduce_checks.h"
#include "dataplane/switch.h"
#include "switchml/status.h"

namespace switchml::control {

struct RegistryOptions;  // registry.h
struct RegisterRequest;  // registry.h

// One job on the switch.
struct Job {
  using TimePoint = std::chrono::steady_clock::time_point;
  dataplane::JobSpec spec;
  std::string secret;
  std::string data_key;  // the authenticated data plane's key; empty: the reference format
  // A striped job's switch hosts as rank 0 listed them (RegisterRequest::switch_list).
  std::string switch_list;
  bool sparse = false;       // block-sparse all-reduces allowed (RegisterRequest::sparse)
  bool sparse_auto = false;  // and the auto rule (RegisterRequest::sparse_auto)
  struct Rank {
    bool registered = false;
    uint32_t ipv4 = 0;
    uint32_t port = 0;
    TimePoint registered_at{};
    uint64_t stream = 0;  // the attached stream's ticket, 0 when none
    bool closed = false;
  };
  std::vector<Rank> ranks;
  TimePoint last_activity{};
  uint64_t packets = 0;                   // the data plane's count when last looked at
  std::optional<AllReduceChecks> checks;  // the per-all-reduce check (set when the job is created)
  TimePoint created{};                    // (JobSummaries: its age)

  void Touch(TimePoint now) { last_activity = now; }
  // The tickets of the streams attached to the job, by rank.
  std::vector<uint64_t> Streams() const;
};

// A job as `switchml status` and the metrics show it (Monitor.Status).
struct JobSummary {
  uint64_t job_id = 0;
  uint32_t num_workers = 0;
  uint32_t registered = 0, attached = 0, closed = 0;  // ranks
  std::chrono::steady_clock::duration age{};
  uint64_t allreduces = 0;  // the newest all-reduce every rank announced alike
  bool has_secret = false;
  bool authenticated_data = false;
};

class JobTable {
 public:
  using TimePoint = Job::TimePoint;

  // Reads the lease, the attach grace, the idle reclaim time and the open checks' limit from
  // `options` (not kept).
  explicit JobTable(const RegistryOptions& options);

  Job* Find(uint64_t job_id);
  const Job* Find(uint64_t job_id) const;
  // The job as a caller with `secret` sees it: another secret's job is answered as no job
  // (issue 28, found 8: whether a job id is in use is not told to a stranger).
  Job* FindFor(uint64_t job_id, const std::string& secret);
  // Whether a caller with `secret` may act for `job_id`: there is no such job, or it has that
  // secret.
  bool Owns(uint64_t job_id, const std::string& secret) const;

  // Adds the job of `spec` (none with its id exists), created at `now`.
  Job& Add(const dataplane::JobSpec& spec, const std::string& secret, TimePoint now);
  void Erase(uint64_t job_id);
  size_t size() const { return jobs_.size(); }
  std::vector<uint64_t> ids() const;

  // Whether `rank` counts as alive at `now`: registered, not closed, and attached, or within its
  // attach grace (a rank registered with a secret or by our workers, running_tsi).
  bool RankAlive(const Job& job, uint32_t rank, TimePoint now) const;
  // The jobs without a live rank and without activity for the lease.
  std::vector<uint64_t> Expired(TimePoint now) const;
  // The job idle the longest, if it has been idle for the idle reclaim time; else null.
  const Job* Idlest(TimePoint now) const;
  // Whether worker ports [port, port + num_ports) at `ipv4` (port 0: any port) are free of
  // other jobs' workers: ALREADY_EXISTS naming the live job that holds them; else OK, with the
  // expired jobs in the way in *in_the_way (the caller removes them).
  Status CheckAddress(uint64_t job_id, uint32_t ipv4, uint32_t port, uint32_t num_ports,
                      TimePoint now, std::vector<uint64_t>* in_the_way) const;
  // Records packets the data plane counted for `job_id` (its activity, at `now` when they
  // changed). No effect when the job is gone.
  void NotePackets(uint64_t job_id, uint64_t packets, TimePoint now);
  // Closes a registered `rank` of `job` at `now`: whether every registered rank has closed.
  Result<bool> CloseRank(Job& job, uint32_t rank, TimePoint now);

  // Every job (secret null), by job id; or only those a caller holding `secret` may see in full
  // (the jobs created without a secret and those created with this one; *hidden counts the
  // others when not null).
  std::vector<JobSummary> Summaries(const std::string* secret, uint32_t* hidden,
                                    TimePoint now) const;

 private:
  bool Expired(const Job& job, TimePoint now) const;

  const std::chrono::milliseconds lease_;
  const std::chrono::milliseconds attach_grace_;
  const std::chrono::milliseconds idle_reclaim_;
  const uint32_t max_open_checks_;
  std::unordered_map<uint64_t, std::unique_ptr<Job>> jobs_;
};

// PERMISSION_DENIED unless `secret` is the secret of `job` (`job_id`).
Status CheckSecret(const Job& job, const std::string& secret, uint64_t job_id);
// Whether a later rank's registration (`spec`, as rank 0's would make it, and its request)
// matches the job rank 0 created: INVALID_ARGUMENT naming the field that differs, and the fix.
Status CheckSameJob(const Job& job, const dataplane::JobSpec& spec, const RegisterRequest& request);
// "127.0.0.1:5000-5003", "127.0.0.1 (any port)".
std::string PortsText(uint32_t ipv4, uint32_t port, uint32_t num_ports);

}  // namespace switchml::control
