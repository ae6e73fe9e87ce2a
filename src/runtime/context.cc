#include "switchml/context.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <vector>

#include "base/affinity.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "control/control_client.h"
#include "proto/wire.h"
#include "runtime/packet_size.h"
#include "runtime/worker_thread.h"
#include "transport/address.h"
#include "transport/auth.h"
#include "transport/factory.h"
#include "transport/shm.h"
#include "transport/udp.h"

namespace switchml {
namespace {

// The slots a striped job asks of each host: the software switch's default pool
// (dataplane::SwitchConfig::slots_per_job), which holds a slot range per failover.
constexpr uint32_t kStripedJobSlots = 8192;

// A switch host as the config names it.
struct SwitchTarget {
  std::string host;
  uint16_t port = 0;
  std::string name() const { return host + ":" + std::to_string(port); }
};

// The job's switch hosts (Config::switch_hosts, else switch_host): checked for syntax and
// duplicates without resolving names (Validate must not block).
Result<std::vector<SwitchTarget>> SwitchTargetsOf(const Config& config) {
  std::vector<SwitchTarget> targets;
  if (config.switch_hosts.empty()) {
    targets.push_back(SwitchTarget{config.switch_host, config.control_port});
    return targets;
  }
  if (config.switch_hosts.size() > Config::kMaxSwitchHosts) {
    return InvalidArgumentError("switch_hosts names " + std::to_string(config.switch_hosts.size()) +
                                " switch hosts; at most " +
                                std::to_string(Config::kMaxSwitchHosts) + " are supported");
  }
  for (const std::string& text : config.switch_hosts) {
    SwitchTarget t{text, config.control_port};
    if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
      t.host = text.substr(0, colon);
      const std::string port = text.substr(colon + 1);
      const bool digits = !port.empty() && port.size() <= 5 &&
                          port.find_first_not_of("0123456789") == std::string::npos;
      const long value = digits ? std::stol(port) : 0;
      if (value < 1 || value > 65535) {
        return InvalidArgumentError("switch host '" + text +
                                    "': the port must be a number in 1..65535");
      }
      t.port = static_cast<uint16_t>(value);
    }
    if (t.host.empty()) {
      return InvalidArgumentError("switch host '" + text + "' has no host name or address");
    }
    for (const SwitchTarget& other : targets) {
      if (other.name() == t.name()) {
        return InvalidArgumentError("switch host " + t.name() +
                                    " is listed twice: list each switch host once");
      }
    }
    targets.push_back(t);
  }
  return targets;
}

}  // namespace

Status Config::Validate() const {
  if (num_workers == 0) return InvalidArgumentError("num_workers must be at least 1");
  if (rank >= num_workers) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is out of range: with " +
                                std::to_string(num_workers) + " workers use ranks 0 to " +
                                std::to_string(num_workers - 1));
  }
  if (switch_host.empty() && switch_hosts.empty())
    return InvalidArgumentError("switch_host is empty: name the switch's host");
  if (control_port == 0) return InvalidArgumentError("control_port must not be 0");
  RETURN_IF_ERROR(SwitchTargetsOf(*this).status());
  // Checked here too, not only when Setup binds: a bad address is refused by Validate (and so
  // by Python's Config.validate() and the torch backend's options) before anything starts.
  if (uint32_t ip = 0; !ParseIpv4(bind_address, &ip)) {
    return InvalidArgumentError("bind_address '" + bind_address +
                                "' is not an IPv4 address (use 0.0.0.0 for any)");
  }
  if (proto::SizeCode code;
      packet_numel != kAutoPacketNumel && !proto::SizeCodeForNumel(packet_numel, &code)) {
    return InvalidArgumentError("packet_numel " + std::to_string(packet_numel) +
                                " is not supported: use 64 or 256, or 512, 1024 or 2048 (jumbo "
                                "packets, where the switch enables them: docs/protocol.md 2.6), "
                                "or 0 (automatic)");
  }
  // (num_worker_threads 0: automatic, chosen at setup; the checks below hold for it too.)
  if (max_outstanding_packets == 0) {  // the automatic window
    if (!(link_gbps > 0 && link_gbps <= 1e6)) {
      return InvalidArgumentError(
          "link_gbps must be in (0, 1e6] (Gbit/s) for the automatic window, or set "
          "max_outstanding_packets");
    }
    if (base_rtt.count() <= 0 || base_rtt > std::chrono::seconds(10)) {
      return InvalidArgumentError(
          "base_rtt must be in (0, 10 s] for the automatic window, or set "
          "max_outstanding_packets");
    }
    if (num_worker_threads > kMaxAutoWindow) {
      return InvalidArgumentError("num_worker_threads must be at most " +
                                  std::to_string(kMaxAutoWindow));
    }
  } else if (max_outstanding_packets < num_worker_threads) {
    return InvalidArgumentError("max_outstanding_packets (" +
                                std::to_string(max_outstanding_packets) +
                                ") must be at least num_worker_threads (" +
                                std::to_string(num_worker_threads) + "): each thread needs a slot");
  }
  if (max_outstanding_packets > proto::kMaxSlots) {
    return InvalidArgumentError("max_outstanding_packets must be at most " +
                                std::to_string(proto::kMaxSlots));
  }
  if (udp_port != 0 && uint32_t{udp_port} + num_worker_threads > 65536) {
    return InvalidArgumentError("udp_port + num_worker_threads exceeds 65535");
  }
  RETURN_IF_ERROR(retransmit.Validate());
  if (setup_timeout.count() <= 0) return InvalidArgumentError("setup_timeout must be positive");
  if (sparse_auto && !sparse) {
    return InvalidArgumentError(
        "sparse_auto needs sparse: set both (block-sparse all-reduces, "
        "the automatic choice per worker thread) or neither");
  }
  if (lan_multicast_required && authenticate_data) {
    return InvalidArgumentError(
        "lan_multicast_required (multicast 'on') cannot go with authenticate_data: datagrams to a "
        "group carry no tag");
  }
  if (lan_multicast_required && !lan_multicast) {
    return InvalidArgumentError(
        "lan_multicast_required needs lan_multicast: set both (multicast 'on', switchml worker "
        "--multicast on), or lan_multicast_required = false");
  }
  if (lan_multicast && !loopback_multicast) {
    // Not a mode: switchml worker --multicast (and Python's Config.multicast) sets lan_multicast
    // only with loopback_multicast, and LAN multicast alone would protect nothing that loopback
    // multicast exposes (a group joined on the LAN interface is open to this host's processes).
    return InvalidArgumentError(
        "lan_multicast needs loopback_multicast: set both (multicast 'auto' or 'on', switchml "
        "worker --multicast auto), or lan_multicast = false (multicast 'local')");
  }
  RETURN_IF_ERROR(wait.Validate());
  if (job_secret.size() > 64) {
    return InvalidArgumentError("job_secret must be at most 64 bytes, not " +
                                std::to_string(job_secret.size()));
  }
  if (transport != transport::kAutoTransport) {  // "auto": chosen at setup (ChooseTransport)
    transport::TransportOptions t;
    t.kind = transport;
    if (Status st = t.Validate(); !st.ok()) {
      return InvalidArgumentError(st.message() + ", or auto (what the switch serves)");
    }
  }
  return Status();
}

