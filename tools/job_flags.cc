#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <thread>

#include "base/affinity.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "commands.h"
#include "proto/wire.h"
#include "transport/address.h"
#include "transport/factory.h"

namespace switchml::tools {

std::string TransportHelp() {
  std::string kinds;
  for (const std::string& k : transport::TransportKinds()) kinds += (kinds.empty() ? "" : ", ") + k;
  return "data-plane transport: " + kinds +
         " (udp uses the kernel's UDP segmentation offloads, GSO/GRO, where it has them; dpdk "
         "bypasses the kernel, see --dpdk-device; shm: shared memory between the processes of this "
         "host, switch included, in $SWITCHML_SHM_DIR or /dev/shm/switchml-<uid>)";
}

void AddDpdkFlags(Flags* f, DpdkFlags* d) {
  f->Add("dpdk-eal", &d->eal,
         "--transport dpdk: EAL arguments (default: SWITCHML_DPDK_EAL, else --no-huge "
         "--no-pci --no-shconf -m 512, virtual devices only)");
  f->Add("dpdk-device", &d->device,
         "--transport dpdk: memif (shared memory between the processes of this host, the "
         "default), a PCI address or a virtual device such as net_af_packet0,iface=veth0");
}

void ApplyDpdkFlags(const DpdkFlags& d) {
  if (!d.eal.empty()) setenv("SWITCHML_DPDK_EAL", d.eal.c_str(), 1);
  if (!d.device.empty()) setenv("SWITCHML_DPDK_DEVICE", d.device.c_str(), 1);
}

void AddTlsClientFlags(Flags* f, TlsClientFlags* t) {
  f->Add("tls-ca", &t->ca, "PEM CA of the switch's certificate: talk TLS to the switch");
  f->Add("tls-cert", &t->cert, "PEM client certificate, for a switch that requires one");
  f->Add("tls-key", &t->key, "PEM private key of --tls-cert");
  f->Add("tls-server-name", &t->server_name,
         "the name in the switch's certificate (default: its host)");
}

void AddJobFlags(Flags* f, JobFlags* j, bool auto_transport) {
  j->auto_transport = auto_transport;
  j->threads = auto_transport ? 0 : 1;
  j->transport = auto_transport ? kAutoTransport : transport::kDefaultTransportKind;
  f->Add("workers", &j->workers, "number of workers in the job");
  f->Add("size", &j->size,
         "elements per all-reduce, not bytes (4 bytes each; sim's --size is in bytes), "
         "suffix K, M, G = 2^10, 2^20, 2^30: 64M is 64 Mi elements, 256 MiB; at most 1024G");
  f->Add("dtype", &j->dtype, "element type: float32 or int32");
  f->Add("iterations", &j->iterations, "timed all-reduces (at most 1000000)");
  f->Add("warmup", &j->warmup, "untimed all-reduces before them (at most 1000000)");
  if (auto_transport) {
    f->Add("threads", &j->threads,
           "worker threads (UDP ports) per worker; 0: " + std::to_string(kShmRunThreads) +
               " over shm on a host with at least " + std::to_string(kShmRunThreads) +
               " cores, else 1");
  } else {
    f->Add("threads", &j->threads, "worker threads (UDP ports) per worker");
  }
  f->Add("window", &j->window,
         "packets in flight per worker (slots used on the switch); 0: twice the "
         "bandwidth-delay product of --link-gbps and --base-rtt-us, at least 64 (over shm "
         "at least " +
             std::to_string(Config::kMinShmAutoWindow) + ")");
  f->Add("link-gbps", &j->link_gbps, "link rate (Gbit/s) the automatic window is sized for");
  f->Add("base-rtt-us", &j->base_rtt_us,
         "round trip through the switch, queues empty, for the window");
  f->Add("packet-numel", &j->packet_numel,
         "elements per packet: 64 or 256, or (our jumbo packets, where the switch enables them: "
         "docs/protocol.md 2.6) 512, 1024 or 2048");
  f->Add("timeout-ms", &j->timeout_ms,
         "retransmission timeout until a round trip has been measured");
  f->Add("min-timeout-us", &j->min_timeout_us,
         "floor of the retransmission timeout measured from round trips");
  f->Add("max-timeout-ms", &j->max_timeout_ms,
         "ceiling of the retransmission timeout, back-off included");
  f->Add("early-retransmit", &j->early_retransmit,
         "re-send a packet at once when the results of this many packets sent after it came "
         "back first (TCP's fast retransmit; 0 = off, wait for the timeout)");
  f->Add("peer-timeout-ms", &j->peer_timeout_ms, "fail when no result arrives for this long");
  f->Add("setup-timeout-ms", &j->setup_timeout_ms,
         "fail when session setup or a barrier takes longer");
  f->Add("seed", &j->seed, "seed of the verifiable input pattern (0..2^63-1)");
  f->Add("no-verify", &j->no_verify, "skip checking each result against the exact sum");
  f->Add("transport", &j->transport,
         auto_transport ? TransportHelp() +
                              "; auto: shm where this host's shared memory can be used (every "
                              "process of the job is on this host), else udp"
                        : TransportHelp());
  f->Add("busy-poll", &j->busy_poll,
         "poll for packets without sleeping (lower latency, busy cores)");
  const std::string pin_help =
      "pin worker thread t to the t-th CPU this process may run on (round robin), as the "
      "switch's --pin-threads does with its thread t: the threads that exchange every datagram "
      "then share one core's caches (docs/architecture.md, \"Pinned threads\")";
  if (auto_transport) {
    f->Add("pin-threads", &j->pin_threads_mode,
           "on, off or auto: " + pin_help +
               "; auto = on over shm where the threads per process equal this host's CPUs");
  } else {
    f->Add("pin-threads", &j->pin_threads, pin_help + "; for workers on the switch's host");
  }
  f->Add("wake-batch", &j->wake_batch,
         "after handling results, sleep until about this fraction of the packets in flight "
         "should be back at the measured rate, so that one wake-up handles several of the "
         "network's runs (0 = wake for every arrival; at most 1)");
  f->Add("no-tensor-check", &j->no_tensor_check,
         "do not have the switch compare every worker's element count and type for each "
         "all-reduce (saves one control round trip per all-reduce; a mismatch then goes "
         "unnoticed)");
  f->Add("auth-data", &j->auth_data,
         "authenticated data plane: every datagram carries an 8-byte tag keyed with a per-job "
         "key from the switch; forged or altered datagrams are dropped and counted (beyond "
         "the reference wire format; every worker of a job the same; docs/security.md 4.4)");
  f->Add("sparse", &j->sparse,
         "block-sparse all-reduces: the workers announce which blocks (--packet-numel "
         "elements) are non-zero on them, then aggregate only the blocks non-zero on some "
         "worker; the others come back as zeros without crossing the network (beyond the "
         "reference; every worker of a job the same; docs/protocol.md 2.5)");
  f->Add("sparse-auto", &j->sparse_auto,
         "--sparse with the automatic choice: a worker thread whose union holds more than "
         "7/8 of its blocks aggregates them all, dense (in place with one thread), and a "
         "switch without block-sparse support runs the job dense instead of refusing it "
         "(implies --sparse; every worker of a job the same; docs/protocol.md 2.5)");
  f->Add("density", &j->density,
         "the input pattern's block density: the fraction of blocks non-zero on some "
         "worker, in [0, 1] (1: the dense pattern; for benchmarks of --sparse, which it "
         "does not turn on)");
  f->Add("overlap", &j->overlap,
         "with --density below 1: the chance that a worker other than a non-zero block's "
         "owner holds it too, in [0, 1] (1: the same blocks on every worker; 0: disjoint)");
  f->Add("multicast", &j->multicast,
         "results sent once to a multicast group of the job instead of once per worker "
         "(docs/architecture.md, \"Multicast results\"): auto = with a switch on this host "
         "(loopback multicast) and on the LAN (the group joined on the interface toward "
         "the switch, which must be bound to its LAN address) where the switch and the "
         "network allow it, else one copy per worker; local = with a switch on this host "
         "only; on = as auto, but setup fails if the LAN group cannot be had, and a job if "
         "no result arrives on it; off = never");
  f->Add("no-loopback-multicast", &j->no_loopback_multicast, "the same as --multicast off");
  AddDpdkFlags(f, &j->dpdk);
}

Status CheckTransportFlag(const std::string& kind, bool auto_transport) {
  if (auto_transport && kind == kAutoTransport) return Status();  // resolved by `run`
  transport::TransportOptions t;
  t.kind = kind;
  Status st = t.Validate();
  if (st.ok()) return st;
  std::string why = "--transport: " + st.message();
  if (kind == kAutoTransport) {
    why +=
        " (auto is for `switchml run`, whose processes all share this host, and for the "
        "library and the PyTorch backend, which ask the switch; `switchml worker` sizes its "
        "window and cleans up by the kind before setup: give the kind the switch uses, which "
        "`switchml status` shows)";
  }
  return InvalidArgumentError(why);
}

Status ReadSeed(int64_t v, uint64_t* out) {
  if (v < 0) {  // was cast to uint64_t: -1 read as 18446744073709551615
    return InvalidArgumentError("--seed must be in 0.." + std::to_string(INT64_MAX) + ", not " +
                                std::to_string(v));
  }
  *out = static_cast<uint64_t>(v);
  return Status();
}

void ResolveAutomaticJobOptions(JobOptions* o) {
  const bool host_local = transport::CapabilitiesOf(o->transport).host_local;
  if (o->threads_automatic) {
    o->threads =
        host_local && std::thread::hardware_concurrency() >= kShmRunThreads ? kShmRunThreads : 1;
    if (!o->window_automatic) o->threads = std::min(o->threads, o->window);  // a slot each
  }
  if (o->pin_threads_automatic) {
    Result<std::vector<int>> cpus = AllowedCpus();
    o->pin_threads = host_local && cpus.ok() && cpus->size() == o->threads;
  }
  if (o->window_automatic) {
    Config c;
    ApplyPacingOptions(*o, &c);
    c.max_outstanding_packets = 0;
    c.num_worker_threads = o->threads;
    c.packet_numel = o->packet_numel;
    c.transport = o->transport;
    o->window = c.OutstandingPackets();
  }
}

Status ReadJobFlags(const JobFlags& f, JobOptions* o) {
  // "auto" is accepted where AddJobFlags made it the default (`run`).
  const bool auto_transport = f.auto_transport;
  auto positive = [](const char* name, int64_t v, int64_t max) -> Status {
    if (v < 1 || v > max) {
      return InvalidArgumentError(std::string("--") + name + " must be in 1.." +
                                  std::to_string(max));
    }
    return Status();
  };
  RETURN_IF_ERROR(positive("workers", f.workers, 64));
  o->workers = static_cast<uint32_t>(f.workers);
  o->size = f.size.value;
  if (o->size > kMaxJobSize) {  // 4 bytes each: beyond this the buffer size wraps
    return InvalidArgumentError("--size " + std::to_string(o->size) +
                                " is too large: at most 1024G elements");
  }
  if (!ParseDataType(f.dtype, &o->dtype)) {
    return InvalidArgumentError("--dtype must be float32 or int32, not '" + f.dtype + "'");
  }
  RETURN_IF_ERROR(positive("iterations", f.iterations, 1000000));
  o->iterations = static_cast<uint32_t>(f.iterations);
  o->warmup = static_cast<uint32_t>(f.warmup);
  if (f.warmup < 0 || f.warmup > 1000000) {
    return InvalidArgumentError("--warmup must be in 0..1000000");
  }
  o->threads_automatic = auto_transport && f.threads == 0;
  if (o->threads_automatic) {
    o->threads = 1;  // until ResolveAutomaticJobOptions knows the transport
  } else {
    RETURN_IF_ERROR(positive("threads", f.threads, 64));
    o->threads = static_cast<uint32_t>(f.threads);
  }
  o->window = static_cast<uint32_t>(f.window);
  o->window_automatic = o->window == 0;
  if (f.window != 0 && !positive("window", f.window, 16384).ok()) {
    return InvalidArgumentError("--window must be 0 (automatic) or in 1..16384, not " +
                                std::to_string(f.window));
  }
  if (o->window != 0 && o->window < o->threads) {
    return InvalidArgumentError("--window (" + std::to_string(o->window) +
                                ") must be at least --threads (" + std::to_string(o->threads) +
                                "): each worker thread needs at least one slot");
  }
  o->packet_numel = static_cast<uint32_t>(f.packet_numel);
  if (proto::SizeCode code; f.packet_numel < 0 || f.packet_numel > 2048 ||
                            !proto::SizeCodeForNumel(o->packet_numel, &code)) {
    return InvalidArgumentError("--packet-numel must be 64, 256, 512, 1024 or 2048");
  }
  RETURN_IF_ERROR(positive("timeout-ms", f.timeout_ms, 3600000));
  RETURN_IF_ERROR(positive("min-timeout-us", f.min_timeout_us, 3600000000));
  RETURN_IF_ERROR(positive("max-timeout-ms", f.max_timeout_ms, 3600000));
  o->timeout_ms = f.timeout_ms;
  o->min_timeout_us = f.min_timeout_us;
  o->max_timeout_ms = f.max_timeout_ms;
  o->early_retransmit = f.early_retransmit;
  if (o->early_retransmit < 0 || o->early_retransmit > 1000000) {
    return InvalidArgumentError("--early-retransmit must be in [0, 1000000]");
  }
  if (o->max_timeout_ms * 1000 < o->min_timeout_us) {
    return InvalidArgumentError("--max-timeout-ms must be at least --min-timeout-us");
  }
  o->link_gbps = f.link_gbps;
  if (!(o->link_gbps > 0 && o->link_gbps <= 1e6)) {
    return InvalidArgumentError("--link-gbps must be in (0, 1e6]");
  }
  RETURN_IF_ERROR(positive("base-rtt-us", f.base_rtt_us, 10000000));
  o->base_rtt_us = f.base_rtt_us;
  o->transport = f.transport;
  RETURN_IF_ERROR(CheckTransportFlag(o->transport, auto_transport));
  // Resolved here so that every command can report them (`run` again once its transport is known).
  ResolveAutomaticJobOptions(o);
  RETURN_IF_ERROR(positive("peer-timeout-ms", f.peer_timeout_ms, 86400000));
  RETURN_IF_ERROR(positive("setup-timeout-ms", f.setup_timeout_ms, 86400000));
  o->peer_timeout_ms = f.peer_timeout_ms;
  o->setup_timeout_ms = f.setup_timeout_ms;
  RETURN_IF_ERROR(ReadSeed(f.seed, &o->seed));
  o->verify = !f.no_verify;
  o->wait.busy_poll = f.busy_poll;
  if (auto_transport) {
    const std::string& pin = f.pin_threads_mode;
    if (pin != "auto" && pin != "on" && pin != "off") {
      return InvalidArgumentError("--pin-threads must be on, off or auto, not '" + pin + "'");
    }
    o->pin_threads_automatic = pin == "auto";
    o->pin_threads = pin == "on";
  } else {
    o->pin_threads = f.pin_threads;
  }
  o->wait.wake_batch = f.wake_batch;
  if (!o->wait.Validate().ok()) {
    return InvalidArgumentError("--wake-batch must be in [0, 1]");
  }
  o->tensor_check = !f.no_tensor_check;
  o->auth_data = f.auth_data;
  o->sparse_auto = f.sparse_auto;
  o->sparse = f.sparse || o->sparse_auto;
  o->density = f.density;
  if (!(o->density >= 0 && o->density <= 1)) {
    return InvalidArgumentError("--density must be in [0, 1] (a fraction of the blocks)");
  }
  o->overlap = f.overlap;
  if (!(o->overlap >= 0 && o->overlap <= 1)) {
    return InvalidArgumentError("--overlap must be in [0, 1] (a probability)");
  }
  const std::string& mc = f.multicast;
  if (mc != "auto" && mc != "local" && mc != "on" && mc != "off") {
    return InvalidArgumentError("--multicast must be auto, local, on or off, not '" + mc + "'");
  }
  if ((mc == "on" || mc == "local") && f.no_loopback_multicast) {  // was silently off
    return InvalidArgumentError(
        "--multicast " + mc +
        " cannot go with --no-loopback-multicast (the same as --multicast off): both use "
        "loopback multicast (Config::lan_multicast needs loopback_multicast); drop one");
  }
  o->loopback_multicast = mc != "off" && !f.no_loopback_multicast;
  o->lan_multicast = o->loopback_multicast && (mc == "auto" || mc == "on");
  o->lan_multicast_required = mc == "on";
  if (o->lan_multicast_required && o->auth_data) {
    return InvalidArgumentError(
        "--multicast on cannot go with --auth-data: datagrams to a group carry no tag");
  }
  ApplyDpdkFlags(f.dpdk);
  return Status();
}

std::vector<std::string> JobFlagArgs(const JobOptions& o) {
  std::vector<std::string> a = {"--workers",
                                std::to_string(o.workers),
                                "--size",
                                std::to_string(o.size),
                                "--dtype",
                                DataTypeName(o.dtype),
                                "--iterations",
                                std::to_string(o.iterations),
                                "--warmup",
                                std::to_string(o.warmup),
                                "--threads",
                                std::to_string(o.threads),
                                "--window",
                                std::to_string(o.window),
                                "--packet-numel",
                                std::to_string(o.packet_numel),
                                "--timeout-ms",
                                std::to_string(o.timeout_ms),
                                "--min-timeout-us",
                                std::to_string(o.min_timeout_us),
                                "--max-timeout-ms",
                                std::to_string(o.max_timeout_ms),
                                "--early-retransmit",
                                std::to_string(o.early_retransmit),
                                "--peer-timeout-ms",
                                std::to_string(o.peer_timeout_ms),
                                "--setup-timeout-ms",
                                std::to_string(o.setup_timeout_ms),
                                "--seed",
                                std::to_string(o.seed)};
  if (!o.verify) a.push_back("--no-verify");
  a.push_back("--transport");
  a.push_back(o.transport);
  if (o.wait.busy_poll) a.push_back("--busy-poll");
  if (o.pin_threads) a.push_back("--pin-threads");
  if (o.wait.wake_batch > 0) {
    a.push_back("--wake-batch");
    a.push_back(std::to_string(o.wait.wake_batch));
  }
  if (!o.tensor_check) a.push_back("--no-tensor-check");
  if (o.auth_data) a.push_back("--auth-data");
  if (o.sparse) a.push_back(o.sparse_auto ? "--sparse-auto" : "--sparse");
  if (o.density != 1 || o.overlap != 1) {  // (%.17g: the workers draw exactly the same pattern)
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", o.density);
    a.insert(a.end(), {"--density", buf});
    std::snprintf(buf, sizeof(buf), "%.17g", o.overlap);
    a.insert(a.end(), {"--overlap", buf});
  }
  if (!o.loopback_multicast || !o.lan_multicast || o.lan_multicast_required) {
    a.push_back("--multicast");
    a.push_back(!o.loopback_multicast ? "off" : !o.lan_multicast ? "local" : "on");
  }
  return a;
}

Result<std::vector<Endpoint>> ParseSwitchList(const std::string& text) {
  std::vector<Endpoint> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (item.empty()) {
      return InvalidArgumentError(
          "--switch '" + text +
          "': an empty entry (use HOST[:PORT] or HOST[:PORT],HOST[:PORT],...)");
    }
    ASSIGN_OR_RETURN(Endpoint e, transport::ParseHostPort(item, proto::kDefaultControlPort));
    for (const Endpoint& other : out) {
      if (other == e) {
        return InvalidArgumentError("--switch '" + text + "' lists " + e.ToString() +
                                    " twice: list each switch host once");
      }
    }
    out.push_back(e);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.size() > Config::kMaxSwitchHosts) {
    return InvalidArgumentError("--switch lists " + std::to_string(out.size()) +
                                " switch hosts; at most " +
                                std::to_string(Config::kMaxSwitchHosts) + " are supported");
  }
  return out;
}

