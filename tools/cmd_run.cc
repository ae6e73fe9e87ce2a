// `switchml run`: the main job on one machine: a software switch plus N worker processes on
// loopback, every result verified, throughput printed.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "base/logging.h"
#include "commands.h"
#include "flags.h"
#include "runtime/switch_daemon.h"
#include "testing/measure.h"
#include "transport/environment.h"
#include "transport/factory.h"
#include "transport/shm.h"

namespace switchml::tools {
namespace {

struct Child {
  uint32_t rank = 0;
  pid_t pid = -1;
  int out_fd = -1;
  std::string buffer;
  std::string result_line;
  bool exited = false;
  int exit_code = -1;
};

// Starts exe with args, its stdout into a non-blocking pipe (*out_fd). Everything the child
// needs is prepared before fork(): this process has other threads, so the child only calls
// async-signal-safe functions.
pid_t Spawn(const std::string& exe, const std::vector<std::string>& args, int* out_fd) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  static const char kExecFailed[] = "switchml run: cannot execute the worker binary\n";
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  // (Were stdout closed, the write end could be fd 1 itself: dup2 would then keep O_CLOEXEC.)
  const bool write_end_is_stdout = fds[1] == STDOUT_FILENO;
  pid_t pid = fork();
  if (pid == 0) {
    if (write_end_is_stdout) {
      fcntl(STDOUT_FILENO, F_SETFD, 0);
    } else {
      dup2(fds[1], STDOUT_FILENO);  // the duplicate does not inherit O_CLOEXEC
    }
    execv(exe.c_str(), argv.data());
    (void)!write(STDERR_FILENO, kExecFailed, sizeof kExecFailed - 1);
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return -1;
  }
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  *out_fd = fds[0];
  return pid;
}

std::map<std::string, std::string> ParseResult(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream s(line);
  std::string tok;
  while (s >> tok) {
    auto eq = tok.find('=');
    if (eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  return kv;
}

std::vector<double> ParseTimes(const std::string& csv) {
  std::vector<double> v;
  std::istringstream s(csv);
  std::string x;
  while (std::getline(s, x, ',')) v.push_back(std::strtod(x.c_str(), nullptr));
  return v;
}

volatile sig_atomic_t g_interrupted = 0;
void OnSignal(int) { g_interrupted = 1; }

// The software switches `run` starts: one, or several for a striped job, all over the transport
// the workers will use.
struct RunSwitches {
  std::vector<std::unique_ptr<runtime::SwitchDaemon>> daemons;
  runtime::SwitchDaemonOptions options;
  std::string why;   // how the transport was chosen (" (auto)", or why shm could not be used)
  std::string list;  // the workers' --switch: "127.0.0.1:p1,127.0.0.1:p2,..."
};

// The command's flags as given (RunCommand binds them).
struct RunFlags {
  JobFlags job;
  double loss = 0;
  int64_t switch_threads = 0;
  int64_t switches = 1;
  std::string json;
  bool per_slot = false;
  std::string log_level = "warning";
};

// Starts `count` switches as the flags ask. --transport auto (the default): every process of
// this job is on this host, so shared memory (the fastest path here, docs/benchmarks.md) unless
// this host's cannot be used; then kernel UDP.
Result<RunSwitches> StartSwitches(const RunFlags& flags, const JobOptions& job, uint32_t count) {
  RunSwitches s;
  runtime::SwitchDaemonOptions& o = s.options;
  o.bind_address = "127.0.0.1";
  o.data_port = 0;
  o.control_port = 0;
  o.switch_config.max_workers_per_job = std::max<uint32_t>(32, job.workers);
  o.switch_config.slots_per_job = std::max<uint32_t>(8192, job.window);
  // The job's own switch takes its packet size, jumbo ones too (docs/protocol.md 2.6).
  o.switch_config.max_packet_numel = std::max<uint32_t>(256, job.packet_numel);
  o.loss = flags.loss;
  o.seed = job.seed;
  o.busy_poll = job.wait.busy_poll;
  const bool automatic = job.transport == kAutoTransport;
  const bool threads_automatic = flags.switch_threads == 0;
  // The switch over `transport`: automatic threads as many as the workers' over it, pinned
  // where theirs are (--pin-threads), both as the workers' options resolve for it.
  auto over = [&](const std::string& transport) {
    JobOptions j = job;
    j.transport = transport;
    ResolveAutomaticJobOptions(&j);
    o.transport = transport;
    o.threads = threads_automatic ? j.threads : static_cast<uint32_t>(flags.switch_threads);
    o.pin_threads = j.pin_threads;
  };
  s.why = automatic ? " (auto)" : "";
  over(automatic ? "shm" : job.transport);
  auto first = runtime::SwitchDaemon::Start(o);
  if (!first.ok() && automatic) {
    s.why = " (auto: shm cannot be used here: " + first.status().message() + ")";
    over(transport::kDefaultTransportKind);
    first = runtime::SwitchDaemon::Start(o);
  }
  if (!first.ok()) {
    return Status(first.status().code(), "cannot start the switch: " + first.status().message());
  }
  s.daemons.push_back(std::move(*first));
  // More switches for a striped job, like the first.
  while (s.daemons.size() < count) {
    auto more = runtime::SwitchDaemon::Start(o);
    if (!more.ok()) {
      return Status(more.status().code(), "cannot start switch " +
                                              std::to_string(s.daemons.size() + 1) + ": " +
                                              more.status().message());
    }
    s.daemons.push_back(std::move(*more));
  }
  for (const auto& d : s.daemons) {
    s.list += (s.list.empty() ? "" : ",") + ("127.0.0.1:" + std::to_string(d->control_port()));
  }
  return s;
}

void PrintSetup(const RunSwitches& s, const JobOptions& job) {
  const runtime::SwitchDaemonOptions& o = s.options;
  for (const auto& d : s.daemons) {
    std::printf(
        "switchml run: software switch on 127.0.0.1 (data port %u, control port %u), transport "
        "%s%s%s\n",
        d->data_port(), d->control_port(), o.transport.c_str(), s.why.c_str(),
        o.loss > 0
            ? (", dropping " + std::to_string(o.loss * 100) + "% of packets each way").c_str()
            : "");
  }
  if (s.daemons.size() > 1) {
    std::printf("switchml run: the job is striped over the %zu switches\n", s.daemons.size());
  }
  std::printf(
      "switchml run: %u workers x %u threads%s, %llu %s elements, %u iterations after %u "
      "warm-up, window %u, %u elements per packet\n",
      job.workers, job.threads, job.pin_threads ? " (thread t of each process on CPU t)" : "",
      static_cast<unsigned long long>(job.size), DataTypeName(job.dtype), job.iterations,
      job.warmup, job.window, job.packet_numel);
  std::fflush(stdout);
}

// Starts the job's worker processes (`self_exe worker ...`), one per rank, each with a fresh
// job id and the job's secret in its environment (docs/security.md; not on the command
// line, which other users can read). On failure kills those started and says why.
Status SpawnWorkers(const std::string& self_exe, const JobOptions& job, const std::string& switches,
                    const std::string& log_level, std::vector<Child>* children) {
  const uint64_t session =
      (static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
       (static_cast<uint64_t>(getpid()) << 32)) |
      1;
  {
    std::random_device rd;
    char secret[33];
    for (int i = 0; i < 4; ++i) std::snprintf(secret + 8 * i, 9, "%08x", rd());
    setenv("SWITCHML_JOB_SECRET", secret, 1);
  }
  children->assign(job.workers, Child{});
  for (uint32_t r = 0; r < job.workers; ++r) {
    std::vector<std::string> a = {
        "switchml", "worker",          "--switch",  switches,
        "--rank",   std::to_string(r), "--session", std::to_string(session),
        "--report", "--log-level",     log_level};
    auto j = JobFlagArgs(job);
    a.insert(a.end(), j.begin(), j.end());
    if (r != 0) a.push_back("--quiet");
    Child& c = (*children)[r];
    c.rank = r;
    c.pid = Spawn(self_exe, a, &c.out_fd);
    if (c.pid < 0) {
      const Status st =
          InternalError("cannot start worker " + std::to_string(r) + ": " + std::strerror(errno));
      for (auto& other : *children)
        if (other.pid > 0) kill(other.pid, SIGKILL);
      return st;
    }
  }
  return Status();
}

// Forwards the workers' output, keeps their result lines, and waits until every one has exited
// and every pipe is drained to its end (a child may exit right after writing its result line,
// before it is read). The first worker to fail (or an interruption) ends the others; returns
// what failed, or "".
std::string SuperviseWorkers(std::vector<Child>& children) {
  std::string failure;
  size_t running = children.size();
  auto any_open = [&] {
    return std::any_of(children.begin(), children.end(),
                       [](const Child& c) { return c.out_fd >= 0; });
  };
  auto take_line = [](Child& c, const std::string& line) {
    if (line.rfind("SWITCHML_RESULT", 0) == 0)
      c.result_line = line;
    else
      std::printf("%s\n", line.c_str());
  };
  while (running > 0 || any_open()) {
    std::vector<pollfd> pfds;
    for (auto& c : children) {
      if (c.out_fd >= 0) pfds.push_back(pollfd{c.out_fd, POLLIN, 0});
    }
    if (!pfds.empty())
      poll(pfds.data(), pfds.size(), 100);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto& c : children) {
      if (c.out_fd < 0) continue;
      char buf[4096];
      ssize_t n = read(c.out_fd, buf, sizeof buf);
      if (n > 0) {
        c.buffer.append(buf, static_cast<size_t>(n));
        size_t nl;
        while ((nl = c.buffer.find('\n')) != std::string::npos) {
          take_line(c, c.buffer.substr(0, nl));
          c.buffer.erase(0, nl + 1);
        }
      } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        if (!c.buffer.empty()) take_line(c, c.buffer);  // a last line without its newline
        c.buffer.clear();
        close(c.out_fd);
        c.out_fd = -1;
      }
    }
    for (auto& c : children) {
      if (c.exited) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.exited = true;
        --running;
        c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (c.exit_code != 0 && failure.empty()) {
          failure = "worker " + std::to_string(c.rank) + " failed (exit code " +
                    std::to_string(c.exit_code) + ")";
          for (auto& other : children) {
            if (!other.exited) kill(other.pid, SIGTERM);
          }
        }
      }
    }
    if (g_interrupted && failure.empty()) {
      failure = "interrupted";
      for (auto& c : children)
        if (!c.exited) kill(c.pid, SIGTERM);
    }
  }
  return failure;
}

