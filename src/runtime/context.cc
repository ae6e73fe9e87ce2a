#include "switchml/context.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "base/affinity.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "control/control_client.h"
#include "proto/wire.h"
#include "runtime/worker_thread.h"
#include "transport/address.h"
#include "transport/auth.h"
#include "transport/factory.h"
#include "transport/shm.h"
#include "transport/udp.h"

namespace switchml {

Status Config::Validate() const {
  if (num_workers == 0) return InvalidArgumentError("num_workers must be at least 1");
  if (rank >= num_workers) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is out of range: with " +
                                std::to_string(num_workers) + " workers use ranks 0 to " +
                                std::to_string(num_workers - 1));
  }
  if (switch_host.empty())
    return InvalidArgumentError("switch_host is empty: name the switch's host");
  if (control_port == 0) return InvalidArgumentError("control_port must not be 0");
  // Checked here too, not only when Setup binds: a bad address is refused by Validate (and so
  // by Python's Config.validate() and the torch backend's options) before anything starts.
  if (uint32_t ip = 0; !ParseIpv4(bind_address, &ip)) {
    return InvalidArgumentError("bind_address '" + bind_address +
                                "' is not an IPv4 address (use 0.0.0.0 for any)");
  }
  if (packet_numel != 64 && packet_numel != 256) {
    return InvalidArgumentError("packet_numel " + std::to_string(packet_numel) +
                                " is not supported: use 64 or 256");
  }
  if (num_worker_threads == 0) return InvalidArgumentError("num_worker_threads must be at least 1");
  if (timeout_threshold == 0) return InvalidArgumentError("timeout_threshold must be at least 1");
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
  if (timeout.count() <= 0) return InvalidArgumentError("timeout must be positive");
  if (min_timeout.count() <= 0) return InvalidArgumentError("min_timeout must be positive");
  if (max_timeout < min_timeout) {
    return InvalidArgumentError("max_timeout must be at least min_timeout");
  }
  if (peer_timeout < timeout) {
    return InvalidArgumentError("peer_timeout must be at least the retransmission timeout");
  }
  if (setup_timeout.count() <= 0) return InvalidArgumentError("setup_timeout must be positive");
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
  if (!(wake_batch >= 0 && wake_batch <= 1)) {
    return InvalidArgumentError(
        "wake_batch must be in [0, 1] (a fraction of the packets in "
        "flight; 0 = wake for every arrival)");
  }
  if (job_secret.size() > 64) {
    return InvalidArgumentError("job_secret must be at most 64 bytes, not " +
                                std::to_string(job_secret.size()));
  }
  transport::TransportOptions t;
  t.kind = transport;
  RETURN_IF_ERROR(t.Validate());
  return Status();
}

uint32_t Config::OutstandingPackets() const {
  if (max_outstanding_packets != 0) return max_outstanding_packets;
  // The bandwidth-delay product in packets, each taking the datagram plus IPv4 and UDP headers
  // and Ethernet framing on the wire; times the safety factor; rounded up to a multiple of 32
  // and then of the threads (equal shares); clamped (over shm from kMinShmAutoWindow, a
  // multiple of 64, so of every power-of-two thread count). Pure arithmetic on the fields, so every
  // worker given the same fields gets the same window.
  proto::SizeCode size;
  proto::SizeCodeForNumel(packet_numel, &size);
  const double wire_bytes = proto::DatagramBytes(size) + kIpUdpHeaderBytes + kEthernetFrameBytes;
  const double bdp = link_gbps * 1e9 / 8 * std::chrono::duration<double>(base_rtt).count();
  uint64_t w = static_cast<uint64_t>(std::ceil(kWindowSafety * bdp / wire_bytes));
  const uint64_t threads = num_worker_threads;
  w = (w + 31) / 32 * 32;
  w = (w + threads - 1) / threads * threads;
  const uint64_t floor = transport == "shm" ? kMinShmAutoWindow : kMinAutoWindow;
  w = std::max<uint64_t>(w, std::max<uint64_t>(floor, threads));
  return static_cast<uint32_t>(std::min<uint64_t>(w, kMaxAutoWindow / threads * threads));
}

