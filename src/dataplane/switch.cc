#include "dataplane/switch.h"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/status_macros.h"
#include "dataplane/stages.h"

namespace switchml::dataplane {
namespace {

// "10.0.0.1:40000", "10.0.0.1:40000-40003" or "10.0.0.1 (any port)".
std::string FormatAddress(const WorkerSpec& w, uint32_t num_ports) {
  std::string s = Ipv4ToString(w.ipv4);
  if (w.port == 0) return s + " (any port)";
  s += ":" + std::to_string(w.port);
  if (num_ports > 1) s += "-" + std::to_string(uint32_t{w.port} + num_ports - 1);
  return s;
}

// The rank a lookup entry carries for a top-of-rack job's upstream switch.
constexpr uint32_t kUpstreamRank = UINT32_MAX;

std::string SessionName(uint64_t job_id) { return "session " + std::to_string(job_id); }

const char* SizeName(proto::SizeCode size) {
  switch (size) {
    case proto::SizeCode::k128B:
      return "128B";
    case proto::SizeCode::k256B:
      return "256B";
    case proto::SizeCode::k512B:
      return "512B";
    case proto::SizeCode::k1024B:
      return "1024B";
    case proto::SizeCode::k2048B:
      return "2048B";
    case proto::SizeCode::k4096B:
      return "4096B";
    case proto::SizeCode::k8192B:
      return "8192B";
  }
  return "?";
}

}  // namespace

uint32_t JobSlots(const SwitchConfig& config, proto::SizeCode size) {
  return static_cast<uint32_t>(
      proto::SameBytesInPackets(config.slots_per_job, proto::NumelOf(size)));
}

size_t MaxDatagramBytes(const SwitchConfig& config) {
  return proto::DatagramBytesForNumel(
      std::max<size_t>(config.max_packet_numel, proto::kReferenceMaxNumel));
}

std::string JumboNote(proto::SizeCode size) {
  if (!proto::IsJumboSize(size)) return "";
  return " of " + std::to_string(proto::NumelOf(size)) + "-element packets";
}

bool AcceptsSize(const SwitchConfig& config, proto::SizeCode size) {
  return proto::IsSupportedSize(size) && proto::NumelOf(size) <= config.max_packet_numel;
}

const char* DropReasonName(DropReason r) {
  switch (r) {
    case DropReason::kNone:
      return "none";
    case DropReason::kMalformed:
      return "malformed";
    case DropReason::kUnknownSource:
      return "unknown_source";
    case DropReason::kJobNotReady:
      return "job_not_ready";
    case DropReason::kWrongSize:
      return "wrong_size";
    case DropReason::kSlotOutOfRange:
      return "slot_out_of_range";
    case DropReason::kDuplicate:
      return "duplicate";
    case DropReason::kStaleResult:
      return "stale_result";
  }
  return "unknown";
}

Status SwitchConfig::Validate() const {
  if (max_workers_per_job < 1 || max_workers_per_job > kMaxWorkerBitmapWidth) {
    return InvalidArgumentError(
        "max_workers_per_job must be in 1.." + std::to_string(kMaxWorkerBitmapWidth) +
        " (the worker bitmap's width), got " + std::to_string(max_workers_per_job));
  }
  if (slots_per_job < 1 || slots_per_job > proto::kMaxSlots) {
    return InvalidArgumentError("slots_per_job must be in 1.." + std::to_string(proto::kMaxSlots) +
                                " (the pool index has 14 bits), got " +
                                std::to_string(slots_per_job));
  }
  if (max_jobs < 1) return InvalidArgumentError("max_jobs must be at least 1, got 0");
  if (proto::SizeCode code; !proto::SizeCodeForNumel(max_packet_numel, &code) ||
                            max_packet_numel < proto::kReferenceMaxNumel) {
    return InvalidArgumentError("max_packet_numel must be 256, 512, 1024 or 2048, got " +
                                std::to_string(max_packet_numel));
  }
  return Status::Ok();
}

// One job: its spec, worker table, pipeline registers, counters and preallocated reply state.
// Owned by Switch::jobs_; the lookup tables point at it.
struct Switch::Job {
  Job(const JobSpec& s, uint32_t slots)
      : spec(s),
        num_slots(slots),
        workers(s.num_workers),
        groups(s.num_workers),
        registered(s.num_workers, false),
        bitmap(num_slots),
        counter(num_slots),
        exponents(num_slots),
        aggregate(num_slots, proto::NumelOf(s.size)),
        next_step(num_slots),
        slot_counters(num_slots),
        group_fresh(s.num_workers),
        group_late(s.num_workers),
        group_strikes(s.num_workers),
        destinations(s.num_workers) {}