uint32_t Config::OutstandingPackets() const {
  if (max_outstanding_packets != 0) return max_outstanding_packets;
  // The bandwidth-delay product in packets, each taking the datagram plus IPv4 and UDP headers
  // and Ethernet framing on the wire; times the safety factor; rounded up to a multiple of 32
  // and then of the threads (equal shares); clamped (over shm from kMinShmAutoWindow, a
  // multiple of 64, so of every power-of-two thread count). For jumbo packets the 32, the floor
  // and the ceiling stand for the same bytes: scaled by 256 / packet_numel
  // (proto::SameBytesInPackets, as the switch's pool). Pure arithmetic on the fields, so every
  // worker given the same fields gets the same window.
  const uint32_t numel =
      packet_numel == kAutoPacketNumel ? uint32_t{proto::kReferenceMaxNumel} : packet_numel;
  proto::SizeCode size;
  proto::SizeCodeForNumel(numel, &size);
  const double wire_bytes = proto::DatagramBytes(size) + kIpUdpHeaderBytes + kEthernetFrameBytes;
  const double bdp = link_gbps * 1e9 / 8 * std::chrono::duration<double>(base_rtt).count();
  uint64_t w = static_cast<uint64_t>(std::ceil(kWindowSafety * bdp / wire_bytes));
  const uint64_t threads = std::max<uint32_t>(num_worker_threads, 1);  // automatic: 1 until chosen
  const uint64_t granule = proto::SameBytesInPackets(32, numel);
  w = (w + granule - 1) / granule * granule;
  w = (w + threads - 1) / threads * threads;
  const uint64_t floor =
      transport::CapabilitiesOf(transport).host_local ? kMinShmAutoWindow : kMinAutoWindow;
  w = std::max<uint64_t>(w, std::max<uint64_t>(proto::SameBytesInPackets(floor, numel), threads));
  const uint64_t most = proto::SameBytesInPackets(kMaxAutoWindow, numel);
  return static_cast<uint32_t>(
      std::min<uint64_t>(w, std::max<uint64_t>(most / threads, 1) * threads));
}

// The nested classes of the exported AllReduceHandle and Context are internals: hidden, not
// exported from a shared library as their enclosing classes are (include/switchml/export.h).
struct [[gnu::visibility("hidden")]] AllReduceHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  int remaining = 0;           // slices not done yet
  bool check_pending = false;  // the switch has not confirmed the tensor check yet
  Status status;
  // Done when every slice is, and the check passed (or something failed: then the check's
  // outcome no longer matters).
  bool done() const { return remaining == 0 && (!check_pending || !status.ok()); }
};

Status AllReduceHandle::Wait() const {
  if (!state_) return FailedPreconditionError("empty AllReduceHandle");
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done(); });
  return state_->status;
}

bool AllReduceHandle::Test() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done();
}

