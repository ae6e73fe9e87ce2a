// The session timing and switch pool the simulator's unit tests share (engine_test.cc,
// hierarchy_sim_test.cc, stripes_sim_test.cc): an RTO floor well above their round trips (about
// 12 us with a window's queue), so that no retransmission happens without loss, and every
// worker's result verified. Tests only.
#pragma once

#include <chrono>

#include "sim/engine.h"

namespace switchml::sim {

inline void UseTestTiming(SimConfig* c) {
  c->switch_config.slots_per_job = 1024;
  c->session.retransmit.timeout = std::chrono::microseconds(200);
  c->session.retransmit.min_timeout = std::chrono::microseconds(100);
  c->session.retransmit.clock_granularity = std::chrono::microseconds(1);
  c->session.retransmit.peer_timeout = std::chrono::seconds(1);
  c->payload = PayloadMode::kVerified;
}

}  // namespace switchml::sim
