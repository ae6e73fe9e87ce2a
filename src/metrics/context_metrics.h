// The worker library's ContextStats (include/switchml/stats.h) as Prometheus metrics
// (switchml_worker_*), for a program that embeds a Context and asks for them, e.g.
// `switchml worker --metrics-port N`: serve the collector with a MetricsServer.
#pragma once

#include <functional>
#include <memory>

#include "switchml/stats.h"

namespace prometheus {
class Collectable;
}

namespace switchml::metrics {

// `read` is called at each scrape, from the metrics server's threads (Context::stats() is safe
// to call so while the context lives; the caller keeps it alive as long as the server).
std::shared_ptr<prometheus::Collectable> ContextStatsCollector(std::function<ContextStats()> read);

}  // namespace switchml::metrics