namespace {

// The multicast group of a session's results (Config::loopback_multicast, lan_multicast), the
// same on every worker: an address in 239.192.0.0/14 (RFC 2365's organization-local scope, whose
// Ethernet addresses 01:00:5e:40:00:00.. do not alias the link-local groups 224.0.0.x that
// snooping switches always flood) and first port in [12000, 20000) from a hash of the job id
// and the switch's control port (below Linux's ephemeral ports and the workers' own
// [20000, 32000)). The control port keeps apart two jobs of one job id on two switches of
// one host (the racks of a hierarchy, whose workers share the job id): on one group each
// worker would also receive, and drop, the other switch's results. Two sessions on one switch
// that hash alike cannot both hold it: the switch keeps it for the first only
// (dataplane::JobSpec::multicast_group), and the other gets results one copy per worker.
Endpoint MulticastGroupOf(uint64_t job_id, uint16_t control_port, uint32_t num_ports) {
  uint64_t h = job_id + 0x9e3779b97f4a7c15ULL * (uint64_t{control_port} + 1);  // splitmix64
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  h ^= h >> 31;
  constexpr uint32_t kFirstPort = 12000, kPorts = 8000;
  const uint32_t room = kPorts - std::min<uint32_t>(num_ports, kPorts - 1);
  return Endpoint{0xefc00000u | static_cast<uint32_t>(h & 0x3ffff),
                  static_cast<uint16_t>(kFirstPort + (h >> 24) % room)};
}

using transport::NetInterface;

// The largest datagram this worker sends with packets of numel elements: the packet, and with
// the authenticated data plane the tag's room behind it (transport/auth.h).
size_t WorkerDatagramBytes(const Config& config, uint32_t numel) {
  return proto::DatagramBytesForNumel(numel) +
         (config.authenticate_data ? transport::kAuthRoomBytes : 0);
}

// Jumbo packets (packet_numel over 256, docs/protocol.md 2.6) must fit the transports and the
// path. CheckTransportCarries refuses transports that would cut the job's datagrams (xdp: one
// UMEM frame); CheckPacketFits refuses a datagram (with its IPv4 and UDP headers) larger than
// the MTU of the interface toward a switch host, naming the interface, its MTU and the largest
// packet_numel that fits. The reference's sizes are never refused here (as before).
Result<transport::Transports> CheckTransportCarries(const Config& config,
                                                    transport::Transports transports,
                                                    size_t needed) {
  const size_t most = transports.empty() ? needed : transports[0]->max_datagram_bytes();
  if (most >= needed) return transports;
  return FailedPreconditionError(
      "packet_numel " + std::to_string(config.packet_numel) + " needs datagrams of " +
      std::to_string(needed) + " bytes and the " + transports[0]->name() +
      " transport carries at most " + std::to_string(most) +
      "; use packet_numel 256, or a transport that carries them (udp, shm)");
}

Status CheckPacketFits(const Config& config, uint32_t bind_ip, uint32_t switch_ip) {
  if (config.packet_numel <= proto::kReferenceMaxNumel ||
      transport::CapabilitiesOf(config.transport).host_local) {
    return Status();
  }
  Result<NetInterface> toward = transport::InterfaceToward(switch_ip, bind_ip);
  if (!toward.ok() || toward->mtu == 0) return Status();  // nothing known: the kernel decides
  constexpr size_t kIpUdp = Config::kIpUdpHeaderBytes;
  const size_t wire = WorkerDatagramBytes(config, config.packet_numel) + kIpUdp;
  if (wire <= toward->mtu) return Status();
  uint32_t fits = 0;
  for (const uint32_t numel : {2048u, 1024u, 512u, 256u, 64u}) {
    if (WorkerDatagramBytes(config, numel) + kIpUdp <= toward->mtu) {
      fits = numel;
      break;
    }
  }
  return FailedPreconditionError(
      "packet_numel " + std::to_string(config.packet_numel) + " makes IP packets of " +
      std::to_string(wire) + " bytes, more than the MTU " + std::to_string(toward->mtu) + " of " +
      toward->name + ", the interface toward the switch " + Ipv4ToString(switch_ip) +
      "; use packet_numel " + std::to_string(fits == 0 ? 256 : fits) +
      " or less, or raise the MTU of " + toward->name + " (and of the path) to " +
      std::to_string(wire));
}

// Joins every worker thread's transport to the session's result group (Config::
// loopback_multicast, Config::lan_multicast): on the loopback interface when the switch is on
// this host (a loopback address), else, with lan_multicast, on the interface toward the switch.
// A striped job has one group for all its switch hosts (each sends its slots' results there;
// switch_ip and control_port are the first host's).
// Sets *group (0: none) and *via. A group that cannot be joined is only logged (results then
// come one per worker), unless it is a LAN group the user required (lan_multicast_required).
Status JoinResultGroup(const Config& config, uint32_t switch_ip, uint16_t control_port,
                       uint32_t bind_ip, uint64_t job_id,
                       std::vector<std::unique_ptr<transport::Transport>>& transports,
                       Endpoint* group, NetInterface* via) {
  *group = Endpoint{};
  *via = NetInterface{};
  via->loopback = true;
  constexpr uint32_t kLoopbackNet = 0x7f000000, kLoopbackMask = 0xff000000;
  const bool local = (switch_ip & kLoopbackMask) == kLoopbackNet;
  if (config.authenticate_data || !(local ? config.loopback_multicast : config.lan_multicast)) {
    return Status();
  }
  // Without a group: an error when the user required LAN multicast, else a line in the log.
  auto without_group = [&](const Status& why) {
    if (!local && config.lan_multicast_required) return why;
    LOG(kInfo, kRuntime) << "no " << (local ? "loopback" : "LAN")
                         << " multicast (results come one copy per worker): " << why.message();
    return Status();
  };
  if (!local) {
    Result<NetInterface> toward = transport::InterfaceToward(switch_ip, bind_ip);
    if (!toward.ok()) return without_group(toward.status());
    *via = *toward;
    if (via->loopback) {
      return without_group(FailedPreconditionError(
          "LAN multicast: the switch " + Ipv4ToString(switch_ip) +
          " is on this host (reached through " + via->name +
          "); name it by a loopback address (127.0.0.1) for loopback multicast, or run without "
          "--multicast on"));
    }
    if (!via->multicast) {
      return without_group(
          FailedPreconditionError("LAN multicast: interface " + via->name + " toward the switch " +
                                  Ipv4ToString(switch_ip) +
                                  " has no multicast (IFF_MULTICAST); run without --multicast on"));
    }
  }
  const Endpoint g = MulticastGroupOf(job_id, control_port, config.num_worker_threads);
  Status joined;
  for (uint32_t t = 0; t < config.num_worker_threads && joined.ok(); ++t) {
    joined = transports[t]->JoinGroup(Endpoint{g.ipv4, static_cast<uint16_t>(g.port + t)},
                                      local ? 0 : via->index);
  }
  if (!joined.ok()) {
    for (auto& t : transports) t->LeaveGroup();
    *via = NetInterface{};
    via->loopback = true;
    return without_group(
        Status(joined.code(), local ? joined.message() : "LAN multicast: " + joined.message()));
  }
  *group = g;
  if (!local) {
    LOG(kInfo, kRuntime) << "results expected on multicast group " << g.ToString()
                         << " (+ thread) via " << via->name;
  }
  return Status();
}

// One switch host of the job (one, or several for a striped job) as this worker knows it.
struct SwitchHost {
  std::string name;  // "host:port" as configured
  Endpoint control;  // resolved
  std::unique_ptr<control::ControlClient> client;
  // This worker's stream to the host (liveness, tensor checks); null before registration.
  std::unique_ptr<control::Attachment> attachment;
  control::UdpSessionReply reply;
  std::atomic<bool> alive{true};
};
using SwitchHosts = std::vector<std::unique_ptr<SwitchHost>>;

// The default Rendezvous: barriers and broadcasts through the switches' control plane, on the
// first switch host still alive (a striped job's rendezvous moves to the next host when the
// first is gone). The broadcast that picks the job id is unscoped (the reference's way: one
// such setup at a time per switch); barriers are scoped by the job id once it is known.
class ControlPlaneRendezvous final : public Rendezvous {
 public:
  ControlPlaneRendezvous(const SwitchHosts* hosts, const Config& config)
      : hosts_(hosts),
        rank_(config.rank),
        num_workers_(config.num_workers),
        secret_(config.job_secret) {}
  void set_scope(uint64_t job_id) { scope_ = job_id; }
  Status Barrier() override {
    return OnFirstAlive(
        [&](control::ControlClient& c) { return c.Barrier(scope_, num_workers_, secret_, rank_); });
  }
  Result<uint64_t> Broadcast(uint64_t value) override {
    Result<uint64_t> out = UnavailableError("no switch host is alive");
    const Status st = OnFirstAlive([&](control::ControlClient& c) {
      out = c.Broadcast(scope_, value, rank_, num_workers_, /*root=*/0, secret_);
      return out.status();
    });
    if (!st.ok()) return st;
    return out;
  }

 private:
  // Calls `call` on the first host alive; on UNAVAILABLE (the host went away) on the next.
  template <typename Call>
  Status OnFirstAlive(Call call) {
    Status st = UnavailableError("no switch host of the job is alive");
    for (const auto& h : *hosts_) {
      if (!h->alive.load()) continue;
      st = call(*h->client);
      if (st.code() != StatusCode::kUnavailable) return st;
    }
    return st;
  }

  const SwitchHosts* hosts_;
  const uint32_t rank_, num_workers_;
  const std::string secret_;
  std::atomic<uint64_t> scope_{0};
};

}  // namespace

class [[gnu::visibility("hidden")]] Context::Impl {
 public:
  Config config;
  uint64_t job_id = 0;
  SwitchHosts hosts;
  // Setup is over: from now on a switch host that goes away is failed over, not fatal.
  std::atomic<bool> running{false};
  // How the workers meet: the caller's, or (null until Setup) one through the control plane.
  std::shared_ptr<Rendezvous> rendezvous;
  std::vector<std::unique_ptr<runtime::WorkerThread>> threads;
  std::mutex mu;
  uint64_t next_allreduce = 1;
  std::vector<AllReduceHandle> pending;
  // Set after a protocol failure (timeout, transport): the workers' slot states no longer
  // agree, so every later operation, and every queued one, fails at once with it.
  std::shared_ptr<runtime::FailureLatch> failure = std::make_shared<runtime::FailureLatch>();
  // The job runs block-sparse all-reduces (config.sparse, and every switch host confirmed it:
  // with sparse_auto a switch without the feature makes the job dense).
  bool sparse = false;

  // What a switch host answered Monitor.Status (asked only for transport or packet_numel auto).
  struct Served {
    bool answered = false;
    control::ServedDataPlane plane;
    std::string why_not;  // the call's error when it did not answer
  };
  std::vector<Served> served;  // by host, when asked