  JobSpec spec;
  uint32_t num_slots;               // JobSlots(config, spec.size)
  std::vector<WorkerSpec> workers;  // by rank
  std::vector<Endpoint> groups;     // by rank: the multicast group each listens on, or zero
  std::vector<bool> registered;     // by rank
  uint32_t num_registered = 0;

  WorkerBitmapStage bitmap;
  WorkerCounterStage counter;
  ExponentMaxStage exponents;
  AggregateStage aggregate;
  NextStepStage next_step;

  JobCounters counters;
  std::vector<SlotCounters> slot_counters;
  // Switch::activity_clock_ at the job's creation or its last datagram: eviction picks the least.
  uint64_t last_active = 0;
  // Which CreateJob made this job (in the master; a mirror copies the master's).
  uint64_t generation = 0;

  // Top-of-rack jobs (SetUpstream): the upstream switch and, per register (slot, set), whether
  // the set holds the upstream's result of its current round, and where the rack's completer
  // sent from (its port offset, and its source port for port-0 workers), to route that result.
  bool has_upstream = false;
  UpstreamSpec upstream;
  struct TorSet {
    bool has_result = false;
    uint16_t offset = 0;
    uint16_t source_port = 0;
    // Workers whose retransmission came since the partial sum was last sent up (see kUnicast).
    WorkerBitmap asked;
  };
  std::vector<TorSet> tor;

  // Results go to spec.multicast_group (set once every worker registered and at least one is a
  // member), and to each worker that is not a member (in_group false) on its own.
  bool use_group = false;
  std::vector<uint8_t> in_group;  // by rank: listens on the group on explicit ports
  // By rank, for members: fresh contributions and retransmissions answered with a stored result
  // since the last check, and how many checks in a row found half or more of them answered so
  // (JobCounters::group_demoted).
  std::vector<uint32_t> group_fresh;
  std::vector<uint32_t> group_late;
  std::vector<uint8_t> group_strikes;

  // Reply state, rewritten by each packet that produces a reply.
  std::vector<Endpoint> destinations;  // num_workers entries, for kMulticast
  Endpoint unicast_destination;        // for kUnicast and kUpstream

  // Fills destinations for a reply to a packet from port p with port offset `offset` (see
  // WorkerSpec): the group endpoint of that offset (once, for all its members) and every other
  // worker's endpoint; returns them.
  std::span<const Endpoint> FillDestinations(uint16_t offset, uint16_t p) {
    size_t n = 0;
    if (use_group) {
      ++counters.group_sends;
      destinations[n++] = Endpoint{spec.multicast_group.ipv4,
                                   static_cast<uint16_t>(spec.multicast_group.port + offset)};
    }
    for (uint32_t w = 0; w < spec.num_workers; ++w) {
      if (use_group && in_group[w]) continue;
      const WorkerSpec& dst = workers[w];
      destinations[n++] =
          Endpoint{dst.ipv4, dst.port != 0 ? static_cast<uint16_t>(dst.port + offset) : p};
    }
    return {destinations.data(), n};
  }

  // Whether results can go to the group, and to which workers through it: the job kept one,
  // every worker is registered, and the members are those registered with it on explicit ports
  // (a port-0 worker's replies follow the completer's source port); the others (a reference
  // worker) get their own copy.
  void UpdateGroupUse() {
    use_group = false;
    in_group.assign(spec.num_workers, 0);
    if (spec.multicast_group.ipv4 == 0 || num_registered < spec.num_workers) return;
    for (uint32_t w = 0; w < spec.num_workers; ++w) {
      in_group[w] = groups[w] == spec.multicast_group && workers[w].port != 0;
      use_group = use_group || in_group[w];
    }
  }

