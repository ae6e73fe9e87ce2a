#include "transport/memory.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/check.h"

namespace switchml::transport {

// A transport attached to a MemoryNetwork. The network owns the receive queue (so Send from any
// transport can reach it under the network mutex); this object only refers to it.
class MemoryNetwork::MemoryTransport final : public Transport {
 public:
  MemoryTransport(MemoryNetwork* network, Endpoint local, Queue* queue, size_t max_datagram)
      : network_(network), local_(local), queue_(queue), max_datagram_(max_datagram) {
    lent_.reserve(64);
  }

  ~MemoryTransport() override {
    std::lock_guard<std::mutex> lock(network_->mu_);
    network_->queues_.erase(local_);
  }

  Endpoint local_endpoint() const override { return local_; }
  size_t max_datagram_bytes() const override { return max_datagram_; }
  std::string name() const override { return "memory"; }

  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    std::lock_guard<std::mutex> lock(network_->mu_);
    for (const TxDatagram& d : batch) network_->Deliver(local_, d);
    sent_.fetch_add(batch.size(), std::memory_order_relaxed);
    return batch.size();
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    if (batch.empty()) return size_t{0};
    std::unique_lock<std::mutex> lock(network_->mu_);
    if (queue_->datagrams.empty() && timeout > timeout.zero()) {
      auto ready = [&] { return !queue_->datagrams.empty() || queue_->woken; };
      if (timeout > std::chrono::hours(24)) {
        queue_->ready.wait(lock, ready);
      } else {
        queue_->ready.wait_for(lock, timeout, ready);
      }
      if (queue_->datagrams.empty()) {
        queue_->woken = false;  // a Wake() (or the timeout) ends this call only
        return size_t{0};
      }
    }
    // The datagrams lent by the previous call are given up now.
    lent_.clear();
    size_t n = 0;
    while (n < batch.size() && !queue_->datagrams.empty()) {
      lent_.push_back(std::move(queue_->datagrams.front()));
      queue_->datagrams.pop_front();
      const Datagram& d = lent_.back();
      RxDatagram& out = batch[n++];
      out.data = {d.data.data(), std::min(d.data.size(), max_datagram_)};
      out.truncated = d.data.size() > max_datagram_;
      out.source = d.source;
    }
    received_.fetch_add(n, std::memory_order_relaxed);
    return n;
  }

  void Wake() override {
    std::lock_guard<std::mutex> lock(network_->mu_);
    queue_->woken = true;
    queue_->ready.notify_all();
  }

  TransportCounters counters() const override {
    TransportCounters c;
    c.datagrams_sent = sent_.load(std::memory_order_relaxed);
    c.datagrams_received = received_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  MemoryNetwork* const network_;
  const Endpoint local_;
  Queue* const queue_;  // owned by network_->queues_ while this transport lives
  const size_t max_datagram_;
  std::vector<Datagram> lent_;  // what the last Receive returned views of
  std::atomic<uint64_t> sent_{0}, received_{0};
};

MemoryNetwork::MemoryNetwork(FaultOptions faults) : faults_(faults), rng_(faults.seed) {
  for (double p : {faults.loss, faults.duplicate, faults.reorder, faults.late}) {
    CHECK(p >= 0 && p <= 1) << "fault probabilities must be within [0, 1], got " << p;
  }
}

MemoryNetwork::~MemoryNetwork() {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(queues_.empty()) << "MemoryNetwork destroyed with " << queues_.size()
                         << " transports still attached; destroy the transports first";
}

std::unique_ptr<Transport> MemoryNetwork::Attach(Endpoint local, size_t max_datagram_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (local.port == 0) {
    for (int tries = 0; tries < 65536; ++tries) {
      Endpoint candidate{local.ipv4, next_ephemeral_port_};
      next_ephemeral_port_ = next_ephemeral_port_ == 65535 ? 49152 : next_ephemeral_port_ + 1;
      if (!queues_.contains(candidate)) {
        local = candidate;
        break;
      }
    }
    CHECK(local.port != 0) << "MemoryNetwork: no free ephemeral port on "
                           << Ipv4ToString(local.ipv4);
  }
  CHECK(!queues_.contains(local)) << "MemoryNetwork: " << local.ToString() << " already attached";
  auto queue = std::make_unique<Queue>();
  Queue* raw = queue.get();
  queues_.emplace(local, std::move(queue));
  return std::make_unique<MemoryTransport>(this, local, raw, max_datagram_bytes);
}

MemoryNetworkCounters MemoryNetwork::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

double MemoryNetwork::Uniform() {
  // 53 random bits: the same sequence on every standard library, unlike the distributions.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

void MemoryNetwork::Deliver(const Endpoint& source, const TxDatagram& datagram) {
  // Draw the faults first, in a fixed order, so a datagram's fate does not depend on whether its
  // destination exists.
  const bool lost = Uniform() < faults_.loss;
  const bool duplicated = Uniform() < faults_.duplicate;
  ++sends_;
  // Release the held-back copies that are due (to endpoints still attached).
  for (size_t i = 0; i < held_.size();) {
    if (held_[i].release_at > sends_) {
      ++i;
      continue;
    }
    if (auto h = queues_.find(held_[i].destination); h != queues_.end()) {
      Enqueue(*h->second, held_[i].datagram.source, held_[i].datagram.data);
      h->second->ready.notify_all();
    } else {
      ++counters_.dropped;  // its destination detached meanwhile
    }
    held_[i] = std::move(held_.back());
    held_.pop_back();
  }
  auto it = queues_.find(datagram.destination);
  if (lost || it == queues_.end()) {
    ++counters_.dropped;
    return;
  }
  for (int copy = 0; copy < (duplicated ? 2 : 1); ++copy) {
    if (copy == 1) ++counters_.duplicated;
    if (faults_.late > 0 && Uniform() < faults_.late) {
      ++counters_.delayed;
      const uint64_t after = 1 + rng_() % std::max<uint32_t>(1, faults_.late_span);
      held_.push_back(Held{sends_ + after, datagram.destination,
                           Datagram{source, {datagram.data.begin(), datagram.data.end()}}});
      continue;
    }
    Enqueue(*it->second, source, datagram.data);
  }
  it->second->ready.notify_all();
}

void MemoryNetwork::Enqueue(Queue& queue, const Endpoint& source, std::span<const uint8_t> data) {
  Datagram d{source, std::vector<uint8_t>(data.begin(), data.end())};
  ++counters_.delivered;
  const bool reorder = Uniform() < faults_.reorder;
  const size_t window = std::min(queue.datagrams.size(), kReorderWindow);
  if (reorder && window > 0) {
    // Insert before one of the last `window` queued datagrams.
    const size_t back = 1 + static_cast<size_t>(rng_() % window);
    queue.datagrams.insert(queue.datagrams.end() - static_cast<std::ptrdiff_t>(back), std::move(d));
    ++counters_.reordered;
    return;
  }
  queue.datagrams.push_back(std::move(d));
}

}  // namespace switchml::transport
