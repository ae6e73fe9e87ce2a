// Example: N workers as threads of one process all-reduce through a SwitchML switch, meeting
// through an in-process Rendezvous instead of the switch's control plane (the way a framework
// with its own store plugs in). Needs a running switch: `switchml switch`.
//
//   allreduce_example [--switch HOST] [--port CONTROL_PORT] [--workers N]
#include <switchml/context.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// Shared by the job's workers (threads here). Barrier: a generation counter; Broadcast: the value
// rank 0 published for the current round.
class ThreadRendezvous {
 public:
  explicit ThreadRendezvous(int n) : n_(n) {}

  void Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }

  uint64_t Broadcast(int rank, uint64_t value) {
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      value_ = value;
    }
    Barrier();  // rank 0's value is published
    uint64_t v;
    {
      std::lock_guard<std::mutex> lock(mu_);
      v = value_;
    }
    Barrier();  // everyone has read it before the next round may overwrite it
    return v;
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0, value_ = 0;
};

// One worker's view of the shared rendezvous, as switchml::Context wants it.
class WorkerRendezvous final : public switchml::Rendezvous {
 public:
  WorkerRendezvous(ThreadRendezvous* shared, int rank) : shared_(shared), rank_(rank) {}
  switchml::Status Barrier() override {
    shared_->Barrier();
    ++barriers;
    return switchml::Status();
  }
  switchml::Result<uint64_t> Broadcast(uint64_t value) override {
    return shared_->Broadcast(rank_, value);
  }
  int barriers = 0;

 private:
  ThreadRendezvous* shared_;
  const int rank_;
};

constexpr const char* kUsage =
    "usage: allreduce_example [--switch HOST] [--port CONTROL_PORT] [--workers N]\n"
    "  --switch HOST   the switch's control-plane host (default 127.0.0.1)\n"
    "  --port N        its control port, 1..65535 (default 50099)\n"
    "  --workers N     workers, as threads of this process, 1..256 (default 2)\n";

// The whole of text as an integer in [lo, hi], or false.
bool ParseInt(const char* text, long lo, long hi, int* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  int port = 50099, workers = 2;
  for (int i = 1; i < argc; i += 2) {
    const char* flag = argv[i];
    if (!std::strcmp(flag, "--help") || !std::strcmp(flag, "-h")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const bool known = !std::strcmp(flag, "--switch") || !std::strcmp(flag, "--port") ||
                       !std::strcmp(flag, "--workers");
    if (!known) {
      std::fprintf(stderr, "allreduce_example: unknown flag %s\n%s", flag, kUsage);
      return 2;
    }
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = value != nullptr;
    if (ok && !std::strcmp(flag, "--switch")) {
      host = value;
    } else if (ok && !std::strcmp(flag, "--port")) {
      ok = ParseInt(value, 1, 65535, &port);
    } else if (ok) {
      ok = ParseInt(value, 1, 256, &workers);
    }
    if (!ok) {
      std::fprintf(stderr, "allreduce_example: %s needs %s\n%s", flag,
                   value == nullptr ? "a value" : "a value in the range below", kUsage);
      return 2;
    }
  }
  constexpr size_t kCount = 100000;
  ThreadRendezvous shared(workers);
  std::vector<std::string> errors(workers);
  std::vector<uint64_t> sessions(workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      switchml::Config config;
      config.rank = r;
      config.num_workers = workers;
      config.switch_host = host;
      config.control_port = static_cast<uint16_t>(port);
      config.session_id = 0;  // agreed through the rendezvous's Broadcast
      auto rendezvous = std::make_shared<WorkerRendezvous>(&shared, r);
      auto ctx = switchml::Context::Create(config, rendezvous);
      if (!ctx.ok()) {
        errors[r] = ctx.status().ToString();
        return;
      }
      sessions[r] = (*ctx)->session_id();
      std::vector<int32_t> v(kCount);
      for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<int32_t>(i) * (r + 1);
      switchml::Status st =
          (*ctx)->AllReduce(v.data(), v.data(), kCount, switchml::DataType::kInt32);
      if (st.ok()) st = (*ctx)->Barrier();
      if (!st.ok()) {
        errors[r] = st.ToString();
        return;
      }
      const int32_t factor = workers * (workers + 1) / 2;
      for (size_t i = 0; i < kCount; ++i) {
        if (v[i] != static_cast<int32_t>(i) * factor) {
          errors[r] = "wrong sum at element " + std::to_string(i);
          return;
        }
      }
      // Two barriers in the session setup and one from Barrier(): all through the rendezvous.
      if (rendezvous->barriers != 3) errors[r] = "the injected rendezvous was not used";
    });
  }
  for (auto& t : threads) t.join();
  int failed = 0;
  for (int r = 0; r < workers; ++r) {
    if (!errors[r].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
      ++failed;
    } else if (sessions[r] != sessions[0]) {
      std::fprintf(stderr, "rank %d: session %llu differs from rank 0's\n", r,
                   static_cast<unsigned long long>(sessions[r]));
      ++failed;
    }
  }
  if (failed) return 1;
  std::printf("allreduce_example: %d workers, %zu int32 elements, session %llu: OK\n", workers,
              kCount, static_cast<unsigned long long>(sessions[0]));
  return 0;
}
