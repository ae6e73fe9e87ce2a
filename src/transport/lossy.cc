#include "transport/lossy.h"

#include <atomic>
#include <random>
#include <vector>

#include "base/check.h"
#include "base/status_macros.h"

namespace switchml::transport {
namespace {

class LossyTransport final : public Transport {
 public:
  LossyTransport(std::unique_ptr<Transport> inner, double loss, uint64_t seed)
      : inner_(std::move(inner)), loss_(loss), rng_(seed) {
    kept_.reserve(kTxBuffers);
    kept_index_.reserve(kTxBuffers);
  }

  Endpoint local_endpoint() const override { return inner_->local_endpoint(); }
  size_t max_datagram_bytes() const override { return inner_->max_datagram_bytes(); }
  std::string name() const override { return "lossy(" + inner_->name() + ")"; }
  std::span<uint8_t> TxBuffer(size_t index) override { return inner_->TxBuffer(index); }
  std::span<uint8_t> TxBufferTo(size_t index, const Endpoint& destination) override {
    return inner_->TxBufferTo(index, destination);  // (a dropped datagram is one left out)
  }
  void Wake() override { inner_->Wake(); }

  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    // Decide each datagram's fate once; a datagram not taken by the inner transport is offered
    // again by the caller and drawn again then, which keeps the loss rate per offered datagram.
    kept_.clear();
    kept_index_.clear();
    uint64_t dropped = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (Lost()) {
        ++dropped;
        continue;
      }
      kept_.push_back(batch[i]);
      kept_index_.push_back(i);
    }
    ASSIGN_OR_RETURN(size_t taken, inner_->Send(kept_));
    if (taken == kept_.size()) {
      dropped_out_.fetch_add(dropped, std::memory_order_relaxed);
      return batch.size();
    }
    // Taken: everything before the first kept datagram the inner transport did not take.
    const size_t stop = kept_index_[taken];
    dropped_out_.fetch_add(stop - taken, std::memory_order_relaxed);
    return stop;
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    ASSIGN_OR_RETURN(size_t got, inner_->Receive(batch, timeout));
    size_t kept = 0;
    for (size_t i = 0; i < got; ++i) {
      if (Lost()) continue;
      batch[kept++] = batch[i];
    }
    dropped_in_.fetch_add(got - kept, std::memory_order_relaxed);
    return kept;
  }

  TransportCounters counters() const override {
    TransportCounters c = inner_->counters();
    c.loss_dropped_in = dropped_in_.load(std::memory_order_relaxed);
    c.loss_dropped_out = dropped_out_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  bool Lost() {
    // 53 random bits: the same sequence on every standard library, unlike the distributions.
    return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < loss_;
  }

  std::unique_ptr<Transport> inner_;
  const double loss_;
  std::mt19937_64 rng_;
  std::vector<TxDatagram> kept_;
  std::vector<size_t> kept_index_;
  std::atomic<uint64_t> dropped_in_{0}, dropped_out_{0};
};

}  // namespace

std::unique_ptr<Transport> MakeLossy(std::unique_ptr<Transport> inner, double loss, uint64_t seed) {
  CHECK(loss >= 0 && loss < 1) << "loss must be in [0, 1), got " << loss;
  return std::make_unique<LossyTransport>(std::move(inner), loss, seed);
}

}  // namespace switchml::transport
