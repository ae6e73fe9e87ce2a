// `switchml sim`: the discrete-event simulator (src/sim) from the command line: a job (or several
// sharing one switch) on simulated links, running the real Switch and WorkerSession code, with
// the ring and halving-doubling baselines on the same links. Output: a summary, and JSON and CSV.
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

json StallsJson(const sim::StallStats& s) {
  return {{"rounds", s.rounds}, {"mean_ns", s.mean_ns}, {"p50_ns", s.p50_ns},
          {"p99_ns", s.p99_ns}, {"max_ns", s.max_ns},   {"stalled_rounds", s.stalled}};
}

struct LinkSummary {
  double mean = 0, max = 0;
  uint64_t lost = 0, tail_dropped = 0;
};

}  // namespace

int SimCommand(const std::vector<std::string>& raw_args) {
  Flags flags(
      "sim",
      "Simulates SwitchML jobs on a simulated network in virtual time (discrete events), running\n"
      "the real switch data plane and worker protocol for every packet, and the ring and\n"
      "halving-doubling all-reduces on the same links. Deterministic: the same flags and seed\n"
      "give the same output. Flags may also come from a JSON file (--config), which the command\n"
      "line overrides. See docs/simulator.md.");
  flags.AddString("config", "", "JSON file of flag values, e.g. {\"workers\": 64, \"loss\": 0.01}");
  flags.AddString("topology", "star",
                  "star: every worker on one switch; two-level: --racks top-of-rack switches "
                  "under one spine, the workers spread evenly over them (docs/hierarchy.md)");
  flags.AddInt("racks", 2, "with --topology two-level: top-of-rack switches (racks)");
  flags.AddInt("workers", 8,
               "workers per job (star: at most 256; two-level: up to 4096, 256 per rack)");
  flags.AddInt("jobs", 1, "concurrent jobs, each with its own workers, all on the one switch");
  flags.AddBool("share-pool",
                "split --slots among the jobs: each job's window is at most slots / jobs");
  flags.AddDouble("gbps", 100, "link rate, Gbit/s (every link; 0.001..1e6)");
  flags.AddDouble("propagation-ns", 500,
                  "one-way propagation delay of each link, ns (at most 1e12, as every delay)");
  flags.AddInt("buffer-kb", 0,
               "output buffer per link, KiB, tail drop beyond (0 = unbounded; at most 1048576)");
  flags.AddDouble("switch-latency-ns", 500, "switch pipeline latency per packet, ns");
  flags.AddDouble("switch-mpps", 0,
                  "switch pipeline capacity, Mpackets/s (0 = unlimited; else 1e-9..1e9)");
  flags.AddDouble("host-latency-ns", 0, "host (NIC, stack) latency per packet sent, ns");
  flags.AddDouble("timer-granularity-ns", 1000,
                  "host timer granularity: timeouts run at deadlines rounded up to this");
  flags.AddInt("packet-numel", 256, "elements per packet: 64 or 256");
  flags.AddInt("slots", 8192, "switch slots per job (the most any window may use)");
  flags.AddInt("window", 0,
               "outstanding packets per worker, at most --slots (0 = from the bandwidth-delay "
               "product, docs/architecture.md 4.5, capped at --slots)");
  flags.AddInt("threads", 1, "worker threads (sessions, slot ranges) per worker");
  flags.AddSize("size", 64 << 20,
                "tensor size in BYTES (4 per element; run's and worker's --size count elements), "
                "suffix K, M, G = 2^10, 2^20, 2^30: 100M is 100 MiB, 26214400 elements");
  flags.AddString("dtype", "int32", "int32 or float32");
  flags.AddInt("iterations", 1, "all-reduces back to back per job");
  flags.AddDouble("loss", 0, "loss rate per link and packet, e.g. 0.0001 (every link)");
  flags.AddDouble("duplicate", 0, "duplication rate per link and packet");
  flags.AddDouble("reorder", 0, "rate of packets delayed by up to --reorder-ns (reordered)");
  flags.AddDouble("reorder-ns", 10000, "the largest extra delay of a reordered packet, ns");
  flags.AddDouble(
      "timeout-us", 100,
      "retransmission timeout before the first RTT sample, us (0.001..1e9, as its bounds)");
  flags.AddDouble("min-timeout-us", 20, "RTO floor, us");
  flags.AddDouble("max-timeout-us", 100000, "RTO ceiling, us");
  flags.AddDouble("clock-granularity-ns", 1000, "RTO = SRTT + max(this, 4 RTTVAR)");
  flags.AddInt("early-retransmit", 0,
               "re-send a packet once the results of this many packets sent after it arrived "
               "(0 = off: only timeouts)");
  flags.AddInt("timeout-threshold", 100, "timeouts (since the last RTT sample) before back-off");
  flags.AddDouble("progress-timeout-ms", 1000,
                  "a slice fails after this long without a result (at most 1e9)");
  flags.AddString("payload", "shared",
                  "shared: one tensor shared by a job's workers (memory of one tensor, output "
                  "checked); verified: each worker its own (memory x workers, every result "
                  "checked)");
  flags.AddInt("seed", 1, "seed of the faults and the tensors (0..2^63-1)");
  flags.AddDouble("max-sim-seconds", 600, "virtual-time limit (at most 1e6)");
  flags.AddBool("baselines", "also run ring and halving-doubling (flow-level) on the same links");
  flags.AddInt("baseline-mtu", 4096, "payload bytes per packet of the baselines (1..1048576)");
  flags.AddString("json", "", "write the results as JSON to this file (- for stdout)");
  flags.AddString("csv", "", "write the results as CSV to this file (- for stdout)");
  flags.AddBool("quiet", "no progress line");
  flags.AddString("log-level", "warning", "debug, info, warning, error or off");

  std::vector<std::string> args;
  for (size_t i = 0; i < raw_args.size(); ++i) {
    std::string path;
    if (raw_args[i] == "--config" && i + 1 < raw_args.size()) {
      path = raw_args[i + 1];
    } else if (raw_args[i].rfind("--config=", 0) == 0) {
      path = raw_args[i].substr(9);
    } else {
      continue;
    }
    Status st = ConfigFileArgs(path, &args);
    if (!st.ok()) {
      std::cerr << "switchml sim: " << st.message() << "\n";
      return 2;
    }
  }
  args.insert(args.end(), raw_args.begin(), raw_args.end());
  if (int code = ParseCommandLine("sim", args, &flags, nullptr); code >= 0) return code;

  auto fail = [](const std::string& m) {
    std::cerr << "switchml sim: " << m << "\n";
    return 2;
  };
  const int64_t workers = flags.GetInt("workers"), jobs = flags.GetInt("jobs");
  const int64_t numel = flags.GetInt("packet-numel"), threads = flags.GetInt("threads");
  const int64_t iterations = flags.GetInt("iterations"), slots = flags.GetInt("slots");
  int64_t window = flags.GetInt("window");
  const std::string topology_name = flags.GetString("topology");
  const bool two_level = topology_name == "two-level";
  if (topology_name != "star" && !two_level) return fail("--topology must be star or two-level");
  const int64_t racks = two_level ? flags.GetInt("racks") : 1;
  if (two_level) {
    if (jobs != 1) return fail("--topology two-level runs one job (--jobs 1)");
    if (racks < 1 || racks > 256 || workers % racks != 0 || workers / racks > 256) {
      return fail("--racks must be in 1..256 and divide --workers into racks of at most 256");
    }
  }
  if (workers < 1 || workers > 4096) return fail("--workers must be in 1..4096");
  if (jobs < 1 || jobs > 200) return fail("--jobs must be in 1..200");
  if (!two_level && workers > 256) {  // failed later naming max_workers_per_job, not a flag
    return fail("--workers " + std::to_string(workers) +
                " exceeds the 256 workers one switch aggregates (the worker bitmap's width): use "
                "--topology two-level --racks R for more");
  }
  const int64_t switches = two_level ? racks + 1 : 1;
  if (jobs * workers + switches > sim::kMaxNodes) {  // was "cannot allocate ... --size"
    return fail("--jobs x --workers is " + std::to_string(jobs * workers) +
                " hosts; with the switches the simulator takes at most " +
                std::to_string(sim::kMaxNodes) + " nodes (docs/simulator.md)");
  }
  if (numel != 64 && numel != 256) return fail("--packet-numel must be 64 or 256");
  if (threads < 1 || threads > 64) return fail("--threads must be in 1..64");
  if (iterations < 1 || iterations > 1000) return fail("--iterations must be in 1..1000");
  if (slots < 1 || slots > 16384) return fail("--slots must be in 1..16384");
  if (window < 0) return fail("--window must be >= 0");
  if (window > slots) {  // was clamped to --slots without a word
    return fail("--window " + std::to_string(window) + " exceeds --slots " + std::to_string(slots) +
                ": raise --slots or lower --window");
  }
  DataType dtype;
  if (flags.GetString("dtype") == "int32") {
    dtype = DataType::kInt32;
  } else if (flags.GetString("dtype") == "float32") {
    dtype = DataType::kFloat32;
  } else {
    return fail("--dtype must be int32 or float32");
  }
  // The timing flags, each checked by name against the simulator's bounds (sim/topology.h)
  // before it is converted: picosecond times wrapped to negative values beyond them.
  struct Range {
    const char* flag;
    double lo, hi;
  };
  for (const Range& r : {Range{"gbps", sim::kMinGbps, sim::kMaxGbps},
                         {"propagation-ns", 0, sim::kMaxDelayNs},
                         {"switch-latency-ns", 0, sim::kMaxDelayNs},
                         {"host-latency-ns", 0, sim::kMaxDelayNs},
                         {"timer-granularity-ns", 0, sim::kMaxDelayNs},
                         {"reorder-ns", 0, sim::kMaxDelayNs},
                         {"clock-granularity-ns", 0, sim::kMaxDelayNs},
                         {"timeout-us", 1e-3, sim::kMaxDelayNs / 1e3},
                         {"min-timeout-us", 1e-3, sim::kMaxDelayNs / 1e3},
                         {"max-timeout-us", 1e-3, sim::kMaxDelayNs / 1e3},
                         {"progress-timeout-ms", 1e-6, sim::kMaxSimSeconds * 1e3},
                         {"max-sim-seconds", 1e-9, sim::kMaxSimSeconds}}) {
    const double v = flags.GetDouble(r.flag);
    if (!(v >= r.lo && v <= r.hi)) {
      std::ostringstream m;
      m << "--" << r.flag << " must be in [" << r.lo << ", " << r.hi << "], not " << v;
      return fail(m.str());
    }
  }
  // 0, or a packet's service time (1e9 / pps ns) that is a delay like the others.
  const double mpps = flags.GetDouble("switch-mpps");
  if (!(mpps == 0 || (mpps >= 1e9 / sim::kMaxDelayNs / 1e6 && mpps <= 1e9))) {
    std::ostringstream m;
    m << "--switch-mpps must be 0 (unlimited) or in [" << 1e9 / sim::kMaxDelayNs / 1e6
      << ", 1e+09], not " << mpps;
    return fail(m.str());
  }
  const int64_t buffer_kb = flags.GetInt("buffer-kb");
  if (buffer_kb < 0 || static_cast<uint64_t>(buffer_kb) > sim::kMaxBufferBytes / 1024) {
    return fail("--buffer-kb must be in 0.." + std::to_string(sim::kMaxBufferBytes / 1024) +
                " (0 = unbounded), not " + std::to_string(buffer_kb));  // was * 1024, wrapped
  }
  const int64_t baseline_mtu = flags.GetInt("baseline-mtu");
  if (baseline_mtu < 1 || baseline_mtu > 1048576) {  // was checked after the run, >= 1 only
    return fail("--baseline-mtu must be in 1..1048576, not " + std::to_string(baseline_mtu));
  }
  const uint64_t size = flags.GetSize("size");
  if (size % 4 != 0) return fail("--size must be a multiple of 4 bytes");
  const uint64_t count = size / 4;
  // Refused before the simulation, which may run for minutes, rather than after it.
  for (const char* out : {"json", "csv"}) {
    if (flags.GetString(out).empty()) continue;
    if (Status st = CheckOutputPath(out, flags.GetString(out), /*allow_stdout=*/true); !st.ok()) {
      return fail(st.message());
    }
  }
  const proto::SizeCode code = numel == 64 ? proto::SizeCode::k256B : proto::SizeCode::k1024B;

  sim::LinkParams lp;
  lp.gbps = flags.GetDouble("gbps");
  lp.propagation_ns = flags.GetDouble("propagation-ns");
  lp.buffer_bytes = static_cast<uint64_t>(buffer_kb) * 1024;
  lp.loss = flags.GetDouble("loss");
  lp.duplicate = flags.GetDouble("duplicate");
  lp.reorder = flags.GetDouble("reorder");
  lp.reorder_ns = flags.GetDouble("reorder-ns");
  if (Status st = lp.Validate(); !st.ok()) return fail(st.message());

  sim::SimConfig c;
  const uint32_t hosts = static_cast<uint32_t>(workers * jobs);
  const uint32_t per_rack = static_cast<uint32_t>(hosts / racks);
  const uint32_t spine = hosts + static_cast<uint32_t>(racks);  // two-level only
  c.topology = two_level ? sim::Topology::TwoLevel(static_cast<uint32_t>(racks), per_rack, lp, lp)
                         : sim::Topology::Star(hosts, lp);
  c.switch_latency_ns = flags.GetDouble("switch-latency-ns");
  c.switch_pps = flags.GetDouble("switch-mpps") * 1e6;
  c.host_latency_ns = flags.GetDouble("host-latency-ns");
  c.timer_granularity_ns = flags.GetDouble("timer-granularity-ns");
  c.switch_config.slots_per_job = static_cast<uint32_t>(slots);
  if (window == 0) {
    // The documented rule (docs/architecture.md 4.5) with this network's base round trip: two
    // links each way (serialization and propagation), the switch and the host latencies.
    const double wire = static_cast<double>(proto::DatagramBytes(code) + sim::kWireOverheadBytes);
    const double ser_ns = wire * 8 / lp.gbps;
    const double levels = two_level ? 2 : 1;  // hops each way: 1 (star) or 2 (host-ToR-spine)
    const double rtt_ns =
        levels * (2 * (ser_ns + lp.propagation_ns) + c.switch_latency_ns) + c.host_latency_ns;
    window = static_cast<int64_t>(std::ceil(2 * lp.gbps * rtt_ns / 8 / wire));
    window = std::max<int64_t>(64, (window + 31) / 32 * 32);
    window = (window + threads - 1) / threads * threads;
  }
  if (flags.GetBool("share-pool")) {
    window = std::min(window, std::max<int64_t>(threads, slots / jobs / threads * threads));
  }
  if (window > slots) window = slots / threads * threads;
  for (int64_t j = 0; j < jobs; ++j) {
    sim::JobConfig job;
    job.session_id = static_cast<uint64_t>(j + 1);
    job.switch_node = two_level ? spine : hosts;
    for (int64_t r = 0; r < workers; ++r) {
      job.hosts.push_back(static_cast<uint32_t>(j * workers + r));
      if (two_level) job.tors.push_back(hosts + static_cast<uint32_t>(r) / per_rack);
    }
    job.size = code;
    job.window = static_cast<uint32_t>(window);
    job.threads = static_cast<uint32_t>(threads);
    job.collectives.assign(static_cast<size_t>(iterations), sim::Collective{dtype, count});
    c.jobs.push_back(job);
  }
  auto us = [](double v) { return worker::Nanos{static_cast<int64_t>(std::llround(v * 1000))}; };
  c.session.timeout = us(flags.GetDouble("timeout-us"));
  c.session.min_timeout = us(flags.GetDouble("min-timeout-us"));
  c.session.max_timeout = us(flags.GetDouble("max-timeout-us"));
  c.session.clock_granularity =
      worker::Nanos{static_cast<int64_t>(flags.GetDouble("clock-granularity-ns"))};
  // Both checked before they narrow to 32 bits (4294967297 read as 1).
  if (flags.GetInt("timeout-threshold") < 1 || flags.GetInt("timeout-threshold") > UINT32_MAX) {
    return fail("--timeout-threshold must be in 1..4294967295");
  }
  c.session.timeout_threshold = static_cast<uint32_t>(flags.GetInt("timeout-threshold"));
  if (flags.GetInt("early-retransmit") < 0 || flags.GetInt("early-retransmit") > 1000000) {
    return fail("--early-retransmit must be in 0..1000000");
  }
  c.session.early_retransmit_after = static_cast<uint32_t>(flags.GetInt("early-retransmit"));
  c.session.progress_timeout = us(flags.GetDouble("progress-timeout-ms") * 1000);
  if (Status st = c.session.Validate(); !st.ok()) return fail(st.message());
  const std::string payload = flags.GetString("payload");
  if (payload == "shared") {
    c.payload = sim::PayloadMode::kShared;
  } else if (payload == "verified") {
    c.payload = sim::PayloadMode::kVerified;
  } else {
    return fail("--payload must be shared or verified");
  }
  if (Status st = ReadSeed(flags, &c.seed); !st.ok()) return fail(st.message());
  c.max_sim_seconds = flags.GetDouble("max-sim-seconds");

  const bool quiet = flags.GetBool("quiet");
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
  const sim::Topology topology = c.topology;
  const std::vector<uint32_t> job0_hosts = c.jobs[0].hosts;
  // The tensors are allocated inside Simulate: a --size this host cannot hold aborted the
  // command with std::bad_alloc (or std::length_error beyond a vector's max_size()).
  auto too_large = [&] {
    return fail("cannot allocate the simulated tensors of --size " + std::to_string(size) +
                " bytes (--payload " + payload + "): use a smaller --size");
  };
  Result<sim::SimResult> result = InternalError("not run");
  try {
    result = sim::Simulate(std::move(c));
  } catch (const std::bad_alloc&) {
    return too_large();
  } catch (const std::length_error&) {
    return too_large();
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  const double cpu = testing::ProcessCpuSeconds() - cpu0;
  if (printed) std::fprintf(stderr, "\n");
  if (!result.ok()) return fail(result.status().message());

  // Baselines on the same links (job 0's workers).
  struct BaselineRow {
    std::string name;
    sim::BaselineResult r;
  };
  std::vector<BaselineRow> baselines;
  if (flags.GetBool("baselines")) {
    sim::Topology t = topology;
    if (Status st = t.Finalize(); !st.ok()) return fail(st.message());
    sim::BaselineConfig bc;
    bc.hosts = job0_hosts;
    bc.bytes = size;
    bc.mtu_payload = static_cast<uint32_t>(baseline_mtu);
    bc.switch_latency_ns = flags.GetDouble("switch-latency-ns");
    bc.host_latency_ns = flags.GetDouble("host-latency-ns");
    for (sim::Baseline b : {sim::Baseline::kRing, sim::Baseline::kHalvingDoubling}) {
      auto r = sim::SimulateBaseline(b, t, bc);
      if (!r.ok()) return fail(r.status().message());
      baselines.push_back({sim::BaselineName(b), *r});
    }
  }

  const double ceiling = sim::GoodputCeilingElementsPerSecond(lp.gbps, code);
  // Link utilisation by direction: host -> switch (up) and switch -> host (down).
  LinkSummary up, down;
  size_t nup = 0, ndown = 0;
  for (const sim::LinkResult& l : result->links) {
    const bool is_up = l.from < hosts || (two_level && l.to == spine);  // toward the aggregator
    LinkSummary& s = is_up ? up : down;
    (is_up ? nup : ndown)++;
    s.mean += l.utilisation;
    s.max = std::max(s.max, l.utilisation);
    s.lost += l.lost;
    s.tail_dropped += l.tail_dropped;
  }
  if (nup > 0) up.mean /= static_cast<double>(nup);
  if (ndown > 0) down.mean /= static_cast<double>(ndown);

  json out;
  out["config"] = {{"topology", topology_name},
                   {"racks", racks},
                   {"workers", workers},
                   {"jobs", jobs},
                   {"gbps", lp.gbps},
                   {"propagation_ns", lp.propagation_ns},
                   {"switch_latency_ns", flags.GetDouble("switch-latency-ns")},
                   {"packet_numel", numel},
                   {"slots", slots},
                   {"window", window},
                   {"threads", threads},
                   {"size_bytes", size},
                   {"dtype", flags.GetString("dtype")},
                   {"iterations", iterations},
                   {"loss", lp.loss},
                   {"min_timeout_us", flags.GetDouble("min-timeout-us")},
                   {"early_retransmit", flags.GetInt("early-retransmit")},
                   {"seed", flags.GetInt("seed")}};
  out["goodput_ceiling_elements_per_second"] = ceiling;
  out["sim_seconds"] = result->sim_seconds;
  out["events"] = result->events;
  out["packets_delivered"] = result->packets_delivered;
  double total_eps = 0;
  bool all_ok = true;
  for (const sim::JobResult& j : result->jobs) {
    all_ok = all_ok && j.status.ok() && j.verified;
    total_eps += j.elements_per_second;
    out["jobs"].push_back({{"session_id", j.session_id},
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
                           {"slot_rounds", StallsJson(j.stalls)}});
  }
  out["aggregated_elements_per_second"] = total_eps;
  out["links"] = {
      {"up_mean_utilisation", up.mean},     {"up_max_utilisation", up.max},
      {"down_mean_utilisation", down.mean}, {"down_max_utilisation", down.max},
      {"lost", up.lost + down.lost},        {"tail_dropped", up.tail_dropped + down.tail_dropped}};
  for (const BaselineRow& b : baselines) {
    out["baselines"][b.name] = {{"seconds", b.r.seconds},
                                {"elements_per_second", static_cast<double>(count) / b.r.seconds},
                                {"steps", b.r.steps},
                                {"bytes_sent_per_worker", b.r.bytes_sent_per_worker},
                                {"max_link_utilisation", b.r.max_link_utilisation}};
  }

  auto write = [&](const std::string& path, const std::string& text) -> bool {
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
  };
  std::ostringstream csv;
  csv.precision(10);
  csv << "algorithm,job,workers,jobs,gbps,packet_numel,window,size_bytes,dtype,loss,seed,"
         "seconds,elements_per_second,fraction_of_ceiling,retransmitted,timeouts,"
         "stalled_rounds,round_p50_ns,round_p99_ns,ok\n";
  auto row_prefix = [&](const std::string& alg, int64_t job) {
    csv << alg << "," << job << "," << workers << "," << jobs << "," << lp.gbps << "," << numel
        << "," << window << "," << size << "," << flags.GetString("dtype") << "," << lp.loss << ","
        << flags.GetInt("seed") << ",";
  };
  for (size_t i = 0; i < result->jobs.size(); ++i) {
    const sim::JobResult& j = result->jobs[i];
    row_prefix("switchml", static_cast<int64_t>(i));
    csv << j.seconds << "," << j.elements_per_second << "," << j.elements_per_second / ceiling
        << "," << j.retransmitted << "," << j.timeouts << "," << j.stalls.stalled << ","
        << j.stalls.p50_ns << "," << j.stalls.p99_ns << "," << (j.status.ok() && j.verified)
        << "\n";
  }
  for (const BaselineRow& b : baselines) {
    row_prefix(b.name, 0);
    const double eps = static_cast<double>(count) / b.r.seconds;
    csv << b.r.seconds << "," << eps << "," << eps / ceiling << ",0,0,0,0,0,1\n";
  }
  if (!write(flags.GetString("json"), out.dump(2) + "\n")) return 2;
  if (!write(flags.GetString("csv"), csv.str())) return 2;

  if (flags.GetString("json") != "-" && flags.GetString("csv") != "-") {
    std::printf(
        "switchml sim: %lld job(s) x %lld workers, %.0f Gbit/s, %lld-element packets, "
        "window %lld, %llu bytes (%llu %s elements), loss %g\n",
        static_cast<long long>(jobs), static_cast<long long>(workers), lp.gbps,
        static_cast<long long>(numel), static_cast<long long>(window),
        static_cast<unsigned long long>(size), static_cast<unsigned long long>(count),
        flags.GetString("dtype").c_str(), lp.loss);
    for (size_t i = 0; i < result->jobs.size(); ++i) {
      const sim::JobResult& j = result->jobs[i];
      std::printf(
          "  job %zu: %s, %.6f s, %.4g elements/s (%.1f%% of the packet format's "
          "ceiling), %llu retransmissions, %llu timeouts, slot rounds p50 %.0f ns p99 "
          "%.0f ns, %llu stalled%s\n",
          i, j.status.ok() ? (j.verified ? "OK (verified)" : "WRONG RESULT") : "FAILED", j.seconds,
          j.elements_per_second, 100 * j.elements_per_second / ceiling,
          static_cast<unsigned long long>(j.retransmitted),
          static_cast<unsigned long long>(j.timeouts), j.stalls.p50_ns, j.stalls.p99_ns,
          static_cast<unsigned long long>(j.stalls.stalled),
          j.status.ok() ? "" : (": " + j.status.ToString()).c_str());
      if (!j.verify_error.empty()) std::printf("    %s\n", j.verify_error.c_str());
    }
    for (const BaselineRow& b : baselines) {
      std::printf("  %s: %.6f s, %.4g elements/s (%.1f%% of the SwitchML ceiling)\n",
                  b.name.c_str(), b.r.seconds, static_cast<double>(count) / b.r.seconds,
                  100 * static_cast<double>(count) / b.r.seconds / ceiling);
    }
    std::printf("  links: up %.1f%% mean / %.1f%% max busy, down %.1f%% / %.1f%%\n", 100 * up.mean,
                100 * up.max, 100 * down.mean, 100 * down.max);
  }
  std::fflush(stdout);
  std::fprintf(stderr,
               "sim: %.6f s simulated, %llu events in %.2f s wall, %.2f s CPU (%.2fM events per "
               "CPU second)\n",
               result->sim_seconds, static_cast<unsigned long long>(result->events), wall, cpu,
               static_cast<double>(result->events) / cpu / 1e6);
  return all_ok ? 0 : 1;
}

}  // namespace switchml::tools