  using Transports = std::vector<std::unique_ptr<transport::Transport>>;
  // What setup learned of the job's multicast results.
  struct ResultGroup {
    Endpoint group;  // where results may come (ipv4 0: none)
    NetInterface via;
    size_t kept = 0;  // hosts that send to it
  };

  // Setup and its steps, in order (each says what it does).
  Status Setup();
  Status ConnectSwitches();
  Status AskSwitches();
  Status ChooseTransport();
  // This worker's packet size, and what bounded it (for the log and errors).
  struct SizeChoice {
    uint32_t numel = 0;
    std::string why;
  };
  SizeChoice ChoosePacketNumel(uint32_t bind_ip) const;
  Status ChooseThreads();
  Status AgreeSessionId();
  Status AgreePacketNumel(const SizeChoice& own);
  Result<Transports> OpenDataTransports(uint32_t bind_ip) const;
  uint32_t Generations() const;
  control::UdpSessionArgs Registration(uint32_t bind_ip, uint16_t base_port) const;
  Status JoinJob(const control::UdpSessionArgs& args);
  Status SettleResultGroup(const Endpoint& asked, Transports& transports, ResultGroup* group) const;
  std::vector<Endpoint> DataEndpoints(uint16_t base_port) const;
  Status Authenticate(const std::vector<Endpoint>& data, Transports& transports) const;
  Status StartThreads(const std::vector<Endpoint>& data, const ResultGroup& group,
                      Transports& transports);
  // Registers this worker on every switch host and attaches its streams.
  Status Register(const control::UdpSessionArgs& args);
  // A switch host's stream ended with `why`: a failed job, or (UNAVAILABLE) the host is gone.
  void OnSwitchFailure(size_t host, const Status& why);
  SwitchHost* FirstAlive() const;
  void Close();
  // Setup failed with `why` after this rank registered: fail the session at the switch with
  // the reason, so that the other ranks learn why this one left instead of only that its
  // connection ended. Not when the switch failed the session itself (it already said why).
  void AbandonSetup(const Status& why);
  Result<AllReduceHandle> Submit(const void* in, void* out, size_t count, DataType dtype);
};

Status Context::Impl::ConnectSwitches() {
  ASSIGN_OR_RETURN(std::vector<SwitchTarget> targets, SwitchTargetsOf(config));
  control::ControlTlsOptions tls;
  tls.ca_file = config.tls_ca_file;
  tls.cert_file = config.tls_cert_file;
  tls.key_file = config.tls_key_file;
  tls.server_name = config.tls_server_name;
  for (const SwitchTarget& t : targets) {
    auto h = std::make_unique<SwitchHost>();
    h->name = t.name();
    Result<uint32_t> ip = transport::ResolveIpv4(t.host);
    if (!ip.ok()) {
      return Status(ip.status().code(), "switch host " + h->name + ": " + ip.status().message());
    }
    h->control = Endpoint{*ip, t.port};
    for (const auto& other : hosts) {
      if (other->control == h->control) {
        return InvalidArgumentError("switch hosts " + other->name + " and " + h->name +
                                    " are the same switch (" + h->control.ToString() +
                                    "): list each switch host once");
      }
    }
    ASSIGN_OR_RETURN(h->client, control::ControlClient::Create(h->name, config.setup_timeout, tls));
    hosts.push_back(std::move(h));
  }
  return Status();
}

SwitchHost* Context::Impl::FirstAlive() const {
  for (const auto& h : hosts) {
    if (h->alive.load()) return h.get();
  }
  return nullptr;
}

// Setup's steps, in order.
Status Context::Impl::Setup() {
  RETURN_IF_ERROR(ConnectSwitches());
  RETURN_IF_ERROR(AskSwitches());
  RETURN_IF_ERROR(ChooseTransport());
  RETURN_IF_ERROR(ChooseThreads());
  uint32_t bind_ip = 0;
  if (!ParseIpv4(config.bind_address, &bind_ip)) {
    return InvalidArgumentError("bind_address '" + config.bind_address +
                                "' is not an IPv4 address (use 0.0.0.0 for any)");
  }
  const SizeChoice own_size = ChoosePacketNumel(bind_ip);
  RETURN_IF_ERROR(AgreeSessionId());
  RETURN_IF_ERROR(AgreePacketNumel(own_size));
  ASSIGN_OR_RETURN(Transports transports, OpenDataTransports(bind_ip));
  const uint16_t base_port = transports[0]->local_endpoint().port;
  control::UdpSessionArgs args = Registration(bind_ip, base_port);
  // Multicast results: every worker of the session derives the same group and ports from the
  // job id, listens there, and asks the switch to send results to it.
  ResultGroup group;
  RETURN_IF_ERROR(JoinResultGroup(config, hosts[0]->control.ipv4, hosts[0]->control.port, bind_ip,
                                  job_id, transports, &args.multicast_group, &group.via));
  RETURN_IF_ERROR(JoinJob(args));
  RETURN_IF_ERROR(SettleResultGroup(args.multicast_group, transports, &group));
  // From now on a switch that went away fails a barrier at once instead of being waited for.
  for (const auto& h : hosts) h->client->set_wait_for_ready(false);
  const std::vector<Endpoint> data = DataEndpoints(base_port);
  if (config.authenticate_data) RETURN_IF_ERROR(Authenticate(data, transports));
  RETURN_IF_ERROR(StartThreads(data, group, transports));
  running.store(true);
  return Status();
}

// Transport "auto", packet_numel auto and automatic threads need what each switch host serves:
// asked of each (Monitor.Status) once. A host that does not answer the call (a reference switch:
// UNIMPLEMENTED; one that requires a job secret, without one) is noted as such; one that cannot
// be reached fails setup as the registration would.
Status Context::Impl::AskSwitches() {
  const bool auto_transport = config.transport == transport::kAutoTransport;
  const bool auto_size = config.packet_numel == Config::kAutoPacketNumel;
  if (!auto_transport && !auto_size && config.num_worker_threads != 0) return Status();
  const std::string what = auto_transport ? "transport auto"
                           : auto_size    ? "packet_numel auto"
                                          : "automatic threads";
  for (const auto& h : hosts) {
    Served s;
    Result<control::ServedDataPlane> plane = h->client->DataPlane(config.job_secret);
    if (!plane.ok()) {
      const StatusCode code = plane.status().code();
      if (code == StatusCode::kDeadlineExceeded || code == StatusCode::kUnavailable) {
        return Status(code, what + ": asking switch host " + h->name +
                                " what it serves: " + plane.status().message());
      }
      s.why_not = plane.status().message();
    } else {
      s.answered = true;
      s.plane = *plane;
    }
    served.push_back(std::move(s));
  }
  return Status();
}

