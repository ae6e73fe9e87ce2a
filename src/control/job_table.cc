#include "control/job_table.h"

#include <algorithm>
#include <utility>

#include "base/endpoint.h"
#include "control/registry.h"
#include "control/request_rules.h"

namespace switchml::control {
namespace {

// Whether registrations of two jobs on one address overlap: "any port" (0) only overlaps "any
// port" (the switch looks up exact ports first, so an explicit range of another job is never
// ambiguous: a port-0 registration cannot squat the address; dataplane::Switch::AddWorker).
bool Overlaps(uint32_t port_a, uint32_t n_a, uint32_t port_b, uint32_t n_b) {
  if (port_a == 0 || port_b == 0) return port_a == port_b;
  return port_a < port_b + n_b && port_b < port_a + n_a;
}

std::string BoolText(bool b) { return b ? "true" : "false"; }

}  // namespace

std::string PortsText(uint32_t ipv4, uint32_t port, uint32_t n) {
  if (port == 0) return Ipv4ToString(ipv4) + " (any port)";
  return Ipv4ToString(ipv4) + ":" + std::to_string(port) +
         (n > 1 ? "-" + std::to_string(port + n - 1) : "");
}

std::vector<uint64_t> Job::Streams() const {
  std::vector<uint64_t> tickets;
  for (const Rank& r : ranks) {
    if (r.stream != 0) tickets.push_back(r.stream);
  }
  return tickets;
}

JobTable::JobTable(const RegistryOptions& options)
    : lease_(options.lease),
      attach_grace_(options.attach_grace),
      idle_reclaim_(options.idle_reclaim),
      max_open_checks_(options.max_open_checks) {}

Job* JobTable::Find(uint64_t job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const Job* JobTable::Find(uint64_t job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

Job* JobTable::FindFor(uint64_t job_id, const std::string& secret) {
  Job* job = Find(job_id);
  return job != nullptr && SameSecret(job->secret, secret) ? job : nullptr;
}

bool JobTable::Owns(uint64_t job_id, const std::string& secret) const {
  const Job* job = Find(job_id);
  return job == nullptr || SameSecret(job->secret, secret);
}

Job& JobTable::Add(const dataplane::JobSpec& spec, const std::string& secret, TimePoint now) {
  auto job = std::make_unique<Job>();
  job->spec = spec;
  job->secret = secret;
  job->ranks.resize(spec.num_workers);
  job->checks.emplace(SessionName(spec.job_id), spec.num_workers, max_open_checks_);
  job->last_activity = job->created = now;
  return *(jobs_[spec.job_id] = std::move(job));
}

void JobTable::Erase(uint64_t job_id) { jobs_.erase(job_id); }

std::vector<uint64_t> JobTable::ids() const {
  std::vector<uint64_t> out;
  for (const auto& [id, job] : jobs_) out.push_back(id);
  return out;
}

bool JobTable::RankAlive(const Job& job, uint32_t rank, TimePoint now) const {
  const Job::Rank& r = job.ranks[rank];
  if (!r.registered || r.closed) return false;
  if (r.stream != 0) return true;
  const bool ours = !job.secret.empty() || job.spec.running_tsi;
  return ours && now - r.registered_at < attach_grace_;
}

bool JobTable::Expired(const Job& job, TimePoint now) const {
  for (uint32_t r = 0; r < job.ranks.size(); ++r) {
    if (RankAlive(job, r, now)) return false;
  }
  return now - job.last_activity >= lease_;
}

std::vector<uint64_t> JobTable::Expired(TimePoint now) const {
  std::vector<uint64_t> expired;
  for (const auto& [id, job] : jobs_) {
    if (Expired(*job, now)) expired.push_back(id);
  }
  return expired;
}

const Job* JobTable::Idlest(TimePoint now) const {
  const Job* idlest = nullptr;
  for (const auto& [id, job] : jobs_) {
    if (now - job->last_activity >= idle_reclaim_ &&
        (idlest == nullptr || job->last_activity < idlest->last_activity)) {
      idlest = job.get();
    }
  }
  return idlest;
}

Status JobTable::CheckAddress(uint64_t job_id, uint32_t ipv4, uint32_t port, uint32_t num_ports,
                              TimePoint now, std::vector<uint64_t>* in_the_way) const {
  for (const auto& [id, job] : jobs_) {
    if (id == job_id) continue;
    for (uint32_t r = 0; r < job->ranks.size(); ++r) {
      const Job::Rank& other = job->ranks[r];
      if (!other.registered || other.ipv4 != ipv4 ||
          !Overlaps(port, num_ports, other.port, job->spec.num_ports)) {
        continue;
      }
      if (!Expired(*job, now)) {
        return AlreadyExistsError(
            "address " + PortsText(ipv4, port, num_ports) + " is registered to rank " +
            std::to_string(r) + " of " + SessionName(id) + " (" +
            PortsText(other.ipv4, other.port, job->spec.num_ports) +
            "), a live job: use other UDP ports, or wait until that job closes or expires");
      }
      in_the_way->push_back(id);
      break;
    }
  }
  return Status::Ok();
}

void JobTable::NotePackets(uint64_t job_id, uint64_t packets, TimePoint now) {
  Job* job = Find(job_id);
  if (job == nullptr || job->packets == packets) return;
  job->packets = packets;
  job->Touch(now);
}

Result<bool> JobTable::CloseRank(Job& job, uint32_t rank, TimePoint now) {
  const std::string name = SessionName(job.spec.job_id);
  if (rank >= job.ranks.size()) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is out of range for " + name +
                                "'s " + std::to_string(job.ranks.size()) + " workers");
  }
  // Only a registered rank can have finished with the job. A Close for one that is not (a late
  // one from an earlier attempt of the job id, whose rank 0 re-created the job since) must not
  // mark it closed: its new worker's Attach would be refused.
  if (!job.ranks[rank].registered) {
    return FailedPreconditionError("rank " + std::to_string(rank) + " is not registered in " +
                                   name + ": nothing of it to close");
  }
  job.ranks[rank].closed = true;
  job.Touch(now);
  return std::all_of(job.ranks.begin(), job.ranks.end(),
                     [](const Job::Rank& r) { return !r.registered || r.closed; });
}

std::vector<JobSummary> JobTable::Summaries(const std::string* secret, uint32_t* hidden,
                                            TimePoint now) const {
  std::vector<JobSummary> out;
  if (hidden != nullptr) *hidden = 0;
  for (const auto& [id, job] : jobs_) {
    if (secret != nullptr && !job->secret.empty() && !SameSecret(job->secret, *secret)) {
      if (hidden != nullptr) ++*hidden;
      continue;
    }
    JobSummary& s = out.emplace_back();
    s.job_id = id;
    s.num_workers = job->spec.num_workers;
    for (const Job::Rank& r : job->ranks) {
      s.registered += r.registered;
      s.attached += r.stream != 0;
      s.closed += r.closed;
    }
    s.age = now - job->created;
    s.allreduces = job->checks->newest_agreed_allreduce();
    s.has_secret = !job->secret.empty();
    s.authenticated_data = !job->data_key.empty();
  }
  std::sort(out.begin(), out.end(),
            [](const JobSummary& a, const JobSummary& b) { return a.job_id < b.job_id; });
  return out;
}

Status CheckSecret(const Job& job, const std::string& secret, uint64_t job_id) {
  if (SameSecret(job.secret, secret)) return Status::Ok();
  return PermissionDeniedError(SessionName(job_id) + " belongs to another job: the request " +
                               (secret.empty() ? "carries no job secret"
                                               : "carries another job "
                                                 "secret") +
                               " (every worker of a job must use the secret its rank 0 created "
                               "the job with)");
}

Status CheckSameJob(const Job& job, const dataplane::JobSpec& spec, const RegisterRequest& r) {
  const std::string name = SessionName(job.spec.job_id);
  auto mismatch = [&](const std::string& field, const std::string& mine, const std::string& theirs,
                      const std::string& fix) {
    return InvalidArgumentError(field + " " + mine + " does not match " + name + "'s " + theirs +
                                " (set by rank 0): " + fix);
  };
  const dataplane::JobSpec& j = job.spec;
  if (j.num_workers != spec.num_workers) {
    return mismatch("num_workers", std::to_string(spec.num_workers), std::to_string(j.num_workers),
                    "start every worker with the same --workers");
  }
  if (j.size != spec.size) {
    return mismatch("packet size", PacketSizeName(r.packet_size),
                    PacketSizeName(static_cast<int>(j.size)),
                    "start every worker with the same elements per packet");
  }
  if (j.num_ports != spec.num_ports) {
    return mismatch("num_udp_ports", std::to_string(spec.num_ports), std::to_string(j.num_ports),
                    "start every worker with the same number of worker threads");
  }
  if (j.max_outstanding_packets != spec.max_outstanding_packets) {
    return mismatch("max_outstanding_packets", std::to_string(spec.max_outstanding_packets),
                    std::to_string(j.max_outstanding_packets),
                    "start every worker with the same window (max outstanding packets)");
  }
  if (j.running_tsi != spec.running_tsi) {
    return mismatch("running_tsi", BoolText(spec.running_tsi), BoolText(j.running_tsi),
                    "do not mix this project's workers with other clients in one job");
  }
  if (job.switch_list != r.switch_list) {
    auto list = [](const std::string& l) { return l.empty() ? "one switch" : "[" + l + "]"; };
    return mismatch("switch hosts", list(r.switch_list), list(job.switch_list),
                    "start every worker with the same --switch list, in the same order");
  }
  if (job.data_key.empty() == r.authenticate_data) {
    return mismatch("authenticate_data", BoolText(r.authenticate_data),
                    BoolText(!r.authenticate_data),
                    "start every worker of the job with --auth-data, or none");
  }
  if (job.sparse != r.sparse) {
    return mismatch("sparse", BoolText(r.sparse), BoolText(job.sparse),
                    "start every worker of the job with --sparse, or none");
  }
  if (job.sparse_auto != r.sparse_auto) {
    return mismatch("sparse_auto", BoolText(r.sparse_auto), BoolText(job.sparse_auto),
                    "start every worker of the job with the same --sparse mode (on or auto)");
  }
  return Status::Ok();
}

}  // namespace switchml::control
