#include "runtime/switch_daemon.h"

#include <pthread.h>
#include <time.h>

#include <array>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "base/affinity.h"
#include "base/endpoint.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "proto/wire.h"
#include "transport/factory.h"
#include "transport/shm.h"
#include "transport/udp.h"

namespace switchml::runtime {
namespace {
// Datagrams per receive; each may produce one reply in a transmit buffer of its own.
constexpr size_t kBatch = 256;
static_assert(kBatch <= transport::Transport::kTxBuffers);
// Destinations remembered for grouping; the table starts over when it holds more.
constexpr size_t kMaxBuckets = 4096;
// Data-plane threads at most.
constexpr uint32_t kMaxThreads = 64;

// A counter only its shard's thread writes: a plain load and store (no locked read-modify-write
// on the packet path), read by others with a relaxed load.
void Bump(std::atomic<uint64_t>& counter, uint64_t n = 1) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

void Add(dataplane::JobCounters& sum, const dataplane::JobCounters& c) {
  sum.received += c.received;
  sum.aggregated += c.aggregated;
  sum.completed += c.completed;
  sum.multicast_packets += c.multicast_packets;
  sum.group_sends += c.group_sends;
  sum.group_demoted += c.group_demoted;
  sum.retransmitted += c.retransmitted;
  sum.upstream_sent += c.upstream_sent;
  sum.upstream_resent += c.upstream_resent;
  sum.upstream_results += c.upstream_results;
  sum.upstream_coalesced += c.upstream_coalesced;
  for (int r = 0; r < dataplane::kNumDropReasons; ++r) sum.dropped[r] += c.dropped[r];
}

}  // namespace

// One data-plane thread: its transport, its replica of the master switch, its scratch.
struct SwitchDaemon::Shard {
  Shard(const dataplane::SwitchConfig& config, std::unique_ptr<transport::Transport> t)
      : transport(std::move(t)), sw(config), max_datagram(dataplane::MaxDatagramBytes(config)) {
    const size_t max_tx = kBatch * config.max_workers_per_job;
    tx.reserve(max_tx);
    sorted.resize(max_tx);
    tx_bucket.resize(max_tx);
    bucket_start.reserve(kMaxBuckets + 2);
  }

  // Orders tx by destination into sorted (stable: each destination's replies keep their order),
  // so that each destination's replies are consecutive: a counting sort over destination
  // buckets, which allocates nothing once the bucket table has seen every destination.
  void GroupByDestination() {
    if (buckets.size() > kMaxBuckets) {
      buckets.clear();
      recent_count = recent_next = 0;
    }
    for (size_t i = 0; i < tx.size(); ++i) tx_bucket[i] = Bucket(tx[i].destination);
    bucket_start.assign(buckets.size() + 1, 0);
    for (size_t i = 0; i < tx.size(); ++i) ++bucket_start[tx_bucket[i] + 1];
    for (size_t b = 1; b < bucket_start.size(); ++b) bucket_start[b] += bucket_start[b - 1];
    for (size_t i = 0; i < tx.size(); ++i) sorted[bucket_start[tx_bucket[i]]++] = tx[i];
  }

  // After a reply built in memory lent for reply_group (index: its transmit buffer index): the
  // reply to send, moved to spill unless it goes to that group alone (memory lent for a
  // destination is that destination's alone: transport.h TxBufferTo); and the next reply's
  // group.
  std::span<const uint8_t> KeepGroupMemoryForTheGroup(const dataplane::Action& a, size_t index) {
    std::span<const uint8_t> data = a.reply;
    const bool alone = a.destinations.size() == 1 && a.destinations[0] == reply_group;
    if (!alone) {
      if (spill.empty()) spill.resize(kBatch * max_datagram);
      uint8_t* to = spill.data() + index * max_datagram;
      std::memcpy(to, a.reply.data(), a.reply.size());
      data = {to, a.reply.size()};
    }
    NoteReplyGroup(a);
    return data;
  }
  void NoteReplyGroup(const dataplane::Action& a) {
    constexpr uint32_t kMulticastMask = 0xf0000000, kMulticastNet = 0xe0000000;
    if (a.destinations.size() == 1 && (a.destinations[0].ipv4 & kMulticastMask) == kMulticastNet) {
      reply_group = a.destinations[0];
    } else if (a.kind == dataplane::Action::Kind::kMulticast) {
      reply_group = Endpoint{};
    }
  }