struct AllReduceHandle::State {
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
// snooping switches always flood) and first port in [12000, 20000) from a hash of the session id
// and the switch's control port (below Linux's ephemeral ports and the workers' own
// [20000, 32000)). The control port keeps apart the jobs of one session id on two switches of
// one host (the racks of a hierarchy, whose workers share the session id): on one group each
// worker would also receive, and drop, the other switch's results. Two sessions on one switch
// that hash alike cannot both hold it: the switch keeps it for the first only
// (dataplane::JobSpec::multicast_group), and the other gets results one copy per worker.
Endpoint MulticastGroupOf(uint64_t session_id, uint16_t control_port, uint32_t num_ports) {
  uint64_t h = session_id + 0x9e3779b97f4a7c15ULL * (uint64_t{control_port} + 1);  // splitmix64
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  h ^= h >> 31;
  constexpr uint32_t kFirstPort = 12000, kPorts = 8000;
  const uint32_t room = kPorts - std::min<uint32_t>(num_ports, kPorts - 1);
  return Endpoint{0xefc00000u | static_cast<uint32_t>(h & 0x3ffff),
                  static_cast<uint16_t>(kFirstPort + (h >> 24) % room)};
}

using transport::NetInterface;

// Joins every worker thread's transport to the session's result group (Config::
// loopback_multicast, Config::lan_multicast): on the loopback interface when the switch is on
// this host (a loopback address), else, with lan_multicast, on the interface toward the switch.
// Sets *group (0: none) and *via. A group that cannot be joined is only logged (results then
// come one per worker), unless it is a LAN group the user required (lan_multicast_required).
Status JoinResultGroup(const Config& config, uint32_t switch_ip, uint32_t bind_ip,
                       uint64_t session_id,
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
  const Endpoint g = MulticastGroupOf(session_id, config.control_port, config.num_worker_threads);
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

// The default Rendezvous: barriers and broadcasts through the switch's control plane. The
// broadcast that picks the session id is unscoped (the reference's way: one such setup at a time
// per switch); barriers are scoped by the session id once it is known.
class ControlPlaneRendezvous final : public Rendezvous {
 public:
  ControlPlaneRendezvous(control::ControlClient* control, const Config& config)
      : control_(control),
        rank_(config.rank),
        num_workers_(config.num_workers),
        secret_(config.job_secret) {}
  void set_scope(uint64_t session_id) { scope_ = session_id; }
  Status Barrier() override { return control_->Barrier(scope_, num_workers_, secret_, rank_); }
  Result<uint64_t> Broadcast(uint64_t value) override {
    return control_->Broadcast(scope_, value, rank_, num_workers_, /*root=*/0, secret_);
  }

 private:
  control::ControlClient* control_;
  const uint32_t rank_, num_workers_;
  const std::string secret_;
  std::atomic<uint64_t> scope_{0};
};

}  // namespace

class Context::Impl {
 public:
  Config config;
  uint64_t session_id = 0;
  std::unique_ptr<control::ControlClient> control;
  // This worker's stream to the switch (liveness, tensor checks); null before registration.
  std::unique_ptr<control::Attachment> attachment;
  // How the workers meet: the caller's, or (null until Setup) one through the control plane.
  std::shared_ptr<Rendezvous> rendezvous;
  std::vector<std::unique_ptr<runtime::WorkerThread>> threads;
  std::mutex mu;
  uint64_t next_job = 1;
  std::vector<AllReduceHandle> pending;
  // Set after a protocol failure (timeout, transport): the workers' slot states no longer
  // agree, so every later operation, and every queued one, fails at once with it.
  std::shared_ptr<runtime::FailureLatch> failure = std::make_shared<runtime::FailureLatch>();

