#include "baseline.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <sstream>

#include "testing/measure.h"
#include "testing/pattern.h"

namespace switchml::bench {
namespace {

// Checks a float32 sum computed in float32 by the baseline (not quantized, so the closed-form
// check of testing::Verify, whose bound is switchml's quantization error, does not apply): the
// exact sum is accumulated in float64 over every rank's input (FillInput, one rank at a time into
// `scratch`) and the result must be within the float32 rounding of N - 1 additions, bounded
// generously by (N + 1) 2^-24 sum_r |x_r[i]|. `expected` and `magnitude` are caller-owned
// float64 buffers of `count` elements.
std::string VerifyFloatSum(const testing::Pattern& p, const float* got, size_t count,
                           float* scratch, double* expected, double* magnitude) {
  std::fill(expected, expected + count, 0.0);
  std::fill(magnitude, magnitude + count, 0.0);
  for (uint32_t r = 0; r < p.num_workers; ++r) {
    testing::FillInput(p, r, scratch, count);
    for (size_t i = 0; i < count; ++i) {
      expected[i] += scratch[i];
      magnitude[i] += std::fabs(static_cast<double>(scratch[i]));
    }
  }
  const double rel = static_cast<double>(p.num_workers + 1) * std::ldexp(1.0, -24);
  const double tiny = std::ldexp(1.0, -149);  // float32's smallest subnormal
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < count; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - expected[i]);
    if (!(err <= rel * magnitude[i] + tiny) && bad++ == 0) first = i;  // NaN fails too
  }
  if (bad == 0) return "";
  std::ostringstream s;
  s.precision(10);
  s << bad << " of " << count << " elements wrong; first at index " << first << ": got "
    << got[first] << ", expected " << expected[first] << " (allowed error "
    << rel * magnitude[first] + tiny << ")";
  return s.str();
}

std::string Join(const std::vector<double>& v) {
  std::ostringstream s;
  s.precision(9);
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}

}  // namespace

void AddBaselineFlags(tools::Flags* flags, BaselineFlags* f, bool with_rank) {
  if (with_rank) {
    flags->Add("rank", &f->rank, "this process's rank, 0..workers-1 (required)");
    flags->Add("workers", &f->workers, "number of processes, 1..64");
  }
  flags->Add("size", &f->size, "elements per all-reduce (suffix K, M, G = 2^10, 2^20, 2^30)");
  flags->Add("dtype", &f->dtype, "element type: float32 or int32");
  flags->Add("iterations", &f->iterations, "timed all-reduces");
  flags->Add("warmup", &f->warmup, "untimed all-reduces before them");
  flags->Add("seed", &f->seed, "seed of the verifiable input pattern (as switchml)");
  flags->Add("packet-numel", &f->packet_numel,
             "the pattern's block size (switchml's default, so the tensor is the same)");
  flags->Add("timeout-s", &f->timeout_s, "fail when setup or any collective takes longer");
  flags->Add("no-verify", &f->no_verify, "skip checking each result");
  flags->Add("report", &f->report, "print a BENCH_RESULT line on stdout");
  flags->Add("quiet", &f->quiet, "no progress output (rank 0 prints progress on stderr)");
}

int ParseBaselineFlags(int argc, char** argv, const std::string& program, bool with_rank,
                       tools::Flags* flags, const BaselineFlags& f, BaselineOptions* o) {
  auto bad = [&](const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n(see %s --help)\n", program.c_str(), msg.c_str(),
                 program.c_str());
    return 2;
  };
  bool help = false;
  Status st = flags->Parse(std::vector<std::string>(argv + 1, argv + argc), &help);
  if (!st.ok()) return bad(st.message());
  if (help) {
    std::fputs(flags->Usage().c_str(), stdout);
    return 0;
  }
  auto in_range = [&](const char* name, int64_t v, int64_t lo, int64_t hi, int64_t* out) {
    if (v < lo || v > hi) {
      bad("--" + std::string(name) + " must be in " + std::to_string(lo) + ".." +
          std::to_string(hi) + ", not " + std::to_string(v));
      return false;
    }
    *out = v;
    return true;
  };
  if (with_rank) {
    if (!in_range("workers", f.workers, 1, 64, &o->workers)) return 2;
    if (!flags->WasSet(&f.rank)) return bad("--rank is required");
    if (!in_range("rank", f.rank, 0, o->workers - 1, &o->rank)) return 2;
  }
  o->size = f.size.value;
  if (o->size == 0 || o->size > (uint64_t{1} << 32)) return bad("--size must be 1..4G elements");
  if (!ParseDataType(f.dtype, &o->dtype))
    return bad("--dtype must be float32 or int32, not '" + f.dtype + "'");
  int64_t seed = 0;
  if (!in_range("iterations", f.iterations, 1, 1000000, &o->iterations) ||
      !in_range("warmup", f.warmup, 0, 1000000, &o->warmup) ||
      !in_range("seed", f.seed, 0, INT64_MAX, &seed) ||
      !in_range("packet-numel", f.packet_numel, 1, 1 << 20, &o->packet_numel) ||
      !in_range("timeout-s", f.timeout_s, 1, 86400, &o->timeout_s)) {
    return 2;
  }
  o->seed = static_cast<uint64_t>(seed);
  o->verify = !f.no_verify;
  o->report = f.report;
  o->quiet = f.quiet;
  return -1;
}

