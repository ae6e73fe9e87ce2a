// `switchml switch`: the software switch daemon.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <utility>

#include "base/logging.h"
#include "commands.h"
#include "flags.h"
#include "metrics/metrics_server.h"
#include "proto/wire.h"
#include "runtime/packet_size.h"
#include "runtime/switch_daemon.h"
#include "runtime/switch_metrics.h"
#include "transport/address.h"
#include "transport/factory.h"

namespace switchml::tools {

namespace {

// Exit code of a flag refused after printing why (ParseCommandLine's convention: -1 goes on).
constexpr int kGoOn = -1;
constexpr int kBadUsage = 2;

int BadFlag(const std::string& what) {
  std::cerr << "switchml switch: " << what << "\n";
  return kBadUsage;
}

// The command's flags as given (DefineSwitchFlags binds them).
struct SwitchFlags {
  std::string bind = "0.0.0.0";
  int64_t data_port = proto::kDefaultDataPort;
  int64_t control_port = proto::kDefaultControlPort;
  int64_t max_workers = 32;
  int64_t slots = 8192;
  int64_t max_jobs = 64;
  int64_t max_packet_numel = 0;  // auto: runtime::LargestMaxPacketNumel(transport)
  double loss = 0;
  int64_t seed = 1;
  int64_t threads = 1;
  std::string transport = transport::kDefaultTransportKind;
  bool busy_poll = false;
  bool pin_threads = false;
  int64_t nap_us = 0;
  bool no_lan_multicast = false;
  int64_t multicast_ttl = 1;
  DpdkFlags dpdk;
  int64_t stats_interval = 0;
  bool per_slot = false;
  std::string upstream;
  int64_t rack_index = 0;
  int64_t racks = 0;
  bool require_secret = false;
  bool require_auth_data = false;
  bool allow_foreign_address = false;
  int64_t lease_seconds = 60;
  std::string tls_cert, tls_key, tls_client_ca;
  int64_t metrics_port = -1;
  std::string metrics_bind = "127.0.0.1";
  std::string log_level = "info";
};

void DefineSwitchFlags(Flags* flags, SwitchFlags* f) {
  flags->Add("bind", &f->bind, "IPv4 address to listen on");
  flags->Add("data-port", &f->data_port, "UDP data port (0 = pick a free one)");
  flags->Add("control-port", &f->control_port, "gRPC control port (0 = pick a free one)");
  flags->Add("max-workers", &f->max_workers, "workers per job (at most 256)");
  flags->Add("slots", &f->slots, "aggregation slots per job (at most 16384)");
  flags->Add("max-jobs", &f->max_jobs, "concurrent jobs (at most 1000000)");
  flags->Add("max-packet-numel", &f->max_packet_numel,
             "the largest packet_numel a job may use: 256 (the reference's sizes only), or 512, "
             "1024 or 2048 to accept jumbo packets too (docs/protocol.md 2.6); 0 (the default): "
             "the largest the transport carries, 2048 for udp, udp-plain and shm, 256 for xdp "
             "and dpdk. Reference clients never use the jumbo sizes; workers with packet_numel 0 "
             "(the torch backend's default) use the largest this allows and their path carries");
  flags->Add("loss", &f->loss, "drop this fraction of packets in each direction (loss simulator)");
  flags->Add("seed", &f->seed, "seed of the loss simulator (0..2^63-1)");
  flags->Add("threads", &f->threads,
             "data-plane threads, each on its own UDP port from --data-port up (workers should "
             "use a multiple of this many --threads; the PyTorch backend's workers take as many "
             "by default)");
  flags->Add("transport", &f->transport, TransportHelp());
  flags->Add("busy-poll", &f->busy_poll,
             "poll the data port without sleeping (lower latency, a busy core)");
  flags->Add("pin-threads", &f->pin_threads,
             "pin data-plane thread t to the t-th CPU this process may run on (round robin): "
             "with workers on this host run with --pin-threads, each thread shares a core's "
             "caches with the worker threads it serves (docs/architecture.md, \"Pinned "
             "threads\")");
  flags->Add("nap-us", &f->nap_us,
             "receive coalescing: after emptying a data port, sleep this many microseconds "
             "before the next receive (0 = off; up to 10000): less CPU for up to this much "
             "more latency per packet");
  flags->Add("no-lan-multicast", &f->no_lan_multicast,
             "refuse LAN multicast: send each result to every worker, even to workers that "
             "ask for a group (switchml worker --multicast auto or on); LAN multicast needs "
             "--bind with the address of the interface the workers reach");
  flags->Add("multicast-ttl", &f->multicast_ttl,
             "IP TTL of results sent to a LAN multicast group (1..255)");
  AddDpdkFlags(flags, &f->dpdk);
  flags->Add("stats-interval", &f->stats_interval,
             "print counters every N seconds (0 = only at exit)");
  flags->Add("per-slot", &f->per_slot, "include per-slot counters in the printed tables");
  flags->Add("upstream", &f->upstream,
             "hierarchical aggregation: make this a top-of-rack switch under the switch whose "
             "control plane is at HOST[:PORT] (port 50099) (workers keep their global --rank "
             "and --workers and use their rack's switch; docs/hierarchy.md)");
  flags->Add("rack-index", &f->rack_index, "with --upstream: this rack's index, 0..racks-1");
  flags->Add("racks", &f->racks,
             "with --upstream: the number of racks; rack r holds global ranks "
             "[r*N/racks, (r+1)*N/racks) of a job of N workers");
  flags->Add("require-secret", &f->require_secret,
             "refuse control requests without a job secret (reference clients send none)");
  flags->Add("require-auth-data", &f->require_auth_data,
             "refuse jobs that do not ask for the authenticated data plane (workers' "
             "--auth-data; reference clients cannot)");
  flags->Add("allow-foreign-address", &f->allow_foreign_address,
             "let a worker register an IPv4 other than its control connection's");
  flags->Add("lease-seconds", &f->lease_seconds,
             "remove a job with no worker stream and no activity for this long");
  flags->Add("tls-cert", &f->tls_cert, "PEM certificate: serve the control plane over TLS only");
  flags->Add("tls-key", &f->tls_key, "PEM private key of --tls-cert");
  flags->Add("tls-client-ca", &f->tls_client_ca,
             "PEM CA: require client certificates signed by it (mutual TLS)");
  flags->Add("metrics-port", &f->metrics_port,
             "serve Prometheus metrics on http://METRICS-BIND:N/metrics (0 = pick a free port, "
             "printed at start; -1 = off; docs/operations.md lists the metrics)");
  flags->Add("metrics-bind", &f->metrics_bind,
             "IPv4 address of the metrics endpoint (0.0.0.0 for every interface: a "
             "Prometheus server on another host)");
  flags->Add("log-level", &f->log_level, "debug, info, warning, error or off");
}
// The data plane's flags: ports, sizes, threads, transport, coalescing, multicast, loss.
int ReadDataPlaneFlags(const SwitchFlags& flags, runtime::SwitchDaemonOptions* out) {
  runtime::SwitchDaemonOptions& o = *out;
  o.bind_address = flags.bind;
  const int64_t dport = flags.data_port, cport = flags.control_port;
  for (const auto& [name, port] : {std::pair{"data-port", dport}, {"control-port", cport}}) {
    if (port < 0 || port > 65535) {
      std::cerr << "switchml switch: --" << name << " must be in 0..65535 (0 = pick a free one), "
                << "not " << port << "\n";
      return 2;
    }
  }
  o.data_port = static_cast<uint16_t>(dport);
  o.control_port = static_cast<uint16_t>(cport);
  // Counts checked here, before they narrow to 32 bits (-1 jobs read as 4294967295, 4294967297
  // slots as 1).
  struct Count {
    const char* name;
    int64_t value, max;
  };
  for (const auto& [name, v, max] : {Count{"max-workers", flags.max_workers, 256},
                                     {"slots", flags.slots, 16384},
                                     {"max-jobs", flags.max_jobs, 1000000}}) {
    if (v < 1 || v > max) {
      std::cerr << "switchml switch: --" << name << " must be in 1.." << max << ", not " << v
                << "\n";
      return 2;
    }
  }
  if (flags.stats_interval < 0) {
    std::cerr << "switchml switch: --stats-interval must be >= 0 seconds (0 = only at exit)\n";
    return 2;
  }
  o.switch_config.max_workers_per_job = static_cast<uint32_t>(flags.max_workers);
  o.switch_config.slots_per_job = static_cast<uint32_t>(flags.slots);
  o.switch_config.max_jobs = static_cast<uint32_t>(flags.max_jobs);
  if (flags.max_packet_numel != 0 && flags.max_packet_numel != 256 &&
      flags.max_packet_numel != 512 && flags.max_packet_numel != 1024 &&
      flags.max_packet_numel != 2048) {
    std::cerr << "switchml switch: --max-packet-numel must be 256, 512, 1024 or 2048 (or 0: the "
                 "largest the transport carries), not "
              << flags.max_packet_numel << "\n";
    return 2;
  }
  o.switch_config.max_packet_numel = flags.max_packet_numel == 0
                                         ? runtime::LargestMaxPacketNumel(flags.transport)
                                         : static_cast<uint32_t>(flags.max_packet_numel);
  o.loss = flags.loss;
  if (Status st = ReadSeed(flags.seed, &o.seed); !st.ok()) {
    std::cerr << "switchml switch: " << st.message() << "\n";
    return 2;
  }
  o.transport = flags.transport;
  if (Status st = CheckTransportFlag(o.transport, /*auto_transport=*/false); !st.ok()) {
    std::cerr << "switchml switch: " << st.message() << "\n";  // was refused only at start
    return 2;
  }
  const int64_t threads = flags.threads;
  if (threads < 1 || threads > 64) {
    std::cerr << "switchml switch: --threads must be in 1..64\n";
    return 2;
  }
  o.threads = static_cast<uint32_t>(threads);
  o.busy_poll = flags.busy_poll;
  o.pin_threads = flags.pin_threads;
  const int64_t nap = flags.nap_us;
  if (nap < 0 || nap > runtime::SwitchDaemonOptions::kMaxNap.count()) {
    std::cerr << "switchml switch: --nap-us must be in 0.."
              << runtime::SwitchDaemonOptions::kMaxNap.count() << "\n";
    return 2;
  }
  o.nap = std::chrono::microseconds(nap);
  if (nap > 0 && o.busy_poll) {
    std::cerr << "switchml switch: --nap-us and --busy-poll contradict each other (sleep or "
                 "spin): choose one\n";
    return 2;
  }
  o.lan_multicast = !flags.no_lan_multicast;
  const int64_t ttl = flags.multicast_ttl;
  if (ttl < 1 || ttl > 255) {
    std::cerr << "switchml switch: --multicast-ttl must be in 1..255\n";
    return 2;
  }
  o.multicast_ttl = static_cast<int>(ttl);
  return kGoOn;
}

// The control plane's flags: secrets, leases, TLS.
int ReadControlFlags(const SwitchFlags& flags, runtime::SwitchDaemonOptions* out) {
  runtime::SwitchDaemonOptions& o = *out;
  o.control.registry.require_secret = flags.require_secret;
  o.control.registry.allow_foreign_address = flags.allow_foreign_address;
  o.control.registry.require_authenticated_data = flags.require_auth_data;
  const int64_t lease = flags.lease_seconds;
  if (lease < 1 || lease > 86400) {
    std::cerr << "switchml switch: --lease-seconds must be in 1..86400\n";
    return 2;
  }
  o.control.registry.lease = std::chrono::seconds(lease);
  o.control.tls_cert_file = flags.tls_cert;
  o.control.tls_key_file = flags.tls_key;
  o.control.tls_client_ca_file = flags.tls_client_ca;
  return kGoOn;
}

// Hierarchical aggregation: --upstream, --racks, --rack-index.
int ReadHierarchyFlags(const SwitchFlags& flags, runtime::SwitchDaemonOptions* out) {
  runtime::SwitchDaemonOptions& o = *out;
  o.upstream = flags.upstream;
  const int64_t racks = flags.racks, rack_index = flags.rack_index;
  if (!o.upstream.empty() &&
      (racks < 1 || racks > 65536 || rack_index < 0 || rack_index >= racks)) {
    std::cerr << "switchml switch: --upstream needs --racks R (at least 1) and --rack-index in "
                 "0..R-1\n";
    return 2;
  }
  if (o.upstream.empty() && (racks != 0 || rack_index != 0)) {
    std::cerr << "switchml switch: --racks and --rack-index need --upstream HOST:PORT\n";
    return 2;
  }
  if (!o.upstream.empty()) {
    // Checked here: a malformed one was taken as given and failed only when a worker joined,
    // and one without a port went to gRPC's default port (443), not the switch's.
    auto up = transport::ParseHostPort(o.upstream, proto::kDefaultControlPort);
    if (!up.ok()) {
      std::cerr << "switchml switch: --upstream: " << up.status().message() << "\n";
      return 2;
    }
    if (o.upstream.find(':') == std::string::npos) {
      o.upstream += ":" + std::to_string(proto::kDefaultControlPort);
    }
  }
  o.racks = static_cast<uint32_t>(racks);
  o.rack_index = static_cast<uint32_t>(rack_index);
  return kGoOn;
}

// The metrics flags: *port -1 when off.
int ReadMetricsFlags(const SwitchFlags& flags, metrics::MetricsServerOptions* out, int64_t* port) {
  *port = flags.metrics_port;
  if (*port < -1 || *port > 65535) {
    return BadFlag("--metrics-port must be in 0..65535 (0 = pick a free one) or -1 (off), not " +
                   std::to_string(*port));
  }
  out->bind_address = flags.metrics_bind;
  out->port = static_cast<uint16_t>(std::max<int64_t>(*port, 0));
  if (Status st = out->Validate(); !st.ok()) return BadFlag("--metrics-bind: " + st.message());
  return kGoOn;
}

void PrintStarted(const runtime::SwitchDaemonOptions& o, const runtime::SwitchDaemon& daemon) {
  const uint32_t first = daemon.data_port();
  const std::string ports =
      o.threads > 1 ? std::to_string(first) + "-" + std::to_string(first + o.threads - 1)
                    : std::to_string(first);
  std::printf(
      "switchml switch: data port%s %s (UDP, transport %s, %u thread%s), control port %u (gRPC) "
      "on %s; max %u workers and %u slots per job%s%s\n",
      o.threads > 1 ? "s" : "", ports.c_str(), o.transport.c_str(), o.threads,
      o.threads > 1 ? "s" : "", daemon.control_port(), o.bind_address.c_str(),
      o.switch_config.max_workers_per_job, o.switch_config.slots_per_job,
      o.switch_config.max_packet_numel > 256
          ? (", packets up to " + std::to_string(o.switch_config.max_packet_numel) + " elements")
                .c_str()
          : "",
      o.loss > 0 ? ", loss simulator on" : "");
  if (!o.upstream.empty()) {
    std::printf("switchml switch: top of rack %u of %u under the upstream switch %s\n",
                o.rack_index, o.racks, o.upstream.c_str());
  }
}

// Prints the counters on SIGUSR1 and every `interval` seconds (0: never) until SIGINT/SIGTERM.
void WaitForTheEnd(const sigset_t& signals, const runtime::SwitchDaemon& daemon, bool per_slot,
                   int64_t interval) {
  timespec wait{interval > 0 ? interval : 3600, 0};
  while (true) {
    int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM) break;
    if (sig == SIGUSR1 || (sig < 0 && interval > 0)) {
      std::printf("%s", daemon.FormatCounters(per_slot).c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace

int SwitchCommand(const std::vector<std::string>& args) {
  Flags parser("switch",
               "Runs the SwitchML software switch: aggregates workers' packets on the data port\n"
               "(UDP) and serves session setup, barriers and broadcasts on the control port\n"
               "(gRPC). Prints its counters at exit (SIGINT/SIGTERM) and on SIGUSR1.");
  SwitchFlags flags;
  DefineSwitchFlags(&parser, &flags);
  if (int code = ParseCommandLine("switch", args, &parser, flags.log_level); code >= 0) return code;
  runtime::SwitchDaemonOptions o;
  metrics::MetricsServerOptions mo;
  int64_t metrics_port = -1;
  for (auto read : {ReadDataPlaneFlags, ReadControlFlags, ReadHierarchyFlags}) {
    if (int code = read(flags, &o); code != kGoOn) return code;
  }
  if (int code = ReadMetricsFlags(flags, &mo, &metrics_port); code != kGoOn) return code;
  ApplyDpdkFlags(flags.dpdk);

  // Signals are taken synchronously by this thread; block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  auto daemon = runtime::SwitchDaemon::Start(o);
  if (!daemon.ok()) {
    std::cerr << "switchml switch: cannot start: " << daemon.status().message() << "\n";
    return 2;
  }
  PrintStarted(o, **daemon);
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (metrics_port >= 0) {
    auto m = metrics::MetricsServer::Start(
        mo, {runtime::SwitchMetricsCollector(daemon->get()), metrics::ProcessCollector()});
    if (!m.ok()) {
      std::cerr << "switchml switch: cannot start: " << m.status().message() << "\n";
      return 2;
    }
    metrics_server = std::move(m).value();
    std::printf("switchml switch: metrics on %s\n", metrics_server->url().c_str());
  }
  std::fflush(stdout);
  const bool per_slot = flags.per_slot;
  WaitForTheEnd(set, **daemon, per_slot, flags.stats_interval);
  metrics_server.reset();  // no scrape may read the daemon once it stops
  (*daemon)->Stop();
  std::printf("switchml switch: shutting down\n%s", (*daemon)->FormatCounters(per_slot).c_str());
  return 0;
}

}  // namespace switchml::tools
