// RetransmitOptions: when a worker thread re-sends a packet whose result is late, and when it
// gives up. One struct, held whole by Config (Config::retransmit) and by each worker thread's
// session (worker::SessionConfig::retransmit), so the runtime hands it on without copying fields.
#pragma once

#include <chrono>
#include <cstdint>

#include "switchml/export.h"
#include "switchml/status.h"

namespace switchml {

struct SWITCHML_EXPORT RetransmitOptions {
  // Retransmission timeout (RTO) of a packet: `timeout` until the first round trip is measured,
  // then from the measured round trips as TCP computes it (RFC 6298): a sample is the time from
  // a packet's only transmission to its result (Karn's rule: none from retransmitted packets, and
  // none from results that come after the result of a packet sent later); SRTT and RTTVAR smooth
  // them (RTTVAR falls only once per window of samples, as Linux's, since a window gives that
  // many per round trip) and RTO = SRTT + max(clock_granularity, 4 RTTVAR), clamped to
  // [min_timeout, ceiling] where the ceiling is min(max_timeout, peer_timeout). The estimate
  // persists across slices: a slice starts with the RTO the previous one ended with.
  // min_timeout's default is measured: docs/architecture.md, 4.3.
  std::chrono::nanoseconds timeout = std::chrono::milliseconds(10);
  std::chrono::nanoseconds min_timeout = std::chrono::milliseconds(10);
  std::chrono::nanoseconds max_timeout = std::chrono::seconds(1);
  std::chrono::nanoseconds clock_granularity = std::chrono::microseconds(100);
  // Back-off (the reference's, counted differently): after `timeout_threshold` timeouts (at most
  // a window's) with no fresh sample in between, the RTO doubles (at most once per RTO period, up
  // to the ceiling) and the threshold grows by `timeout_threshold_increment`. The next fresh
  // sample ends the back-off: the RTO is recomputed from the estimate, which that sample updated.
  // (The reference counts all timeouts, so random loss alone inflates the timeout; one window
  // timing out at once would double it several times.) docs/architecture.md, 4.3, says why.
  uint32_t timeout_threshold = 100;
  uint32_t timeout_threshold_increment = 100;
  // Early retransmission (TCP's fast retransmit; ours), off when 0. A packet sent once whose
  // result is still missing when the results of this many packets first sent after it (to the
  // same switch host) have arrived is re-sent at once, without waiting for its timeout (at most
  // once early; the timer stays). On a network that keeps each link's order, results come back
  // in send order, so a result overtaken by later ones was held up: this worker's packet or its
  // result was lost (then the re-send recovers it within a round trip instead of an RTO), or a
  // peer's was (then the switch drops the re-send as a duplicate, as a timeout's would be). Early
  // re-sends are retransmissions, not timeouts: they do not back off. docs/architecture.md 4.3
  // and docs/simulator.md give the measurements.
  uint32_t early_retransmit_after = 0;
  // An all-reduce (a worker thread's slice of it) fails with DEADLINE_EXCEEDED when no result at
  // all arrives for this long: a peer or the switch is gone.
  std::chrono::nanoseconds peer_timeout = std::chrono::seconds(10);

  // OK, or a message that names the field that is wrong and what it must be.
  Status Validate() const;
};

}  // namespace switchml
