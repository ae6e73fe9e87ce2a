// `gloo_allreduce`: the baseline that puts SwitchML's throughput in context. One process of a
// Gloo CPU all-reduce (SUM, ring, TCP over loopback) on the same verifiable tensor as
// `switchml worker` (src/testing/pattern.h), measured the same way: fill the input, barrier,
// time one all-reduce with a steady clock, verify after the timer stops.
//
// scripts/bench.sh starts --workers of these (ranks 0..N-1) with a fresh --rendezvous directory
// and collects their GLOO_RESULT lines. Exit codes: 0 ok, 1 failure, 2 bad flags.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "flags.h"
#include "switchml/types.h"
#include "testing/pattern.h"

namespace {

using switchml::DataType;

constexpr char kUsage[] =
    "usage: gloo_allreduce --rank R --workers N --rendezvous DIR [flags]\n"
    "\n"
    "One process of a Gloo CPU all-reduce (SUM, TCP on 127.0.0.1) of the same verifiable\n"
    "tensor `switchml worker` uses; start N of them with ranks 0..N-1 and the same fresh,\n"
    "empty --rendezvous directory. Each all-reduce is preceded by a Gloo barrier, timed alone\n"
    "and verified after the timer stops.\n"
    "\n"
    "  --rank R             this process's rank, 0..N-1 (required)\n"
    "  --workers N          number of processes, 1..64 (default 2)\n"
    "  --size S             elements per all-reduce; suffix K, M, G = 2^10, 2^20, 2^30\n"
    "                       (default 1M)\n"
    "  --dtype T            float32 or int32 (default float32)\n"
    "  --iterations I       timed all-reduces (default 5)\n"
    "  --warmup W           untimed all-reduces before them (default 1)\n"
    "  --rendezvous DIR     an existing directory for Gloo's file store, fresh per run (required)\n"
    "  --seed X             seed of the input pattern (default 1, as switchml)\n"
    "  --packet-numel P     the pattern's block size (default 256, switchml's default, so the\n"
    "                       tensor is the same as `switchml run`'s)\n"
    "  --timeout-s T        fail when setup or any collective takes longer (default 60)\n"
    "  --no-verify          skip checking each result\n"
    "  --report             print `GLOO_RESULT rank=R status=ok times=t1,t2,...` on stdout\n"
    "  --quiet              no progress output (rank 0 prints progress on stderr)\n"
    "  --help               this text\n";

struct Options {
  int64_t rank = -1;
  int64_t workers = 2;
  uint64_t size = 1 << 20;
  DataType dtype = DataType::kFloat32;
  int64_t iterations = 5;
  int64_t warmup = 1;
  std::string rendezvous;
  uint64_t seed = 1;
  int64_t packet_numel = 256;
  int64_t timeout_s = 60;
  bool verify = true;
  bool report = false;
  bool quiet = false;
};

using switchml::tools::ParseSize;  // the same size syntax as switchml (64K, 16M, 1G)

bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

// Returns -1 when the flags are fine, else the exit code (0 after --help, 2 on an error).
int ParseFlags(int argc, char** argv, Options* o) {
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr, "gloo_allreduce: %s\n(see gloo_allreduce --help)\n", msg.c_str());
    return 2;
  };
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) return bad("unexpected argument '" + arg + "'");
    arg = arg.substr(2);
    if (arg == "report" || arg == "quiet" || arg == "no-verify") {
      values[arg] = "1";
      continue;
    }
    std::string value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return bad("--" + arg + " needs a value");
    }
    values[arg] = value;
  }
  for (const auto& [name, value] : values) {
    int64_t v = 0;
    auto int_in = [&](int64_t lo, int64_t hi, int64_t* out) {
      if (!ParseInt(value, &v) || v < lo || v > hi) return false;
      *out = v;
      return true;
    };
    auto range = [&](int64_t lo, int64_t hi) {
      return "--" + name + " must be an integer in " + std::to_string(lo) + ".." +
             std::to_string(hi) + ", not '" + value + "'";
    };
    if (name == "rank") {
      if (!int_in(0, 63, &o->rank)) return bad(range(0, 63));
    } else if (name == "workers") {
      if (!int_in(1, 64, &o->workers)) return bad(range(1, 64));
    } else if (name == "size") {
      if (!ParseSize(value, &o->size) || o->size == 0 || o->size > (uint64_t{1} << 32)) {
        return bad("--size must be 1..4G elements (a number, optionally with K, M or G), not '" +
                   value + "'");
      }
    } else if (name == "dtype") {
      if (!switchml::ParseDataType(value, &o->dtype))
        return bad("--dtype must be float32 or int32, not '" + value + "'");
    } else if (name == "iterations") {
      if (!int_in(1, 1000000, &o->iterations)) return bad(range(1, 1000000));
    } else if (name == "warmup") {
      if (!int_in(0, 1000000, &o->warmup)) return bad(range(0, 1000000));
    } else if (name == "rendezvous") {
      o->rendezvous = value;
    } else if (name == "seed") {
      int64_t s = 0;
      if (!int_in(0, INT64_MAX, &s)) return bad(range(0, INT64_MAX));
      o->seed = static_cast<uint64_t>(s);
    } else if (name == "packet-numel") {
      if (!int_in(1, 1 << 20, &o->packet_numel)) return bad(range(1, 1 << 20));
    } else if (name == "timeout-s") {
      if (!int_in(1, 86400, &o->timeout_s)) return bad(range(1, 86400));
    } else if (name == "report") {
      o->report = true;
    } else if (name == "quiet") {
      o->quiet = true;
    } else if (name == "no-verify") {
      o->verify = false;
    } else {
      return bad("unknown flag --" + name);
    }
  }
  if (o->rank < 0) return bad("--rank is required");
  if (o->rank >= o->workers) {
    return bad("--rank " + std::to_string(o->rank) + " is out of range: with --workers " +
               std::to_string(o->workers) + " use 0.." + std::to_string(o->workers - 1));
  }
  if (o->rendezvous.empty()) return bad("--rendezvous DIR is required (a fresh, empty directory)");
  struct stat st {};
  if (stat(o->rendezvous.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return bad("--rendezvous " + o->rendezvous + " is not an existing directory");
  }
  return -1;
}