// Transport "auto" (Config::transport): the kind every switch host serves (AskSwitches), mapped
// to what this host can open (transport::ChooseAutoTransport), so that config.transport
// (Context::config()) names the kind opened from here on, and every worker of the job, asking
// the same switches, opens the same kind and sizes the same window. A host that did not answer
// counts as udp, the reference's.
Status Context::Impl::ChooseTransport() {
  if (config.transport != transport::kAutoTransport) return Status();
  std::string chosen, because;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const auto& h = hosts[i];
    const Served& s = served[i];
    std::string kind, why;
    if (!s.answered) {
      kind = "udp";
      why = "switch host " + h->name + " did not say which transport it serves (" + s.why_not +
            "), so the reference's";
    } else {
      Result<std::string> k = transport::ChooseAutoTransport(s.plane.transport, s.plane.data_port,
                                                             transport::ProcessEnvironment());
      if (!k.ok()) {
        return Status(k.status().code(), "switch host " + h->name + ": " + k.status().message());
      }
      kind = *k;
      why = "switch host " + h->name + " serves " +
            (s.plane.transport.empty() ? std::string("an unnamed transport") : s.plane.transport);
    }
    if (!chosen.empty() && kind != chosen) {
      return FailedPreconditionError(
          "transport auto: the switch hosts serve different transports (" + because + "; " + why +
          "): run them with one, or set the worker's transport");
    }
    chosen = kind;
    because = why;
  }
  LOG(kInfo, kRuntime) << "rank " << config.rank << ": transport auto chose " << chosen << " ("
                       << because << (hosts.size() > 1 ? ", as every host" : "") << ")";
  config.transport = chosen;
  return Status();
}

// packet_numel auto (Config::packet_numel 0): this worker's choice (runtime/packet_size.h) from
// the smallest max_packet_numel of the switch hosts (256 from one that did not say), the
// transport's longest datagram, and, off this host, the smallest MTU of the interfaces toward
// them. The explicit size otherwise.
Context::Impl::SizeChoice Context::Impl::ChoosePacketNumel(uint32_t bind_ip) const {
  if (config.packet_numel != Config::kAutoPacketNumel) return {config.packet_numel, "as set"};
  runtime::PacketSizeLimits limits;
  const transport::Capabilities caps = transport::CapabilitiesOf(config.transport);
  limits.switch_max = static_cast<uint32_t>(proto::kMaxNumel);
  for (const Served& s : served) {
    const uint32_t most = s.answered && s.plane.max_packet_numel != 0
                              ? s.plane.max_packet_numel
                              : static_cast<uint32_t>(proto::kReferenceMaxNumel);
    limits.switch_max = std::min(limits.switch_max, most);
  }
  limits.transport_max_datagram = caps.max_datagram_bytes;
  limits.extra_bytes = config.authenticate_data ? transport::kAuthRoomBytes : 0;
  limits.host_local = caps.host_local;
  if (!limits.host_local) {
    for (const auto& h : hosts) {
      Result<NetInterface> toward = transport::InterfaceToward(h->control.ipv4, bind_ip);
      const uint32_t mtu = toward.ok() ? toward->mtu : 0;
      if (mtu == 0) {
        limits.mtu = 0;  // unknown toward one host: unknown
        break;
      }
      limits.mtu = limits.mtu == 0 ? mtu : std::min(limits.mtu, mtu);
    }
  }
  SizeChoice choice;
  choice.numel = runtime::ChooseAutoPacketNumel(limits, &choice.why);
  return choice;
}

// Every worker of a job must use one size. With packet_numel auto the workers' own choices
// could differ (different MTUs toward the switch): each takes rank 0's, through the rendezvous,
// and one whose path cannot carry it fails setup saying what to do.
Status Context::Impl::AgreePacketNumel(const SizeChoice& own_choice) {
  if (config.packet_numel != Config::kAutoPacketNumel) return Status();
  const uint32_t own = own_choice.numel;
  const std::string& why = own_choice.why;
  uint32_t chosen = own;
  if (config.num_workers > 1) {
    ASSIGN_OR_RETURN(const uint64_t first, rendezvous->Broadcast(own));
    proto::SizeCode code;
    if (first > proto::kMaxNumel || !proto::SizeCodeForNumel(static_cast<size_t>(first), &code)) {
      return InternalError("packet_numel auto: rank 0 sent " + std::to_string(first) +
                           ", not a packet size");
    }
    chosen = static_cast<uint32_t>(first);
    if (chosen > own) {
      return FailedPreconditionError(
          "packet_numel auto: rank 0 chose " + std::to_string(chosen) +
          " elements per packet, but this worker can use at most " + std::to_string(own) + " (" +
          why + "); give every worker the same MTU toward the switch, or set packet_numel " +
          std::to_string(own) + " on every worker (SWITCHML_PACKET_NUMEL, --packet-numel)");
    }
  }
  LOG(kInfo, kRuntime) << "rank " << config.rank << ": packet_numel auto chose " << chosen
                       << (chosen == own ? " (" + why + ")" : " (rank 0's choice)");
  config.packet_numel = chosen;
  return Status();
}

// Automatic threads (Config::num_worker_threads 0): as many as the switch's data-plane threads,
// asked of each host (Monitor.Status), so that each worker thread has a switch thread of its
// own; over several hosts the least common multiple (a multiple of each host's), at most
// Config::kMaxAutoThreads. A host that does not say (a reference switch) counts as one thread.
// Every worker, asking the same switches, chooses the same number; a fixed window too small for
// it (a slot per thread) is refused by the Validate after it.
Status Context::Impl::ChooseThreads() {
  if (config.num_worker_threads != 0) return Status();
  uint64_t chosen = 1;
  std::string because;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const Served& s = served[i];
    const bool said = s.answered && s.plane.threads > 0;
    chosen = std::min<uint64_t>(std::lcm(chosen, uint64_t{said ? s.plane.threads : 1u}),
                                Config::kMaxAutoThreads);
    because += (because.empty() ? "" : ", ") + hosts[i]->name + " " +
               (said ? std::to_string(s.plane.threads) : std::string("did not say (1)"));
  }
  config.num_worker_threads = static_cast<uint32_t>(chosen);
  LOG(kInfo, kRuntime) << "rank " << config.rank << ": automatic threads chose " << chosen
                       << " (switch data-plane threads: " << because << ")";
  return config.Validate();
}

Result<Context::Impl::Transports> Context::Impl::OpenDataTransports(uint32_t bind_ip) const {
  transport::TransportOptions topts;
  topts.kind = config.transport;
  topts.bind_ipv4 = bind_ip;
  topts.port = config.udp_port;
  // With the authenticated data plane every datagram carries a tag behind it (transport/auth.h).
  topts.max_datagram_bytes = WorkerDatagramBytes(config, config.packet_numel);
  // shm (the other kinds ignore it): each thread's inbox has room for twice its window of
  // results (at least the data plane's default).
  const uint64_t window = config.OutstandingPackets() / config.num_worker_threads;
  uint32_t slots = transport::kShmDataPlaneRingSlots;
  while (slots < 2 * window && slots < 65536) slots *= 2;
  topts.shm.ring_slots = slots;
  for (const auto& h : hosts) RETURN_IF_ERROR(CheckPacketFits(config, bind_ip, h->control.ipv4));
  auto opened = transport::OpenTransports(topts, config.num_worker_threads);
  if (!opened.ok() && config.packet_numel > proto::kReferenceMaxNumel) {
    return Status(opened.status().code(), "packet_numel " + std::to_string(config.packet_numel) +
                                              " (datagrams of " +
                                              std::to_string(topts.max_datagram_bytes) +
                                              " bytes): " + opened.status().message());
  }
  if (!opened.ok()) return opened;
  return CheckTransportCarries(config, std::move(*opened), topts.max_datagram_bytes);
}