  // The group delivery check of a member's fresh contribution (JobCounters::group_demoted).
  // A member the group does not reach gets no result of a slot it contributed to but through
  // the unicast reply to its retransmission: about one such reply per contribution, check after
  // check. On a working network the group's losses make it a few in a hundred, and a burst of
  // spurious timeouts (a whole window re-sent while its results queue on a slow link or a
  // starved core) at most a window's worth: half of a check of two windows, short of three in
  // four.
  void CheckGroupDelivery(uint32_t rank) {
    if (++group_fresh[rank] < GroupCheckContributions(spec)) return;
    if (uint64_t{group_late[rank]} * 4 < uint64_t{group_fresh[rank]} * 3) {
      group_strikes[rank] = 0;
    } else if (++group_strikes[rank] >= kGroupCheckStrikes) {
      in_group[rank] = 0;
      use_group = std::any_of(in_group.begin(), in_group.end(), [](uint8_t m) { return m != 0; });
      ++counters.group_demoted;
    }
    group_fresh[rank] = group_late[rank] = 0;
  }
};

struct Switch::ClosedJob {
  uint64_t id = 0;
  uint32_t num_registered = 0;
  JobSpec spec;
  JobCounters counters;
  bool has_upstream = false;
  UpstreamSpec upstream;
};

Switch::Switch(SwitchConfig config) : config_(config) {
  const Status st = config_.Validate();
  CHECK(st.ok()) << st.ToString();
}

Switch::~Switch() = default;

void Switch::Retire(const Job& job) {
  if (job.counters.received == 0) return;
  if (closed_.size() >= kMaxClosedJobs) closed_.erase(closed_.begin());
  closed_.push_back(ClosedJob{job.spec.job_id, job.num_registered, job.spec, job.counters,
                              job.has_upstream, job.upstream});
}

Status Switch::CreateJob(const JobSpec& spec, std::vector<uint64_t>* evicted) {
  const std::string name = SessionName(spec.job_id);
  if (spec.num_workers == 0) {
    return InvalidArgumentError(name + ": num_workers must be at least 1");
  }
  if (spec.num_workers > config_.max_workers_per_job) {
    return InvalidArgumentError(name + ": num_workers " + std::to_string(spec.num_workers) +
                                " exceeds this switch's limit of " +
                                std::to_string(config_.max_workers_per_job) + " workers per job");
  }
  if (!AcceptsSize(config_, spec.size)) {
    return InvalidArgumentError(name + ": packet size code " +
                                std::to_string(static_cast<int>(spec.size)) +
                                " is not supported; this switch takes 64 to " +
                                std::to_string(config_.max_packet_numel) + " elements per packet");
  }
  if (spec.num_ports == 0) {
    return InvalidArgumentError(name + ": num_ports must be at least 1");
  }
  const uint32_t slots = JobSlots(config_, spec.size);
  if (spec.max_outstanding_packets == 0 || spec.max_outstanding_packets > slots) {
    return InvalidArgumentError(name + ": max_outstanding_packets " +
                                std::to_string(spec.max_outstanding_packets) + " must be in 1.." +
                                std::to_string(slots) + " (this switch's slots per job" +
                                JumboNote(spec.size) + ")");
  }
  if (auto it = jobs_.find(spec.job_id); it != jobs_.end()) {
    RemoveFromLookup(*it->second);
    Retire(*it->second);
    jobs_.erase(it);
  } else if (jobs_.size() >= config_.max_jobs) {
    // Sessions are never closed, so a full table holds dead jobs: make room by evicting the one
    // that has been quiet the longest.
    const auto lru = std::min_element(jobs_.begin(), jobs_.end(), [](const auto& a, const auto& b) {
      return a.second->last_active < b.second->last_active;
    });
    Evict(lru->first, evicted);
  }
  JobSpec kept = spec;
  if (kept.multicast_group.ipv4 != 0) {
    // One job per group (a worker that listens on a group takes every result sent to it), and
    // only over a transport that can send to it.
    bool taken = !config_.loopback_multicast && !config_.lan_multicast;
    for (const auto& [id, other] : jobs_) {
      taken = taken || other->spec.multicast_group == kept.multicast_group;
    }
    if (taken) kept.multicast_group = Endpoint{};
  }
  auto job = std::make_unique<Job>(kept, slots);
  job->last_active = ++activity_clock_;
  job->generation = next_generation_++;
  jobs_.emplace(spec.job_id, std::move(job));
  mutations_.fetch_add(1, std::memory_order_release);
  return Status::Ok();
}

Status Switch::AddWorker(uint64_t job_id, uint32_t rank, const WorkerSpec& worker,
                         std::vector<uint64_t>* evicted, const Endpoint& multicast_group) {
  const std::string name = SessionName(job_id);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return NotFoundError(name + " does not exist: rank 0 must open it first");
  }
  Job& job = *it->second;
  const uint32_t n = job.spec.num_workers;
  if (rank >= n) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " out of range: " + name +
                                " has " + std::to_string(n) + " workers (ranks 0-" +
                                std::to_string(n - 1) + ")");
  }
  if (job.registered[rank]) {
    return AlreadyExistsError("rank " + std::to_string(rank) + " is already registered in " + name);
  }
  const uint32_t num_ports = job.spec.num_ports;
  if (worker.port != 0 && uint32_t{worker.port} + num_ports - 1 > 0xffff) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " of " + name + ": ports " +
                                std::to_string(worker.port) + "-" +
                                std::to_string(uint32_t{worker.port} + num_ports - 1) +
                                " go past 65535; choose a lower base port");
  }
  // Overlap with any registered worker of any job. Inside the session a port-0 entry owns every
  // port of its ip (a conflict there is a configuration error: replies to a port-0 worker go to
  // the completer's source port). Across sessions a port-0 entry conflicts only with another
  // port-0 entry of the ip: the lookup tries the exact (ip, port) entries first, so an explicit
  // range of another session on the same ip is unambiguous, and a port-0 registration cannot
  // squat an address (issue 28, found 7). An explicit range that overlaps only other sessions'
  // explicit ranges takes them over: the new registrant has bound those ports, so the sessions
  // that held them are dead. Anything else is refused: a port-0 entry says nothing about which
  // process owns which port.
  std::vector<uint64_t> dead;
  for (const auto& [other_id, other] : jobs_) {
    const uint32_t other_ports = other->spec.num_ports;
    for (uint32_t r = 0; r < other->spec.num_workers; ++r) {
      if (!other->registered[r]) continue;
      const WorkerSpec& w = other->workers[r];
      if (w.ipv4 != worker.ipv4) continue;
      const bool any_here = w.port == 0, any_new = worker.port == 0;
      const bool overlap = (any_here || any_new)
                               ? (any_here == any_new || other_id == job_id)
                               : (uint32_t{worker.port} < uint32_t{w.port} + other_ports &&
                                  uint32_t{w.port} < uint32_t{worker.port} + num_ports);
      if (!overlap) continue;
      if (other_id != job_id && w.port != 0 && worker.port != 0) {
        if (dead.empty() || dead.back() != other_id) dead.push_back(other_id);
        continue;
      }
      return AlreadyExistsError("address " + FormatAddress(worker, num_ports) +
                                " is already used by rank " + std::to_string(r) + " of " +
                                SessionName(other_id) + " (" + FormatAddress(w, other_ports) + ")");
    }
  }
  // A top-of-rack job's upstream endpoints are not a worker's.
  if (worker.port != 0) {
    for (uint32_t k = 0; k < num_ports; ++k) {
      const Endpoint e{worker.ipv4, static_cast<uint16_t>(worker.port + k)};
      if (auto it = by_endpoint_.find(e);
          it != by_endpoint_.end() && it->second.second == kUpstreamRank) {
        return AlreadyExistsError("address " + e.ToString() + " is the upstream switch of " +
                                  SessionName(it->second.first->spec.job_id));
      }
    }
  }
  // Only now that the registration cannot fail: a refused call evicts nothing.
  std::sort(dead.begin(), dead.end());
  for (uint64_t id : dead) Evict(id, evicted);
  job.workers[rank] = worker;
  job.registered[rank] = true;
  ++job.num_registered;
  mutations_.fetch_add(1, std::memory_order_release);
  job.groups[rank] = multicast_group;
  AddToLookup(job, rank);
  job.UpdateGroupUse();
  return Status::Ok();
}