// Gloo's FileStore::get() waits for a key with the store's fixed default timeout (30 s); this
// store waits with ours first, so a missing peer fails setup after --timeout-s with a clear
// message instead of Gloo's default.
class TimedStore : public gloo::rendezvous::Store {
 public:
  TimedStore(const std::string& dir, std::chrono::milliseconds timeout)
      : inner_(dir), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    inner_.wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }

 private:
  gloo::rendezvous::FileStore inner_;
  std::chrono::milliseconds timeout_;
};

// Ends the process when setup has not finished within the deadline, whatever Gloo is blocked
// in (a last resort: Gloo's own timeouts should fire first).
class SetupWatchdog {
 public:
  SetupWatchdog(std::chrono::seconds deadline, std::string who)
      : thread_([this, deadline, who = std::move(who)] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, deadline, [this] { return done_; })) {
            std::fprintf(stderr,
                         "%s: FAILED: setup did not finish within %lld s (is every rank "
                         "running with the same --rendezvous directory?)\n",
                         who.c_str(), static_cast<long long>(deadline.count()));
            std::fflush(stderr);
            std::_Exit(1);
          }
        }) {}
  ~SetupWatchdog() { Done(); }
  void Done() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Checks a float32 sum computed by Gloo in float32: the exact sum is accumulated in float64 over
// every rank's input (FillInput, one rank at a time into `scratch`) and the result must be within
// the float32 rounding of N - 1 additions, bounded generously by (N + 1) 2^-24 sum_r |x_r[i]|.
// `expected` and `magnitude` are caller-owned float64 buffers of `count` elements.
std::string VerifyFloatSum(const switchml::testing::Pattern& p, const float* got, size_t count,
                           float* scratch, double* expected, double* magnitude) {
  std::fill(expected, expected + count, 0.0);
  std::fill(magnitude, magnitude + count, 0.0);
  for (uint32_t r = 0; r < p.num_workers; ++r) {
    switchml::testing::FillInput(p, r, scratch, count);
    for (size_t i = 0; i < count; ++i) {
      expected[i] += scratch[i];
      magnitude[i] += std::fabs(static_cast<double>(scratch[i]));
    }
  }
  const double rel = static_cast<double>(p.num_workers + 1) * std::ldexp(1.0, -24);
  const double tiny = std::ldexp(1.0, -149);  // float32's smallest subnormal
  size_t bad = 0, first = 0;
  double max_error = 0;
  for (size_t i = 0; i < count; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - expected[i]);
    if (!(err <= rel * magnitude[i] + tiny)) {  // NaN fails too
      if (bad++ == 0) first = i;
    }
    if (err > max_error) max_error = err;
  }
  if (bad == 0) return "";
  std::ostringstream s;
  s.precision(10);
  s << bad << " of " << count << " elements wrong; first at index " << first << ": got "
    << got[first] << ", expected " << expected[first] << " (allowed error "
    << rel * magnitude[first] + tiny << ")";
  return s.str();
}