void ApplyPacingOptions(const JobOptions& o, Config* c) {
  c->max_outstanding_packets = o.window;
  c->link_gbps = o.link_gbps;
  c->base_rtt = std::chrono::microseconds(o.base_rtt_us);
  c->retransmit.timeout = std::chrono::milliseconds(o.timeout_ms);
  c->retransmit.min_timeout = std::chrono::microseconds(o.min_timeout_us);
  c->retransmit.max_timeout = std::chrono::milliseconds(o.max_timeout_ms);
  c->retransmit.early_retransmit_after = static_cast<uint32_t>(o.early_retransmit);
}

int ParseCommandLine(const std::string& command, const std::vector<std::string>& args, Flags* flags,
                     const std::string& log_level, const JobFlags* job_flags, JobOptions* job) {
  bool help = false;
  Status st = flags->Parse(args, &help);
  if (help) {
    std::cout << flags->Usage();
    return 0;
  }
  if (st.ok() && job != nullptr) st = ReadJobFlags(*job_flags, job);
  LogLevel level = LogLevel::kWarning;
  if (st.ok() && !ParseLogLevel(log_level, &level)) {
    st = InvalidArgumentError("--log-level must be debug, info, warning, error or off");
  }
  if (!st.ok()) {
    std::cerr << "switchml " << command << ": " << st.message() << "\n";
    return 2;
  }
  SetLogLevel(level);
  return -1;
}

}  // namespace switchml::tools
