#include "sim/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <queue>

#include "base/check.h"
#include "base/status_macros.h"
#include "testing/pattern.h"
#include "worker/sparse.h"
#include "worker/sparse_session.h"

namespace switchml::sim {

double GoodputCeilingElementsPerSecond(double gbps, proto::SizeCode size) {
  const double wire = static_cast<double>(proto::DatagramBytes(size) + kWireOverheadBytes);
  return gbps * 1e9 / (8 * wire) * static_cast<double>(proto::NumelOf(size));
}

// The bounds as Validate's messages spell them.
static_assert(kMaxDelayNs == 1e12 && kMaxSimSeconds == 1e6);

Status SimConfig::Validate() const {
  const auto& nodes = topology.nodes();
  if (jobs.empty()) return InvalidArgumentError("no job to simulate");
  for (size_t j = 0; j < jobs.size(); ++j) {
    const JobConfig& job = jobs[j];
    const std::string what = "job " + std::to_string(j) + ": ";
    auto is_switch = [&](uint32_t n) {
      return n < nodes.size() && nodes[n].kind == Node::Kind::kSwitch;
    };
    if (job.stripes.empty() && !is_switch(job.switch_node)) {
      return InvalidArgumentError(what + "switch_node is not a switch");
    }
    if (job.hosts.empty()) return InvalidArgumentError(what + "no workers");
    for (uint32_t h : job.hosts) {
      if (h >= nodes.size() || nodes[h].kind != Node::Kind::kHost) {
        return InvalidArgumentError(what + "worker on node " + std::to_string(h) +
                                    ", which is not a host");
      }
    }
    if (!job.tors.empty()) {
      if (job.tors.size() != job.hosts.size()) {
        return InvalidArgumentError(what + "tors must name one top-of-rack switch per rank");
      }
      for (uint32_t t : job.tors) {
        if (t >= nodes.size() || nodes[t].kind != Node::Kind::kSwitch || t == job.switch_node) {
          return InvalidArgumentError(what + "top-of-rack node " + std::to_string(t) +
                                      " is not a switch other than the spine");
        }
        for (size_t k = 0; k < j; ++k) {
          if (jobs[k].switch_node == job.switch_node &&
              std::find(jobs[k].tors.begin(), jobs[k].tors.end(), t) != jobs[k].tors.end()) {
            return InvalidArgumentError(what + "shares top-of-rack switch " + std::to_string(t) +
                                        " and its spine with job " + std::to_string(k) +
                                        ": one two-level job per ToR and spine at a time");
          }
        }
      }
    }
    if (job.threads == 0 || job.threads > 64) {
      return InvalidArgumentError(what + "threads must be in 1..64");
    }
    if (job.window < job.threads || job.window % job.threads != 0) {
      return InvalidArgumentError(what + "window must be a positive multiple of threads");
    }
    if (!job.stripes.empty()) {
      if (!job.tors.empty()) {
        return InvalidArgumentError(what + "stripes and tors do not combine (one level only)");
      }
      if (job.stripes.size() > job.window / job.threads) {
        return InvalidArgumentError(
            what + std::to_string(job.stripes.size()) + " stripes exceed the " +
            std::to_string(job.window / job.threads) +
            " slots of a worker thread's window: each stripe needs a slot (raise the window)");
      }
      for (size_t s = 0; s < job.stripes.size(); ++s) {
        if (!is_switch(job.stripes[s])) {
          return InvalidArgumentError(what + "stripe " + std::to_string(s) + " (node " +
                                      std::to_string(job.stripes[s]) + ") is not a switch");
        }
        for (size_t t = 0; t < s; ++t) {
          if (job.stripes[t] == job.stripes[s]) {
            return InvalidArgumentError(what + "node " + std::to_string(job.stripes[s]) +
                                        " is stripe " + std::to_string(t) + " and " +
                                        std::to_string(s) + ": stripes must be distinct");
          }
        }
      }
    }
    if (job.window > switch_config.slots_per_job) {
      return InvalidArgumentError(what + "window " + std::to_string(job.window) +
                                  " exceeds the switch's " +
                                  std::to_string(switch_config.slots_per_job) + " slots per job");
    }
    if (!proto::IsReferenceSize(job.size)) {
      // (The simulator's packet buffers hold the reference's sizes; jumbo packets are not
      // simulated.)
      return InvalidArgumentError(what + "packet size must be 64 or 256 elements");
    }
    if (job.collectives.empty()) return InvalidArgumentError(what + "no all-reduce to run");
    if (!(job.density >= 0 && job.density <= 1) || !(job.overlap >= 0 && job.overlap <= 1)) {
      return InvalidArgumentError(what + "density and overlap must be in [0, 1]");
    }
    if (!(job.start_ns >= 0 && job.start_ns <= kMaxSimSeconds * 1e9)) {
      return InvalidArgumentError(what + "start time must be in [0, 1e15] ns");
    }
    for (size_t k = j + 1; k < jobs.size(); ++k) {
      if (jobs[k].job_id == job.job_id) {
        return InvalidArgumentError(what + "session id shared with job " + std::to_string(k));
      }
    }
  }
  if (jobs.size() > 200) return InvalidArgumentError("at most 200 concurrent jobs");
  auto delay = [](double ns) { return ns >= 0 && ns <= kMaxDelayNs; };
  if (!delay(switch_latency_ns) || !delay(host_latency_ns) || !delay(timer_granularity_ns)) {
    return InvalidArgumentError("latencies and the timer granularity must be in [0, 1e12] ns");
  }
  // 0: unlimited; else one packet's service time, 1e9 / switch_pps ns, is a delay too.
  if (!(switch_pps == 0 || (switch_pps >= 1e9 / kMaxDelayNs && switch_pps <= 1e15))) {
    return InvalidArgumentError(
        "the switch's packet rate must be 0 (unlimited) or in [0.001, 1e15] packets/s");
  }
  auto ns = [](worker::Nanos d) { return static_cast<double>(d.count()); };
  if (!delay(ns(session.retransmit.timeout)) || !delay(ns(session.retransmit.max_timeout)) ||
      !delay(ns(session.retransmit.min_timeout)) ||
      !delay(ns(session.retransmit.clock_granularity))) {
    return InvalidArgumentError(
        "the sessions' timeouts and clock granularity must be at most 1e12 ns (1000 s)");
  }
  if (!(max_sim_seconds > 0 && max_sim_seconds <= kMaxSimSeconds)) {
    return InvalidArgumentError("the time limit must be in (0, 1e6] s");
  }
  if (ns(session.retransmit.peer_timeout) > kMaxSimSeconds * 1e9) {
    return InvalidArgumentError("the sessions' progress timeout must be at most 1e6 s");
  }
  return Status();
}

bool SimResult::ok() const {
  for (const JobResult& j : jobs) {
    if (!j.status.ok() || !j.verified) return false;
  }
  return true;
}

namespace {

using Time = int64_t;  // picoseconds
constexpr Time kNever = std::numeric_limits<Time>::max();
constexpr uint16_t kHostPortBase = 20000;
constexpr uint32_t kPortsPerJob = 64;  // threads per worker at most
constexpr uint32_t kNoSession = UINT32_MAX;

Time Ps(double ns) { return static_cast<Time>(std::llround(ns * 1000)); }  // ns: validated
// t + d (d >= 0), kNever where that would overflow: queues of delays (a switch or link busy
// for ever more retransmissions of slow packets) stop at "never" instead of wrapping to negative
// times. Every event at kNever lies past the time limit, so it never runs.
Time Later(Time t, Time d) { return t > kNever - d ? kNever : t + d; }

// SplitMix64: the fault coins, a pure function of (seed, link, sequence number).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double Coin(uint64_t seed, uint64_t link, uint64_t seq, uint64_t which) {
  const uint64_t h = Mix(Mix(Mix(seed) ^ (link * 0x100000001b3ull)) ^ (seq * 4 + which));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

struct Packet {
  uint32_t refs = 0;
  uint16_t len = 0;
  Endpoint source;
  alignas(64) uint8_t data[proto::kReferenceMaxDatagramBytes];
};

// Fixed-size packet buffers in chunks (stable addresses) with a free list.
class PacketPool {
 public:
  uint32_t Alloc() {
    if (free_.empty()) Grow();
    const uint32_t i = free_.back();
    free_.pop_back();
    Packet& p = Get(i);
    p.refs = 1;
    return i;
  }
  void Release(uint32_t i) {
    Packet& p = Get(i);
    if (--p.refs == 0) free_.push_back(i);
  }
  Packet& Get(uint32_t i) { return chunks_[i >> kShift][i & kMask]; }

