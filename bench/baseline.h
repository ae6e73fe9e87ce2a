// What the baseline all-reduce programs (gloo_allreduce, mpi_allreduce) share with each other
// and with `switchml worker`: the same flags, the same verifiable input (src/testing/pattern.h),
// the same measurement (fill the input, barrier, time one all-reduce with a steady clock and the
// process CPU clock, verify after both clocks stop) and one result line for bench/bench.py:
//
//   BENCH_RESULT rank=R status=ok verified=1 times=t1,t2,... cpu=c1,c2,...
//
// times are wall seconds of the timed all-reduces, cpu the CPU seconds this process (all its
// threads) spent in each of them. Not thread-safe; one benchmark per process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flags.h"
#include "switchml/types.h"

namespace switchml::bench {

struct BaselineOptions {
  int64_t rank = 0;
  int64_t workers = 1;
  uint64_t size = 1 << 20;
  DataType dtype = DataType::kFloat32;
  int64_t iterations = 5;
  int64_t warmup = 1;
  uint64_t seed = 1;
  int64_t packet_numel = 256;
  int64_t timeout_s = 60;
  bool verify = true;
  bool report = false;
  bool quiet = false;
};

// The shared flags as given (AddBaselineFlags binds them; ParseBaselineFlags checks them).
struct BaselineFlags {
  int64_t rank = -1;
  int64_t workers = 2;
  tools::Size size{1 << 20};
  std::string dtype = "float32";
  int64_t iterations = 5;
  int64_t warmup = 1;
  int64_t seed = 1;
  int64_t packet_numel = 256;
  int64_t timeout_s = 60;
  bool no_verify = false;
  bool report = false;
  bool quiet = false;
};

// Binds the shared flags (--size, --dtype, --iterations, --warmup, --seed, --packet-numel,
// --timeout-s, --no-verify, --report, --quiet; --rank and --workers when with_rank) to *f.
void AddBaselineFlags(tools::Flags* flags, BaselineFlags* f, bool with_rank);

// Parses argv[1..argc) with `flags` and checks the shared ones (bound to `f`) into `o`. Returns
// -1 when the program should go on, else its exit code (0 after --help, 2 on a bad flag, with a
// message).
int ParseBaselineFlags(int argc, char** argv, const std::string& program, bool with_rank,
                       tools::Flags* flags, const BaselineFlags& f, BaselineOptions* o);

// The collective under test. All three may throw std::exception on failure.
struct Collective {
  std::function<void()> barrier;
  // Untimed, before each timed all-reduce (e.g. copy the input into an in-place buffer); optional.
  std::function<void(const void* in, void* out, size_t count)> prepare;
  // The timed all-reduce (SUM) of in[0..count) into out[0..count).
  std::function<void(const void* in, void* out, size_t count)> allreduce;
};

// Runs o.warmup + o.iterations all-reduces, verifying each (unless --no-verify), prints progress
// (rank 0) and the BENCH_RESULT line (--report). Returns the exit code: 0 ok, 1 failure.
int RunBaseline(const BaselineOptions& o, const std::string& who, const Collective& c);

}  // namespace switchml::bench
