// Per-datagram cost of the authenticated data plane (auth.h): tagging on send and verifying on
// receive, through the wrapper, over a fake transport that costs nothing (sends are discarded;
// receives hand back the same batch of tagged 1034-byte datagrams). Items are datagrams. The
// baselines are the fake transport alone (wrapper=0), the same wrapper with no keyed peer (a
// switch without authenticated jobs: what it costs over wrapper=0 is what every switch pays)
// and the bare SipHash.
#include <benchmark/benchmark.h>
#include <sodium.h>

#include <cstring>
#include <memory>
#include <vector>

#include "transport/auth.h"

namespace switchml::transport {
namespace {

constexpr size_t kDatagram = 1034;  // a 256-element packet
constexpr size_t kBatch = 64;
constexpr Endpoint kPeer{0x7f000001, 40000};

// Discards what it sends; receives `rx` again on every call.
class FakeTransport final : public Transport {
 public:
  explicit FakeTransport(std::vector<std::vector<uint8_t>> rx) : rx_(std::move(rx)) {}
  Endpoint local_endpoint() const override { return {kLoopbackIpv4, 48864}; }
  size_t max_datagram_bytes() const override { return kDatagram + kAuthRoomBytes; }
  std::string name() const override { return "fake"; }
  void Wake() override {}
  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    benchmark::DoNotOptimize(batch.data());
    return batch.size();
  }
  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds) override {
    const size_t n = std::min(batch.size(), rx_.size());
    for (size_t i = 0; i < n; ++i) batch[i] = RxDatagram{rx_[i], kPeer, false, {}};
    return n;
  }
  TransportCounters counters() const override { return {}; }

 private:
  std::vector<std::vector<uint8_t>> rx_;
};

std::vector<uint8_t> Datagram(uint8_t seed) {
  std::vector<uint8_t> d(kDatagram);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(seed + 31 * i);
  return d;
}

// The worker's side (one key) or the switch's (a table of `peers` endpoints, one of them kPeer);
// keyed = false: the switch with no authenticated job; wrapped = false: the fake transport
// alone.
std::unique_ptr<Transport> Make(bool keyed, bool switch_side, bool wrapped, size_t peers,
                                std::vector<std::vector<uint8_t>> rx, const AuthKey& key) {
  auto inner = std::make_unique<FakeTransport>(std::move(rx));
  if (!wrapped) return inner;
  if (!switch_side) return MakeAuthenticated(std::move(inner), 1, 0, key);
  auto table = std::make_shared<AuthKeyTable>();
  if (keyed) {
    table->Add(1, key, 0, kPeer.ipv4, kPeer.port, 1);
    for (size_t i = 1; i < peers; ++i) {
      table->Add(1 + i, NewAuthKey(), 0, 0x0a000000 + static_cast<uint32_t>(i), 40000, 1);
    }
  }
  return MakeAuthenticated(std::move(inner), table);
}

// Sends batches of kBatch distinct datagrams to kPeer (each tagged once).
void BM_Send(benchmark::State& state) {
  const bool keyed = state.range(0) != 0, switch_side = state.range(1) != 0;
  auto t = Make(keyed, switch_side, state.range(2) != 0, 256, {}, NewAuthKey());
  std::vector<TxDatagram> tx(kBatch);
  const auto d = Datagram(1);
  for (auto _ : state) {
    for (size_t i = 0; i < kBatch; ++i) {
      std::span<uint8_t> b = t->TxBuffer(i);
      std::memcpy(b.data(), d.data(), d.size());
      tx[i] = TxDatagram{kPeer, b.first(d.size())};
    }
    benchmark::DoNotOptimize(t->Send(tx));
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_Send)
    ->ArgNames({"keyed", "switch", "wrapper"})
    ->Args({0, 1, 0})
    ->Args({0, 1, 1})
    ->Args({1, 1, 1})
    ->Args({1, 0, 1});

// Receives batches of kBatch tagged datagrams from kPeer and verifies each.
void BM_Receive(benchmark::State& state) {
  const bool keyed = state.range(0) != 0, switch_side = state.range(1) != 0;
  const AuthKey key = NewAuthKey();
  std::vector<std::vector<uint8_t>> rx;
  for (size_t i = 0; i < kBatch; ++i) {
    auto d = Datagram(static_cast<uint8_t>(i));
    // From the switch to a worker, or from worker rank 0 to the switch.
    const uint64_t tag = AuthTag(key, 1, switch_side ? 0 : kAuthSwitchSender, d);
    d.resize(d.size() + kAuthTagBytes);
    std::memcpy(d.data() + kDatagram, &tag, kAuthTagBytes);
    rx.push_back(std::move(d));
  }
  // (Without the wrapper the fake hands back the tagged datagrams as they are.)
  auto t = Make(keyed, switch_side, state.range(2) != 0, 256, rx, key);
  std::vector<RxDatagram> batch(kBatch);
  for (auto _ : state) {
    auto n = t->Receive(batch, std::chrono::nanoseconds(0));
    if (!n.ok() || *n != kBatch) state.SkipWithError("a datagram did not verify");
    benchmark::DoNotOptimize(batch.data());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_Receive)
    ->ArgNames({"keyed", "switch", "wrapper"})
    ->Args({0, 1, 0})
    ->Args({0, 1, 1})
    ->Args({1, 1, 1})
    ->Args({1, 0, 1});

// The bare SipHash-2-4 over a datagram, the job id and the sender (1046 bytes).
void BM_SipHash(benchmark::State& state) {
  const AuthKey key = NewAuthKey();
  std::vector<uint8_t> d = Datagram(3);
  d.resize(kDatagram + kAuthRoomBytes);
  uint8_t tag[8];
  for (auto _ : state) {
    crypto_shorthash(tag, d.data(), d.size(), key.data());
    benchmark::DoNotOptimize(tag);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(d.size()));
}
BENCHMARK(BM_SipHash);

}  // namespace
}  // namespace switchml::transport

BENCHMARK_MAIN();