void Switch::AddToLookup(Job& job, uint32_t rank) {
  last_lookup_ = nullptr;
  const WorkerSpec& w = job.workers[rank];
  if (w.port == 0) {
    by_address_[w.ipv4] = {&job, rank};
    return;
  }
  for (uint32_t k = 0; k < job.spec.num_ports; ++k) {
    by_endpoint_[Endpoint{w.ipv4, static_cast<uint16_t>(w.port + k)}] = {&job, rank};
  }
}

void Switch::RemoveFromLookup(const Job& job) {
  last_lookup_ = nullptr;
  RemoveUpstreamFromLookup(job);
  for (uint32_t r = 0; r < job.spec.num_workers; ++r) {
    if (!job.registered[r]) continue;
    const WorkerSpec& w = job.workers[r];
    if (w.port == 0) {
      by_address_.erase(w.ipv4);
    } else {
      for (uint32_t k = 0; k < job.spec.num_ports; ++k) {
        by_endpoint_.erase(Endpoint{w.ipv4, static_cast<uint16_t>(w.port + k)});
      }
    }
  }
}

void Switch::Evict(uint64_t job_id, std::vector<uint64_t>* evicted) {
  auto it = jobs_.find(job_id);
  CHECK(it != jobs_.end()) << SessionName(job_id);
  RemoveFromLookup(*it->second);
  Retire(*it->second);
  jobs_.erase(it);
  mutations_.fetch_add(1, std::memory_order_release);
  ++counters_.jobs_evicted;
  if (evicted != nullptr) evicted->push_back(job_id);
}