// What the workers reported: per iteration the slowest worker's time, and their counters.
struct WorkerTotals {
  std::vector<double> per_iteration;
  uint64_t retransmitted = 0, auth_dropped = 0;
  double srtt_us = 0, rto_us = 0;  // the largest over the workers
  // --sparse: the blocks the workers announced and, of those, the union's (aggregated).
  uint64_t sparse_blocks = 0, union_blocks = 0;
  double union_fraction() const {
    return sparse_blocks > 0 ? static_cast<double>(union_blocks) / sparse_blocks : 0.0;
  }
};

Result<WorkerTotals> ReadResults(const std::vector<Child>& children, uint32_t iterations) {
  WorkerTotals w;
  w.per_iteration.assign(iterations, 0);
  for (const Child& c : children) {
    auto kv = ParseResult(c.result_line);
    if (kv["status"] != "ok") {
      return InternalError("worker " + std::to_string(c.rank) + " reported no result");
    }
    auto t = ParseTimes(kv["times"]);
    for (size_t i = 0; i < t.size() && i < w.per_iteration.size(); ++i) {
      w.per_iteration[i] = std::max(w.per_iteration[i], t[i]);
    }
    w.retransmitted += std::strtoull(kv["retransmitted"].c_str(), nullptr, 10);
    w.auth_dropped += std::strtoull(kv["auth_dropped"].c_str(), nullptr, 10);
    w.srtt_us = std::max(w.srtt_us, std::strtod(kv["srtt_us"].c_str(), nullptr));
    w.rto_us = std::max(w.rto_us, std::strtod(kv["rto_us"].c_str(), nullptr));
    w.sparse_blocks += std::strtoull(kv["sparse_blocks"].c_str(), nullptr, 10);
    w.union_blocks += std::strtoull(kv["union_blocks"].c_str(), nullptr, 10);
  }
  return w;
}

