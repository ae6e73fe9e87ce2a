// `switchml sim`: the discrete-event simulator (src/sim) from the command line: a job (or several
// sharing one switch, or one striped over server aggregators) on simulated links, running the real
// Switch and WorkerSession code, with the ring and halving-doubling baselines on the same links.
// Output: a summary, and JSON and CSV.
//
// The steps, one function each: the flags (DefineFlags, with --config files expanded first), the
// options read and checked from them (ReadOptions: every message names its flag), the simulator's
// configuration (BuildConfig, with the window rule), the run (RunSimulation) and the baselines,
// then one result document (ResultJson, nlohmann) from which the JSON, the CSV and the summary are
// all written.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "base/status_macros.h"
#include "commands.h"
#include "flags.h"
#include "sim/baselines.h"
#include "sim/engine.h"
#include "testing/measure.h"

namespace switchml::tools {

namespace {

using nlohmann::json;

// The flags a --config JSON file sets: {"workers": 64, "loss": 0.001, "baselines": true}, as if
// they came first on the command line (so the command line overrides them).
Status ConfigFileArgs(const std::string& path, std::vector<std::string>* out) {
  std::ifstream f(path);
  if (!f) return InvalidArgumentError("cannot read --config file " + path);
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    return InvalidArgumentError("--config file " + path + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) {
    return InvalidArgumentError("--config file " + path +
                                " must hold one JSON object of flag names and values");
  }
  for (auto& [key, value] : j.items()) {
    if (key == "config") return InvalidArgumentError("--config files do not nest");
    if (value.is_boolean()) {
      if (value.get<bool>()) out->push_back("--" + key);
    } else if (value.is_number_integer()) {
      out->push_back("--" + key + "=" + std::to_string(value.get<int64_t>()));
    } else if (value.is_number()) {
      std::ostringstream s;
      s.precision(17);
      s << value.get<double>();
      out->push_back("--" + key + "=" + s.str());
    } else if (value.is_string()) {
      out->push_back("--" + key + "=" + value.get<std::string>());
    } else {
      return InvalidArgumentError("--config file " + path + ": the value of \"" + key +
                                  "\" must be a number, string or boolean");
    }
  }
  return Status();
}

// The command line with the flags of each --config file in front of it.
Status ExpandConfigFiles(const std::vector<std::string>& raw_args, std::vector<std::string>* out) {
  for (size_t i = 0; i < raw_args.size(); ++i) {
    std::string path;
    if (raw_args[i] == "--config" && i + 1 < raw_args.size()) {
      path = raw_args[i + 1];
    } else if (raw_args[i].rfind("--config=", 0) == 0) {
      path = raw_args[i].substr(9);
    } else {
      continue;
    }
    RETURN_IF_ERROR(ConfigFileArgs(path, out));
  }
  out->insert(out->end(), raw_args.begin(), raw_args.end());
  return Status();
}

// The command's flags as given (DefineFlags binds them; ReadOptions checks them).
struct SimFlags {
  std::string config;
  std::string topology = "star";
  int64_t racks = 2;
  int64_t aggregators = 0;
  double aggregator_gbps = 0;
  int64_t workers = 8;
  int64_t jobs = 1;
  bool share_pool = false;
  double gbps = 100;
  double propagation_ns = 500;
  int64_t buffer_kb = 0;
  double switch_latency_ns = 500;
  double switch_mpps = 0;
  double host_latency_ns = 0;
  double timer_granularity_ns = 1000;
  int64_t packet_numel = 256;
  int64_t slots = 8192;
  int64_t window = 0;
  int64_t threads = 1;
  Size size{64 << 20};
  std::string dtype = "int32";
  bool sparse = false;
  double density = 1;
  double overlap = 1;
  int64_t iterations = 1;
  double loss = 0;
  double duplicate = 0;
  double reorder = 0;
  double reorder_ns = 10000;
  double timeout_us = 100;
  double min_timeout_us = 20;
  double max_timeout_us = 100000;
  double clock_granularity_ns = 1000;
  int64_t early_retransmit = 0;
  int64_t timeout_threshold = 100;
  double progress_timeout_ms = 1000;
  std::string payload = "shared";
  int64_t seed = 1;
  double max_sim_seconds = 600;
  bool baselines = false;
  int64_t baseline_mtu = 4096;
  std::string json;
  std::string csv;
  bool quiet = false;
  std::string log_level = "warning";
};

void DefineFlags(Flags* flags, SimFlags* f) {
  flags->Add("config", &f->config,
             "JSON file of flag values, e.g. {\"workers\": 64, \"loss\": 0.01}");
  flags->Add("topology", &f->topology,
             "star: every worker on one switch; two-level: --racks top-of-rack switches "
             "under one spine, the workers spread evenly over them (docs/hierarchy.md)");
  flags->Add("racks", &f->racks, "with --topology two-level: top-of-rack switches (racks)");
  flags->Add("aggregators", &f->aggregators,
             "aggregation on servers (1..1024): the workers on a switch that only forwards, "
             "and this many aggregators (each a switch on a server, on its own link to that "
             "switch) over which every worker stripes its slots (docs/simulator.md); 0: the "
             "star's one switch in the fabric aggregates");
  flags->Add("aggregator-gbps", &f->aggregator_gbps,
             "with --aggregators: the rate of each aggregator's link (0 = --gbps)");
  flags->Add("workers", &f->workers,
             "workers per job (star: at most 256; two-level: up to 4096, 256 per rack)");
  flags->Add("jobs", &f->jobs, "concurrent jobs, each with its own workers, all on the one switch");
  flags->Add("share-pool", &f->share_pool,
             "split --slots among the jobs: each job's window is at most slots / jobs");
  flags->Add("gbps", &f->gbps, "link rate, Gbit/s (every link; 0.001..1e6)");
  flags->Add("propagation-ns", &f->propagation_ns,
             "one-way propagation delay of each link, ns (at most 1e12, as every delay)");
  flags->Add("buffer-kb", &f->buffer_kb,
             "output buffer per link, KiB, tail drop beyond (0 = unbounded; at most 1048576)");
  flags->Add("switch-latency-ns", &f->switch_latency_ns, "switch pipeline latency per packet, ns");
  flags->Add("switch-mpps", &f->switch_mpps,
             "switch pipeline capacity, Mpackets/s (0 = unlimited; else 1e-9..1e9; with "
             "--aggregators each aggregator's, the fabric forwarding at line rate)");
  flags->Add("host-latency-ns", &f->host_latency_ns,
             "host (NIC, stack) latency per packet sent, ns");
  flags->Add("timer-granularity-ns", &f->timer_granularity_ns,
             "host timer granularity: timeouts run at deadlines rounded up to this");
  flags->Add("packet-numel", &f->packet_numel, "elements per packet: 64 or 256");
  flags->Add("slots", &f->slots, "switch slots per job (the most any window may use)");
  flags->Add("window", &f->window,
             "outstanding packets per worker, at most --slots (0 = from the bandwidth-delay "
             "product, docs/architecture.md 4.5, capped at --slots)");
  flags->Add("threads", &f->threads, "worker threads (sessions, slot ranges) per worker");
  flags->Add("size", &f->size,
             "tensor size in BYTES (4 per element; run's and worker's --size count elements), "
             "suffix K, M, G = 2^10, 2^20, 2^30: 100M is 100 MiB, 26214400 elements");
  flags->Add("dtype", &f->dtype, "int32 or float32");
  flags->Add("sparse", &f->sparse,
             "block-sparse all-reduces (docs/protocol.md 2.5): the workers announce their "
             "non-zero blocks, then aggregate only the union's");
  flags->Add("density", &f->density,
             "the inputs' block density: the fraction of blocks (--packet-numel elements) "
             "non-zero on some worker, in [0, 1]; 1 = the dense pattern (with or without "
             "--sparse)");
  flags->Add("overlap", &f->overlap,
             "with --density < 1 and --payload verified: the chance that a worker other "
             "than a block's owner holds it too, in [0, 1] (1: the same blocks everywhere, "
             "0: disjoint); shared payloads are the same everywhere");
  flags->Add("iterations", &f->iterations, "all-reduces back to back per job");
  flags->Add("loss", &f->loss, "loss rate per link and packet, e.g. 0.0001 (every link)");
  flags->Add("duplicate", &f->duplicate, "duplication rate per link and packet");
  flags->Add("reorder", &f->reorder, "rate of packets delayed by up to --reorder-ns (reordered)");
  flags->Add("reorder-ns", &f->reorder_ns, "the largest extra delay of a reordered packet, ns");
  flags->Add("timeout-us", &f->timeout_us,
             "retransmission timeout before the first RTT sample, us (0.001..1e9, as its bounds)");
  flags->Add("min-timeout-us", &f->min_timeout_us, "RTO floor, us");
  flags->Add("max-timeout-us", &f->max_timeout_us, "RTO ceiling, us");
  flags->Add("clock-granularity-ns", &f->clock_granularity_ns, "RTO = SRTT + max(this, 4 RTTVAR)");
  flags->Add("early-retransmit", &f->early_retransmit,
             "re-send a packet once the results of this many packets sent after it arrived "
             "(0 = off: only timeouts)");
  flags->Add("timeout-threshold", &f->timeout_threshold,
             "timeouts (since the last RTT sample) before back-off");
  flags->Add("progress-timeout-ms", &f->progress_timeout_ms,
             "a slice fails after this long without a result (at most 1e9)");
  flags->Add("payload", &f->payload,
             "shared: one tensor shared by a job's workers (memory of one tensor, output "
             "checked); verified: each worker its own (memory x workers, every result "
             "checked)");
  flags->Add("seed", &f->seed, "seed of the faults and the tensors (0..2^63-1)");
  flags->Add("max-sim-seconds", &f->max_sim_seconds, "virtual-time limit (at most 1e6)");
  flags->Add("baselines", &f->baselines,
             "also run ring and halving-doubling (flow-level) on the same links");
  flags->Add("baseline-mtu", &f->baseline_mtu,
             "payload bytes per packet of the baselines (1..1048576)");
  flags->Add("json", &f->json, "write the results as JSON to this file (- for stdout)");
  flags->Add("csv", &f->csv, "write the results as CSV to this file (- for stdout)");
  flags->Add("quiet", &f->quiet, "no progress line");
  flags->Add("log-level", &f->log_level, "debug, info, warning, error or off");
}

enum class Shape : uint8_t { kStar, kTwoLevel, kServerAggregators };
const char* ShapeName(Shape s) {
  switch (s) {
    case Shape::kStar:
      return "star";
    case Shape::kTwoLevel:
      return "two-level";
    case Shape::kServerAggregators:
      return "server-aggregators";
  }
  return "?";
}

// The command's options, read from its flags and checked.
struct Options {
  Shape shape = Shape::kStar;
  int64_t workers = 0, jobs = 0;
  int64_t racks = 1;        // two-level: top-of-rack switches; else 1
  int64_t aggregators = 0;  // server aggregators: K; else 0
  int64_t numel = 0, threads = 0, iterations = 0, slots = 0;
  int64_t window = 0;  // 0 until BuildConfig applies the rule
  std::string dtype_name;
  DataType dtype = DataType::kInt32;
  uint64_t size = 0, count = 0;  // the tensor: bytes, elements
  proto::SizeCode code = proto::SizeCode::k1024B;
  sim::LinkParams link;             // every link (the workers')
  sim::LinkParams aggregator_link;  // server aggregators: each aggregator's
  int64_t baseline_mtu = 0;
  std::string payload;
  bool sparse = false;
  double density = 1, overlap = 1;