// The job id: given, or rank 0's pick broadcast to everyone (the reference's way).
Status Context::Impl::AgreeSessionId() {
  ControlPlaneRendezvous* own_rendezvous = nullptr;
  if (rendezvous == nullptr) {
    auto r = std::make_shared<ControlPlaneRendezvous>(&hosts, config);
    own_rendezvous = r.get();
    rendezvous = std::move(r);
  }
  job_id = config.session_id;
  if (job_id == 0) {
    const uint64_t pick =
        static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    ASSIGN_OR_RETURN(job_id, rendezvous->Broadcast(pick));
    if (job_id == 0) job_id = 1;
  }
  if (own_rendezvous != nullptr) own_rendezvous->set_scope(job_id);
  return Status();
}

// A striped job reserves on every host a slot range per failover it can survive (a host that
// dies moves every thread to a fresh range: StripedSession), as many as fit in the software
// switch's default pool.
uint32_t Context::Impl::Generations() const {
  if (hosts.size() == 1) return 1;
  const auto pool =
      static_cast<uint32_t>(proto::SameBytesInPackets(kStripedJobSlots, config.packet_numel));
  return std::max<uint32_t>(
      1, std::min(static_cast<uint32_t>(hosts.size()), pool / config.OutstandingPackets()));
}

control::UdpSessionArgs Context::Impl::Registration(uint32_t bind_ip, uint16_t base_port) const {
  control::UdpSessionArgs args;
  args.job_id = job_id;
  args.rank = config.rank;
  args.num_workers = config.num_workers;
  args.ipv4 = bind_ip;  // 0: the switch uses the address our control connection comes from
  args.udp_port = base_port;
  args.num_udp_ports = config.num_worker_threads;
  args.max_outstanding_packets = config.OutstandingPackets() * Generations();
  proto::SizeCodeForNumel(config.packet_numel, &args.size);
  args.job_secret = config.job_secret;
  args.authenticate_data = config.authenticate_data;
  args.sparse = config.sparse;
  args.sparse_auto = config.sparse_auto;
  if (hosts.size() > 1) {
    // Every worker must stripe over the same hosts in the same order: each host compares.
    for (const auto& h : hosts) {
      args.switch_list += (args.switch_list.empty() ? "" : ",") + h->control.ToString();
    }
  }
  return args;
}

// Rank 0 (re)creates the job first; the others join after a barrier; all meet again.
Status Context::Impl::JoinJob(const control::UdpSessionArgs& args) {
  if (config.rank == 0) {
    RETURN_IF_ERROR(Register(args));
    RETURN_IF_ERROR(rendezvous->Barrier());
  } else {
    RETURN_IF_ERROR(rendezvous->Barrier());
    RETURN_IF_ERROR(Register(args));
  }
  RETURN_IF_ERROR(rendezvous->Barrier());
  // The stream may have been refused, or the job failed, meanwhile.
  if (failure->is_set()) return failure->Get();
  return Status();
}

// Results come to the group from the hosts that kept it (the others send one copy per worker);
// without any, this worker leaves the group.
Status Context::Impl::SettleResultGroup(const Endpoint& asked, Transports& transports,
                                        ResultGroup* group) const {
  group->group = asked;
  if (asked.ipv4 == 0) return Status();
  for (const auto& h : hosts) group->kept += h->reply.multicast_group_kept ? 1 : 0;
  if (group->kept == hosts.size()) return Status();
  if (!group->via.loopback && config.lan_multicast_required) {
    return FailedPreconditionError(
        "the switch did not keep LAN multicast group " + asked.ToString() +
        " for this job (rank 0 ran with --multicast local or off, or the switch runs with "
        "--no-lan-multicast, is bound to 0.0.0.0 rather than the address of the interface the "
        "workers reach (--bind), uses a transport other than kernel UDP, holds the group for "
        "another job, or is a reference switch); run the workers with --multicast auto (results "
        "then come one copy per worker where the group cannot be had)");
  }
  if (!group->via.loopback) {
    LOG(kInfo, kRuntime) << "no LAN multicast from " << hosts.size() - group->kept << " of "
                         << hosts.size()
                         << " switch host(s) (results come one copy per worker): they did not "
                            "keep group "
                         << asked.ToString()
                         << " (bound to 0.0.0.0, --no-lan-multicast, a reference switch, or "
                            "another job holds it)";
  }
  if (group->kept == 0) {
    // No switch sends to the group for this job (a reference switch, another job holds the
    // group, or a transport without it): do not listen to it either.
    for (auto& t : transports) t->LeaveGroup();
    group->group = Endpoint{};
  }
  return Status();
}

// Each switch's data plane: at the address it names, or (0) where its control plane is.
std::vector<Endpoint> Context::Impl::DataEndpoints(uint16_t base_port) const {
  std::vector<Endpoint> data;
  std::string where;
  for (const auto& h : hosts) {
    data.push_back(Endpoint{h->reply.switch_ipv4 != 0 ? h->reply.switch_ipv4 : h->control.ipv4,
                            h->reply.data_port});
    where += (where.empty() ? "" : ", ") + data.back().ToString();
  }
  LOG(kInfo, kRuntime) << "rank " << config.rank << " joined session " << job_id << "; "
                       << (hosts.size() == 1
                               ? "switch data plane at "
                               : std::to_string(hosts.size()) + " switch hosts, data at ")
                       << where << "; local ports " << base_port << ".."
                       << base_port + config.num_worker_threads - 1;
  return data;
}

// The authenticated data plane: each host's datagrams tagged and verified with its key.
Status Context::Impl::Authenticate(const std::vector<Endpoint>& data,
                                   Transports& transports) const {
  std::vector<transport::AuthSwitch> keys;
  for (size_t i = 0; i < hosts.size(); ++i) {
    transport::AuthSwitch k{data[i].ipv4, data[i].port, hosts[i]->reply.num_data_ports, {}};
    if (!transport::AuthKeyFromBytes(hosts[i]->reply.data_key, &k.key)) {
      return InternalError("switch host " + hosts[i]->name +
                           ": its data-plane key is not 16 bytes");
    }
    keys.push_back(k);
  }
  for (auto& t : transports) {
    t = transport::MakeAuthenticated(std::move(t), job_id, config.rank, keys);
  }
  return Status();
}