Status Switch::CheckUpstream(const Job& job, const UpstreamSpec& u) const {
  for (uint32_t k = 0; k < u.num_ports; ++k) {
    const Endpoint e{u.ipv4, static_cast<uint16_t>(u.port + k)};
    auto it = by_endpoint_.find(e);
    if ((it != by_endpoint_.end() && it->second.second != kUpstreamRank) ||
        by_address_.contains(u.ipv4)) {
      return AlreadyExistsError("upstream " + e.ToString() + " of " + SessionName(job.spec.job_id) +
                                " is a worker's address");
    }
  }
  return Status::Ok();
}

void Switch::AddUpstreamToLookup(Job& job) {
  last_lookup_ = nullptr;
  const UpstreamSpec& u = job.upstream;
  for (uint32_t k = 0; k < u.num_ports; ++k) {
    by_endpoint_[Endpoint{u.ipv4, static_cast<uint16_t>(u.port + k)}] = {&job, kUpstreamRank};
  }
}

void Switch::RemoveUpstreamFromLookup(const Job& job) {
  last_lookup_ = nullptr;
  if (!job.has_upstream) return;
  for (uint32_t k = 0; k < job.upstream.num_ports; ++k) {
    const Endpoint e{job.upstream.ipv4, static_cast<uint16_t>(job.upstream.port + k)};
    auto it = by_endpoint_.find(e);
    if (it != by_endpoint_.end() && it->second.first == &job) by_endpoint_.erase(it);
  }
}

Status Switch::SetUpstream(uint64_t job_id, const UpstreamSpec& upstream) {
  const std::string name = SessionName(job_id);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NotFoundError(name + " does not exist");
  if (upstream.ipv4 == 0 || upstream.port == 0) {
    return InvalidArgumentError(name + ": the upstream switch needs an IPv4 address and a port");
  }
  if (upstream.num_ports < 1 || upstream.num_ports > 64 ||
      uint32_t{upstream.port} + upstream.num_ports - 1 > 0xffff) {
    return InvalidArgumentError(name + ": upstream data ports " + std::to_string(upstream.port) +
                                " + " + std::to_string(upstream.num_ports) +
                                " must be 1 to 64 ports below 65536");
  }
  Job& job = *it->second;
  RETURN_IF_ERROR(CheckUpstream(job, upstream));
  RemoveUpstreamFromLookup(job);
  job.has_upstream = true;
  job.upstream = upstream;
  AddUpstreamToLookup(job);
  job.tor.assign(size_t{job.num_slots} * 2, Job::TorSet{});
  job.generation = next_generation_++;  // a mirror rebuilds the job with its upstream
  mutations_.fetch_add(1, std::memory_order_release);
  return Status::Ok();
}

const UpstreamSpec* Switch::FindUpstream(uint64_t job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !it->second->has_upstream) return nullptr;
  return &it->second->upstream;
}

Status Switch::RemoveJob(uint64_t job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NotFoundError(SessionName(job_id) + " does not exist");
  RemoveFromLookup(*it->second);
  Retire(*it->second);
  jobs_.erase(it);
  mutations_.fetch_add(1, std::memory_order_release);
  return Status::Ok();
}

bool Switch::HasJob(uint64_t job_id) const { return jobs_.contains(job_id); }