  uint32_t hosts() const { return static_cast<uint32_t>(workers * jobs); }
  // The node the star's or the fabric's switch is, or the two-level spine.
  uint32_t hub() const {
    return shape == Shape::kTwoLevel ? hosts() + static_cast<uint32_t>(racks) : hosts();
  }
};

// The topology and the job's shape: workers, jobs, racks or aggregators, packets, threads,
// window, element type.
Status ReadShape(const SimFlags& flags, Options* o) {
  o->workers = flags.workers;
  o->jobs = flags.jobs;
  o->numel = flags.packet_numel;
  o->threads = flags.threads;
  o->iterations = flags.iterations;
  o->slots = flags.slots;
  o->window = flags.window;
  const std::string topology = flags.topology;
  const int64_t aggregators = flags.aggregators;
  if (topology == "two-level") {
    o->shape = Shape::kTwoLevel;
  } else if (topology != "star") {
    return InvalidArgumentError("--topology must be star or two-level");
  } else if (aggregators != 0) {
    o->shape = Shape::kServerAggregators;
  }
  if (o->shape == Shape::kTwoLevel) {
    o->racks = flags.racks;
    if (o->jobs != 1) return InvalidArgumentError("--topology two-level runs one job (--jobs 1)");
    if (o->racks < 1 || o->racks > 256 || o->workers % o->racks != 0 ||
        o->workers / o->racks > 256) {
      return InvalidArgumentError(
          "--racks must be in 1..256 and divide --workers into racks of at most 256");
    }
    if (aggregators != 0) {
      return InvalidArgumentError(
          "--aggregators does not combine with --topology two-level (aggregators sit on a "
          "star's fabric switch)");
    }
  }
  if (aggregators < 0 || aggregators > 1024) {
    return InvalidArgumentError("--aggregators must be in 0..1024 (0: the switch in the fabric)");
  }
  o->aggregators = aggregators;
  if (o->workers < 1 || o->workers > 4096) {
    return InvalidArgumentError("--workers must be in 1..4096");
  }
  if (o->jobs < 1 || o->jobs > 200) return InvalidArgumentError("--jobs must be in 1..200");
  if (o->shape != Shape::kTwoLevel && o->workers > 256) {  // else refused naming no flag
    return InvalidArgumentError(
        "--workers " + std::to_string(o->workers) +
        " exceeds the 256 workers one switch aggregates (the worker bitmap's width): use "
        "--topology two-level --racks R for more");
  }
  const int64_t switches = o->shape == Shape::kTwoLevel ? o->racks + 1 : 1 + o->aggregators;
  if (o->jobs * o->workers + switches > sim::kMaxNodes) {  // was "cannot allocate ... --size"
    return InvalidArgumentError("--jobs x --workers is " + std::to_string(o->jobs * o->workers) +
                                " hosts; with the switches the simulator takes at most " +
                                std::to_string(sim::kMaxNodes) + " nodes (docs/simulator.md)");
  }
  if (o->numel != 64 && o->numel != 256) {
    return InvalidArgumentError("--packet-numel must be 64 or 256");
  }
  if (o->threads < 1 || o->threads > 64) return InvalidArgumentError("--threads must be in 1..64");
  if (o->iterations < 1 || o->iterations > 1000) {
    return InvalidArgumentError("--iterations must be in 1..1000");
  }
  if (o->slots < 1 || o->slots > 16384) return InvalidArgumentError("--slots must be in 1..16384");
  if (o->window < 0) return InvalidArgumentError("--window must be >= 0");
  if (o->window > o->slots) {  // was clamped to --slots without a word
    return InvalidArgumentError("--window " + std::to_string(o->window) + " exceeds --slots " +
                                std::to_string(o->slots) + ": raise --slots or lower --window");
  }
  o->dtype_name = flags.dtype;
  if (o->dtype_name == "int32") {
    o->dtype = DataType::kInt32;
  } else if (o->dtype_name == "float32") {
    o->dtype = DataType::kFloat32;
  } else {
    return InvalidArgumentError("--dtype must be int32 or float32");
  }
  o->code = o->numel == 64 ? proto::SizeCode::k256B : proto::SizeCode::k1024B;
  return Status();
}

// The timing and size flags, each checked by name against the simulator's bounds
// (sim/topology.h) before it is converted: picosecond times wrapped to negative values beyond
// them.
Status CheckBounds(const SimFlags& flags) {
  struct Range {
    const char* flag;
    double value, lo, hi;
  };
  for (const Range& r :
       {Range{"gbps", flags.gbps, sim::kMinGbps, sim::kMaxGbps},
        {"propagation-ns", flags.propagation_ns, 0, sim::kMaxDelayNs},
        {"switch-latency-ns", flags.switch_latency_ns, 0, sim::kMaxDelayNs},
        {"host-latency-ns", flags.host_latency_ns, 0, sim::kMaxDelayNs},
        {"timer-granularity-ns", flags.timer_granularity_ns, 0, sim::kMaxDelayNs},
        {"reorder-ns", flags.reorder_ns, 0, sim::kMaxDelayNs},
        {"clock-granularity-ns", flags.clock_granularity_ns, 0, sim::kMaxDelayNs},
        {"timeout-us", flags.timeout_us, 1e-3, sim::kMaxDelayNs / 1e3},
        {"min-timeout-us", flags.min_timeout_us, 1e-3, sim::kMaxDelayNs / 1e3},
        {"max-timeout-us", flags.max_timeout_us, 1e-3, sim::kMaxDelayNs / 1e3},
        {"progress-timeout-ms", flags.progress_timeout_ms, 1e-6, sim::kMaxSimSeconds * 1e3},
        {"max-sim-seconds", flags.max_sim_seconds, 1e-9, sim::kMaxSimSeconds}}) {
    const double v = r.value;
    if (!(v >= r.lo && v <= r.hi)) {
      std::ostringstream m;
      m << "--" << r.flag << " must be in [" << r.lo << ", " << r.hi << "], not " << v;
      return InvalidArgumentError(m.str());
    }
  }
  const double agg_gbps = flags.aggregator_gbps;
  if (!(agg_gbps == 0 || (agg_gbps >= sim::kMinGbps && agg_gbps <= sim::kMaxGbps))) {
    std::ostringstream m;
    m << "--aggregator-gbps must be 0 (--gbps) or in [" << sim::kMinGbps << ", " << sim::kMaxGbps
      << "], not " << agg_gbps;
    return InvalidArgumentError(m.str());
  }
  // 0, or a packet's service time (1e9 / pps ns) that is a delay like the others.
  const double mpps = flags.switch_mpps;
  if (!(mpps == 0 || (mpps >= 1e9 / sim::kMaxDelayNs / 1e6 && mpps <= 1e9))) {
    std::ostringstream m;
    m << "--switch-mpps must be 0 (unlimited) or in [" << 1e9 / sim::kMaxDelayNs / 1e6
      << ", 1e+09], not " << mpps;
    return InvalidArgumentError(m.str());
  }
  const int64_t buffer_kb = flags.buffer_kb;
  if (buffer_kb < 0 || static_cast<uint64_t>(buffer_kb) > sim::kMaxBufferBytes / 1024) {
    return InvalidArgumentError("--buffer-kb must be in 0.." +
                                std::to_string(sim::kMaxBufferBytes / 1024) +
                                " (0 = unbounded), not " + std::to_string(buffer_kb));
  }
  const int64_t baseline_mtu = flags.baseline_mtu;
  if (baseline_mtu < 1 || baseline_mtu > 1048576) {  // was checked after the run, >= 1 only
    return InvalidArgumentError("--baseline-mtu must be in 1..1048576, not " +
                                std::to_string(baseline_mtu));
  }
  return Status();
}

Result<Options> ReadOptions(const SimFlags& flags) {
  Options o;
  RETURN_IF_ERROR(ReadShape(flags, &o));
  RETURN_IF_ERROR(CheckBounds(flags));
  o.baseline_mtu = flags.baseline_mtu;
  o.size = flags.size.value;
  if (o.size % 4 != 0) return InvalidArgumentError("--size must be a multiple of 4 bytes");
  o.count = o.size / 4;
  // Refused before the simulation, which may run for minutes, rather than after it.
  for (const auto& [flag, path] : {std::pair{"json", &flags.json}, {"csv", &flags.csv}}) {
    if (path->empty()) continue;
    RETURN_IF_ERROR(CheckOutputPath(flag, *path, /*allow_stdout=*/true));
  }
  o.link.gbps = flags.gbps;
  o.link.propagation_ns = flags.propagation_ns;
  o.link.buffer_bytes = static_cast<uint64_t>(flags.buffer_kb) * 1024;
  o.link.loss = flags.loss;
  o.link.duplicate = flags.duplicate;
  o.link.reorder = flags.reorder;
  o.link.reorder_ns = flags.reorder_ns;
  RETURN_IF_ERROR(o.link.Validate());
  o.aggregator_link = o.link;
  if (flags.aggregator_gbps > 0) {
    o.aggregator_link.gbps = flags.aggregator_gbps;
  }
  o.payload = flags.payload;
  o.sparse = flags.sparse;
  o.density = flags.density;
  o.overlap = flags.overlap;
  if (!(o.density >= 0 && o.density <= 1)) {
    return InvalidArgumentError("--density must be in [0, 1] (a fraction of the blocks)");
  }
  if (!(o.overlap >= 0 && o.overlap <= 1)) {
    return InvalidArgumentError("--overlap must be in [0, 1] (a probability)");
  }
  return o;
}

// The window when --window is 0: the documented rule (docs/architecture.md 4.5), twice the
// bandwidth-delay product of this network's base round trip (serialization and propagation of
// each link each way, the switches' and the host's latencies), a multiple of 32, at least 64.
// Striped over K aggregators, also at least 2K (two slots of each worker at every aggregator:
// while one slot's round fills the aggregator's link, the other's result travels and comes
// back; with one, 64 workers on 64 aggregators reach 60 % of the ceiling, docs/simulator.md
// "Server aggregators") and K per thread (StripeOfSlot gives each aggregator a slot of each
// thread's window). Then a multiple of --threads.
int64_t RuleWindow(const Options& o, double switch_latency_ns, double host_latency_ns) {
  const double wire = static_cast<double>(proto::DatagramBytes(o.code) + sim::kWireOverheadBytes);
  const double ser_ns = wire * 8 / o.link.gbps;
  // Hops each way: 1 (star) or 2 (host-ToR-spine, host-fabric-aggregator).
  const double levels = o.shape == Shape::kStar ? 1 : 2;
  const double rtt_ns =
      levels * (2 * (ser_ns + o.link.propagation_ns) + switch_latency_ns) + host_latency_ns;
  int64_t window = static_cast<int64_t>(std::ceil(2 * o.link.gbps * rtt_ns / 8 / wire));
  window = std::max<int64_t>(64, (window + 31) / 32 * 32);
  window = std::max({window, 2 * o.aggregators, o.aggregators * o.threads});
  return (window + o.threads - 1) / o.threads * o.threads;
}

// The sessions' timing from the timeout flags.
Status ReadSessionConfig(const SimFlags& flags, worker::SessionConfig* s) {
  auto us = [](double v) { return worker::Nanos{static_cast<int64_t>(std::llround(v * 1000))}; };
  s->retransmit.timeout = us(flags.timeout_us);
  s->retransmit.min_timeout = us(flags.min_timeout_us);
  s->retransmit.max_timeout = us(flags.max_timeout_us);
  s->retransmit.clock_granularity =
      worker::Nanos{static_cast<int64_t>(flags.clock_granularity_ns)};
  // Both checked before they narrow to 32 bits (4294967297 read as 1).
  if (flags.timeout_threshold < 1 || flags.timeout_threshold > UINT32_MAX) {
    return InvalidArgumentError("--timeout-threshold must be in 1..4294967295");
  }
  s->retransmit.timeout_threshold = static_cast<uint32_t>(flags.timeout_threshold);
  if (flags.early_retransmit < 0 || flags.early_retransmit > 1000000) {
    return InvalidArgumentError("--early-retransmit must be in 0..1000000");
  }
  s->retransmit.early_retransmit_after = static_cast<uint32_t>(flags.early_retransmit);
  s->retransmit.peer_timeout = us(flags.progress_timeout_ms * 1000);
  return s->Validate();
}

// The simulator's configuration; settles o->window (the rule's when --window is 0).
Result<sim::SimConfig> BuildConfig(const SimFlags& flags, Options* o) {
  sim::SimConfig c;
  const uint32_t hosts = o->hosts();
  const uint32_t per_rack = static_cast<uint32_t>(hosts / o->racks);
  switch (o->shape) {
    case Shape::kStar:
      c.topology = sim::Topology::Star(hosts, o->link);
      break;
    case Shape::kTwoLevel:
      c.topology =
          sim::Topology::TwoLevel(static_cast<uint32_t>(o->racks), per_rack, o->link, o->link);
      break;
    case Shape::kServerAggregators:
      c.topology = sim::Topology::ServerAggregators(hosts, static_cast<uint32_t>(o->aggregators),
                                                    o->link, o->aggregator_link);
      break;
  }
  c.switch_latency_ns = flags.switch_latency_ns;
  c.switch_pps = flags.switch_mpps * 1e6;
  c.host_latency_ns = flags.host_latency_ns;
  c.timer_granularity_ns = flags.timer_granularity_ns;
  c.switch_config.slots_per_job = static_cast<uint32_t>(o->slots);
  int64_t& window = o->window;
  if (window == 0) window = RuleWindow(*o, c.switch_latency_ns, c.host_latency_ns);
  if (flags.share_pool) {
    window = std::min(window,
                      std::max<int64_t>(o->threads, o->slots / o->jobs / o->threads * o->threads));
  }
  if (window > o->slots) window = o->slots / o->threads * o->threads;
  if (window / o->threads < o->aggregators) {
    return InvalidArgumentError(
        "--aggregators " + std::to_string(o->aggregators) + " needs at least one slot of each " +
        "worker thread's window per aggregator: the window is " + std::to_string(window) +
        " over --threads " + std::to_string(o->threads) +
        "; raise --window (0: the rule's) or --slots, or lower --aggregators");
  }
  for (int64_t j = 0; j < o->jobs; ++j) {
    sim::JobConfig job;
    job.job_id = static_cast<uint64_t>(j + 1);
    job.switch_node = o->hub();
    for (int64_t r = 0; r < o->workers; ++r) {
      job.hosts.push_back(static_cast<uint32_t>(j * o->workers + r));
      if (o->shape == Shape::kTwoLevel) {
        job.tors.push_back(hosts + static_cast<uint32_t>(r) / per_rack);
      }
    }
    for (int64_t a = 0; a < o->aggregators; ++a) {
      job.stripes.push_back(hosts + 1 + static_cast<uint32_t>(a));
    }
    job.size = o->code;
    job.window = static_cast<uint32_t>(window);
    job.threads = static_cast<uint32_t>(o->threads);
    job.collectives.assign(static_cast<size_t>(o->iterations), sim::Collective{o->dtype, o->count});
    job.sparse = o->sparse;
    job.density = o->density;
    job.overlap = o->overlap;
    c.jobs.push_back(job);
  }
  RETURN_IF_ERROR(ReadSessionConfig(flags, &c.session));
  if (o->payload == "shared") {
    c.payload = sim::PayloadMode::kShared;
  } else if (o->payload == "verified") {
    c.payload = sim::PayloadMode::kVerified;
  } else {
    return InvalidArgumentError("--payload must be shared or verified");
  }
  RETURN_IF_ERROR(ReadSeed(flags.seed, &c.seed));
  c.max_sim_seconds = flags.max_sim_seconds;
  return c;
}

// The run's own cost (stderr only: the JSON and CSV stay identical across runs).
struct RunCost {
  double wall = 0, cpu = 0;
};

// Runs the simulation with a progress line on stderr (unless quiet).
Result<sim::SimResult> RunSimulation(sim::SimConfig c, const Options& o, bool quiet,
                                     RunCost* cost) {
  const auto wall0 = std::chrono::steady_clock::now();
  const double cpu0 = testing::ProcessCpuSeconds();
  auto last_print = wall0;
  bool printed = false;
  if (!quiet) {
    c.progress = [&](const sim::Progress& p) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_print < std::chrono::seconds(1)) return;
      last_print = now;
      printed = true;
      const double wall = std::chrono::duration<double>(now - wall0).count();
      std::fprintf(stderr, "\rsim: %5.1f%% done, %.6f s simulated, %.1fM events, %.0f s ",
                   100 * p.fraction, p.sim_seconds, static_cast<double>(p.events) / 1e6, wall);
      std::fflush(stderr);
    };
  }
  // The tensors are allocated inside Simulate: a --size this host cannot hold aborted the
  // command with std::bad_alloc (or std::length_error beyond a vector's max_size()).
  const Status too_large = InvalidArgumentError("cannot allocate the simulated tensors of --size " +
                                                std::to_string(o.size) + " bytes (--payload " +
                                                o.payload + "): use a smaller --size");
  Result<sim::SimResult> result = InternalError("not run");
  try {
    result = sim::Simulate(std::move(c));
  } catch (const std::bad_alloc&) {
    return too_large;
  } catch (const std::length_error&) {
    return too_large;
  }
  cost->wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  cost->cpu = testing::ProcessCpuSeconds() - cpu0;
  if (printed) std::fprintf(stderr, "\n");
  return result;
}

