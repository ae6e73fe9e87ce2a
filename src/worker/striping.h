// Striping: one job's slots spread over several switch hosts (docs/architecture.md, "Striping
// over several switches"; ours, beyond the reference).
//
// Each worker thread owns a window of W slots (WorkerSession). With k switch hosts, local slot
// l in [0, W) of every thread is served by host StripeOfSlot(l, W, k): contiguous ranges of about
// W/k slots each, so that a run of packets freed by one host's results goes back to that host as
// one batch (one segmented send). Every worker of a job maps slots alike, so each host aggregates
// a disjoint share of every all-reduce and knows nothing of the others. Pure arithmetic.
#pragma once

#include <cstdint>

namespace switchml::worker {

// The stripe (index into the job's list of live switch hosts) that serves local slot `slot` of a
// window of `window` slots spread over `stripes` hosts. Needs slot < window and
// 1 <= stripes <= window: then every stripe gets floor or ceil of window / stripes slots.
constexpr uint32_t StripeOfSlot(uint32_t slot, uint32_t window, uint32_t stripes) {
  return static_cast<uint32_t>(uint64_t{slot} * stripes / window);
}

}  // namespace switchml::worker