void Switch::MirrorJobs(const Switch& master) {
  CHECK(config_.slots_per_job == master.config_.slots_per_job &&
        config_.max_packet_numel == master.config_.max_packet_numel &&
        config_.max_workers_per_job == master.config_.max_workers_per_job)
      << "a mirror needs its master's switch config";
  // Jobs gone from master, or re-created there, or with other workers: dropped here.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    auto m = master.jobs_.find(it->first);
    const bool same = m != master.jobs_.end() && m->second->generation == it->second->generation &&
                      m->second->registered == it->second->registered;
    if (same) {
      ++it;
      continue;
    }
    RemoveFromLookup(*it->second);
    // (A job whose workers changed is re-created here with the master's: not a closed one.)
    if (m == master.jobs_.end() || m->second->generation != it->second->generation) {
      Retire(*it->second);
    }
    it = jobs_.erase(it);
  }
  // Jobs of master missing here: created with master's workers.
  for (const auto& [id, m] : master.jobs_) {
    if (jobs_.contains(id)) continue;
    auto job = std::make_unique<Job>(m->spec, JobSlots(config_, m->spec.size));
    job->generation = m->generation;
    job->last_active = ++activity_clock_;
    Job& j = *job;
    jobs_.emplace(id, std::move(job));
    for (uint32_t r = 0; r < m->spec.num_workers; ++r) {
      if (!m->registered[r]) continue;
      j.workers[r] = m->workers[r];
      j.groups[r] = m->groups[r];
      j.registered[r] = true;
      ++j.num_registered;
      AddToLookup(j, r);
    }
    j.UpdateGroupUse();
    if (m->has_upstream) {
      j.has_upstream = true;
      j.upstream = m->upstream;
      j.tor.assign(size_t{j.num_slots} * 2, Job::TorSet{});
      AddUpstreamToLookup(j);
    }
  }
  counters_.jobs_evicted = master.counters_.jobs_evicted;
}

const JobSpec* Switch::FindJob(uint64_t job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second->spec;
}

const JobCounters* Switch::job_counters(uint64_t job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second->counters;
}

std::span<const SlotCounters> Switch::slot_counters(uint64_t job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return {};
  return it->second->slot_counters;
}

std::vector<uint64_t> Switch::job_ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

const Action& Switch::DropForJob(Job& job, DropReason reason) {
  ++job.counters.dropped[static_cast<int>(reason)];
  action_.reason = reason;
  return action_;
}

const Action& Switch::Process(const Endpoint& source, std::span<const uint8_t> datagram) {
  return Process(source, datagram, reply_);
}