 private:
  static constexpr uint32_t kShift = 12, kMask = (1u << kShift) - 1;
  void Grow() {
    const uint32_t base = static_cast<uint32_t>(chunks_.size() << kShift);
    chunks_.push_back(std::make_unique<Packet[]>(size_t{1} << kShift));
    for (uint32_t k = (1u << kShift); k-- > 0;) free_.push_back(base + k);
  }
  std::vector<std::unique_ptr<Packet[]>> chunks_;
  std::vector<uint32_t> free_;
};

struct Flight {
  Time arrive;
  uint32_t packet;
  Endpoint destination;
};

// A FIFO ring of packets in flight on a link, in arrival order.
class FlightQueue {
 public:
  bool empty() const { return size_ == 0; }
  const Flight& front() const { return ring_[head_]; }
  void pop() {
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
  }
  void push(const Flight& f) {
    if (size_ == ring_.size()) Grow();
    ring_[(head_ + size_) & (ring_.size() - 1)] = f;
    ++size_;
  }

 private:
  void Grow() {
    std::vector<Flight> bigger(std::max<size_t>(16, ring_.size() * 2));
    for (size_t i = 0; i < size_; ++i) bigger[i] = ring_[(head_ + i) & (ring_.size() - 1)];
    ring_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<Flight> ring_;
  size_t head_ = 0, size_ = 0;
};

struct LinkState {
  uint32_t from = 0, to = 0;
  double ps_per_byte = 0;
  Time propagation = 0;
  Time buffer_ps = kNever;  // the backlog (in transmit time) at which packets are tail-dropped
  LinkParams params;
  Time free_at = 0;
  uint64_t seq = 0;
  FlightQueue flights;
  LinkResult result;
  Time busy = 0;
};

enum class EventKind : uint32_t { kLinkHead, kTimer, kDelayed, kJobStart };

struct Event {
  Time t;
  uint64_t seq;
  EventKind kind;
  uint32_t id;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct SessionState {
  // The worker library's striped session (one host but for striped jobs: then exactly a
  // WorkerSession), which names the host of each datagram before PollTransmit writes it.
  std::unique_ptr<worker::SparseSession> session;
  uint32_t job = 0, rank = 0, thread = 0;
  uint32_t host = 0;
  uint32_t uplink = 0;  // first link toward the job's switch
  Endpoint self, switch_ep;
  // A striped job (JobConfig::stripes): the first link toward each stripe's switch (the
  // stripe's endpoint is JobState::stripe_endpoints); empty otherwise.
  std::vector<uint32_t> stripe_uplinks;
  Time timer_at = kNever;
  bool running = false;
  uint64_t slice_packets = 0;  // packets of the running slice (for progress)
};

struct RankState {
  uint32_t collective = 0;  // the running (or next) collective
  uint32_t running_sessions = 0;
  std::vector<int32_t> in, out;  // kVerified
};

struct JobState {
  JobConfig config;
  JobResult result;
  // The switches the workers send to: {switch_node} (one level; the spine with two), or the
  // stripes in order; and, when striped, their endpoints.
  std::vector<uint32_t> switch_nodes;
  std::vector<Endpoint> stripe_endpoints;
  std::vector<uint32_t> sessions;  // rank * threads + thread
  std::vector<RankState> ranks;
  std::vector<int32_t> shared_in, shared_out;  // kShared
  uint32_t shared_started = 0;                 // kShared: all-reduces whose inputs were filled
  std::vector<Time> collective_start, collective_end;
  uint32_t ranks_done_current = 0;
  bool failed = false, done = false;
  Time open_since_unset = kNever;
  std::vector<Time> open_since;  // per (slot, set) register at the switch: round opened at
  std::vector<float> round_ns;
};

class Engine {
 public:
  explicit Engine(SimConfig config) : cfg_(std::move(config)) {}