  // The destination's bucket: a job's few workers are found in a small array of recent
  // destinations without hashing; others in the table.
  uint32_t Bucket(const Endpoint& destination) {
    for (size_t k = 0; k < recent_count; ++k) {
      if (recent[k].first == destination) return recent[k].second;
    }
    auto [it, inserted] = buckets.try_emplace(destination, static_cast<uint32_t>(buckets.size()));
    recent[recent_next] = {destination, it->second};
    recent_next = (recent_next + 1) % recent.size();
    recent_count = std::max(recent_count, recent_next == 0 ? recent.size() : recent_next);
    return it->second;
  }

  std::unique_ptr<transport::Transport> transport;
  // The replica, used by the shard's thread under mu (which readers of its counters also take;
  // the control plane never does: the replica follows the master by MirrorJobs).
  mutable std::mutex mu;
  dataplane::Switch sw;
  uint64_t mirrored = UINT64_MAX;  // the master's mutations() the replica reflects
  std::atomic<uint64_t> received{0}, sent{0}, truncated{0}, naps{0};
  // Datagrams the pipeline dropped, by dataplane::DropReason, and stored results re-sent to one
  // worker (written by the shard's thread alone: Bump).
  std::array<std::atomic<uint64_t>, dataplane::kNumDropReasons> dropped{};
  std::atomic<uint64_t> unicast_resends{0};
  // The thread's CPU clock (pthread_getcpuclockid), valid while it runs; set before it starts.
  clockid_t cpu_clock{};
  std::atomic<bool> has_cpu_clock{false};
  // Scratch of the thread, sized once: the batch's replies and their grouping.
  std::vector<transport::TxDatagram> tx, sorted;
  std::vector<uint32_t> tx_bucket;                 // tx[i]'s destination bucket
  std::unordered_map<Endpoint, uint32_t> buckets;  // destination -> bucket, kept across batches
  std::vector<uint32_t> bucket_start;
  std::array<std::pair<Endpoint, uint32_t>, 8> recent{};  // of buckets, the latest misses
  size_t recent_count = 0, recent_next = 0;
  // The group the last reply went to alone (ipv4 0: none): with a transport that lends a
  // group's memory (shm: its ring, sent without a copy), the next reply is built there.
  bool group_lending = false;
  Endpoint reply_group;
  std::vector<uint8_t> spill;  // replies built in a group's memory that go elsewhere (kBatch)
  // The largest datagram of any job the switch accepts (its max_packet_numel).
  const size_t max_datagram;
  std::thread thread;
};

Status SwitchDaemonOptions::Validate() const {
  uint32_t ip;
  if (!ParseIpv4(bind_address, &ip)) {
    return InvalidArgumentError("bind address '" + bind_address +
                                "' is not an IPv4 address (use 0.0.0.0 for all)");
  }
  if (!(loss >= 0 && loss < 1)) {
    return InvalidArgumentError("loss must be in [0, 1), e.g. 0.01 for 1%");
  }
  if (nap.count() < 0 || nap > kMaxNap) {
    return InvalidArgumentError("receive coalescing (nap) must be 0.." +
                                std::to_string(kMaxNap.count()) + " us, got " +
                                std::to_string(nap.count()));
  }
  if (nap.count() > 0 && busy_poll) {
    return InvalidArgumentError(
        "busy polling and receive coalescing (nap) contradict each other: choose one");
  }
  if (threads < 1 || threads > kMaxThreads) {
    return InvalidArgumentError("data-plane threads must be in 1.." + std::to_string(kMaxThreads) +
                                ", got " + std::to_string(threads));
  }
  if (data_port != 0 && uint32_t{data_port} + threads - 1 > 65535) {
    return InvalidArgumentError("data ports " + std::to_string(data_port) + ".." +
                                std::to_string(uint32_t{data_port} + threads - 1) +
                                " pass 65535: choose a lower data port");
  }
  transport::TransportOptions t;
  t.kind = transport;
  RETURN_IF_ERROR(t.Validate());
  if (multicast_ttl < 1 || multicast_ttl > 255) {
    return InvalidArgumentError("multicast TTL must be in 1..255, got " +
                                std::to_string(multicast_ttl));
  }
  if (!upstream.empty()) {
    UplinkOptions u;
    u.upstream = upstream;
    u.rack_index = rack_index;
    u.racks = racks;
    u.data_port = 1;  // checked once known
    RETURN_IF_ERROR(u.Validate());
  } else if (racks != 0) {
    return InvalidArgumentError("racks and a rack index need an upstream switch");
  }
  return switch_config.Validate();
}

// The transports with multicast groups (transport::Capabilities: kernel UDP, and shm with groups
// of this host only) get them; the others do not. Bound to a loopback address or to any, or over
// a transport whose groups stay on this host: groups of this host's workers, on the loopback
// interface. Bound to a LAN address: groups on that address's interface (the workers cannot
// reach the switch through the loopback interface then).
namespace {
void ChooseMulticastScope(SwitchDaemonOptions* options, transport::TransportOptions* topts) {
  constexpr uint32_t kLoopbackNet = 0x7f000000, kLoopbackMask = 0xff000000;
  dataplane::SwitchConfig& c = options->switch_config;
  c.loopback_multicast = c.lan_multicast = false;
  const transport::Capabilities caps = transport::CapabilitiesOf(options->transport);
  if (!caps.host_multicast) return;
  const uint32_t bind = topts->bind_ipv4;
  if (!caps.lan_multicast || bind == 0 || (bind & kLoopbackMask) == kLoopbackNet) {
    c.loopback_multicast = true;
    return;
  }
  if (!options->lan_multicast) {
    LOG(kInfo, kDataplane) << "LAN multicast off (--no-lan-multicast): results go to each worker";
    return;
  }
  auto iface = transport::InterfaceToward(bind, bind);
  if (!iface.ok() || !iface->multicast || iface->loopback) {
    LOG(kWarning, kDataplane) << "LAN multicast off: "
                              << (iface.ok() ? "interface " + iface->name + " of " +
                                                   Ipv4ToString(bind) + " cannot send multicast"
                                             : iface.status().message())
                              << "; results go to each worker";
    return;
  }
  c.lan_multicast = true;
  topts->udp.multicast_ttl = options->multicast_ttl;
  LOG(kInfo, kDataplane)
      << "LAN multicast on " << iface->name << " (TTL " << options->multicast_ttl
      << ") for jobs whose workers ask for it (switchml worker --multicast auto, the "
         "default, or on)";
}
}  // namespace

SwitchDaemon::SwitchDaemon(const SwitchDaemonOptions& options)
    : options_(options),
      switch_(std::make_unique<dataplane::LockedSwitch>(options.switch_config)) {}

Result<std::unique_ptr<SwitchDaemon>> SwitchDaemon::Start(const SwitchDaemonOptions& given) {
  RETURN_IF_ERROR(given.Validate());
  SwitchDaemonOptions options = given;
  std::vector<int> cpus;  // pin_threads: shard t runs on CpuOfThread(cpus, t)
  if (options.pin_threads) {
    ASSIGN_OR_RETURN(cpus, AllowedCpus());
  }
  transport::TransportOptions topts;
  topts.kind = options.transport;
  ParseIpv4(options.bind_address, &topts.bind_ipv4);
  ChooseMulticastScope(&options, &topts);
  std::unique_ptr<SwitchDaemon> d(new SwitchDaemon(options));
  topts.port = options.data_port;
  // Room for the authenticated data plane's tag (the wrapper lends and accepts
  // transport::kAuthRoomBytes less: exactly the largest datagram of the packet sizes the switch
  // accepts, 1034 bytes unless max_packet_numel enables jumbo packets).
  const size_t max_datagram = dataplane::MaxDatagramBytes(options.switch_config);
  topts.max_datagram_bytes = max_datagram + transport::kAuthRoomBytes;
  topts.udp.socket_buffer_bytes = 16 << 20;  // room for every worker's window at once
  topts.switch_side = true;
  topts.shm.ring_slots = transport::kShmDataPlaneRingSlots;
  topts.loss = options.loss;
  topts.loss_seed = options.seed;
  auto ts = transport::OpenTransports(topts, options.threads);
  if (!ts.ok()) {
    return Status(ts.status().code(), "data port: " + ts.status().message());
  }
  // A transport that cannot carry the largest packet the switch would accept (xdp: one UMEM frame)
  // is refused here rather than truncating every such datagram later.
  if (const size_t most = (*ts)[0]->max_datagram_bytes(); most < topts.max_datagram_bytes) {
    return FailedPreconditionError(
        "data port: the " + (*ts)[0]->name() + " transport carries datagrams of at most " +
        std::to_string(most) + " bytes, and --max-packet-numel " +
        std::to_string(options.switch_config.max_packet_numel) + " needs " +
        std::to_string(topts.max_datagram_bytes) +
        "; use --max-packet-numel 256 or a transport that carries them (udp, shm)");
  }
  d->auth_keys_ = std::make_shared<transport::AuthKeyTable>();
  for (auto& t : *ts) {
    // Datagrams of authenticated jobs are verified and stripped (others pass unchanged).
    t = transport::MakeAuthenticated(std::move(t), d->auth_keys_);
    d->shards_.push_back(std::make_unique<Shard>(options.switch_config, std::move(t)));
    d->shards_.back()->group_lending =
        transport::CapabilitiesOf(options.transport).lends_destination_memory;
  }
  const transport::Transport& first = *d->shards_[0]->transport;
  d->data_port_ = first.local_endpoint().port;
  LOG(kInfo, kDataplane) << "data plane on " << first.local_endpoint().ToString() << " ("
                         << options.threads << " thread" << (options.threads > 1 ? "s" : "")
                         << ") over " << first.name();
  control::ControlServerOptions copts = options.control;
  copts.registry_hooks.activity = [p = d.get()](uint64_t job_id) -> uint64_t {
    auto c = p->job_counters(job_id);
    return c ? c->received : 0;
  };
  copts.snapshot = [p = d.get()] { return p->Snapshot(); };
  copts.bind_address = options.bind_address;
  copts.port = options.control_port;
  copts.data_port = d->data_port_;
  copts.num_data_ports = options.threads;
  copts.switch_ipv4 = topts.bind_ipv4;
  copts.registry_hooks.data_key_added =
      [keys = d->auth_keys_](uint64_t job_id, const std::string& data_key, uint32_t rank,
                             uint32_t ipv4, uint32_t port, uint32_t num_ports) {
        transport::AuthKey key;
        if (transport::AuthKeyFromBytes(data_key, &key)) {
          keys->Add(job_id, key, rank, ipv4, static_cast<uint16_t>(port), num_ports);
        }
      };
  copts.registry_hooks.job_removed = [keys = d->auth_keys_,
                                      then = copts.registry_hooks.job_removed](uint64_t id) {
    keys->RemoveJob(id);
    if (then) then(id);
  };
  if (!options.upstream.empty()) {
    UplinkOptions u;
    u.upstream = options.upstream;
    u.rack_index = options.rack_index;
    u.racks = options.racks;
    u.data_ipv4 = topts.bind_ipv4;  // 0 (any): the upstream uses our control connection's address
    u.data_port = d->data_port_;
    u.num_data_ports = options.threads;
    RETURN_IF_ERROR(u.Validate());
    d->uplink_ = std::make_unique<Uplink>(u, d->switch_.get());
    copts.hooks = d->uplink_.get();
    // The tags end at this switch: the partial sums to and from the upstream switch would travel
    // unauthenticated, so the combination is refused rather than half protected.
    copts.registry.authenticated_data_unsupported =
        "this switch is a top-of-rack switch of a two-level hierarchy (--upstream), which does "
        "not authenticate the partial sums it exchanges with its upstream switch";
    // Liveness and tensor checks across both levels (uplink.h).
    Uplink* uplink = d->uplink_.get();
    copts.registry_hooks.job_ended = [uplink](uint64_t id, const Status& why) {
      uplink->OnJobEnded(id, why);
    };
    copts.registry_hooks.check_agreed = [uplink](uint64_t id, uint64_t op, uint64_t count,
                                                 uint32_t dtype) {
      uplink->OnCheckAgreed(id, op, count, dtype);
    };
    LOG(kInfo, kControl) << "top of rack " << options.rack_index << " of " << options.racks
                         << " under the upstream switch " << options.upstream;
  }
  auto c = control::ControlServer::Start(copts, d->switch_.get());
  if (!c.ok()) return c.status();
  d->control_ = std::move(c).value();
  if (d->uplink_) d->uplink_->set_registry(&d->control_->registry());
  for (uint32_t t = 0; t < d->shards_.size(); ++t) {
    const int cpu = cpus.empty() ? -1 : CpuOfThread(cpus, t);
    d->shards_[t]->thread = std::thread([p = d.get(), s = d->shards_[t].get(), cpu] {
      PinDataThread(cpu, LogSubsystem::kDataplane);
      p->Run(*s);
    });
    Shard& shard = *d->shards_[t];
    if (pthread_getcpuclockid(shard.thread.native_handle(), &shard.cpu_clock) == 0) {
      shard.has_cpu_clock.store(true, std::memory_order_release);
    }
  }
  return d;
}

SwitchDaemon::~SwitchDaemon() { Stop(); }

void SwitchDaemon::Stop() {
  if (stop_.exchange(true)) return;
  if (uplink_) uplink_->Shutdown();
  if (control_) control_->Shutdown();
  // No RPC runs any more: end the uplink (its task thread may still use the registry).
  if (uplink_) uplink_->set_registry(nullptr);
  uplink_.reset();
  for (auto& s : shards_) s->transport->Wake();
  for (auto& s : shards_) {
    if (s->thread.joinable()) s->thread.join();
  }
}

void SwitchDaemon::Run(Shard& shard) {
  std::array<transport::RxDatagram, kBatch> rx;
  transport::Transport& transport = *shard.transport;
  transport.TxBuffer(0);  // the transmit memory, allocated and touched before traffic
  const auto wait =
      options_.busy_poll ? std::chrono::milliseconds(0) : std::chrono::milliseconds(200);
  while (!stop_.load(std::memory_order_relaxed)) {
    auto r = transport.Receive(rx, wait);
    if (!r.ok()) {
      LOG(kError, kDataplane) << "receive failed: " << r.status().ToString();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // do not spin on a hard error
      continue;
    }
    if (*r == 0) continue;
    shard.received.fetch_add(*r, std::memory_order_relaxed);
    shard.tx.clear();
    {
      std::lock_guard<std::mutex> lock(shard.mu);
      if (switch_->sw.mutations() != shard.mirrored) {
        // The control plane changed the jobs: mirror them (rare; only then the master's lock).
        std::lock_guard<std::mutex> master(switch_->mu);
        shard.sw.MirrorJobs(switch_->sw);
        shard.mirrored = switch_->sw.mutations();
      }
      size_t replies = 0;
      for (size_t i = 0; i < *r; ++i) {
        if (rx[i].truncated) {  // longer than any SwitchML packet: not ours
          shard.truncated.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        // The reply goes over the datagram where the transport lends it for that (DPDK: no
        // transmit buffer to take and fill), else into the ring of the group it will likely go
        // to (shm), else into a transmit buffer.
        const bool over = rx[i].reply_buffer.size() >= shard.max_datagram;
        const bool to_group = !over && shard.group_lending && shard.reply_group.ipv4 != 0;
        std::span<uint8_t> reply = rx[i].reply_buffer;
        if (to_group) {
          reply = transport.TxBufferTo(replies, shard.reply_group);
        } else if (!over) {
          reply = transport.TxBuffer(replies);
        }
        const dataplane::Action& a = shard.sw.Process(rx[i].source, rx[i].data, reply);
        if (a.kind == dataplane::Action::Kind::kDrop) {
          if (a.reason != dataplane::DropReason::kNone) {  // (kNone: aggregated, no reply)
            Bump(shard.dropped[static_cast<size_t>(a.reason)]);
          }
          continue;
        }
        if (a.kind == dataplane::Action::Kind::kUnicast) Bump(shard.unicast_resends);
        std::span<const uint8_t> data = a.reply;
        if (to_group) {
          data = shard.KeepGroupMemoryForTheGroup(a, replies);
        } else {
          shard.NoteReplyGroup(a);
        }
        if (!over) ++replies;
        for (const Endpoint& dst : a.destinations) shard.tx.push_back({dst, data});
      }
    }
    shard.GroupByDestination();
    size_t done = 0;
    const std::span<const transport::TxDatagram> out(shard.sorted.data(), shard.tx.size());
    for (int attempt = 0; done < out.size() && attempt < 1000; ++attempt) {
      auto s = transport.Send(out.subspan(done));
      if (!s.ok()) {
        LOG(kError, kDataplane) << "send failed: " << s.status().ToString();
        break;
      }
      done += *s;
      if (done < out.size()) std::this_thread::yield();
    }
    shard.sent.fetch_add(done, std::memory_order_relaxed);
    if (options_.nap.count() > 0 && *r < rx.size()) {
      // The port is empty: let datagrams gather for the next receive (receive coalescing).
      shard.naps.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::sleep_for(options_.nap);
    }
  }
}

std::vector<DaemonCounters> SwitchDaemon::shard_counters() const {
  std::vector<DaemonCounters> out;
  for (const auto& s : shards_) {
    const transport::TransportCounters t = s->transport->counters();
    DaemonCounters c;
    c.received = s->received.load(std::memory_order_relaxed);
    c.sent = s->sent.load(std::memory_order_relaxed);
    c.truncated = s->truncated.load(std::memory_order_relaxed);
    c.loss_dropped_in = t.loss_dropped_in;
    c.loss_dropped_out = t.loss_dropped_out;
    c.receive_calls = t.receive_calls;
    c.send_calls = t.send_calls;
    c.coalesced_receives = t.coalesced_receives;
    c.segmented_sends = t.segmented_sends;
    c.send_errors = t.send_errors;
    c.send_buffer_full = t.send_buffer_full;
    c.auth_dropped = t.auth_dropped;
    c.naps = s->naps.load(std::memory_order_relaxed);
    out.push_back(c);
  }
  return out;
}

DaemonCounters SwitchDaemon::counters() const {
  DaemonCounters sum;
  for (const DaemonCounters& c : shard_counters()) {
    sum.received += c.received;
    sum.sent += c.sent;
    sum.truncated += c.truncated;
    sum.loss_dropped_in += c.loss_dropped_in;
    sum.loss_dropped_out += c.loss_dropped_out;
    sum.receive_calls += c.receive_calls;
    sum.send_calls += c.send_calls;
    sum.coalesced_receives += c.coalesced_receives;
    sum.segmented_sends += c.segmented_sends;
    sum.send_errors += c.send_errors;
    sum.send_buffer_full += c.send_buffer_full;
    sum.auth_dropped += c.auth_dropped;
    sum.naps += c.naps;
  }
  return sum;
}

dataplane::SwitchCounters SwitchDaemon::switch_counters() const {
  dataplane::SwitchCounters sum;
  for (const auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    const dataplane::SwitchCounters& c = s->sw.counters();
    sum.received += c.received;
    for (int e = 0; e < proto::kNumDecodeErrors; ++e) {
      sum.dropped_malformed[e] += c.dropped_malformed[e];
    }
    sum.dropped_unknown_source += c.dropped_unknown_source;
    sum.upstream_results += c.upstream_results;
  }
  std::lock_guard<std::mutex> lock(switch_->mu);
  sum.jobs_evicted = switch_->sw.counters().jobs_evicted;
  return sum;
}

std::optional<dataplane::JobCounters> SwitchDaemon::job_counters(uint64_t job_id) const {
  std::optional<dataplane::JobCounters> sum;
  for (const auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    if (const dataplane::JobCounters* c = s->sw.job_counters(job_id)) {
      if (!sum) sum.emplace();
      Add(*sum, *c);
    }
  }
  return sum;
}

control::SwitchSnapshot SwitchDaemon::Snapshot() const {
  control::SwitchSnapshot snap;
  snap.transport = options_.transport;
  snap.data_port = data_port_;
  snap.started = started_;
  snap.uptime = std::chrono::steady_clock::now() - started_steady_;
  snap.config = options_.switch_config;
  snap.upstream = options_.upstream;
  const std::vector<DaemonCounters> counters = shard_counters();
  for (size_t k = 0; k < shards_.size(); ++k) {
    const Shard& s = *shards_[k];
    const DaemonCounters& c = counters[k];
    control::ThreadSnapshot& t = snap.threads.emplace_back();
    t.port = static_cast<uint16_t>(data_port_ + k);
    t.received = c.received;
    t.sent = c.sent;
    t.receive_calls = c.receive_calls;
    t.send_calls = c.send_calls;
    t.truncated = c.truncated;
    t.auth_dropped = c.auth_dropped;
    t.loss_dropped_in = c.loss_dropped_in;
    t.loss_dropped_out = c.loss_dropped_out;
    t.send_errors = c.send_errors;
    for (int r = 0; r < dataplane::kNumDropReasons; ++r) {
      t.dropped[r] = s.dropped[r].load(std::memory_order_relaxed);
    }
    t.unicast_resends = s.unicast_resends.load(std::memory_order_relaxed);
    timespec ts{};
    if (!stop_.load() && s.has_cpu_clock.load(std::memory_order_acquire) &&
        clock_gettime(s.cpu_clock, &ts) == 0) {
      t.cpu_seconds = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
    }
  }
  {
    std::lock_guard<std::mutex> lock(switch_->mu);
    snap.jobs_evicted = switch_->sw.counters().jobs_evicted;
    for (uint64_t id : switch_->sw.job_ids()) {
      const dataplane::JobSpec* spec = switch_->sw.FindJob(id);
      if (spec == nullptr) continue;
      control::JobDataSnapshot& j = snap.jobs[id];
      j.spec = *spec;
      j.elements_per_packet = static_cast<uint32_t>(proto::NumelOf(spec->size));
      j.payload_bytes = j.elements_per_packet * 4;
    }
  }
  for (const auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    for (auto& [id, j] : snap.jobs) {
      if (const dataplane::JobCounters* c = s->sw.job_counters(id)) Add(j.counters, *c);
    }
  }
  return snap;
}

std::string SwitchDaemon::FormatCounters(bool per_slot) const {
  const DaemonCounters c = counters();
  std::ostringstream out;
  out << "daemon: received " << c.received << ", sent " << c.sent << " over "
      << shards_[0]->transport->name() << " by " << shards_.size() << " thread"
      << (shards_.size() > 1 ? "s" : "") << " (" << c.receive_calls << " receive calls, "
      << c.send_calls << " send calls, " << c.coalesced_receives << " coalesced receives, "
      << c.segmented_sends << " segmented sends)";
  if (options_.loss > 0) {
    out << ", loss-simulator dropped " << c.loss_dropped_in << " in and " << c.loss_dropped_out
        << " out";
  }
  if (c.truncated > 0) out << ", oversized " << c.truncated;
  if (c.naps > 0) out << ", coalescing naps " << c.naps;
  if (c.send_errors > 0) out << ", replies not sent (send errors) " << c.send_errors;
  if (c.send_buffer_full > 0) out << ", sends cut short by a full buffer " << c.send_buffer_full;
  if (c.auth_dropped > 0 || auth_keys_->size() > 0) {
    out << ", authentication failed (dropped) " << c.auth_dropped;
  }
  out << "\n";
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (shards_.size() > 1) out << "shard " << k << " (port " << data_port_ + k << "):\n";
    std::lock_guard<std::mutex> lock(shards_[k]->mu);
    out << shards_[k]->sw.FormatCounters(per_slot);
  }
  return out.str();
}

}  // namespace switchml::runtime