const Action& Switch::Process(const Endpoint& source, std::span<const uint8_t> datagram,
                              std::span<uint8_t> reply_out) {
  CHECK(reply_out.size() >= MaxDatagramBytes(config_))
      << "reply buffer of " << reply_out.size() << " bytes";
  action_ = Action{};
  ++counters_.received;

  // Parser.
  PacketMetadata md;
  const proto::DecodeError error = proto::DecodeHeader(datagram, &md.header);
  if (error != proto::DecodeError::kOk) {
    ++counters_.dropped_malformed[static_cast<int>(error)];
    action_.reason = DropReason::kMalformed;
    action_.decode_error = error;
    return action_;
  }

  // Receive/lookup: the exact (ip, port) entry, then the any-port entry of the ip.
  // Consecutive datagrams mostly come from one source (a receive batch holds runs of one flow):
  // the last hit is tried first.
  const std::pair<Job*, uint32_t>* entry = nullptr;
  if (last_lookup_ != nullptr && last_lookup_source_ == source) {
    entry = last_lookup_;
  } else if (auto it = by_endpoint_.find(source); it != by_endpoint_.end()) {
    entry = &it->second;
  } else if (auto it2 = by_address_.find(source.ipv4); it2 != by_address_.end()) {
    entry = &it2->second;
  }
  last_lookup_ = entry;
  last_lookup_source_ = source;
  if (entry == nullptr) {
    ++counters_.dropped_unknown_source;
    action_.reason = DropReason::kUnknownSource;
    return action_;
  }
  Job& job = *entry->first;
  const uint32_t rank = entry->second;
  ++job.counters.received;
  job.last_active = ++activity_clock_;
  if (job.num_registered < job.spec.num_workers) return DropForJob(job, DropReason::kJobNotReady);
  if (md.header.size != job.spec.size) return DropForJob(job, DropReason::kWrongSize);
  if (md.header.slot.index >= job.num_slots) {
    return DropForJob(job, DropReason::kSlotOutOfRange);
  }
  SlotCounters& slot = job.slot_counters[md.header.slot.index];
  ++slot.received;
  if (rank == kUpstreamRank) [[unlikely]] {
    return ProcessResult(job, md.header, datagram, reply_out);
  }

  md.payload = datagram.subspan(proto::kPrefixBytes);
  // The completing contribution writes the reply's payload in its add (whether reply_out is a
  // transmit buffer or the datagram itself; LoadPayloadAndCopy then writes nothing).
  md.reply_payload = reply_out.subspan(proto::kPrefixBytes, md.payload.size());
  md.num_workers = job.spec.num_workers;
  md.running_tsi = job.spec.running_tsi;
  md.rank = rank;

  // The pipeline.
  job.bitmap.Apply(md);
  job.counter.Apply(md);
  if (md.stale) job.bitmap.Restore(md);
  job.exponents.Apply(md);
  job.aggregate.Apply(md);
  job.next_step.Apply(md);
  if (md.contribute) {
    ++job.counters.aggregated;
    if (job.use_group && job.in_group[rank]) job.CheckGroupDelivery(rank);
  }

  switch (md.next) {
    case NextStep::kConsume:
      return action_;
    case NextStep::kDropDuplicate:
      ++slot.duplicates;
      return DropForJob(job, DropReason::kDuplicate);
    case NextStep::kMulticast: {
      const WorkerSpec& completer = job.workers[rank];
      const uint16_t p = source.port;
      const uint16_t offset = completer.port != 0 ? static_cast<uint16_t>(p - completer.port) : 0;
      ++slot.completed;
      ++job.counters.completed;
      if (job.has_upstream) [[unlikely]] {
        // Top-of-rack: the rack's partial sum goes up; the result comes back in ProcessResult.
        Job::TorSet& t = job.tor[RegisterIndex(md.header.slot)];
        t = Job::TorSet{false, offset, p, WorkerBitmap{}};
        SendUp(job, offset);
        break;
      }
      action_.destinations = job.FillDestinations(offset, p);
      job.counters.multicast_packets += job.spec.num_workers;
      action_.kind = Action::Kind::kMulticast;
      break;
    }
    case NextStep::kUnicast:
      if (job.has_upstream) [[unlikely]] {
        Job::TorSet& t = job.tor[RegisterIndex(md.header.slot)];
        if (!t.has_result) {
          // Complete here, no result from upstream yet: the partial sum or the result was lost
          // above this switch (or is late). Re-send the partial sum (the upstream answers a
          // retransmission into a complete set with its stored result) once per wave of the
          // rack's timeouts: on the first retransmission since the last send, and again when a
          // worker that already asked asks again (that re-send went unanswered). The others'
          // retransmissions of the same wave would only load the uplink, which carries one packet
          // per round of the whole rack.
          const bool asked_again = t.asked.Test(md.rank);
          if (t.asked == WorkerBitmap{} || asked_again) {
            t.asked = WorkerBitmap::Bit(md.rank);
            ++job.counters.upstream_resent;
            SendUp(job, t.offset);
            break;
          }
          t.asked.Set(md.rank);
          ++job.counters.upstream_coalesced;
          return DropForJob(job, DropReason::kDuplicate);
        }
      }
      job.unicast_destination = source;
      ++slot.retransmitted;
      ++job.counters.retransmitted;
      if (job.use_group && job.in_group[rank]) ++job.group_late[rank];
      action_.kind = Action::Kind::kUnicast;
      action_.destinations = {&job.unicast_destination, 1};
      break;
  }
  const size_t bytes = EncodeReply(md, reply_out);
  action_.reply = {reply_out.data(), bytes};
  return action_;
}

void Switch::SendUp(Job& job, uint16_t offset) {
  const UpstreamSpec& u = job.upstream;
  job.unicast_destination = Endpoint{u.ipv4, static_cast<uint16_t>(u.port + offset % u.num_ports)};
  ++job.counters.upstream_sent;
  action_.kind = Action::Kind::kUpstream;
  action_.destinations = {&job.unicast_destination, 1};
}

const Action& Switch::ProcessResult(Job& job, const proto::Header& header,
                                    std::span<const uint8_t> datagram,
                                    std::span<uint8_t> reply_out) {
  const proto::SlotId s = header.slot;
  Job::TorSet& t = job.tor[RegisterIndex(s)];
  // Only the result of the round this set completed and sent up, and only once: anything else
  // is a duplicate or a late copy, and storing it would corrupt the shadow copy.
  if (t.has_result || !job.counter.IsCompleteRound(s, header.job_number, header.tsi)) {
    return DropForJob(job, DropReason::kStaleResult);
  }
  PacketMetadata md{};
  md.header = header;
  md.result = job.aggregate.Store(s, datagram.subspan(proto::kPrefixBytes));
  job.exponents.Store(s, header.e0, header.e1);
  md.max_e0 = header.e0;
  md.max_e1 = header.e1;
  md.reply_job_number = header.job_number;
  md.reply_tsi = header.tsi;
  t.has_result = true;
  ++job.counters.upstream_results;
  ++counters_.upstream_results;
  action_.destinations = job.FillDestinations(t.offset, t.source_port);
  job.counters.multicast_packets += job.spec.num_workers;
  action_.kind = Action::Kind::kMulticast;
  const size_t bytes = EncodeReply(md, reply_out);
  action_.reply = {reply_out.data(), bytes};
  return action_;
}