int Run(const Options& o) {
  const std::string who = "gloo_allreduce (rank " + std::to_string(o.rank) + ")";
  const bool progress = !o.quiet && o.rank == 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "%s: FAILED: %s\n", who.c_str(), what.c_str());
    if (o.report)
      std::printf("GLOO_RESULT rank=%lld status=error\n", static_cast<long long>(o.rank));
    std::fflush(stdout);
    return 1;
  };
  const auto timeout = std::chrono::milliseconds(o.timeout_s * 1000);
  const auto count = static_cast<size_t>(o.size);

  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    // Setup: TCP device on loopback, rendezvous through the file store, full mesh of pairs.
    SetupWatchdog watchdog(std::chrono::seconds(o.timeout_s + 15), who);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    TimedStore store(o.rendezvous, timeout);
    context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(o.rank),
                                                          static_cast<int>(o.workers));
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
    watchdog.Done();
  } catch (const std::exception& e) {
    return fail("setup failed (rendezvous in " + o.rendezvous + ", TCP on 127.0.0.1, " +
                std::to_string(o.timeout_s) + " s timeout; are all " + std::to_string(o.workers) +
                " ranks running with this --rendezvous?): " + e.what());
  }
  if (progress) {
    std::fprintf(stderr, "%s: connected to %lld peers; %llu %s elements per all-reduce\n",
                 who.c_str(), static_cast<long long>(o.workers - 1),
                 static_cast<unsigned long long>(o.size), switchml::DataTypeName(o.dtype));
  }

  // Buffers allocated and touched once, before anything is timed.
  std::vector<uint32_t> in(count, 1), out(count, 1);
  std::vector<double> expected, magnitude;
  if (o.verify && o.dtype == DataType::kFloat32) {
    expected.assign(count, 1.0);
    magnitude.assign(count, 1.0);
  }

  switchml::testing::Pattern pattern;
  pattern.seed = o.seed;
  pattern.num_workers = static_cast<uint32_t>(o.workers);
  pattern.packet_numel = static_cast<uint32_t>(o.packet_numel);
  pattern.dtype = o.dtype;
  using ReduceFn = void (*)(void*, const void*, const void*, size_t);
  std::vector<double> times;
  const int64_t total = o.warmup + o.iterations;
  for (int64_t it = 0; it < total; ++it) {
    pattern.iteration = static_cast<uint32_t>(it);
    switchml::testing::FillInput(pattern, static_cast<uint32_t>(o.rank), in.data(), count);
    double secs = 0;
    try {
      gloo::AllreduceOptions opts(context);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTimeout(timeout);
      if (o.dtype == DataType::kFloat32) {
        opts.setInput(reinterpret_cast<float*>(in.data()), count);
        opts.setOutput(reinterpret_cast<float*>(out.data()), count);
        opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
      } else {
        opts.setInput(reinterpret_cast<int32_t*>(in.data()), count);
        opts.setOutput(reinterpret_cast<int32_t*>(out.data()), count);
        opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<int32_t>));
      }
      gloo::BarrierOptions barrier(context);
      barrier.setTimeout(timeout);
      gloo::barrier(barrier);
      const auto t0 = std::chrono::steady_clock::now();
      gloo::allreduce(opts);
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } catch (const std::exception& e) {
      return fail("all-reduce " + std::to_string(it) + " failed: " + e.what());
    }
    std::string verdict = "not verified";
    if (o.verify) {
      if (o.dtype == DataType::kInt32) {
        // int32 sums wrap around in Gloo as in switchml: the check is exact.
        auto v = switchml::testing::Verify(pattern, out.data(), count);
        if (!v.ok())
          return fail("all-reduce " + std::to_string(it) + " gave a wrong result: " + v.ToString());
      } else {
        // The input of this iteration is spent: reuse its buffer as scratch.
        std::string err =
            VerifyFloatSum(pattern, reinterpret_cast<const float*>(out.data()), count,
                           reinterpret_cast<float*>(in.data()), expected.data(), magnitude.data());
        if (!err.empty())
          return fail("all-reduce " + std::to_string(it) + " gave a wrong result: " + err);
      }
      verdict = "verified";
    }
    const bool warm = it < o.warmup;
    if (!warm) times.push_back(secs);
    if (progress) {
      std::fprintf(stderr, "%s: %s %lld/%lld: %.4f s, %.3g elements/s, %s\n", who.c_str(),
                   warm ? "warm-up" : "iteration",
                   static_cast<long long>(warm ? it + 1 : it - o.warmup + 1),
                   static_cast<long long>(warm ? o.warmup : o.iterations), secs,
                   secs > 0 ? static_cast<double>(count) / secs : 0.0, verdict.c_str());
    }
  }
  if (progress) {
    const double med = Median(times);
    std::fprintf(stderr, "%s: median %.4f s over %lld iterations: %.4g elements/s (this rank)\n",
                 who.c_str(), med, static_cast<long long>(o.iterations),
                 med > 0 ? static_cast<double>(count) / med : 0.0);
  }
  if (o.report) {
    std::ostringstream line;
    line << "GLOO_RESULT rank=" << o.rank << " status=ok verified=" << (o.verify ? 1 : 0)
         << " times=";
    for (size_t i = 0; i < times.size(); ++i) line << (i ? "," : "") << times[i];
    std::printf("%s\n", line.str().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int code = ParseFlags(argc, argv, &o); code >= 0) return code;
  try {
    return Run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce (rank %lld): FAILED: %s\n", static_cast<long long>(o.rank),
                 e.what());
    if (o.report)
      std::printf("GLOO_RESULT rank=%lld status=error\n", static_cast<long long>(o.rank));
    return 1;
  }
}
