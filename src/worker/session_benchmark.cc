// Micro-benchmarks of the worker's data path: WorkerSession slices on one core, no I/O.
//
// BM_WorkerPath: one worker whose datagrams come straight back as its results. That is exactly
// what a switch returns to a job of one worker (the sum of one contribution, the max of one
// exponent, the same header fields), so it measures the worker alone: exponent scan, quantize,
// encode, decode, dequantize and the session's bookkeeping.
// BM_WorkerPathLarge: the same on a 64 MiB slice with a window of 256 packets, as a worker's
// thread runs a large all-reduce: the input and output are far larger than the caches, so this
// also measures how well the session hides the memory's latency (the small slices stay in L2).
// BM_RoundTrip: n sessions (the ranks of a job) and a Switch in memory, all on this core.
// Items are tensor elements per worker (BM_RoundTrip: times n, the elements all sessions handled).
#include <benchmark/benchmark.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/check.h"
#include "dataplane/switch.h"
#include "proto/wire.h"
#include "worker/session.h"

namespace switchml::worker {
namespace {

constexpr size_t kCount = 1 << 16;  // elements per slice: 256 packets of 256
constexpr uint32_t kWindow = 64;
constexpr size_t kLargeCount = size_t{1} << 24;  // 64 MiB of float32 or int32
constexpr uint32_t kLargeWindow = 256;

SessionConfig Config(uint32_t n, uint32_t window = kWindow) {
  SessionConfig c;
  c.num_workers = n;
  c.window = window;
  c.size = proto::SizeCode::k1024B;
  return c;
}

template <typename T>
std::vector<T> Input(size_t count = kCount) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<T>(static_cast<int32_t>(i % 1000) - 500);
  return v;
}

template <typename T>
void WorkerPath(benchmark::State& state, size_t count, uint32_t window) {
  const DataType dtype = std::is_same_v<T, float> ? DataType::kFloat32 : DataType::kInt32;
  const std::vector<T> in = Input<T>(count);
  std::vector<T> out(count, T{1});  // touched: no page faults in the timed loop
  WorkerSession s(Config(1, window));
  std::array<uint8_t, proto::kMaxDatagramBytes> buf;
  const Nanos now{0};
  uint64_t allreduce = 0;
  for (auto _ : state) {
    s.Start(Slice{++allreduce, dtype, in.data(), out.data(), count, 0}, now);
    while (s.state() == WorkerSession::State::kRunning) {
      const size_t len = s.PollTransmit(now, buf);
      CHECK(len > 0);
      s.HandleDatagram({buf.data(), len}, now);
    }
    CHECK(s.status().ok());
  }
  CHECK(out[count - 1] == in[count - 1]);
  state.SetItemsProcessed(state.iterations() * count);
}

template <typename T>
void BM_WorkerPath(benchmark::State& state) {
  WorkerPath<T>(state, kCount, kWindow);
}
BENCHMARK(BM_WorkerPath<float>)->Name("BM_WorkerPath/float32");
BENCHMARK(BM_WorkerPath<int32_t>)->Name("BM_WorkerPath/int32");

template <typename T>
void BM_WorkerPathLarge(benchmark::State& state) {
  WorkerPath<T>(state, kLargeCount, kLargeWindow);
}
BENCHMARK(BM_WorkerPathLarge<float>)
    ->Name("BM_WorkerPathLarge/float32")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WorkerPathLarge<int32_t>)
    ->Name("BM_WorkerPathLarge/int32")
    ->Unit(benchmark::kMillisecond);

template <typename T>
void BM_RoundTrip(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const DataType dtype = std::is_same_v<T, float> ? DataType::kFloat32 : DataType::kInt32;
  dataplane::SwitchConfig sc;
  sc.slots_per_job = kWindow;
  dataplane::Switch sw(sc);
  dataplane::JobSpec spec;
  spec.job_id = 1;
  spec.num_workers = n;
  spec.max_outstanding_packets = kWindow;
  spec.running_tsi = true;
  CHECK(sw.CreateJob(spec).ok());
  std::vector<std::unique_ptr<WorkerSession>> sessions;
  std::vector<Endpoint> addresses;
  for (uint32_t r = 0; r < n; ++r) {
    addresses.push_back(Endpoint{0x0a000001 + r, 40000});
    CHECK(sw.AddWorker(1, r, dataplane::WorkerSpec{addresses[r].ipv4, 40000}).ok());
    sessions.push_back(std::make_unique<WorkerSession>(Config(n)));
  }
  const std::vector<T> in = Input<T>();
  std::vector<std::vector<T>> out(n, std::vector<T>(kCount));
  std::array<uint8_t, proto::kMaxDatagramBytes> buf;
  std::array<uint8_t, proto::kMaxDatagramBytes> reply;  // the switch's transmit buffer
  const Nanos now{0};
  uint64_t allreduce = 0;
  for (auto _ : state) {
    ++allreduce;
    for (uint32_t r = 0; r < n; ++r) {
      sessions[r]->Start(Slice{allreduce, dtype, in.data(), out[r].data(), kCount, 0}, now);
    }
    bool running = true;
    while (running) {
      running = false;
      for (uint32_t r = 0; r < n; ++r) {
        if (sessions[r]->state() != WorkerSession::State::kRunning) continue;
        running = true;
        const size_t len = sessions[r]->PollTransmit(now, buf);
        if (len == 0) continue;
        const dataplane::Action& a = sw.Process(addresses[r], {buf.data(), len}, reply);
        if (a.kind != dataplane::Action::Kind::kMulticast) continue;
        for (uint32_t d = 0; d < n; ++d) sessions[d]->HandleDatagram(a.reply, now);
      }
    }
    for (uint32_t r = 0; r < n; ++r) CHECK(sessions[r]->status().ok());
  }
  state.SetItemsProcessed(state.iterations() * kCount * n);
}
BENCHMARK(BM_RoundTrip<float>)->Name("BM_RoundTrip/float32")->Arg(1)->Arg(2);
BENCHMARK(BM_RoundTrip<int32_t>)->Name("BM_RoundTrip/int32")->Arg(1)->Arg(2);

}  // namespace
}  // namespace switchml::worker

BENCHMARK_MAIN();