struct BaselineRow {
  std::string name;
  sim::BaselineResult r;
};

// Ring and halving-doubling on the same links, among job 0's workers.
Result<std::vector<BaselineRow>> RunBaselines(sim::Topology t, const Options& o,
                                              const SimFlags& flags) {
  RETURN_IF_ERROR(t.Finalize());
  sim::BaselineConfig bc;
  for (int64_t r = 0; r < o.workers; ++r) bc.hosts.push_back(static_cast<uint32_t>(r));
  bc.bytes = o.size;
  bc.mtu_payload = static_cast<uint32_t>(o.baseline_mtu);
  bc.switch_latency_ns = flags.switch_latency_ns;
  bc.host_latency_ns = flags.host_latency_ns;
  std::vector<BaselineRow> rows;
  for (sim::Baseline b : {sim::Baseline::kRing, sim::Baseline::kHalvingDoubling}) {
    Result<sim::BaselineResult> r = sim::SimulateBaseline(b, t, bc);
    if (!r.ok()) return r.status();
    rows.push_back({sim::BaselineName(b), *r});
  }
  return rows;
}

struct LinkSummary {
  double mean = 0, max = 0;
  uint64_t lost = 0, tail_dropped = 0;
  size_t links = 0;
  void Add(const sim::LinkResult& l) {
    ++links;
    mean += l.utilisation;
    max = std::max(max, l.utilisation);
    lost += l.lost;
    tail_dropped += l.tail_dropped;
  }
  void Finish() {
    if (links > 0) mean /= static_cast<double>(links);
  }
};

