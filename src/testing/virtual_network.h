// VirtualNetwork: a discrete-event network for tests that run the real Switch and worker
// sessions in one process in virtual time: every send becomes 0, 1 or 2 deliveries after a base
// delay plus seeded jitter (loss, duplication, reordering). Used by tests only.
#pragma once

#include <chrono>
#include <cstdint>
#include <queue>
#include <random>
#include <span>
#include <vector>

#include "base/endpoint.h"

namespace switchml::testing {

using Nanos = std::chrono::nanoseconds;

struct Faults {
  double loss = 0;
  double duplicate = 0;
  Nanos jitter{0};  // each copy's delay is base + uniform [0, jitter): reordering
};

// A discrete-event network: every send becomes 0, 1 or 2 deliveries at base + jitter delays.
class VirtualNetwork {
 public:
  VirtualNetwork(Faults faults, uint64_t seed) : faults_(faults), rng_(seed) {}

  void Send(Nanos now, const Endpoint& from, const Endpoint& to, std::span<const uint8_t> data) {
    const int copies = Bernoulli(faults_.duplicate) ? 2 : 1;
    for (int c = 0; c < copies; ++c) {
      if (Bernoulli(faults_.loss)) {
        ++dropped_;
        continue;
      }
      Nanos delay = kBase;
      if (faults_.jitter.count() > 0) {
        delay += Nanos(std::uniform_int_distribution<int64_t>(0, faults_.jitter.count() - 1)(rng_));
      }
      queue_.push(Event{now + delay, seq_++, from, to, {data.begin(), data.end()}});
    }
  }

  struct Event {
    Nanos at;
    uint64_t seq;
    Endpoint from, to;
    std::vector<uint8_t> data;
  };
  bool empty() const { return queue_.empty(); }
  Nanos next() const { return queue_.top().at; }
  Event Pop() {
    Event e = queue_.top();
    queue_.pop();
    return e;
  }
  uint64_t dropped() const { return dropped_; }

 private:
  static constexpr Nanos kBase{2000};
  bool Bernoulli(double p) {
    return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.at != b.at ? a.at > b.at : a.seq > b.seq;
    }
  };
  Faults faults_;
  std::mt19937_64 rng_;
  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  uint64_t seq_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace switchml::testing
