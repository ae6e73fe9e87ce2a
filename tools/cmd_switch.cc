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

Flags SwitchFlags() {
  Flags flags("switch",
              "Runs the SwitchML software switch: aggregates workers' packets on the data port\n"
              "(UDP) and serves session setup, barriers and broadcasts on the control port\n"
              "(gRPC). Prints its counters at exit (SIGINT/SIGTERM) and on SIGUSR1.");
  flags.AddString("bind", "0.0.0.0", "IPv4 address to listen on");
  flags.AddInt("data-port", 48864, "UDP data port (0 = pick a free one)");
  flags.AddInt("control-port", 50099, "gRPC control port (0 = pick a free one)");
  flags.AddInt("max-workers", 32, "workers per job (at most 256)");
  flags.AddInt("slots", 8192, "aggregation slots per job (at most 16384)");
  flags.AddInt("max-jobs", 64, "concurrent jobs (at most 1000000)");
  flags.AddDouble("loss", 0, "drop this fraction of packets in each direction (loss simulator)");
  flags.AddInt("seed", 1, "seed of the loss simulator (0..2^63-1)");
  flags.AddInt("threads", 1,
               "data-plane threads, each on its own UDP port from --data-port up (workers should "
               "use a multiple of this many --threads)");
  flags.AddString("transport", transport::kDefaultTransportKind, TransportHelp());
  flags.AddBool("busy-poll", "poll the data port without sleeping (lower latency, a busy core)");
  flags.AddBool("pin-threads",
                "pin data-plane thread t to the t-th CPU this process may run on (round robin): "
                "with workers on this host run with --pin-threads, each thread shares a core's "
                "caches with the worker threads it serves (docs/architecture.md, \"Pinned "
                "threads\")");
  flags.AddInt("nap-us", 0,
               "receive coalescing: after emptying a data port, sleep this many microseconds "
               "before the next receive (0 = off; up to 10000): less CPU for up to this much "
               "more latency per packet");
  flags.AddBool("no-lan-multicast",
                "refuse LAN multicast: send each result to every worker, even to workers that "
                "ask for a group (switchml worker --multicast auto or on); LAN multicast needs "
                "--bind with the address of the interface the workers reach");
  flags.AddInt("multicast-ttl", 1, "IP TTL of results sent to a LAN multicast group (1..255)");
  AddDpdkFlags(&flags);
  flags.AddInt("stats-interval", 0, "print counters every N seconds (0 = only at exit)");
  flags.AddBool("per-slot", "include per-slot counters in the printed tables");
  flags.AddString("upstream", "",
                  "hierarchical aggregation: make this a top-of-rack switch under the switch whose "
                  "control plane is at HOST[:PORT] (port 50099) (workers keep their global --rank "
                  "and --workers and use their rack's switch; docs/hierarchy.md)");
  flags.AddInt("rack-index", 0, "with --upstream: this rack's index, 0..racks-1");
  flags.AddInt("racks", 0,
               "with --upstream: the number of racks; rack r holds global ranks "
               "[r*N/racks, (r+1)*N/racks) of a job of N workers");
  flags.AddBool("require-secret",
                "refuse control requests without a job secret (reference clients send none)");
  flags.AddBool("require-auth-data",
                "refuse jobs that do not ask for the authenticated data plane (workers' "
                "--auth-data; reference clients cannot)");
  flags.AddBool("allow-foreign-address",
                "let a worker register an IPv4 other than its control connection's");
  flags.AddInt("lease-seconds", 60,
               "remove a job with no worker stream and no activity for this long");
  flags.AddString("tls-cert", "", "PEM certificate: serve the control plane over TLS only");
  flags.AddString("tls-key", "", "PEM private key of --tls-cert");
  flags.AddString("tls-client-ca", "",
                  "PEM CA: require client certificates signed by it (mutual TLS)");
  flags.AddInt("metrics-port", -1,
               "serve Prometheus metrics on http://METRICS-BIND:N/metrics (0 = pick a free port, "
               "printed at start; -1 = off; docs/operations.md lists the metrics)");
  flags.AddString("metrics-bind", "127.0.0.1",
                  "IPv4 address of the metrics endpoint (0.0.0.0 for every interface: a "
                  "Prometheus server on another host)");
  flags.AddString("log-level", "info", "debug, info, warning, error or off");
  return flags;
}
// The data plane's flags: ports, sizes, threads, transport, coalescing, multicast, loss.
int ReadDataPlaneFlags(const Flags& flags, runtime::SwitchDaemonOptions* out) {
  runtime::SwitchDaemonOptions& o = *out;
  o.bind_address = flags.GetString("bind");
  const int64_t dport = flags.GetInt("data-port"), cport = flags.GetInt("control-port");
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
  for (const auto& [name, max] : {std::pair<const char*, int64_t>{"max-workers", 256},
                                  {"slots", 16384},
                                  {"max-jobs", 1000000}}) {
    const int64_t v = flags.GetInt(name);
    if (v < 1 || v > max) {
      std::cerr << "switchml switch: --" << name << " must be in 1.." << max << ", not " << v
                << "\n";
      return 2;
    }
  }
  if (flags.GetInt("stats-interval") < 0) {
    std::cerr << "switchml switch: --stats-interval must be >= 0 seconds (0 = only at exit)\n";
    return 2;
  }
  o.switch_config.max_workers_per_job = static_cast<uint32_t>(flags.GetInt("max-workers"));
  o.switch_config.slots_per_job = static_cast<uint32_t>(flags.GetInt("slots"));
  o.switch_config.max_jobs = static_cast<uint32_t>(flags.GetInt("max-jobs"));
  o.loss = flags.GetDouble("loss");
  if (Status st = ReadSeed(flags, &o.seed); !st.ok()) {
    std::cerr << "switchml switch: " << st.message() << "\n";
    return 2;
  }
  o.transport = flags.GetString("transport");
  if (Status st = CheckTransportFlag(o.transport, /*auto_transport=*/false); !st.ok()) {
    std::cerr << "switchml switch: " << st.message() << "\n";  // was refused only at start
    return 2;
  }
  const int64_t threads = flags.GetInt("threads");
  if (threads < 1 || threads > 64) {
    std::cerr << "switchml switch: --threads must be in 1..64\n";
    return 2;
  }
  o.threads = static_cast<uint32_t>(threads);
  o.busy_poll = flags.GetBool("busy-poll");
  o.pin_threads = flags.GetBool("pin-threads");
  const int64_t nap = flags.GetInt("nap-us");
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
  o.lan_multicast = !flags.GetBool("no-lan-multicast");
  const int64_t ttl = flags.GetInt("multicast-ttl");
  if (ttl < 1 || ttl > 255) {
    std::cerr << "switchml switch: --multicast-ttl must be in 1..255\n";
    return 2;
  }
  o.multicast_ttl = static_cast<int>(ttl);
  return kGoOn;
}