// A WorkerThread per worker thread, each with its slots, its routes to every host and its
// transport.
Status Context::Impl::StartThreads(const std::vector<Endpoint>& data, const ResultGroup& group,
                                   Transports& transports) {
  const uint32_t num_hosts = static_cast<uint32_t>(hosts.size());
  const uint32_t window_total = config.OutstandingPackets();
  const uint32_t window = window_total / config.num_worker_threads;
  std::vector<int> cpus;  // Config::pin_threads: thread t runs on CpuOfThread(cpus, t)
  if (config.pin_threads) {
    ASSIGN_OR_RETURN(cpus, AllowedCpus());
  }
  for (uint32_t t = 0; t < config.num_worker_threads; ++t) {
    runtime::WorkerThreadOptions o;
    worker::SessionConfig& sc = o.session.session;
    sc.num_workers = config.num_workers;
    sc.slot_start = t * window;
    sc.window = window;
    proto::SizeCodeForNumel(config.packet_numel, &sc.size);
    sc.retransmit = config.retransmit;
    o.session.num_hosts = num_hosts;
    o.session.generations = Generations();
    o.session.generation_stride = window_total;
    RETURN_IF_ERROR(o.session.Validate());
    for (uint32_t i = 0; i < num_hosts; ++i) {
      // Worker thread t talks to each switch's data-plane thread t mod (its threads).
      const uint32_t ports = hosts[i]->reply.num_data_ports;
      o.switches.push_back(runtime::SwitchRoute{
          Endpoint{data[i].ipv4, static_cast<uint16_t>(data[i].port + t % ports)}, data[i].port,
          ports, hosts[i]->name});
    }
    o.wait = config.wait;
    if (!cpus.empty()) o.cpu = CpuOfThread(cpus, t);
    // Checked for LAN groups only (a loopback one cannot fail), and only where every host sends
    // to the group (else some results come as unicast by design).
    if (group.group.ipv4 != 0 && !group.via.loopback && group.kept == num_hosts) {
      o.expected_group =
          Endpoint{group.group.ipv4, static_cast<uint16_t>(group.group.port + t)}.ToString() +
          " on " + group.via.name;
    }
    o.group_required = config.lan_multicast_required;
    // (The threads stop before the control clients go: ~Context.)
    o.explain_stall = [this, id = job_id, secret = config.job_secret](uint64_t op) {
      SwitchHost* h = FirstAlive();
      if (h == nullptr) return std::string();
      Result<std::string> why = h->client->Diagnose(id, secret, op, std::chrono::seconds(1));
      return why.ok() ? *why : std::string();
    };
    threads.push_back(
        std::make_unique<runtime::WorkerThread>(std::move(o), std::move(transports[t]), failure));
  }
  return Status();
}

// Registers this worker on every switch host and attaches its streams: from then on a host
// notices at once when this worker dies (and fails the job, naming the rank), and this worker
// when a host dies (OnSwitchFailure) or the job fails.
Status Context::Impl::Register(const control::UdpSessionArgs& args) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    SwitchHost& h = *hosts[i];
    Result<control::UdpSessionReply> reply = h.client->UdpSession(args);
    if (!reply.ok()) {
      if (hosts.size() == 1) return reply.status();
      return Status(reply.status().code(),
                    "switch host " + h.name + ": " + reply.status().message());
    }
    h.reply = *reply;
    sparse = (i == 0 || sparse) && reply->sparse;
    // (The stream ends before the control client is destroyed: the callback may use it.)
    h.attachment = h.client->Attach(job_id, config.rank, config.job_secret,
                                    [this, i](const Status& why) { OnSwitchFailure(i, why); });
  }
  if (config.sparse && !sparse && config.rank == 0) {
    LOG(kInfo, kRuntime) << "block-sparse all-reduces (auto) off for this job: a switch host does "
                            "not support them (a reference switch?); every worker runs dense";
  }
  return Status();
}

void Context::Impl::OnSwitchFailure(size_t host, const Status& why) {
  SwitchHost& h = *hosts[host];
  if (hosts.size() == 1 || why.code() != StatusCode::kUnavailable || !running.load()) {
    // The job failed (a peer died, a check failed), or its only switch went away.
    failure->Set(why);
    // A barrier under way ends too: its peers or the switch are not coming.
    for (const auto& other : hosts) other->client->CancelCalls(why);
    return;
  }
  if (!h.alive.exchange(false)) return;
  size_t alive = 0;
  for (const auto& other : hosts) alive += other->alive.load() ? 1 : 0;
  if (alive == 0) {
    const Status all = UnavailableError("every switch host of the job is gone (the last, " +
                                        h.name + ": " + why.message() + ")");
    failure->Set(all);
    for (const auto& other : hosts) other->client->CancelCalls(all);
    return;
  }
  LOG(kWarning, kRuntime) << "switch host " << h.name << " is gone (" << why.message()
                          << "): moving its share of session " << job_id << " to the " << alive
                          << " host(s) left";
  for (auto& t : threads) t->MoveOff(static_cast<uint32_t>(host));
}

void Context::Impl::AbandonSetup(const Status& why) {
  if (failure->is_set()) return;
  for (const auto& h : hosts) {
    if (h->attachment == nullptr) continue;
    h->client
        ->Close(job_id, config.job_secret, std::nullopt, std::chrono::milliseconds(1000),
                "session " + std::to_string(job_id) + " failed: rank " +
                    std::to_string(config.rank) + " gave up joining it: " + why.message())
        .IgnoreError();
    h->attachment.reset();
  }
}

// Tells every switch host alive that this rank is done (the job's slots are freed when every
// rank is), then ends the streams. Best effort: a switch may be gone.
void Context::Impl::Close() {
  for (const auto& h : hosts) {
    if (h->attachment == nullptr) continue;
    if (h->alive.load()) {
      h->client->Close(job_id, config.job_secret, config.rank, std::chrono::milliseconds(1000))
          .IgnoreError();
    }
    h->attachment.reset();
  }
}