// Link utilisation by direction: up (toward the aggregating switch: host -> switch, ToR ->
// spine) and down. With server aggregators, up and down are the workers' links, and the
// aggregators' links (fabric -> aggregator in, aggregator -> fabric out) are summed apart.
struct LinkSummaries {
  LinkSummary up, down, aggregator_in, aggregator_out;
};

LinkSummaries SummarizeLinks(const sim::SimResult& result, const Options& o) {
  LinkSummaries s;
  const uint32_t hosts = o.hosts(), hub = o.hub();
  for (const sim::LinkResult& l : result.links) {
    if (o.shape == Shape::kServerAggregators && l.to > hub) {
      s.aggregator_in.Add(l);
    } else if (o.shape == Shape::kServerAggregators && l.from > hub) {
      s.aggregator_out.Add(l);
    } else if (l.from < hosts || (o.shape == Shape::kTwoLevel && l.to == hub)) {
      s.up.Add(l);
    } else {
      s.down.Add(l);
    }
  }
  for (LinkSummary* x : {&s.up, &s.down, &s.aggregator_in, &s.aggregator_out}) x->Finish();
  return s;
}

json StallsJson(const sim::StallStats& s) {
  return {{"rounds", s.rounds}, {"mean_ns", s.mean_ns}, {"p50_ns", s.p50_ns},
          {"p99_ns", s.p99_ns}, {"max_ns", s.max_ns},   {"stalled_rounds", s.stalled}};
}