  Status Setup();
  Status Register(const control::UdpSessionArgs& args, control::UdpSessionReply* reply);
  void Close();
  // Setup failed with `why` after this rank registered: fail the session at the switch with
  // the reason, so that the other ranks learn why this one left instead of only that its
  // connection ended. Not when the switch failed the session itself (it already said why).
  void AbandonSetup(const Status& why);
  Result<AllReduceHandle> Submit(const void* in, void* out, size_t count, DataType dtype);
};

Status Context::Impl::Setup() {
  const std::string target = config.switch_host + ":" + std::to_string(config.control_port);
  control::ControlTlsOptions tls;
  tls.ca_file = config.tls_ca_file;
  tls.cert_file = config.tls_cert_file;
  tls.key_file = config.tls_key_file;
  tls.server_name = config.tls_server_name;
  ASSIGN_OR_RETURN(control, control::ControlClient::Create(target, config.setup_timeout, tls));
  ASSIGN_OR_RETURN(uint32_t switch_ip, transport::ResolveIpv4(config.switch_host));
  uint32_t bind_ip = 0;
  if (!ParseIpv4(config.bind_address, &bind_ip)) {
    return InvalidArgumentError("bind_address '" + config.bind_address +
                                "' is not an IPv4 address (use 0.0.0.0 for any)");
  }
  transport::TransportOptions topts;
  topts.kind = config.transport;
  topts.bind_ipv4 = bind_ip;
  topts.port = config.udp_port;
  // With the authenticated data plane every datagram carries a tag behind it (transport/auth.h).
  topts.max_datagram_bytes =
      proto::kMaxDatagramBytes + (config.authenticate_data ? transport::kAuthRoomBytes : 0);
  // shm: each thread's inbox has room for twice its window of results (at least the default).
  if (topts.kind == "shm") {
    const uint64_t window = config.OutstandingPackets() / config.num_worker_threads;
    uint32_t slots = transport::kShmDataPlaneRingSlots;
    while (slots < 2 * window && slots < 65536) slots *= 2;
    topts.shm_ring_slots = slots;
  }
  ASSIGN_OR_RETURN(auto transports, transport::OpenTransports(topts, config.num_worker_threads));
  const uint16_t base_port = transports[0]->local_endpoint().port;

  // Agree on the session id: given, or rank 0's pick broadcast to everyone (reference).
  ControlPlaneRendezvous* own_rendezvous = nullptr;
  if (rendezvous == nullptr) {
    auto r = std::make_shared<ControlPlaneRendezvous>(control.get(), config);
    own_rendezvous = r.get();
    rendezvous = std::move(r);
  }
  session_id = config.session_id;
  if (session_id == 0) {
    const uint64_t pick =
        static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    ASSIGN_OR_RETURN(session_id, rendezvous->Broadcast(pick));
    if (session_id == 0) session_id = 1;
  }
  if (own_rendezvous != nullptr) own_rendezvous->set_scope(session_id);
  proto::SizeCode size;
  proto::SizeCodeForNumel(config.packet_numel, &size);
  control::UdpSessionArgs args;
  args.session_id = session_id;
  args.rank = config.rank;
  args.num_workers = config.num_workers;
  args.ipv4 = bind_ip;  // 0: the switch uses the address our control connection comes from
  args.udp_port = base_port;
  args.num_udp_ports = config.num_worker_threads;
  args.max_outstanding_packets = config.OutstandingPackets();
  args.size = size;
  args.job_secret = config.job_secret;
  args.authenticate_data = config.authenticate_data;
  // Multicast results: every worker of the session derives the same group and ports from the
  // session id, listens there, and asks the switch to send results to it.
  NetInterface group_interface;
  RETURN_IF_ERROR(JoinResultGroup(config, switch_ip, bind_ip, session_id, transports,
                                  &args.multicast_group, &group_interface));
  // Rank 0 (re)creates the job first; the others join after a barrier; all meet again.
  control::UdpSessionReply reply;
  if (config.rank == 0) {
    RETURN_IF_ERROR(Register(args, &reply));
    RETURN_IF_ERROR(rendezvous->Barrier());
  } else {
    RETURN_IF_ERROR(rendezvous->Barrier());
    RETURN_IF_ERROR(Register(args, &reply));
  }
  RETURN_IF_ERROR(rendezvous->Barrier());
  // The stream may have been refused, or the job failed, meanwhile.
  if (failure->is_set()) return failure->Get();
  if (args.multicast_group.ipv4 != 0 && !reply.multicast_group_kept) {
    // The switch will not send to the group for this job (a reference switch, another job holds
    // the group, or a transport without it): do not listen to it either.
    for (auto& t : transports) t->LeaveGroup();
    if (!group_interface.loopback && config.lan_multicast_required) {
      return FailedPreconditionError(
          "the switch did not keep LAN multicast group " + args.multicast_group.ToString() +
          " for this job (rank 0 ran with --multicast local or off, or the switch runs with "
          "--no-lan-multicast, is bound to 0.0.0.0 rather than the address of the interface the "
          "workers reach (--bind), uses a transport other than kernel UDP, holds the group for "
          "another job, or is a reference switch); run the workers with --multicast auto (results "
          "then come one copy per worker where the group cannot be had)");
    }
    if (!group_interface.loopback) {
      LOG(kInfo, kRuntime) << "no LAN multicast (results come one copy per worker): the switch "
                              "did not keep group "
                           << args.multicast_group.ToString()
                           << " (bound to 0.0.0.0, --no-lan-multicast, a reference switch, or "
                              "another job holds it)";
    }
    args.multicast_group = Endpoint{};
  }
  // From now on a switch that went away fails a barrier at once instead of being waited for.
  control->set_wait_for_ready(false);
  // The switch's data plane: at the address it names, or (0) where its control plane is.
  const Endpoint switch_data{reply.switch_ipv4 != 0 ? reply.switch_ipv4 : switch_ip,
                             reply.data_port};
  LOG(kInfo, kRuntime) << "rank " << config.rank << " joined session " << session_id
                       << "; switch data plane at " << switch_data.ToString() << "; local ports "
                       << base_port << ".." << base_port + config.num_worker_threads - 1;

  if (config.authenticate_data) {
    transport::AuthKey key;
    if (!transport::AuthKeyFromBytes(reply.data_key, &key)) {  // the client checked the size
      return InternalError("the switch's data-plane key is not 16 bytes");
    }
    for (auto& t : transports)
      t = transport::MakeAuthenticated(std::move(t), session_id, config.rank, key);
  }

  const uint32_t window = args.max_outstanding_packets / config.num_worker_threads;
  std::vector<int> cpus;  // Config::pin_threads: thread t runs on CpuOfThread(cpus, t)
  if (config.pin_threads) {
    ASSIGN_OR_RETURN(cpus, AllowedCpus());
  }
  for (uint32_t t = 0; t < config.num_worker_threads; ++t) {
    worker::SessionConfig sc;
    sc.num_workers = config.num_workers;
    sc.slot_start = t * window;
    sc.window = window;
    sc.size = size;
    sc.timeout = config.timeout;
    sc.min_timeout = config.min_timeout;
    sc.max_timeout = config.max_timeout;
    sc.early_retransmit_after = config.early_retransmit_after;
    sc.timeout_threshold = config.timeout_threshold;
    sc.timeout_threshold_increment = config.timeout_threshold_increment;
    sc.progress_timeout = config.peer_timeout;
    RETURN_IF_ERROR(sc.Validate());
    // Worker thread t talks to the switch's data-plane thread t mod (its threads).
    const Endpoint shard{switch_data.ipv4,
                         static_cast<uint16_t>(switch_data.port + t % reply.num_data_ports)};
    runtime::WaitPolicy wait;
    wait.busy_poll = config.busy_poll;
    wait.wake_batch = config.wake_batch;
    if (!cpus.empty()) wait.cpu = CpuOfThread(cpus, t);
    std::string expected_group;  // checked for LAN groups only (a loopback one cannot fail)
    if (args.multicast_group.ipv4 != 0 && !group_interface.loopback) {
      expected_group =
          Endpoint{args.multicast_group.ipv4, static_cast<uint16_t>(args.multicast_group.port + t)}
              .ToString() +
          " on " + group_interface.name;
    }
    // (The threads stop before the control client goes: ~Context.)
    auto explain_stall = [client = control.get(), id = session_id,
                          secret = config.job_secret](uint64_t op) -> std::string {
      Result<std::string> why = client->Diagnose(id, secret, op, std::chrono::seconds(1));
      return why.ok() ? *why : std::string();
    };
    threads.push_back(std::make_unique<runtime::WorkerThread>(
        sc, std::move(transports[t]), shard, failure, wait, switch_data.port, reply.num_data_ports,
        std::move(expected_group), std::move(explain_stall), config.lan_multicast_required));
  }
  return Status();
}

// Registers this worker and attaches its stream: from then on the switch notices at once when
// this worker dies (and fails the job, naming the rank), and this worker when the switch dies
// or the job fails.
Status Context::Impl::Register(const control::UdpSessionArgs& args,
                               control::UdpSessionReply* reply) {
  ASSIGN_OR_RETURN(*reply, control->UdpSession(args));
  // (The stream ends before the control client is destroyed: the callback may use it.)
  attachment = control->Attach(session_id, config.rank, config.job_secret,
                               [latch = failure, client = control.get()](const Status& why) {
                                 latch->Set(why);
                                 // A barrier under way ends too: its peers or the switch are
                                 // not coming.
                                 client->CancelCalls(why);
                               });
  return Status();
}

void Context::Impl::AbandonSetup(const Status& why) {
  if (control == nullptr || attachment == nullptr || failure->is_set()) return;
  control
      ->Close(session_id, config.job_secret, std::nullopt, std::chrono::milliseconds(1000),
              "session " + std::to_string(session_id) + " failed: rank " +
                  std::to_string(config.rank) + " gave up joining it: " + why.message())
      .IgnoreError();
  attachment.reset();
}

// Tells the switch this rank is done (the job's slots are freed when every rank is), then ends
// the stream. Best effort: the switch may be gone.
void Context::Impl::Close() {
  if (control == nullptr || attachment == nullptr) return;
  control->Close(session_id, config.job_secret, config.rank, std::chrono::milliseconds(1000))
      .IgnoreError();
  attachment.reset();
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
  const bool check = config.check_tensors && attachment != nullptr;
  state->remaining = static_cast<int>(nthreads);
  state->check_pending = check;
  const uint64_t job_id = next_job++;
  auto slice_done = [state](const Status& st) {
    std::lock_guard<std::mutex> l(state->mu);
    if (state->status.ok() && !st.ok()) state->status = st;
    --state->remaining;
    state->cv.notify_all();
  };
  // The switch compares every worker's count and type for this all-reduce; the result counts
  // only once they agree.
  if (check) {
    attachment->Announce(job_id, count, static_cast<uint32_t>(dtype), [state](const Status& st) {
      std::lock_guard<std::mutex> l(state->mu);
      if (state->status.ok() && !st.ok()) state->status = st;
      state->check_pending = false;
      state->cv.notify_all();
    });
  }
  const size_t esize = DataTypeSize(dtype);
  for (size_t t = 0; t < nthreads; ++t) {
    // Slices of whole packets, the same on every worker of the job.
    const size_t p0 = packets * t / nthreads, p1 = packets * (t + 1) / nthreads;
    const size_t e0 = std::min(count, p0 * numel), e1 = std::min(count, p1 * numel);
    worker::SliceJob job;
    job.job_id = job_id;
    job.dtype = dtype;
    job.in = static_cast<const uint8_t*>(in) + e0 * esize;
    job.out = static_cast<uint8_t*>(out) + e0 * esize;
    job.count = e1 - e0;
    job.element_offset = e0;
    threads[t]->Submit(job, slice_done);
  }
  pending.push_back(handle);
  if (pending.size() > 1024) {
    std::erase_if(pending, [](const AllReduceHandle& h) { return h.Test(); });
  }
  return handle;
}

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Context::~Context() {
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

uint64_t Context::session_id() const { return impl_->session_id; }
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
  }
  return s;
}

}  // namespace switchml