std::string Switch::FormatCounters(bool per_slot) const {
  std::string out;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  uint64_t malformed = 0;
  for (uint64_t c : counters_.dropped_malformed) malformed += c;
  add("switch: %zu jobs, received %" PRIu64 ", malformed %" PRIu64 ", unknown_source %" PRIu64
      ", jobs_evicted %" PRIu64,
      jobs_.size(), counters_.received, malformed, counters_.dropped_unknown_source,
      counters_.jobs_evicted);
  // (A top-of-rack switch's, over every job: its jobs' tables below end when the jobs close.)
  if (counters_.upstream_results > 0)
    add(", upstream_results %" PRIu64, counters_.upstream_results);
  out += '\n';
  for (int e = 1; e < proto::kNumDecodeErrors; ++e) {
    if (counters_.dropped_malformed[e] == 0) continue;
    const std::string label =
        std::string("malformed ") + proto::DecodeErrorName(static_cast<proto::DecodeError>(e));
    add("  %-26s %12" PRIu64 "\n", label.c_str(), counters_.dropped_malformed[e]);
  }
  // One job's table: a live one's (then its per-slot counters may follow) or a closed one's.
  auto table = [&](uint64_t id, bool closed, uint32_t num_registered, const JobSpec& spec,
                   const JobCounters& c, const UpstreamSpec* upstream) {
    add("session %" PRIu64 "%s: %u/%u workers registered, size %s, %u ports/worker, window %u\n",
        id, closed ? " (closed)" : "", num_registered, spec.num_workers, SizeName(spec.size),
        spec.num_ports, spec.max_outstanding_packets);
    add("  %-26s %12" PRIu64 "\n", "received", c.received);
    add("  %-26s %12" PRIu64 "\n", "aggregated", c.aggregated);
    add("  %-26s %12" PRIu64 "\n", "completed", c.completed);
    add("  %-26s %12" PRIu64 "\n", "multicast_packets", c.multicast_packets);
    if (spec.multicast_group.ipv4 != 0) {
      add("  %-26s %12s\n", "multicast_group", spec.multicast_group.ToString().c_str());
      add("  %-26s %12" PRIu64 "\n", "group_sends", c.group_sends);
      if (c.group_demoted > 0) add("  %-26s %12" PRIu64 "\n", "group_demoted", c.group_demoted);
    }
    add("  %-26s %12" PRIu64 "\n", "retransmitted", c.retransmitted);
    if (upstream != nullptr) {
      add("  %-26s %12s\n", "upstream",
          (Ipv4ToString(upstream->ipv4) + ":" + std::to_string(upstream->port)).c_str());
      add("  %-26s %12" PRIu64 "\n", "upstream_sent", c.upstream_sent);
      add("  %-26s %12" PRIu64 "\n", "upstream_resent", c.upstream_resent);
      add("  %-26s %12" PRIu64 "\n", "upstream_results", c.upstream_results);
      add("  %-26s %12" PRIu64 "\n", "upstream_coalesced", c.upstream_coalesced);
    }
    for (int r = 1; r < kNumDropReasons; ++r) {
      if (c.dropped[r] == 0) continue;
      const std::string label =
          std::string("dropped ") + DropReasonName(static_cast<DropReason>(r));
      add("  %-26s %12" PRIu64 "\n", label.c_str(), c.dropped[r]);
    }
  };
  for (const ClosedJob& j : closed_) {
    table(j.id, true, j.num_registered, j.spec, j.counters, j.has_upstream ? &j.upstream : nullptr);
  }
  for (uint64_t id : job_ids()) {
    const Job& job = *jobs_.at(id);
    table(id, false, job.num_registered, job.spec, job.counters,
          job.has_upstream ? &job.upstream : nullptr);
    if (!per_slot) continue;
    bool header = false;
    for (size_t s = 0; s < job.slot_counters.size(); ++s) {
      const SlotCounters& sc = job.slot_counters[s];
      if (sc.received == 0) continue;
      if (!header) {
        add("  %6s %12s %12s %14s %12s\n", "slot", "received", "completed", "retransmitted",
            "duplicates");
        header = true;
      }
      add("  %6zu %12" PRIu64 " %12" PRIu64 " %14" PRIu64 " %12" PRIu64 "\n", s, sc.received,
          sc.completed, sc.retransmitted, sc.duplicates);
    }
  }
  return out;
}

}  // namespace switchml::dataplane