json StripesJson(const std::vector<sim::StripeResult>& stripes, const sim::SimResult& result) {
  json out = json::array();
  for (const sim::StripeResult& s : stripes) {
    double in = 0, out_busy = 0;  // the aggregator's link, both ways
    for (const sim::LinkResult& l : result.links) {
      if (l.to == s.node) in = l.utilisation;
      if (l.from == s.node) out_busy = l.utilisation;
    }
    out.push_back({{"node", s.node},
                   {"received", s.received},
                   {"completed_rounds", s.completed},
                   {"unicasts", s.unicasts},
                   {"duplicates_dropped", s.duplicates_dropped},
                   {"slots", s.slots.size()},
                   {"in_utilisation", in},
                   {"out_utilisation", out_busy}});
  }
  return out;
}

// The one result document: the JSON output, and the source of the CSV and the summary.
json ResultJson(const SimFlags& flags, const Options& o, const sim::SimResult& result,
                const std::vector<BaselineRow>& baselines) {
  const double ceiling = sim::GoodputCeilingElementsPerSecond(o.link.gbps, o.code);
  json out;
  out["config"] = {{"topology", ShapeName(o.shape)},
                   {"racks", o.racks},
                   {"aggregators", o.aggregators},
                   {"workers", o.workers},
                   {"jobs", o.jobs},
                   {"gbps", o.link.gbps},
                   {"propagation_ns", o.link.propagation_ns},
                   {"switch_latency_ns", flags.switch_latency_ns},
                   {"packet_numel", o.numel},
                   {"slots", o.slots},
                   {"window", o.window},
                   {"threads", o.threads},
                   {"size_bytes", o.size},
                   {"dtype", o.dtype_name},
                   {"sparse", o.sparse},
                   {"density", o.density},
                   {"overlap", o.overlap},
                   {"iterations", o.iterations},
                   {"loss", o.link.loss},
                   {"min_timeout_us", flags.min_timeout_us},
                   {"early_retransmit", flags.early_retransmit},
                   {"seed", flags.seed}};
  if (o.shape == Shape::kServerAggregators) {
    out["config"]["aggregator_gbps"] = o.aggregator_link.gbps;
  }
  out["goodput_ceiling_elements_per_second"] = ceiling;
  out["sim_seconds"] = result.sim_seconds;
  out["events"] = result.events;
  out["packets_delivered"] = result.packets_delivered;
  double total_eps = 0;
  for (const sim::JobResult& j : result.jobs) {
    total_eps += j.elements_per_second;
    json job = {{"job_id", j.job_id},
                {"workers", j.workers},
                {"ok", j.status.ok()},
                {"status", j.status.ok() ? "OK" : j.status.ToString()},
                {"verified", j.verified},
                {"verify_error", j.verify_error},
                {"seconds", j.seconds},
                {"allreduce_seconds", j.collective_seconds},
                {"elements", j.elements},
                {"elements_per_second", j.elements_per_second},
                {"fraction_of_ceiling", j.elements_per_second / ceiling},
                {"sent", j.sent},
                {"retransmitted", j.retransmitted},
                {"timeouts", j.timeouts},
                {"early_retransmits", j.early_retransmits},
                {"duplicate_results", j.duplicates},
                {"switch_unicasts", j.switch_unicasts},
                {"switch_duplicates_dropped", j.switch_duplicates_dropped},
                {"slot_rounds", StallsJson(j.stalls)}};
    if (o.shape == Shape::kServerAggregators) job["aggregators"] = StripesJson(j.stripes, result);
    if (o.sparse) {
      job["sparse_blocks"] = j.sparse_blocks;
      job["union_blocks"] = j.sparse_union_blocks;
      job["union_fraction"] = j.sparse_blocks > 0 ? static_cast<double>(j.sparse_union_blocks) /
                                                        static_cast<double>(j.sparse_blocks)
                                                  : 0.0;
    }
    out["jobs"].push_back(std::move(job));
  }
  out["aggregated_elements_per_second"] = total_eps;
  const LinkSummaries links = SummarizeLinks(result, o);
  const LinkSummary &up = links.up, &down = links.down;
  out["links"] = {
      {"up_mean_utilisation", up.mean},     {"up_max_utilisation", up.max},
      {"down_mean_utilisation", down.mean}, {"down_max_utilisation", down.max},
      {"lost", up.lost + down.lost},        {"tail_dropped", up.tail_dropped + down.tail_dropped}};
  if (o.shape == Shape::kServerAggregators) {
    const LinkSummary &in = links.aggregator_in, &agg_out = links.aggregator_out;
    json& l = out["links"];
    l["aggregator_in_mean_utilisation"] = in.mean;
    l["aggregator_in_max_utilisation"] = in.max;
    l["aggregator_out_mean_utilisation"] = agg_out.mean;
    l["aggregator_out_max_utilisation"] = agg_out.max;
    l["lost"] = l["lost"].get<uint64_t>() + in.lost + agg_out.lost;
    l["tail_dropped"] = l["tail_dropped"].get<uint64_t>() + in.tail_dropped + agg_out.tail_dropped;
  }
  for (const BaselineRow& b : baselines) {
    out["baselines"][b.name] = {{"seconds", b.r.seconds},
                                {"elements_per_second", static_cast<double>(o.count) / b.r.seconds},
                                {"steps", b.r.steps},
                                {"bytes_sent_per_worker", b.r.bytes_sent_per_worker},
                                {"max_link_utilisation", b.r.max_link_utilisation}};
  }
  return out;
}

