// `gloo_allreduce`: a baseline that puts SwitchML's throughput in context. One process of a Gloo
// CPU all-reduce (SUM over TCP; ring or halving-doubling) on the same verifiable tensor as
// `switchml worker`, measured the same way (bench/baseline.h).
//
// bench/bench.py starts --workers of these (ranks 0..N-1) with a fresh --rendezvous directory,
// each with --host set to the address its traffic must use (127.0.0.1 on loopback, its own
// namespace's address in the emulated rack), and collects their BENCH_RESULT lines.
// Exit codes: 0 ok, 1 failure, 2 bad flags.
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "baseline.h"

namespace {

using switchml::DataType;
using switchml::bench::BaselineOptions;

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

// Halving-doubling lives in Gloo's older algorithm classes: constructed once per buffer (it
// registers the buffer with every pair), then run in place as often as needed.
template <typename T>
struct HalvingDoubling {
  HalvingDoubling(const std::shared_ptr<gloo::Context>& context, void* buffer, size_t count)
      : algorithm(context, {static_cast<T*>(buffer)}, static_cast<int>(count)) {}
  gloo::AllreduceHalvingDoubling<T> algorithm;
};

int Run(const BaselineOptions& o, const std::string& algorithm, const std::string& rendezvous,
        const std::string& host) {
  const std::string who = "gloo_allreduce " + algorithm + " (rank " + std::to_string(o.rank) + ")";
  const auto timeout = std::chrono::milliseconds(o.timeout_s * 1000);

  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    // Setup: TCP device on --host, rendezvous through the file store, full mesh of pairs.
    SetupWatchdog watchdog(std::chrono::seconds(o.timeout_s + 15), who);
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    attr.ai_family = AF_INET;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    TimedStore store(rendezvous, timeout);
    context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(o.rank),
                                                          static_cast<int>(o.workers));
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
    watchdog.Done();
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "%s: FAILED: setup failed (rendezvous in %s, TCP on %s, %lld s timeout; are all "
                 "%lld ranks running with this --rendezvous?): %s\n",
                 who.c_str(), rendezvous.c_str(), host.c_str(), static_cast<long long>(o.timeout_s),
                 static_cast<long long>(o.workers), e.what());
    if (o.report)
      std::printf("BENCH_RESULT rank=%lld status=error\n", static_cast<long long>(o.rank));
    return 1;
  }
  if (!o.quiet && o.rank == 0) {
    std::fprintf(stderr, "%s: connected to %lld peers over %s; %llu %s elements per all-reduce\n",
                 who.c_str(), static_cast<long long>(o.workers - 1), host.c_str(),
                 static_cast<unsigned long long>(o.size), switchml::DataTypeName(o.dtype));
  }

  switchml::bench::Collective c;
  c.barrier = [&] {
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(timeout);
    gloo::barrier(barrier);
  };
  using ReduceFn = void (*)(void*, const void*, const void*, size_t);
  const bool f32 = o.dtype == DataType::kFloat32;
  std::unique_ptr<HalvingDoubling<float>> hd_float;
  std::unique_ptr<HalvingDoubling<int32_t>> hd_int;
  if (algorithm == "ring") {
    c.allreduce = [&](const void* in, void* out, size_t count) {
      gloo::AllreduceOptions opts(context);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTimeout(timeout);
      if (f32) {
        opts.setInput(static_cast<float*>(const_cast<void*>(in)), count);
        opts.setOutput(static_cast<float*>(out), count);
        opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
      } else {
        opts.setInput(static_cast<int32_t*>(const_cast<void*>(in)), count);
        opts.setOutput(static_cast<int32_t*>(out), count);
        opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<int32_t>));
      }
      gloo::allreduce(opts);
    };
  } else {
    // In place on `out`: the input is copied there before the timer starts.
    c.prepare = [&](const void* in, void* out, size_t count) {
      std::memcpy(out, in, count * 4);
      if (f32 && !hd_float)
        hd_float = std::make_unique<HalvingDoubling<float>>(context, out, count);
      if (!f32 && !hd_int) hd_int = std::make_unique<HalvingDoubling<int32_t>>(context, out, count);
    };
    c.allreduce = [&](const void*, void*, size_t) {
      if (f32)
        hd_float->algorithm.run();
      else
        hd_int->algorithm.run();
    };
  }
  return switchml::bench::RunBaseline(o, who, c);
}

}  // namespace

int main(int argc, char** argv) {
  switchml::tools::Flags flags(
      "gloo_allreduce",
      "One process of a Gloo CPU all-reduce (SUM over TCP) of the same verifiable tensor\n"
      "`switchml worker` uses; start N of them with ranks 0..N-1 and the same fresh, empty\n"
      "--rendezvous directory. Each all-reduce is preceded by a Gloo barrier, timed alone and\n"
      "verified after the timer stops.",
      /*program=*/"");
  switchml::bench::BaselineFlags shared;
  switchml::bench::AddBaselineFlags(&flags, &shared, /*with_rank=*/true);
  std::string algorithm = "ring", rendezvous, host = "127.0.0.1";
  flags.Add("algorithm", &algorithm,
            "ring (gloo::allreduce) or halving-doubling (gloo::AllreduceHalvingDoubling)");
  flags.Add("rendezvous", &rendezvous,
            "an existing directory for Gloo's file store, fresh per run");
  flags.Add("host", &host, "IPv4 address this rank's TCP traffic uses");
  BaselineOptions o;
  if (int code = switchml::bench::ParseBaselineFlags(argc, argv, "gloo_allreduce", true, &flags,
                                                     shared, &o);
      code >= 0) {
    return code;
  }
  if (algorithm != "ring" && algorithm != "halving-doubling") {
    std::fprintf(stderr, "gloo_allreduce: --algorithm must be ring or halving-doubling, not '%s'\n",
                 algorithm.c_str());
    return 2;
  }
  struct stat st {};
  if (rendezvous.empty() || stat(rendezvous.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr,
                 "gloo_allreduce: --rendezvous must name an existing, fresh directory, not '%s'\n",
                 rendezvous.c_str());
    return 2;
  }
  try {
    return Run(o, algorithm, rendezvous, host);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce (rank %lld): FAILED: %s\n", static_cast<long long>(o.rank),
                 e.what());
    if (o.report)
      std::printf("BENCH_RESULT rank=%lld status=error\n", static_cast<long long>(o.rank));
    return 1;
  }
}
