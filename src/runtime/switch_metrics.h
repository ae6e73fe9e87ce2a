// The switch daemon's Prometheus metrics (docs/operations.md lists every one): a collector that
// reads the daemon's snapshot (SwitchDaemon::Snapshot), the registry's jobs and the control
// plane's call counters when scraped. Serve it with metrics::MetricsServer
// (`switchml switch --metrics-port`).
//
// Labels stay bounded: per data-plane thread (at most 64), per drop reason and control call
// (fixed sets), and per live job (label session="<job id>", at most --max-jobs; not "job",
// which Prometheus gives every target): a job's series end when the job leaves the switch, since
// nothing is kept between scrapes.
#pragma once

#include <memory>

namespace prometheus {
class Collectable;
}

namespace switchml::runtime {

class SwitchDaemon;

// `daemon` must outlive the collector's use (stop the metrics server before the daemon).
std::shared_ptr<prometheus::Collectable> SwitchMetricsCollector(const SwitchDaemon* daemon);

}  // namespace switchml::runtime