// The baselines of the result document in the order they ran (its object sorts them by name).
std::vector<std::pair<std::string, const json*>> BaselinesOf(const json& out) {
  std::vector<std::pair<std::string, const json*>> rows;
  if (!out.contains("baselines")) return rows;
  for (sim::Baseline b : {sim::Baseline::kRing, sim::Baseline::kHalvingDoubling}) {
    const char* name = sim::BaselineName(b);
    if (out["baselines"].contains(name)) rows.emplace_back(name, &out["baselines"][name]);
  }
  return rows;
}

// CSV: one row per job, then one per baseline.
std::string CsvText(const json& out) {
  const json& cfg = out["config"];
  const double ceiling = out["goodput_ceiling_elements_per_second"].get<double>();
  std::ostringstream csv;
  csv.precision(10);
  csv << "algorithm,job,workers,jobs,gbps,packet_numel,window,size_bytes,dtype,loss,seed,"
         "seconds,elements_per_second,fraction_of_ceiling,retransmitted,timeouts,"
         "stalled_rounds,round_p50_ns,round_p99_ns,ok,sparse,density,union_fraction\n";
  auto row_prefix = [&](const std::string& alg, size_t job) {
    csv << alg << "," << job << "," << cfg["workers"].get<int64_t>() << ","
        << cfg["jobs"].get<int64_t>() << "," << cfg["gbps"].get<double>() << ","
        << cfg["packet_numel"].get<int64_t>() << "," << cfg["window"].get<int64_t>() << ","
        << cfg["size_bytes"].get<uint64_t>() << "," << cfg["dtype"].get<std::string>() << ","
        << cfg["loss"].get<double>() << "," << cfg["seed"].get<int64_t>() << ",";
  };
  for (size_t i = 0; i < out["jobs"].size(); ++i) {
    const json& j = out["jobs"][i];
    const json& rounds = j["slot_rounds"];
    row_prefix("switchml", i);
    csv << j["seconds"].get<double>() << "," << j["elements_per_second"].get<double>() << ","
        << j["fraction_of_ceiling"].get<double>() << "," << j["retransmitted"].get<uint64_t>()
        << "," << j["timeouts"].get<uint64_t>() << "," << rounds["stalled_rounds"].get<uint64_t>()
        << "," << rounds["p50_ns"].get<double>() << "," << rounds["p99_ns"].get<double>() << ","
        << (j["ok"].get<bool>() && j["verified"].get<bool>()) << "," << cfg["sparse"].get<bool>()
        << "," << cfg["density"].get<double>() << ","
        << (j.contains("union_fraction") ? j["union_fraction"].get<double>() : 1.0) << "\n";
  }
  for (const auto& [name, b] : BaselinesOf(out)) {
    row_prefix(name, 0);
    const double eps = (*b)["elements_per_second"].get<double>();
    csv << (*b)["seconds"].get<double>() << "," << eps << "," << eps / ceiling << ",0,0,0,0,0,1,0,"
        << cfg["density"].get<double>() << ",1\n";
  }
  return csv.str();
}