int RunBaseline(const BaselineOptions& o, const std::string& who, const Collective& c) {
  const bool progress = !o.quiet && o.rank == 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "%s: FAILED: %s\n", who.c_str(), what.c_str());
    if (o.report)
      std::printf("BENCH_RESULT rank=%lld status=error\n", static_cast<long long>(o.rank));
    std::fflush(stdout);
    return 1;
  };
  const auto count = static_cast<size_t>(o.size);
  // Buffers allocated and touched once, before anything is timed.
  std::vector<uint32_t> in(count, 1), out(count, 1);
  std::vector<double> expected, magnitude;
  if (o.verify && o.dtype == DataType::kFloat32) {
    expected.assign(count, 1.0);
    magnitude.assign(count, 1.0);
  }
  testing::Pattern pattern;
  pattern.seed = o.seed;
  pattern.num_workers = static_cast<uint32_t>(o.workers);
  pattern.packet_numel = static_cast<uint32_t>(o.packet_numel);
  pattern.dtype = o.dtype;
  std::vector<double> times, cpu;
  const int64_t total = o.warmup + o.iterations;
  for (int64_t it = 0; it < total; ++it) {
    pattern.iteration = static_cast<uint32_t>(it);
    testing::FillInput(pattern, static_cast<uint32_t>(o.rank), in.data(), count);
    double secs = 0, cpu_secs = 0;
    try {
      if (c.prepare) c.prepare(in.data(), out.data(), count);
      c.barrier();
      const double c0 = testing::ProcessCpuSeconds();
      const auto t0 = std::chrono::steady_clock::now();
      c.allreduce(in.data(), out.data(), count);
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      cpu_secs = testing::ProcessCpuSeconds() - c0;
    } catch (const std::exception& e) {
      return fail("all-reduce " + std::to_string(it) + " failed: " + e.what());
    }
    std::string verdict = "not verified";
    if (o.verify) {
      std::string err;
      if (o.dtype == DataType::kInt32) {
        // int32 sums wrap around here as in switchml: the closed-form check is exact.
        auto v = testing::Verify(pattern, out.data(), count);
        if (!v.ok()) err = v.ToString();
      } else {
        // The input of this iteration is spent: its buffer is the scratch.
        err =
            VerifyFloatSum(pattern, reinterpret_cast<const float*>(out.data()), count,
                           reinterpret_cast<float*>(in.data()), expected.data(), magnitude.data());
      }
      if (!err.empty())
        return fail("all-reduce " + std::to_string(it) + " gave a wrong result: " + err);
      verdict = "verified";
    }
    const bool warm = it < o.warmup;
    if (!warm) {
      times.push_back(secs);
      cpu.push_back(cpu_secs);
    }
    if (progress) {
      std::fprintf(stderr, "%s: %s %lld/%lld: %.4f s, %.3g elements/s, %s\n", who.c_str(),
                   warm ? "warm-up" : "iteration",
                   static_cast<long long>(warm ? it + 1 : it - o.warmup + 1),
                   static_cast<long long>(warm ? o.warmup : o.iterations), secs,
                   secs > 0 ? static_cast<double>(count) / secs : 0.0, verdict.c_str());
    }
  }
  if (progress) {
    const double med = testing::Median(times);
    std::fprintf(stderr, "%s: median %.4f s over %lld iterations: %.4g elements/s (this rank)\n",
                 who.c_str(), med, static_cast<long long>(o.iterations),
                 med > 0 ? static_cast<double>(count) / med : 0.0);
  }
  if (o.report) {
    std::printf("BENCH_RESULT rank=%lld status=ok verified=%d times=%s cpu=%s\n",
                static_cast<long long>(o.rank), o.verify ? 1 : 0, Join(times).c_str(),
                Join(cpu).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace switchml::bench