Result<AllReduceHandle> Context::Impl::Submit(const void* in, void* out, size_t count,
                                              DataType dtype) {
  if (count > 0 && (in == nullptr || out == nullptr)) {
    return InvalidArgumentError("AllReduce: null buffer with count " + std::to_string(count));
  }
  // In place (in == out) is safe: a block is read only before its own result is written. Other
  // overlaps are not: a block's result would overwrite input of blocks still to be sent or re-sent.
  if (count > 0 && in != out) {
    const auto a = reinterpret_cast<uintptr_t>(in), b = reinterpret_cast<uintptr_t>(out);
    const size_t bytes = count * DataTypeSize(dtype);
    if (a < b + bytes && b < a + bytes) {
      return InvalidArgumentError(
          "AllReduce: in and out overlap without being the same buffer (out - in = " +
          std::to_string(static_cast<int64_t>(b - a)) + " bytes, " + std::to_string(bytes) +
          " bytes each); pass the same pointer for an "
          "in-place all-reduce, or buffers that do not overlap");
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  if (failure->is_set()) {
    const Status f = failure->Get();
    return Status(f.code(), "this context failed earlier and cannot be used: " + f.message());
  }
  auto state = std::make_shared<AllReduceHandle::State>();
  AllReduceHandle handle(state);
  const size_t numel = config.packet_numel;
  const size_t packets = (count + numel - 1) / numel;
  const size_t nthreads = threads.size();
  std::vector<control::Attachment*> checkers;  // the streams of the switch hosts alive
  if (config.check_tensors) {
    for (const auto& h : hosts) {
      if (h->alive.load() && h->attachment != nullptr) checkers.push_back(h->attachment.get());
    }
  }
  const bool check = !checkers.empty();
  state->remaining = static_cast<int>(nthreads);
  state->check_pending = check;
  const uint64_t allreduce = next_allreduce++;
  auto slice_done = [state](const Status& st) {
    std::lock_guard<std::mutex> l(state->mu);
    if (state->status.ok() && !st.ok()) state->status = st;
    --state->remaining;
    state->cv.notify_all();
  };
  // The switch compares every worker's count and type for this all-reduce; the result counts
  // only once they agree. A striped job asks every host alive: the first verdict counts, but a
  // host that went away (UNAVAILABLE) says nothing unless every host did.
  if (check) {
    struct Verdict {
      std::mutex mu;
      size_t waiting;
      bool given = false;
    };
    auto verdict = std::make_shared<Verdict>();
    verdict->waiting = checkers.size();
    for (control::Attachment* a : checkers) {
      a->Announce(allreduce, count, static_cast<uint32_t>(dtype),
                  [state, verdict](const Status& st) {
                    {
                      std::lock_guard<std::mutex> v(verdict->mu);
                      if (verdict->given) return;
                      if (st.code() == StatusCode::kUnavailable && --verdict->waiting > 0) return;
                      verdict->given = true;
                    }
                    std::lock_guard<std::mutex> l(state->mu);
                    if (state->status.ok() && !st.ok()) state->status = st;
                    state->check_pending = false;
                    state->cv.notify_all();
                  });
    }
  }
  const size_t esize = DataTypeSize(dtype);
  for (size_t t = 0; t < nthreads; ++t) {
    // Slices of whole packets, the same on every worker of the job.
    const size_t p0 = packets * t / nthreads, p1 = packets * (t + 1) / nthreads;
    const size_t e0 = std::min(count, p0 * numel), e1 = std::min(count, p1 * numel);
    worker::Slice slice;
    slice.allreduce = allreduce;
    slice.dtype = dtype;
    slice.in = static_cast<const uint8_t*>(in) + e0 * esize;
    slice.out = static_cast<uint8_t*>(out) + e0 * esize;
    slice.count = e1 - e0;
    slice.element_offset = e0;
    if (sparse) {
      // Block-sparse (docs/protocol.md 2.5): every thread gets the whole tensor and takes the
      // blocks b with b mod nthreads = t of it (worker::SparseSession).
      slice.in = in;
      slice.out = out;
      slice.count = count;
      slice.element_offset = 0;
      slice.sparse = true;
      slice.sparse_auto = config.sparse_auto;
      slice.lane = static_cast<uint32_t>(t);
      slice.lanes = static_cast<uint32_t>(nthreads);
    }
    threads[t]->Submit(slice, slice_done);
  }
  pending.push_back(handle);
  if (pending.size() > 1024) {
    std::erase_if(pending, [](const AllReduceHandle& h) { return h.Test(); });
  }
  return handle;
}

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Context::~Context() {
  impl_->running.store(false);  // a switch host lost from here on is no failover
  for (auto& t : impl_->threads) t->Stop();
  impl_->Close();
}

Result<std::unique_ptr<Context>> Context::Create(const Config& config) {
  return Create(config, nullptr);
}

Result<std::unique_ptr<Context>> Context::Create(const Config& config,
                                                 std::shared_ptr<Rendezvous> rendezvous) {
  RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->rendezvous = std::move(rendezvous);
  if (Status st = impl->Setup(); !st.ok()) {
    impl->AbandonSetup(st);
    return st;
  }
  return std::unique_ptr<Context>(new Context(std::move(impl)));
}

Status Context::AllReduce(const void* in, void* out, size_t count, DataType dtype) {
  ASSIGN_OR_RETURN(AllReduceHandle h, impl_->Submit(in, out, count, dtype));
  return h.Wait();
}

Result<AllReduceHandle> Context::AllReduceAsync(const void* in, void* out, size_t count,
                                                DataType dtype) {
  return impl_->Submit(in, out, count, dtype);
}

Status Context::WaitForAll() {
  std::vector<AllReduceHandle> pending;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    pending.swap(impl_->pending);
  }
  Status first;
  for (auto& h : pending) {
    Status st = h.Wait();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

Status Context::Barrier() {
  // After a failure (a dead peer or switch, a failed check) the job cannot go on: say why at
  // once instead of meeting the peers (or a switch that is gone).
  if (impl_->failure->is_set()) {
    const Status f = impl_->failure->Get();
    return Status(f.code(), "this context failed earlier and cannot be used: " + f.message());
  }
  return impl_->rendezvous->Barrier();
}

uint64_t Context::session_id() const { return impl_->job_id; }
const Config& Context::config() const { return impl_->config; }

ContextStats Context::stats() const {
  ContextStats s;
  for (auto& t : impl_->threads) {
    const worker::SessionCounters c = t->counters();
    s.packets_sent += c.sent;
    s.packets_retransmitted += c.retransmitted;
    s.timeouts += c.timeouts;
    s.results += c.results;
    s.duplicates_dropped += c.duplicates;
    s.stale_dropped += c.stale;
    s.malformed_dropped += c.malformed + c.foreign_slot;
    s.rtt_samples += c.rtt_samples;
    s.backoffs += c.backoffs;
    const auto us = [](worker::Nanos d) { return static_cast<double>(d.count()) / 1e3; };
    s.srtt_us = std::max(s.srtt_us, us(c.srtt));
    s.rttvar_us = std::max(s.rttvar_us, us(c.rttvar));
    s.rto_us = std::max(s.rto_us, us(c.rto));
    s.foreign_source_dropped += t->foreign_source_dropped();
    const transport::TransportCounters tc = t->transport_counters();
    s.auth_dropped += tc.auth_dropped;
    s.datagrams_received += tc.datagrams_received;
    s.group_datagrams_received += tc.group_datagrams_received;
    s.coalesced_receives += tc.coalesced_receives;
    const worker::FailoverCounters f = t->failover_counters();
    s.failovers = std::max<uint64_t>(s.failovers, f.failovers);
    s.blocks_repaired += f.blocks_staged + f.blocks_tail;
    const worker::SparseCounters sc = t->sparse_counters();
    s.sparse_allreduces = std::max<uint64_t>(s.sparse_allreduces, sc.allreduces);
    s.sparse_blocks += sc.blocks;
    s.sparse_own_blocks += sc.own_blocks;
    s.sparse_union_blocks += sc.union_blocks;
    s.sparse_dense_shares += sc.dense_shares;
    s.sparse_aggregated_blocks += sc.aggregated_blocks;
  }
  for (const auto& h : impl_->hosts) s.switch_hosts_alive += h->alive.load() ? 1 : 0;
  return s;
}

}  // namespace switchml