  Status Setup();
  SimResult Run();

 private:
  Time Now() const { return now_; }
  worker::Nanos NowNanos() const { return worker::Nanos{now_ / 1000}; }
  void Push(Time t, EventKind kind, uint32_t id) { heap_.push(Event{t, next_seq_++, kind, id}); }
  uint32_t NodeOf(uint32_t ipv4) const {
    const uint32_t n = ipv4 - kNodeIpBase;
    return n < nodes_ ? n : UINT32_MAX;
  }
  // Puts packet p (one reference, taken over) on link l, to enter the transmitter at time t.
  void Transmit(uint32_t l, uint32_t p, const Endpoint& dst, Time t);
  void Deliver(uint32_t p, const Endpoint& dst, uint32_t node);
  void SwitchReceive(uint32_t node, uint32_t p);
  void AfterSession(uint32_t s);
  void StartCollective(uint32_t job, uint32_t rank);
  // The inputs of all-reduce `collective` of job j for n workers.
  testing::Pattern PatternOf(uint32_t j, uint32_t collective, uint32_t n) const;
  void SliceDone(uint32_t s);
  void FinishJob(JobState& job);
  void FailJob(JobState& job, const Status& st);
  double ProgressFraction() const;

  SimConfig cfg_;
  uint32_t nodes_ = 0;
  std::vector<LinkState> links_;
  std::vector<std::unique_ptr<dataplane::Switch>> switches_;  // per node (null for hosts)
  std::vector<Time> switch_busy_;
  Time switch_latency_ = 0, switch_service_ = 0, host_latency_ = 0, timer_granularity_ = 0;
  // Per host node: session index by port - kHostPortBase.
  std::vector<std::vector<uint32_t>> port_table_;
  std::vector<SessionState> sessions_;
  std::vector<JobState> jobs_;
  PacketPool pool_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> heap_;
  struct Delayed {
    uint32_t packet;
    uint32_t node;
    Endpoint destination;
  };
  std::vector<Delayed> delayed_;
  std::vector<uint32_t> delayed_free_;
  uint64_t next_seq_ = 0;
  Time now_ = 0;
  uint64_t events_ = 0, delivered_ = 0;
  uint64_t total_packets_ = 0, answered_packets_ = 0;
  uint32_t jobs_left_ = 0;
};

Status Engine::Setup() {
  RETURN_IF_ERROR(cfg_.Validate());
  RETURN_IF_ERROR(cfg_.topology.Finalize());
  const auto& nodes = cfg_.topology.nodes();
  nodes_ = static_cast<uint32_t>(nodes.size());
  switch_latency_ = Ps(cfg_.switch_latency_ns);
  host_latency_ = Ps(cfg_.host_latency_ns);
  timer_granularity_ = Ps(cfg_.timer_granularity_ns);
  switch_service_ = cfg_.switch_pps > 0 ? Ps(1e9 / cfg_.switch_pps) : 0;
  for (const Link& l : cfg_.topology.links()) {
    LinkState s;
    s.from = l.from;
    s.to = l.to;
    s.params = l.params;
    s.ps_per_byte = 8000.0 / l.params.gbps;
    s.propagation = Ps(l.params.propagation_ns);
    if (l.params.buffer_bytes > 0) {
      s.buffer_ps = static_cast<Time>(static_cast<double>(l.params.buffer_bytes) * s.ps_per_byte);
    }
    s.result.from = l.from;
    s.result.to = l.to;
    links_.push_back(std::move(s));
  }
  uint32_t max_workers = 1;
  for (const JobConfig& j : cfg_.jobs) {
    if (j.tors.empty()) {
      max_workers = std::max<uint32_t>(max_workers, static_cast<uint32_t>(j.hosts.size()));
      continue;
    }
    // Two levels: a ToR's job has its rack's ranks, the spine's one member per rack.
    std::map<uint32_t, uint32_t> rack_size;
    for (uint32_t t : j.tors) ++rack_size[t];
    max_workers = std::max<uint32_t>(max_workers, static_cast<uint32_t>(rack_size.size()));
    for (const auto& [t, k] : rack_size) max_workers = std::max(max_workers, k);
  }
  dataplane::SwitchConfig sc = cfg_.switch_config;
  sc.max_workers_per_job = std::max(sc.max_workers_per_job, max_workers);
  sc.max_jobs = std::max<uint32_t>(sc.max_jobs, static_cast<uint32_t>(cfg_.jobs.size()));
  RETURN_IF_ERROR(sc.Validate());
  switches_.resize(nodes_);
  switch_busy_.assign(nodes_, 0);
  port_table_.resize(nodes_);
  for (uint32_t n = 0; n < nodes_; ++n) {
    if (nodes[n].kind == Node::Kind::kSwitch)
      switches_[n] = std::make_unique<dataplane::Switch>(sc);
  }
  std::vector<std::vector<uint32_t>> jobs_on_host(nodes_);
  jobs_.resize(cfg_.jobs.size());
  for (uint32_t j = 0; j < cfg_.jobs.size(); ++j) {
    JobState& job = jobs_[j];
    job.config = cfg_.jobs[j];
    const JobConfig& jc = job.config;
    const uint32_t n = static_cast<uint32_t>(jc.hosts.size());
    const uint32_t T = jc.threads;
    const uint32_t W = jc.window / T;
    job.result.job_id = jc.job_id;
    job.result.workers = n;
    // The switch each rank registers with and its rank there: switch_node and r (one level), or
    // its ToR and its place in the rack (two levels; the ToRs join the spine as its members).
    std::vector<uint32_t> rank_switch(n, jc.switch_node), rank_local(n);
    std::iota(rank_local.begin(), rank_local.end(), 0u);
    job.switch_nodes = jc.stripes.empty() ? std::vector<uint32_t>{jc.switch_node} : jc.stripes;
    if (jc.tors.empty()) {
      // Every stripe runs the whole job, as a switch host that knows nothing of the others.
      for (uint32_t sw : job.switch_nodes) {
        RETURN_IF_ERROR(switches_[sw]->CreateJob({jc.job_id, n, jc.size, T, jc.window,
                                                  /*running_tsi=*/true, /*multicast_group=*/{}}));
      }
      if (!jc.stripes.empty()) {
        for (uint32_t sw : jc.stripes) {
          job.stripe_endpoints.push_back(Endpoint{Topology::Ip(sw), kSwitchPort});
        }
      }
    } else {
      std::vector<uint32_t> racks;  // ToR nodes in order of first appearance
      std::map<uint32_t, uint32_t> rack_size;
      for (uint32_t r = 0; r < n; ++r) {
        const uint32_t t = jc.tors[r];
        if (rack_size[t] == 0) racks.push_back(t);
        rank_switch[r] = t;
        rank_local[r] = rack_size[t]++;
      }
      dataplane::Switch& spine = *switches_[jc.switch_node];
      RETURN_IF_ERROR(
          spine.CreateJob({jc.job_id, static_cast<uint32_t>(racks.size()), jc.size, T,
                           jc.window, /*running_tsi=*/true, /*multicast_group=*/{}}));
      for (uint32_t k = 0; k < racks.size(); ++k) {
        dataplane::Switch& tor = *switches_[racks[k]];
        RETURN_IF_ERROR(tor.CreateJob({jc.job_id, rack_size[racks[k]], jc.size, T, jc.window,
                                       /*running_tsi=*/true, /*multicast_group=*/{}}));
        RETURN_IF_ERROR(tor.SetUpstream(
            jc.job_id, {Topology::Ip(jc.switch_node), kSwitchPort, /*num_ports=*/1}));
        RETURN_IF_ERROR(spine.AddWorker(jc.job_id, k, {Topology::Ip(racks[k]), kSwitchPort}));
      }
    }
    const uint16_t port = static_cast<uint16_t>(kHostPortBase + kPortsPerJob * j);
    job.ranks.resize(n);
    uint64_t max_count = 0;
    for (const Collective& c : jc.collectives) {
      max_count = std::max(max_count, c.count);
      job.result.elements += c.count;
      uint64_t blocks = (c.count + proto::NumelOf(jc.size) - 1) / proto::NumelOf(jc.size);
      if (jc.sparse) {  // (for the progress line: the expected union and the announcement)
        blocks = static_cast<uint64_t>(std::ceil(static_cast<double>(blocks) * jc.density)) +
                 worker::AnnounceWords(blocks, n) / proto::NumelOf(jc.size);
      }
      total_packets_ +=
          n *
          (c.dtype == DataType::kFloat32 ? blocks + std::min<uint64_t>(blocks, jc.window) : blocks);
    }
    if (cfg_.payload == PayloadMode::kShared) {
      job.shared_in.resize(max_count);
      job.shared_out.resize(max_count);
    }
    for (uint32_t r = 0; r < n; ++r) {
      const uint32_t host = jc.hosts[r];
      for (uint32_t other : jobs_on_host[host]) {
        if (other == j) {
          return InvalidArgumentError("job " + std::to_string(j) + " has two ranks on node " +
                                      std::to_string(host));
        }
      }
      jobs_on_host[host].push_back(j);
      if (jc.stripes.empty()) {
        RETURN_IF_ERROR(switches_[rank_switch[r]]->AddWorker(jc.job_id, rank_local[r],
                                                             {Topology::Ip(host), port}));
      } else {
        for (uint32_t sw : jc.stripes) {
          RETURN_IF_ERROR(switches_[sw]->AddWorker(jc.job_id, r, {Topology::Ip(host), port}));
        }
      }
      auto& table = port_table_[host];
      if (table.size() < (j + 1) * kPortsPerJob) table.resize((j + 1) * kPortsPerJob, kNoSession);
      for (uint32_t t = 0; t < T; ++t) {
        worker::SessionConfig wc = cfg_.session;
        wc.num_workers = n;  // the global count, also with two levels
        wc.window = W;
        wc.slot_start = t * W;
        wc.size = jc.size;
        worker::StripedSessionConfig sc;
        sc.session = wc;
        sc.num_hosts = static_cast<uint32_t>(job.switch_nodes.size());
        RETURN_IF_ERROR(sc.Validate());
        SessionState s;
        s.session = std::make_unique<worker::SparseSession>(sc);
        s.job = j;
        s.rank = r;
        s.thread = t;
        s.host = host;
        s.uplink = cfg_.topology.NextLink(host, rank_switch[r]);
        s.self = Endpoint{Topology::Ip(host), static_cast<uint16_t>(port + t)};
        s.switch_ep = Endpoint{Topology::Ip(rank_switch[r]), kSwitchPort};
        for (uint32_t sw : jc.stripes) s.stripe_uplinks.push_back(cfg_.topology.NextLink(host, sw));
        table[j * kPortsPerJob + t] = static_cast<uint32_t>(sessions_.size());
        job.sessions.push_back(static_cast<uint32_t>(sessions_.size()));
        sessions_.push_back(std::move(s));
      }
    }
    job.collective_start.assign(jc.collectives.size(), kNever);
    job.collective_end.assign(jc.collectives.size(), 0);
    job.open_since.assign(2 * size_t{jc.window}, kNever);
    Push(Ps(jc.start_ns), EventKind::kJobStart, j);
  }
  jobs_left_ = static_cast<uint32_t>(jobs_.size());
  return Status();
}

void Engine::Transmit(uint32_t l, uint32_t p, const Endpoint& dst, Time t) {
  LinkState& link = links_[l];
  const uint64_t seq = link.seq++;
  const Time backlog = link.free_at > t ? link.free_at - t : 0;
  if (backlog > link.buffer_ps) {
    ++link.result.tail_dropped;
    pool_.Release(p);
    return;
  }
  const double bytes = pool_.Get(p).len + double{kWireOverheadBytes};
  link.result.max_queue_bytes =
      std::max<uint64_t>(link.result.max_queue_bytes,
                         static_cast<uint64_t>(static_cast<double>(backlog) / link.ps_per_byte));
  const Time ser = static_cast<Time>(bytes * link.ps_per_byte + 0.5);
  const Time start = std::max(t, link.free_at);
  link.free_at = Later(start, ser);
  link.busy = Later(link.busy, ser);
  ++link.result.packets;
  link.result.bytes += static_cast<uint64_t>(bytes);
  const LinkParams& f = link.params;
  if (f.loss > 0 && Coin(cfg_.seed, l, seq, 0) < f.loss) {
    ++link.result.lost;
    pool_.Release(p);
    return;
  }
  const Time arrive = Later(link.free_at, link.propagation);
  int copies = 1;
  if (f.duplicate > 0 && Coin(cfg_.seed, l, seq, 1) < f.duplicate) {
    ++link.result.duplicated;
    ++pool_.Get(p).refs;
    copies = 2;
  }
  for (int c = 0; c < copies; ++c) {
    if (f.reorder > 0 && Coin(cfg_.seed, l, seq, 2 + c) < f.reorder) {
      ++link.result.reordered;
      const Time extra = Ps(f.reorder_ns * Coin(cfg_.seed, l, seq, 4 + c));
      uint32_t id;
      if (delayed_free_.empty()) {
        id = static_cast<uint32_t>(delayed_.size());
        delayed_.push_back({});
      } else {
        id = delayed_free_.back();
        delayed_free_.pop_back();
      }
      delayed_[id] = Delayed{p, link.to, dst};
      Push(Later(arrive, extra), EventKind::kDelayed, id);
      continue;
    }
    if (link.flights.empty()) Push(arrive, EventKind::kLinkHead, l);
    link.flights.push(Flight{arrive, p, dst});
  }
}

void Engine::Deliver(uint32_t p, const Endpoint& dst, uint32_t node) {
  ++delivered_;
  if (switches_[node] != nullptr) {
    if (dst.ipv4 == Topology::Ip(node) && dst.port == kSwitchPort) {
      SwitchReceive(node, p);
      return;
    }
    const uint32_t to = NodeOf(dst.ipv4);
    const uint32_t l = to == UINT32_MAX ? UINT32_MAX : cfg_.topology.NextLink(node, to);
    if (l == UINT32_MAX) {
      pool_.Release(p);
      return;
    }
    Transmit(l, p, dst, Later(now_, switch_latency_));
    return;
  }
  // A host: hand it to the session on that port, if any.
  uint32_t s = kNoSession;
  const auto& table = port_table_[node];
  if (dst.ipv4 == Topology::Ip(node) && dst.port >= kHostPortBase &&
      size_t{dst.port} - kHostPortBase < table.size()) {
    s = table[dst.port - kHostPortBase];
  }
  if (s != kNoSession && sessions_[s].running) {
    const Packet& pk = pool_.Get(p);
    sessions_[s].session->HandleDatagram({pk.data, pk.len}, NowNanos());
    pool_.Release(p);
    AfterSession(s);
    return;
  }
  pool_.Release(p);
}

void Engine::SwitchReceive(uint32_t node, uint32_t p) {
  dataplane::Switch& sw = *switches_[node];
  Packet& in = pool_.Get(p);
  // The round-time statistics: the source's job, and the slot register the packet addresses.
  JobState* job = nullptr;
  size_t reg = 0;
  {
    const uint32_t src_node = NodeOf(in.source.ipv4);
    if (src_node != UINT32_MAX && in.source.port >= kHostPortBase) {
      const auto& table = port_table_[src_node];
      const uint32_t idx = in.source.port - kHostPortBase;
      if (idx < table.size() && table[idx] != kNoSession) {
        job = &jobs_[sessions_[table[idx]].job];
        if (!job->config.tors.empty()) job = nullptr;  // round times: one level only
      }
      if (job != nullptr) {
        proto::Header h;
        if (proto::DecodeHeader({in.data, in.len}, &h) == proto::DecodeError::kOk) {
          reg = size_t{h.slot.index} * 2 + h.slot.set;
          if (reg >= job->open_since.size()) job = nullptr;
        } else {
          job = nullptr;
        }
      }
    }
  }
  if (job != nullptr && job->open_since[reg] == kNever) job->open_since[reg] = now_;
  Time out = now_;
  if (switch_service_ > 0) {
    out = Later(std::max(out, switch_busy_[node]), switch_service_);
    switch_busy_[node] = out;
  }
  out = Later(out, switch_latency_);
  const uint32_t r = pool_.Alloc();
  Packet& reply = pool_.Get(r);
  const dataplane::Action& a = sw.Process(in.source, {in.data, in.len}, reply.data);
  pool_.Release(p);
  if (a.kind == dataplane::Action::Kind::kDrop) {
    pool_.Release(r);
    return;
  }
  if (a.kind == dataplane::Action::Kind::kMulticast && job != nullptr) {
    job->round_ns.push_back(static_cast<float>(now_ - job->open_since[reg]) / 1000.0f);
    job->open_since[reg] = kNever;
  }
  reply.len = static_cast<uint16_t>(a.reply.size());
  reply.source = Endpoint{Topology::Ip(node), kSwitchPort};
  reply.refs = static_cast<uint32_t>(a.destinations.size());
  if (reply.refs == 0) {
    reply.refs = 1;
    pool_.Release(r);
    return;
  }
  for (const Endpoint& d : a.destinations) {
    const uint32_t to = NodeOf(d.ipv4);
    const uint32_t l = to == UINT32_MAX ? UINT32_MAX : cfg_.topology.NextLink(node, to);
    if (l == UINT32_MAX) {
      pool_.Release(r);
      continue;
    }
    Transmit(l, r, d, out);
  }
}

void Engine::AfterSession(uint32_t s) {
  SessionState& ss = sessions_[s];
  worker::SparseSession& session = *ss.session;
  const worker::Nanos now = NowNanos();
  for (;;) {
    // Striped: the switch that serves the next datagram's slot, as the worker library says.
    uint32_t stripe = 0;
    if (!ss.stripe_uplinks.empty()) {
      const std::optional<uint32_t> host = session.NextTransmitHost();
      if (!host) break;
      stripe = *host;
    }
    const uint32_t p = pool_.Alloc();
    Packet& pk = pool_.Get(p);
    const size_t n = session.PollTransmit(now, pk.data);
    if (n == 0) {
      pool_.Release(p);
      break;
    }
    pk.len = static_cast<uint16_t>(n);
    pk.source = ss.self;
    if (ss.stripe_uplinks.empty()) {
      Transmit(ss.uplink, p, ss.switch_ep, Later(now_, host_latency_));
      continue;
    }
    Transmit(ss.stripe_uplinks[stripe], p, jobs_[ss.job].stripe_endpoints[stripe],
             Later(now_, host_latency_));
  }
  if (session.state() != worker::SparseSession::State::kRunning) {
    if (ss.running) SliceDone(s);
    return;
  }
  if (auto d = session.PollTimeout()) {
    Time t = d->count() > kNever / 1000 ? kNever : static_cast<Time>(d->count()) * 1000;
    if (timer_granularity_ > 0 && t != kNever)
      t = Later(t, timer_granularity_ - 1) / timer_granularity_ * timer_granularity_;
    if (t < ss.timer_at) {
      ss.timer_at = t;
      Push(t, EventKind::kTimer, s);
    }
  }
}

testing::Pattern Engine::PatternOf(uint32_t j, uint32_t collective, uint32_t n) const {
  const JobConfig& jc = jobs_[j].config;
  testing::Pattern p{cfg_.seed + j, collective, n, static_cast<uint32_t>(proto::NumelOf(jc.size)),
                     jc.collectives[collective].dtype};
  p.density = jc.density;
  p.overlap = jc.overlap;
  return p;
}

void Engine::StartCollective(uint32_t j, uint32_t rank) {
  JobState& job = jobs_[j];
  RankState& rs = job.ranks[rank];
  const JobConfig& jc = job.config;
  const Collective& c = jc.collectives[rs.collective];
  job.collective_start[rs.collective] = std::min(job.collective_start[rs.collective], now_);
  const size_t numel = proto::NumelOf(jc.size);
  const uint32_t n = static_cast<uint32_t>(jc.hosts.size());
  void* in;
  void* out;
  if (cfg_.payload == PayloadMode::kVerified) {
    rs.in.resize(c.count);
    rs.out.assign(c.count, 0x7fc00000);  // a NaN pattern: outputs left untouched fail
    const testing::Pattern pat = PatternOf(j, rs.collective, n);
    testing::FillInput(pat, rank, rs.in.data(), c.count);
    in = rs.in.data();
    out = rs.out.data();
  } else {
    if (rs.collective >= job.shared_started) {
      // The first rank to start this all-reduce (any rank: rank 0 may still be finishing the
      // previous one) puts its inputs in place. Identical inputs on every worker: the rank-0
      // input of the pattern.
      job.shared_started = rs.collective + 1;
      testing::FillInput(PatternOf(j, rs.collective, 1), 0, job.shared_in.data(), c.count);
      std::fill(job.shared_out.begin(), job.shared_out.begin() + c.count, 0x7fc00000);
    }
    in = job.shared_in.data();
    out = job.shared_out.data();
  }
  const uint32_t T = jc.threads;
  const size_t packets = (c.count + numel - 1) / numel;
  rs.running_sessions = T;
  for (uint32_t t = 0; t < T; ++t) {
    const size_t e0 = std::min<size_t>(c.count, packets * t / T * numel);
    const size_t e1 = std::min<size_t>(c.count, packets * (t + 1) / T * numel);
    const uint32_t s = job.sessions[rank * T + t];
    SessionState& ss = sessions_[s];
    ss.running = true;
    const size_t bytes = c.dtype == DataType::kInt32 ? 4 : 4;
    worker::Slice slice{rs.collective + 1ull,
                        c.dtype,
                        static_cast<const uint8_t*>(in) + e0 * bytes,
                        static_cast<uint8_t*>(out) + e0 * bytes,
                        e1 - e0,
                        e0};
    if (jc.sparse) {  // the whole tensor; the session takes lane t's blocks of it
      slice.in = in;
      slice.out = out;
      slice.count = c.count;
      slice.element_offset = 0;
      slice.sparse = true;
      slice.lane = t;
      slice.lanes = T;
    }
    ss.session->Start(slice, NowNanos());
    ss.slice_packets = ss.session->remaining();
    AfterSession(s);
  }
}

void Engine::SliceDone(uint32_t s) {
  SessionState& ss = sessions_[s];
  ss.running = false;
  ss.timer_at = kNever;
  answered_packets_ += ss.slice_packets;
  JobState& job = jobs_[ss.job];
  if (job.failed) return;
  if (!ss.session->status().ok()) {
    FailJob(job, ss.session->status());
    return;
  }
  RankState& rs = job.ranks[ss.rank];
  if (--rs.running_sessions > 0) return;
  const uint32_t c = rs.collective;
  job.collective_end[c] = std::max(job.collective_end[c], now_);
  const Collective& col = job.config.collectives[c];
  const uint32_t n = static_cast<uint32_t>(job.config.hosts.size());
  if (cfg_.payload == PayloadMode::kVerified && job.result.verify_error.empty()) {
    const testing::Pattern pat = PatternOf(ss.job, c, n);
    testing::VerifyResult v = testing::Verify(pat, rs.out.data(), col.count);
    if (!v.ok()) {
      job.result.verify_error = "all-reduce " + std::to_string(c) + " rank " +
                                std::to_string(ss.rank) + ": " + v.ToString();
    }
  }
  if (++rs.collective < job.config.collectives.size()) {
    StartCollective(ss.job, ss.rank);
    return;
  }
  if (++job.ranks_done_current == n) FinishJob(job);
}

void Engine::FailJob(JobState& job, const Status& st) {
  job.failed = true;
  job.done = true;
  job.result.status = st;
  for (uint32_t s : job.sessions) {
    SessionState& ss = sessions_[s];
    if (ss.running) {
      ss.session->Abort(st);
      ss.running = false;
      ss.timer_at = kNever;
    }
  }
  --jobs_left_;
}

void Engine::FinishJob(JobState& job) {
  job.done = true;
  --jobs_left_;
  JobResult& r = job.result;
  const size_t C = job.config.collectives.size();
  for (size_t c = 0; c < C; ++c) {
    r.collective_seconds.push_back(
        static_cast<double>(job.collective_end[c] - job.collective_start[c]) * 1e-12);
  }
  r.seconds = static_cast<double>(job.collective_end[C - 1] - job.collective_start[0]) * 1e-12;
  r.elements_per_second = r.seconds > 0 ? static_cast<double>(r.elements) / r.seconds : 0;
  if (cfg_.payload == PayloadMode::kShared) {
    // Only the last all-reduce's output is still there to check.
    const Collective& col = job.config.collectives[C - 1];
    const uint32_t n = static_cast<uint32_t>(job.config.hosts.size());
    const size_t numel = proto::NumelOf(job.config.size);
    for (size_t i = 0; i < col.count && r.verify_error.empty(); ++i) {
      if (col.dtype == DataType::kInt32) {
        const int32_t want = static_cast<int32_t>(static_cast<uint32_t>(job.shared_in[i]) * n);
        if (job.shared_out[i] != want) {
          r.verify_error = "element " + std::to_string(i) + ": got " +
                           std::to_string(job.shared_out[i]) + ", want " + std::to_string(want);
        }
      } else {
        // Within the quantization bound: n / (2 f) of the block's scale, f = 2^(30 - e) / n
        // for the block's largest magnitude 2^e (docs/architecture.md 5.2), loosely.
        const size_t b0 = i / numel * numel, b1 = std::min<size_t>(col.count, b0 + numel);
        float maxabs = 0;
        for (size_t k = b0; k < b1; ++k) {
          float x;
          std::memcpy(&x, &job.shared_in[k], 4);
          maxabs = std::max(maxabs, std::fabs(x));
        }
        for (size_t k = b0; k < b1 && r.verify_error.empty(); ++k) {
          float x, y;
          std::memcpy(&x, &job.shared_in[k], 4);
          std::memcpy(&y, &job.shared_out[k], 4);
          const double want = double{x} * n;
          const double bound = double{maxabs} * n * n * 0x1.0p-28 + std::fabs(want) * 1e-6;
          if (!(std::fabs(double{y} - want) <= bound)) {
            r.verify_error = "element " + std::to_string(k) + ": got " + std::to_string(y) +
                             ", want " + std::to_string(want);
          }
        }
        i = b1 - 1;
      }
    }
  }
  r.verified = r.verify_error.empty();
}

double Engine::ProgressFraction() const {
  if (total_packets_ == 0) return 1;
  uint64_t answered = answered_packets_;
  for (const SessionState& s : sessions_) {
    if (s.running) answered += s.slice_packets - s.session->remaining();
  }
  return std::min(1.0, static_cast<double>(answered) / static_cast<double>(total_packets_));
}

SimResult Engine::Run() {
  const Time limit = Ps(cfg_.max_sim_seconds * 1e9);
  uint64_t next_progress = cfg_.progress_every_events;
  while (!heap_.empty() && jobs_left_ > 0) {
    const Event ev = heap_.top();
    heap_.pop();
    if (ev.t > limit) {
      now_ = limit;
      break;
    }
    now_ = ev.t;
    ++events_;
    switch (ev.kind) {
      case EventKind::kLinkHead: {
        LinkState& link = links_[ev.id];
        const Flight f = link.flights.front();
        link.flights.pop();
        if (!link.flights.empty()) Push(link.flights.front().arrive, EventKind::kLinkHead, ev.id);
        Deliver(f.packet, f.destination, link.to);
        break;
      }
      case EventKind::kTimer: {
        SessionState& ss = sessions_[ev.id];
        if (ev.t != ss.timer_at || !ss.running) break;
        ss.timer_at = kNever;
        ss.session->HandleTimeout(NowNanos());
        AfterSession(ev.id);
        break;
      }
      case EventKind::kDelayed: {
        const Delayed d = delayed_[ev.id];
        delayed_free_.push_back(ev.id);
        Deliver(d.packet, d.destination, d.node);
        break;
      }
      case EventKind::kJobStart: {
        for (uint32_t r = 0; r < jobs_[ev.id].ranks.size(); ++r) StartCollective(ev.id, r);
        break;
      }
    }
    if (cfg_.progress && events_ >= next_progress) {
      next_progress += cfg_.progress_every_events;
      cfg_.progress(Progress{static_cast<double>(now_) * 1e-12, events_, ProgressFraction()});
    }
  }
  for (JobState& job : jobs_) {
    if (!job.done) {
      FailJob(job, DeadlineExceededError("the job did not finish within the simulated " +
                                         std::to_string(cfg_.max_sim_seconds) + " s"));
    }
  }
  SimResult out;
  out.sim_seconds = static_cast<double>(now_) * 1e-12;
  out.events = events_;
  out.packets_delivered = delivered_;
  for (JobState& job : jobs_) {
    JobResult& r = job.result;
    for (uint32_t s : job.sessions) {
      const worker::SessionCounters c = sessions_[s].session->counters();
      r.sent += c.sent;
      r.retransmitted += c.retransmitted;
      r.timeouts += c.timeouts;
      r.results += c.results;
      r.duplicates += c.duplicates;
      r.early_retransmits += c.early_retransmits;
      r.foreign_slot += c.foreign_slot;
      r.stale += c.stale;
      const worker::SparseCounters& sc = sessions_[s].session->sparse_counters();
      r.sparse_blocks += sc.blocks;
      r.sparse_union_blocks += sc.union_blocks;
    }
    for (uint32_t node : job.switch_nodes) {
      const dataplane::Switch& sw = *switches_[node];
      const dataplane::JobCounters* jc = sw.job_counters(job.config.job_id);
      if (jc == nullptr) continue;
      using dataplane::DropReason;
      StripeResult sr;
      sr.node = node;
      sr.received = jc->received;
      sr.aggregated = jc->aggregated;
      sr.completed = jc->completed;
      sr.unicasts = jc->retransmitted;
      sr.duplicates_dropped = jc->dropped[static_cast<int>(DropReason::kDuplicate)];
      const auto slots = sw.slot_counters(job.config.job_id);
      for (size_t i = 0; i < slots.size(); ++i) {
        if (slots[i].received > 0) sr.slots.push_back(static_cast<uint32_t>(i));
      }
      r.switch_unicasts += sr.unicasts;
      r.switch_duplicates_dropped += sr.duplicates_dropped;
      r.switch_wrong_size += jc->dropped[static_cast<int>(DropReason::kWrongSize)];
      r.switch_slot_out_of_range += jc->dropped[static_cast<int>(DropReason::kSlotOutOfRange)];
      r.stripes.push_back(std::move(sr));
    }
    std::vector<float>& rt = job.round_ns;
    StallStats& st = r.stalls;
    st.rounds = rt.size();
    if (!rt.empty()) {
      double sum = 0;
      for (float x : rt) sum += x;
      st.mean_ns = sum / static_cast<double>(rt.size());
      auto pct = [&](double q) {
        const size_t k =
            std::min(rt.size() - 1, static_cast<size_t>(q * static_cast<double>(rt.size())));
        std::nth_element(rt.begin(), rt.begin() + static_cast<std::ptrdiff_t>(k), rt.end());
        return static_cast<double>(rt[k]);
      };
      st.p50_ns = pct(0.5);
      st.p99_ns = pct(0.99);
      st.max_ns = *std::max_element(rt.begin(), rt.end());
      for (float x : rt) st.stalled += x > 2 * st.p50_ns + 1000 ? 1 : 0;
    }
    out.jobs.push_back(std::move(r));
  }
  for (const auto& sw : switches_) {
    if (sw != nullptr) out.switch_unknown_source += sw->counters().dropped_unknown_source;
  }
  const double total = static_cast<double>(now_);
  for (LinkState& l : links_) {
    l.result.utilisation = total > 0 ? static_cast<double>(l.busy) / total : 0;
    out.links.push_back(l.result);
  }
  return out;
}

}  // namespace

Result<SimResult> Simulate(SimConfig config) {
  auto engine = std::make_unique<Engine>(std::move(config));
  RETURN_IF_ERROR(engine->Setup());
  return engine->Run();
}

}  // namespace switchml::sim