// The switches' counters, summed, and each one's report.
runtime::DaemonCounters SwitchTotals(const RunSwitches& s, bool per_slot, std::string* reports) {
  runtime::DaemonCounters dc;
  for (size_t i = 0; i < s.daemons.size(); ++i) {
    const runtime::DaemonCounters c = s.daemons[i]->counters();
    dc.received += c.received;
    dc.auth_dropped += c.auth_dropped;
    if (s.daemons.size() > 1) *reports += "switch " + std::to_string(i + 1) + ":\n";
    *reports += s.daemons[i]->FormatCounters(per_slot);
  }
  return dc;
}

}  // namespace

int RunCommand(const std::vector<std::string>& args, const std::string& self_exe) {
  Flags parser("run",
               "Runs the main job on this machine: starts a software switch and --workers worker\n"
               "processes (over shared memory by default, --transport udp for loopback UDP),\n"
               "all-reduces a --size tensor --iterations times, verifies every result against an\n"
               "exact float64/int64 sum and prints the median tensor aggregation time, aggregated\n"
               "elements/s and algorithm bandwidth.");
  RunFlags flags;
  AddJobFlags(&parser, &flags.job, /*auto_transport=*/true);
  parser.Add("loss", &flags.loss, "the switch drops this fraction of packets in each direction");
  parser.Add("switch-threads", &flags.switch_threads,
             "the switch's data-plane threads, 1..64 (worker thread t uses switch thread t mod "
             "this); 0: as many as the workers' --threads (with --threads 0: " +
                 std::to_string(kShmRunThreads) + " where shm is tried on a host with at least " +
                 std::to_string(kShmRunThreads) + " cores, else 1)");
  parser.Add("switches", &flags.switches,
             "software switches to start, 1..8; with more than one the job is striped over "
             "them (as over switch hosts: docs/deployment.md; on one machine this shows "
             "striping, it adds no bandwidth)");
  parser.Add("json", &flags.json, "also write the summary as JSON to this file");
  parser.Add("per-slot", &flags.per_slot, "print per-slot switch counters at the end");
  parser.Add("log-level", &flags.log_level, "debug, info, warning, error or off");
  JobOptions job;
  if (int code = ParseCommandLine("run", args, &parser, flags.log_level, &flags.job, &job);
      code >= 0) {
    return code;
  }
  const std::string& json = flags.json;
  if (!json.empty()) {  // refused now, not after the run
    if (Status st = CheckOutputPath("json", json, /*allow_stdout=*/false); !st.ok()) {
      std::cerr << "switchml run: " << st.message() << "\n";
      return 2;
    }
  }
  if (transport::CapabilitiesOf(job.transport).one_process_per_interface) {
    std::cerr << "switchml run: --transport " << job.transport
              << " is not available here: run's switch and worker processes share loopback, and "
                 "it takes one process per interface. Run `switchml switch` and `switchml "
                 "worker` with --transport "
              << job.transport
              << " on interfaces of their own (network namespaces: scripts/rack.sh, "
                 "tests/netns_test.sh)\n";
    return 2;
  }
  const int64_t num_switches = flags.switches;
  if (num_switches < 1 || num_switches > 8) {
    std::cerr << "switchml run: --switches must be in 1..8\n";
    return 2;
  }
  if (flags.switch_threads < 0 || flags.switch_threads > 64) {
    // Checked before it narrows to 32 bits (4294967297 read as 1).
    std::cerr << "switchml run: --switch-threads must be 0 (automatic) or in 1..64\n";
    return 2;
  }
  Result<RunSwitches> switches = StartSwitches(flags, job, static_cast<uint32_t>(num_switches));
  if (!switches.ok()) {
    std::cerr << "switchml run: " << switches.status().message() << "\n";
    return 2;
  }
  const runtime::SwitchDaemonOptions& o = switches->options;
  job.transport = o.transport;       // the workers use the switch's
  ResolveAutomaticJobOptions(&job);  // --threads 0 and --window 0 for that transport
  PrintSetup(*switches, job);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::vector<Child> children;
  if (Status st = SpawnWorkers(self_exe, job, switches->list, flags.log_level, &children);
      !st.ok()) {
    std::cerr << "switchml run: " << st.message() << "\n";
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string failure = SuperviseWorkers(children);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& d : switches->daemons) d->Stop();
  if (transport::CapabilitiesOf(o.transport).files_outlive_processes) {
    // Workers that did not close their transports (killed: after a failure or Ctrl-C) left
    // their inboxes and groups in the shm directory; nothing else would remove them.
    std::vector<uint32_t> pids;
    for (const Child& c : children) pids.push_back(static_cast<uint32_t>(c.pid));
    const size_t removed = transport::RemoveShmFilesLeftBy(transport::DefaultShmDirectory(), pids);
    if (removed > 0) {
      LOG(kInfo, kTransport) << "removed " << removed << " shm files the workers left behind";
    }
  }
  std::string switch_reports;
  const runtime::DaemonCounters dc =
      SwitchTotals(*switches, failure.empty() && flags.per_slot, &switch_reports);
  if (!failure.empty()) {
    std::fprintf(stderr, "switchml run: FAILED: %s\n%s", failure.c_str(), switch_reports.c_str());
    return 1;
  }
  Result<WorkerTotals> totals = ReadResults(children, job.iterations);
  if (!totals.ok()) {
    std::fprintf(stderr, "switchml run: FAILED: %s\n", totals.status().message().c_str());
    return 1;
  }
  const WorkerTotals& w = *totals;
  const double med = testing::Median(w.per_iteration);
  const double elems = static_cast<double>(job.size);
  const double per_allreduce = static_cast<double>(dc.received) / (job.warmup + job.iterations);
  const double eps = med > 0 ? elems / med : 0;
  const double algbw = med > 0 ? elems * 4 * 8 / med / 1e9 : 0;
  const double pps = med > 0 ? per_allreduce / med : 0;
  std::printf("\n%s", switch_reports.c_str());
  std::printf("\nswitchml run: OK: %u workers, %llu %s elements, every result %s\n", job.workers,
              static_cast<unsigned long long>(job.size), DataTypeName(job.dtype),
              job.verify ? "verified against the exact sum" : "NOT verified (--no-verify)");
  const auto [fastest, slowest] =
      std::minmax_element(w.per_iteration.begin(), w.per_iteration.end());
  std::printf("  tensor aggregation time (median of %u): %.6f s (min %.6f, max %.6f)\n",
              job.iterations, med, *fastest, *slowest);
  std::printf("  aggregated elements/s:                  %.4g\n", eps);
  std::printf("  algorithm bandwidth:                    %.3f Gbit/s (bus bandwidth %.3f)\n", algbw,
              algbw * 2 * (job.workers - 1) / job.workers);
  std::printf("  switch packets received/s:              %.4g (%.0f per all-reduce)\n", pps,
              per_allreduce);
  std::printf("  retransmissions:                        %llu (all workers, all iterations)\n",
              static_cast<unsigned long long>(w.retransmitted));
  std::printf(
      "  round trip (smoothed), timeout:         %.0f us, %.0f us (the largest of any "
      "worker at the end)\n",
      w.srtt_us, w.rto_us);
  if (job.auth_data) {
    std::printf(
        "  authenticated data plane:               on; tags that failed: %llu at the "
        "switch, %llu at the workers\n",
        static_cast<unsigned long long>(dc.auth_dropped),
        static_cast<unsigned long long>(w.auth_dropped));
  }
  if (job.sparse) {
    std::printf(
        "  block-sparse:                           the union was %.3g %% of the blocks (input "
        "density %g; %llu of %llu blocks, all workers and iterations)\n",
        100 * w.union_fraction(), job.density, static_cast<unsigned long long>(w.union_blocks),
        static_cast<unsigned long long>(w.sparse_blocks));
  }
  std::printf("  wall time:                              %.2f s\n", wall);
  if (!json.empty()) {
    const nlohmann::json summary = {{"workers", job.workers},
                                    {"size", job.size},
                                    {"dtype", DataTypeName(job.dtype)},
                                    {"loss", o.loss},
                                    {"iterations", job.iterations},
                                    {"threads", job.threads},
                                    {"pinned", job.pin_threads},
                                    {"window", job.window},
                                    {"packet_numel", job.packet_numel},
                                    {"switches", switches->daemons.size()},
                                    {"median_s", med},
                                    {"min_s", *fastest},
                                    {"max_s", *slowest},
                                    {"elements_per_s", eps},
                                    {"algbw_gbps", algbw},
                                    {"switch_rx_pps", pps},
                                    {"retransmitted", w.retransmitted},
                                    {"srtt_us", w.srtt_us},
                                    {"rto_us", w.rto_us},
                                    {"auth_data", job.auth_data},
                                    {"auth_dropped_switch", dc.auth_dropped},
                                    {"auth_dropped_workers", w.auth_dropped},
                                    {"sparse", job.sparse},
                                    {"sparse_auto", job.sparse_auto},
                                    {"density", job.density},
                                    {"overlap", job.overlap},
                                    {"union_fraction", job.sparse ? w.union_fraction() : 1.0},
                                    {"verified", job.verify}};
    std::ofstream f(json);
    f << summary.dump() << "\n";
    if (!f) {
      std::cerr << "switchml run: cannot write " << json << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace switchml::tools
