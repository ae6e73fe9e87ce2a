// `switchml worker`: one worker of a job, against a switch that runs elsewhere (or locally).
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/logging.h"
#include "base/status_macros.h"
#include "commands.h"
#include "flags.h"
#include "metrics/context_metrics.h"
#include "metrics/metrics_server.h"
#include "proto/wire.h"
#include "switchml/context.h"
#include "testing/measure.h"
#include "testing/pattern.h"
#include "transport/address.h"
#include "transport/environment.h"
#include "transport/factory.h"
#include "transport/shm.h"

namespace switchml::tools {
namespace {

// SIGINT and SIGTERM while a worker runs: a thread of its own waits for them (they are blocked
// in every thread), and on one stops the process at once, whatever the worker is blocked in
// (setup, a barrier, an all-reduce): it says so, removes the files its shm transports hold
// (inboxes, groups of its own; nothing else would), prints the --report line and exits 1, as
// an interrupted `switchml run` does. Its control connection ends with the process: the switch
// fails the job on the other workers, naming this rank. Construct before any other thread.
class StopOnSignal {
 public:
  StopOnSignal(std::string who, bool report, long long rank, bool shm)
      : who_(std::move(who)), report_(report), rank_(rank), shm_(shm) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] { Run(); });
  }
  // Ends the waiting thread (by a SIGTERM to it alone, which it takes as the end).
  ~StopOnSignal() {
    stopping_.store(true);
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

 private:
  void Run() {
    int sig = 0;
    while (sigwait(&set_, &sig) != 0) {
    }
    if (stopping_.load()) return;
    std::fprintf(stderr, "%s: interrupted (%s): stopping\n", who_.c_str(),
                 sig == SIGINT ? "SIGINT" : "SIGTERM");
    if (shm_) transport::RemoveOwnShmFiles(transport::DefaultShmDirectory());
    if (report_) std::printf("SWITCHML_RESULT rank=%lld status=error\n", rank_);
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(1);
  }

  const std::string who_;
  const bool report_;
  const long long rank_;
  const bool shm_;
  sigset_t set_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// --metrics-linger: after the job, waits until the counters have been scraped once more than
// `scrapes` counted at the call, or `max_seconds` have passed.
void LingerForScrape(const std::atomic<uint64_t>& scrapes, int64_t max_seconds) {
  if (max_seconds <= 0) return;
  const uint64_t seen = scrapes.load(std::memory_order_relaxed);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(max_seconds);
  while (scrapes.load(std::memory_order_relaxed) == seen &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The command's flags as given (DefineWorkerFlags binds them).
struct WorkerFlags {
  std::string switches = "127.0.0.1";
  int64_t rank = 0;
  JobFlags job;
  int64_t session = 0;
  std::string bind = "0.0.0.0";
  int64_t udp_port = 0;
  std::string job_secret;
  TlsClientFlags tls;
  int64_t metrics_port = -1;
  std::string metrics_bind = "127.0.0.1";
  int64_t metrics_linger = 0;
  bool report = false;
  bool quiet = false;
  std::string log_level = "warning";
};

void DefineWorkerFlags(Flags* flags, WorkerFlags* f) {
  flags->Add("switch", &f->switches,
             "the switch's control plane, HOST[:PORT] (port 50099); or a comma-separated list "
             "HOST[:PORT],HOST[:PORT],... to stripe the job over several switch hosts (every "
             "worker lists the same hosts in the same order; docs/deployment.md)");
  flags->Add("rank", &f->rank, "this worker's rank, 0..workers-1");
  AddJobFlags(flags, &f->job);
  flags->Add("session", &f->session,
             "job id on the switch; concurrent jobs need different ids "
             "(0 = rank 0 picks one)");
  flags->Add("bind", &f->bind, "local IPv4 address for the data-plane sockets");
  flags->Add("udp-port", &f->udp_port, "first local UDP port (0 = pick free ones)");
  flags->Add("job-secret", &f->job_secret,
             "the job's secret, the same on every worker (default: $SWITCHML_JOB_SECRET; "
             "none: an unprotected job)");
  AddTlsClientFlags(flags, &f->tls);
  flags->Add("metrics-port", &f->metrics_port,
             "serve this worker's counters as Prometheus metrics on "
             "http://METRICS-BIND:N/metrics while the job runs (0 = pick a port; -1 = off)");
  flags->Add("metrics-bind", &f->metrics_bind, "IPv4 address of the metrics endpoint");
  flags->Add("metrics-linger", &f->metrics_linger,
             "after the job, keep serving the metrics until they have been scraped once more, "
             "at most this many seconds (so a scraper sees a short job's final counters)");
  flags->Add("report", &f->report, "print a machine-readable SWITCHML_RESULT line on stdout");
  flags->Add("quiet", &f->quiet, "no progress output");
  flags->Add("log-level", &f->log_level, "debug, info, warning, error or off");
}

// What the worker's own flags (beyond the job's) ask for, checked.
struct WorkerOptions {
  std::vector<Endpoint> switches;
  int64_t rank = 0;
  uint16_t udp_port = 0;
  bool quiet = false;
  bool report = false;
  std::string who;  // "switchml worker (rank R)": the prefix of every message
};

// Reads the flags WorkerFlags added beyond the job's; an error says which flag is wrong.
Result<WorkerOptions> ReadWorkerFlags(const WorkerFlags& flags, const JobOptions& job) {
  WorkerOptions o;
  ASSIGN_OR_RETURN(o.switches, ParseSwitchList(flags.switches));
  o.rank = flags.rank;
  if (o.rank < 0 || o.rank >= job.workers) {
    return InvalidArgumentError("--rank " + std::to_string(o.rank) +
                                " is out of range: with --workers " + std::to_string(job.workers) +
                                " use 0.." + std::to_string(job.workers - 1));
  }
  const int64_t udp_port = flags.udp_port;
  if (udp_port < 0 || udp_port > 65535) {
    return InvalidArgumentError("--udp-port must be in 0..65535 (0 = pick free ports)");
  }
  o.udp_port = static_cast<uint16_t>(udp_port);
  if (flags.session < 0) {
    return InvalidArgumentError("--session must be a non-negative job id");
  }
  o.quiet = flags.quiet;
  o.report = flags.report;
  o.who = "switchml worker (rank " + std::to_string(o.rank) + ")";
  return o;
}

// The context's Config from the flags; warns (unless --quiet) when the job has no secret.
Config MakeConfig(const WorkerFlags& flags, const JobOptions& job, const WorkerOptions& w) {
  Config config;
  config.rank = static_cast<uint32_t>(w.rank);
  config.num_workers = job.workers;
  if (w.switches.size() == 1) {
    config.switch_host = Ipv4ToString(w.switches[0].ipv4);
    config.control_port = w.switches[0].port;
  } else {
    for (const Endpoint& e : w.switches) config.switch_hosts.push_back(e.ToString());
  }
  config.session_id = static_cast<uint64_t>(flags.session);
  config.num_worker_threads = job.threads;
  config.packet_numel = job.packet_numel;
  config.bind_address = flags.bind;
  config.udp_port = w.udp_port;
  config.transport = job.transport;
  config.wait = job.wait;
  config.pin_threads = job.pin_threads;
  config.loopback_multicast = job.loopback_multicast;
  config.lan_multicast = job.lan_multicast;
  config.lan_multicast_required = job.lan_multicast_required;
  config.check_tensors = job.tensor_check;
  config.authenticate_data = job.auth_data;
  config.sparse = job.sparse;
  config.sparse_auto = job.sparse_auto;
  config.retransmit.peer_timeout = std::chrono::milliseconds(job.peer_timeout_ms);
  config.setup_timeout = std::chrono::milliseconds(job.setup_timeout_ms);
  ApplyPacingOptions(job, &config);
  config.job_secret = flags.job_secret;
  if (config.job_secret.empty()) {
    if (const char* env = std::getenv("SWITCHML_JOB_SECRET")) config.job_secret = env;
  }
  if (config.job_secret.empty() && !w.quiet) {
    std::fprintf(stderr,
                 "%s: warning: no job secret (--job-secret or SWITCHML_JOB_SECRET): anyone who "
                 "reaches the switch's control port can disturb this job\n",
                 w.who.c_str());
  }
  config.tls_ca_file = flags.tls.ca;
  config.tls_cert_file = flags.tls.cert;
  config.tls_key_file = flags.tls.key;
  config.tls_server_name = flags.tls.server_name;
  return config;
}

// --metrics-port: serves `ctx`'s counters, counting the scrapes in `scrapes` (for
// --metrics-linger); nullptr when the flag is -1 (off).
Result<std::unique_ptr<metrics::MetricsServer>> StartMetrics(
    const WorkerFlags& flags, Context* ctx, std::shared_ptr<std::atomic<uint64_t>> scrapes) {
  const int64_t port = flags.metrics_port;
  if (port < 0) return std::unique_ptr<metrics::MetricsServer>();
  if (port > 65535) return InvalidArgumentError("--metrics-port must be in 0..65535");
  return metrics::MetricsServer::Start(
      {flags.metrics_bind, static_cast<uint16_t>(port)},
      {metrics::ContextStatsCollector([ctx, scrapes = std::move(scrapes)] {
         scrapes->fetch_add(1, std::memory_order_relaxed);
         return ctx->stats();
       }),
       metrics::ProcessCollector()});
}

// The seconds and process CPU seconds of each timed (not warm-up) all-reduce.
struct Timings {
  std::vector<double> times, cpu_times;
};

// A step that failed: what the worker was doing, and why.
struct Failure {
  std::string what;
  Status status;
};

// The job's --warmup + --iterations all-reduces of the verifiable pattern, each after a
// barrier, with a progress line each (unless --quiet); `in` and `out` hold job.size elements.
std::optional<Failure> RunIterations(Context& ctx, const JobOptions& job, const WorkerOptions& w,
                                     std::vector<uint8_t>& in, std::vector<uint8_t>& out,
                                     Timings* timings) {
  testing::Pattern pattern;
  pattern.seed = job.seed;
  pattern.num_workers = job.workers;
  pattern.packet_numel = job.packet_numel;
  pattern.dtype = job.dtype;
  pattern.density = job.density;
  pattern.overlap = job.overlap;
  const uint32_t total = job.warmup + job.iterations;
  for (uint32_t it = 0; it < total; ++it) {
    pattern.iteration = it;
    testing::FillInput(pattern, static_cast<uint32_t>(w.rank), in.data(), job.size);
    Status b = ctx.Barrier();
    if (!b.ok()) return Failure{"barrier before iteration " + std::to_string(it) + " failed", b};
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = testing::ProcessCpuSeconds();
    Status r = ctx.AllReduce(in.data(), out.data(), job.size, job.dtype);
    const double cpu = testing::ProcessCpuSeconds() - cpu0;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r.ok()) return Failure{"all-reduce " + std::to_string(it) + " failed", r};
    std::string verdict = "not verified";
    if (job.verify) {
      testing::VerifyResult v = testing::Verify(pattern, out.data(), job.size);
      if (!v.ok()) {
        return Failure{"all-reduce " + std::to_string(it) + " gave a wrong result",
                       InternalError(v.ToString())};
      }
      verdict = "verified";
    }
    const bool warm = it < job.warmup;
    if (!warm) {
      timings->times.push_back(secs);
      timings->cpu_times.push_back(cpu);
    }
    if (!w.quiet) {
      std::fprintf(stderr, "%s: %s %u/%u: %.4f s, %.3g elements/s, %s\n", w.who.c_str(),
                   warm ? "warm-up" : "iteration", warm ? it + 1 : it - job.warmup + 1,
                   warm ? job.warmup : job.iterations, secs,
                   secs > 0 ? static_cast<double>(job.size) / secs : 0.0, verdict.c_str());
    }
  }
  return std::nullopt;
}

// The summary on stderr: the median and the counters, and the block-sparse figures of a
// --sparse job.
void PrintSummary(const std::string& who, const JobOptions& job, const ContextStats& s,
                  const Timings& timings) {
  const double med = testing::Median(timings.times);
  std::fprintf(
      stderr,
      "%s: median %.4f s over %u iterations: %.4g elements/s, algorithm bandwidth "
      "%.3f Gbit/s; %llu packets sent, %llu retransmitted; round trip %.0f us "
      "(variation %.0f us), timeout %.0f us\n",
      who.c_str(), med, job.iterations, med > 0 ? job.size / med : 0.0,
      med > 0 ? job.size * 32.0 / med / 1e9 : 0.0, static_cast<unsigned long long>(s.packets_sent),
      static_cast<unsigned long long>(s.packets_retransmitted), s.srtt_us, s.rttvar_us, s.rto_us);
  if (!job.sparse) return;
  std::fprintf(stderr,
               "%s: block-sparse: the union was %.3g%% of the blocks (%llu of %llu, every "
               "all-reduce), %llu of them non-zero here; %llu blocks aggregated, %llu "
               "thread shares dense\n",
               who.c_str(),
               s.sparse_blocks > 0 ? 100.0 * static_cast<double>(s.sparse_union_blocks) /
                                         static_cast<double>(s.sparse_blocks)
                                   : 0.0,
               static_cast<unsigned long long>(s.sparse_union_blocks),
               static_cast<unsigned long long>(s.sparse_blocks),
               static_cast<unsigned long long>(s.sparse_own_blocks),
               static_cast<unsigned long long>(s.sparse_aggregated_blocks),
               static_cast<unsigned long long>(s.sparse_dense_shares));
}

// --report: the SWITCHML_RESULT line of a job that succeeded, on stdout.
void PrintReport(int64_t rank, const JobOptions& job, const ContextStats& s,
                 const Timings& timings) {
  std::ostringstream line;
  line << "SWITCHML_RESULT rank=" << rank << " status=ok verified=" << (job.verify ? 1 : 0)
       << " sent=" << s.packets_sent << " retransmitted=" << s.packets_retransmitted
       << " srtt_us=" << s.srtt_us << " rto_us=" << s.rto_us
       << " foreign_dropped=" << s.foreign_source_dropped << " auth_dropped=" << s.auth_dropped
       << " received=" << s.datagrams_received << " group_received=" << s.group_datagrams_received
       << " coalesced=" << s.coalesced_receives;
  if (job.sparse) {
    line << " sparse_blocks=" << s.sparse_blocks << " own_blocks=" << s.sparse_own_blocks
         << " union_blocks=" << s.sparse_union_blocks;
  }
  line << " times=";
  for (size_t i = 0; i < timings.times.size(); ++i) line << (i ? "," : "") << timings.times[i];
  // CPU seconds of this whole process (all its threads) during each timed all-reduce.
  line << " cpu=";
  for (size_t i = 0; i < timings.cpu_times.size(); ++i) {
    line << (i ? "," : "") << timings.cpu_times[i];
  }
  std::printf("%s\n", line.str().c_str());
  std::fflush(stdout);
}

}  // namespace

int WorkerCommand(const std::vector<std::string>& args) {
  Flags parser("worker",
               "Runs one worker of a SwitchML job: joins the job through the switch's control\n"
               "plane, all-reduces a verifiable tensor --iterations times and checks every\n"
               "result against the exact sum. Start one per host with the same flags and\n"
               "ranks 0..N-1.");
  WorkerFlags flags;
  DefineWorkerFlags(&parser, &flags);
  JobOptions job;
  if (int code = ParseCommandLine("worker", args, &parser, flags.log_level, &flags.job, &job);
      code >= 0) {
    return code;
  }
  Result<WorkerOptions> read = ReadWorkerFlags(flags, job);
  if (!read.ok()) {
    std::cerr << "switchml worker: " << read.status().message() << "\n";
    return 2;
  }
  const WorkerOptions& w = *read;
  auto fail = [&w](const std::string& what, const Status& s) {
    std::cerr << w.who << ": " << what << ": " << s.ToString() << "\n";
    if (w.report)
      std::printf("SWITCHML_RESULT rank=%lld status=error\n", static_cast<long long>(w.rank));
    std::fflush(stdout);
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  };
  const Config config = MakeConfig(flags, job, w);

  // Buffers allocated and touched once, before the job is joined (a worker that cannot hold its
  // tensor says so at once instead of aborting mid-job with std::bad_alloc) and before anything
  // is timed.
  const size_t bytes = std::max<size_t>(4, job.size * 4);  // job.size <= kMaxJobSize: no wrap
  std::vector<uint8_t> in, out;
  try {
    in.assign(bytes, 1);
    out.assign(bytes, 1);
  } catch (const std::bad_alloc&) {
    return fail(
        "cannot allocate the tensors",
        InvalidArgumentError("2 buffers of " + std::to_string(bytes) + " bytes for --size " +
                             std::to_string(job.size) + ": use a smaller --size"));
  }

  const StopOnSignal stop_on_signal(
      w.who, w.report, static_cast<long long>(w.rank),
      transport::CapabilitiesOf(config.transport).files_outlive_processes);
  auto ctx = Context::Create(config);
  if (!ctx.ok()) return fail("setup failed", ctx.status());
  // Scrapes of this worker's counters so far (for --metrics-linger).
  auto scrapes = std::make_shared<std::atomic<uint64_t>>(0);
  auto started = StartMetrics(flags, ctx->get(), scrapes);
  if (!started.ok()) return fail("cannot serve metrics", started.status());
  // (destroyed before the context)
  const std::unique_ptr<metrics::MetricsServer> metrics_server = std::move(started).value();
  if (metrics_server != nullptr && !w.quiet)
    std::fprintf(stderr, "%s: metrics on %s\n", w.who.c_str(), metrics_server->url().c_str());
  if (!w.quiet) {
    std::fprintf(stderr,
                 "%s: joined session %llu with %u workers; %llu %s elements per all-reduce\n",
                 w.who.c_str(), static_cast<unsigned long long>((*ctx)->session_id()), job.workers,
                 static_cast<unsigned long long>(job.size), DataTypeName(job.dtype));
  }

  Timings timings;
  if (auto f = RunIterations(**ctx, job, w, in, out, &timings)) return fail(f->what, f->status);
  const ContextStats s = (*ctx)->stats();
  if (!w.quiet) PrintSummary(w.who, job, s, timings);
  if (w.report) PrintReport(w.rank, job, s, timings);
  if (metrics_server != nullptr) LingerForScrape(*scrapes, flags.metrics_linger);
  return 0;
}

}  // namespace switchml::tools