void PrintSummary(const json& out) {
  const json& cfg = out["config"];
  const double ceiling = out["goodput_ceiling_elements_per_second"].get<double>();
  const uint64_t size = cfg["size_bytes"].get<uint64_t>(), count = size / 4;
  const int64_t aggregators = cfg["aggregators"].get<int64_t>();
  const std::string over =
      aggregators > 0 ? " over " + std::to_string(aggregators) + " server aggregator(s)" : "";
  std::printf(
      "switchml sim: %lld job(s) x %lld workers%s, %.0f Gbit/s, %lld-element packets, "
      "window %lld, %llu bytes (%llu %s elements), loss %g\n",
      static_cast<long long>(cfg["jobs"].get<int64_t>()),
      static_cast<long long>(cfg["workers"].get<int64_t>()), over.c_str(),
      cfg["gbps"].get<double>(), static_cast<long long>(cfg["packet_numel"].get<int64_t>()),
      static_cast<long long>(cfg["window"].get<int64_t>()), static_cast<unsigned long long>(size),
      static_cast<unsigned long long>(count), cfg["dtype"].get<std::string>().c_str(),
      cfg["loss"].get<double>());
  for (size_t i = 0; i < out["jobs"].size(); ++i) {
    const json& j = out["jobs"][i];
    const json& rounds = j["slot_rounds"];
    const bool ok = j["ok"].get<bool>();
    const double eps = j["elements_per_second"].get<double>();
    std::printf(
        "  job %zu: %s, %.6f s, %.4g elements/s (%.1f%% of the packet format's "
        "ceiling), %llu retransmissions, %llu timeouts, slot rounds p50 %.0f ns p99 "
        "%.0f ns, %llu stalled%s\n",
        i, ok ? (j["verified"].get<bool>() ? "OK (verified)" : "WRONG RESULT") : "FAILED",
        j["seconds"].get<double>(), eps, 100 * eps / ceiling,
        static_cast<unsigned long long>(j["retransmitted"].get<uint64_t>()),
        static_cast<unsigned long long>(j["timeouts"].get<uint64_t>()),
        rounds["p50_ns"].get<double>(), rounds["p99_ns"].get<double>(),
        static_cast<unsigned long long>(rounds["stalled_rounds"].get<uint64_t>()),
        ok ? "" : (": " + j["status"].get<std::string>()).c_str());
    if (j.contains("union_fraction")) {
      std::printf("    sparse: the union was %.3g%% of the blocks (input density %g)\n",
                  100 * j["union_fraction"].get<double>(), cfg["density"].get<double>());
    }
    const std::string verify_error = j["verify_error"].get<std::string>();
    if (!verify_error.empty()) std::printf("    %s\n", verify_error.c_str());
  }
  for (const auto& [name, b] : BaselinesOf(out)) {
    const double seconds = (*b)["seconds"].get<double>();
    std::printf("  %s: %.6f s, %.4g elements/s (%.1f%% of the SwitchML ceiling)\n", name.c_str(),
                seconds, static_cast<double>(count) / seconds,
                100 * static_cast<double>(count) / seconds / ceiling);
  }
  const json& l = out["links"];
  std::printf("  links: up %.1f%% mean / %.1f%% max busy, down %.1f%% / %.1f%%\n",
              100 * l["up_mean_utilisation"].get<double>(),
              100 * l["up_max_utilisation"].get<double>(),
              100 * l["down_mean_utilisation"].get<double>(),
              100 * l["down_max_utilisation"].get<double>());
  if (aggregators > 0) {
    std::printf("  aggregator links: in %.1f%% mean / %.1f%% max busy, out %.1f%% / %.1f%%\n",
                100 * l["aggregator_in_mean_utilisation"].get<double>(),
                100 * l["aggregator_in_max_utilisation"].get<double>(),
                100 * l["aggregator_out_mean_utilisation"].get<double>(),
                100 * l["aggregator_out_max_utilisation"].get<double>());
  }
}