// The control plane's flags: secrets, leases, TLS.
int ReadControlFlags(const Flags& flags, runtime::SwitchDaemonOptions* out) {
  runtime::SwitchDaemonOptions& o = *out;
  o.control.registry.require_secret = flags.GetBool("require-secret");
  o.control.registry.allow_foreign_address = flags.GetBool("allow-foreign-address");
  o.control.registry.require_authenticated_data = flags.GetBool("require-auth-data");
  const int64_t lease = flags.GetInt("lease-seconds");
  if (lease < 1 || lease > 86400) {
    std::cerr << "switchml switch: --lease-seconds must be in 1..86400\n";
    return 2;
  }
  o.control.registry.lease = std::chrono::seconds(lease);
  o.control.tls_cert_file = flags.GetString("tls-cert");
  o.control.tls_key_file = flags.GetString("tls-key");
  o.control.tls_client_ca_file = flags.GetString("tls-client-ca");
  return kGoOn;
}

// Hierarchical aggregation: --upstream, --racks, --rack-index.
int ReadHierarchyFlags(const Flags& flags, runtime::SwitchDaemonOptions* out) {
  runtime::SwitchDaemonOptions& o = *out;
  o.upstream = flags.GetString("upstream");
  const int64_t racks = flags.GetInt("racks"), rack_index = flags.GetInt("rack-index");
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
int ReadMetricsFlags(const Flags& flags, metrics::MetricsServerOptions* out, int64_t* port) {
  *port = flags.GetInt("metrics-port");
  if (*port < -1 || *port > 65535) {
    return BadFlag("--metrics-port must be in 0..65535 (0 = pick a free one) or -1 (off), not " +
                   std::to_string(*port));
  }
  out->bind_address = flags.GetString("metrics-bind");
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
      "on %s; max %u workers and %u slots per job%s\n",
      o.threads > 1 ? "s" : "", ports.c_str(), o.transport.c_str(), o.threads,
      o.threads > 1 ? "s" : "", daemon.control_port(), o.bind_address.c_str(),
      o.switch_config.max_workers_per_job, o.switch_config.slots_per_job,
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
  Flags flags = SwitchFlags();
  if (int code = ParseCommandLine("switch", args, &flags, nullptr); code >= 0) return code;
  runtime::SwitchDaemonOptions o;
  metrics::MetricsServerOptions mo;
  int64_t metrics_port = -1;
  for (auto read : {ReadDataPlaneFlags, ReadControlFlags, ReadHierarchyFlags}) {
    if (int code = read(flags, &o); code != kGoOn) return code;
  }
  if (int code = ReadMetricsFlags(flags, &mo, &metrics_port); code != kGoOn) return code;
  ApplyDpdkFlags(flags);

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
  const bool per_slot = flags.GetBool("per-slot");
  WaitForTheEnd(set, **daemon, per_slot, flags.GetInt("stats-interval"));
  metrics_server.reset();  // no scrape may read the daemon once it stops
  (*daemon)->Stop();
  std::printf("switchml switch: shutting down\n%s", (*daemon)->FormatCounters(per_slot).c_str());
  return 0;
}

}  // namespace switchml::tools