// Writes text to path ("-": stdout; empty: nowhere).
bool WriteOutput(const std::string& path, const std::string& text) {
  if (path.empty()) return true;
  if (path == "-") {
    std::cout << text;
    return true;
  }
  std::ofstream f(path);
  f << text;
  if (!f) {
    std::cerr << "switchml sim: cannot write " << path << "\n";
    return false;
  }
  return true;
}

int Fail(const std::string& message) {
  std::cerr << "switchml sim: " << message << "\n";
  return 2;
}

}  // namespace

int SimCommand(const std::vector<std::string>& raw_args) {
  Flags parser(
      "sim",
      "Simulates SwitchML jobs on a simulated network in virtual time (discrete events), running\n"
      "the real switch data plane and worker protocol for every packet, and the ring and\n"
      "halving-doubling all-reduces on the same links. Deterministic: the same flags and seed\n"
      "give the same output. Flags may also come from a JSON file (--config), which the command\n"
      "line overrides. See docs/simulator.md.");
  SimFlags flags;
  DefineFlags(&parser, &flags);
  std::vector<std::string> args;
  if (Status st = ExpandConfigFiles(raw_args, &args); !st.ok()) return Fail(st.message());
  if (int code = ParseCommandLine("sim", args, &parser, flags.log_level); code >= 0) return code;

  Result<Options> options = ReadOptions(flags);
  if (!options.ok()) return Fail(options.status().message());
  Options& o = *options;
  Result<sim::SimConfig> config = BuildConfig(flags, &o);
  if (!config.ok()) return Fail(config.status().message());
  const sim::Topology topology = config->topology;  // for the baselines
  RunCost cost;
  Result<sim::SimResult> result = RunSimulation(std::move(*config), o, flags.quiet, &cost);
  if (!result.ok()) return Fail(result.status().message());

  std::vector<BaselineRow> baselines;
  if (flags.baselines) {
    Result<std::vector<BaselineRow>> rows = RunBaselines(topology, o, flags);
    if (!rows.ok()) return Fail(rows.status().message());
    baselines = std::move(*rows);
  }
  const json out = ResultJson(flags, o, *result, baselines);
  if (!WriteOutput(flags.json, out.dump(2) + "\n")) return 2;
  if (!WriteOutput(flags.csv, CsvText(out))) return 2;
  if (flags.json != "-" && flags.csv != "-") PrintSummary(out);
  std::fflush(stdout);
  std::fprintf(stderr,
               "sim: %.6f s simulated, %llu events in %.2f s wall, %.2f s CPU (%.2fM events per "
               "CPU second)\n",
               result->sim_seconds, static_cast<unsigned long long>(result->events), cost.wall,
               cost.cpu, static_cast<double>(result->events) / cost.cpu / 1e6);
  return result->ok() ? 0 : 1;
}

}  // namespace switchml::tools
