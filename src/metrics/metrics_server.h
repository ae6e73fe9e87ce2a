// MetricsServer: serves GET /metrics in the Prometheus text format (prometheus-cpp's Exposer, a
// civetweb HTTP server on threads of its own) from collectors that read their figures when
// scraped. No metric state lives here: each collector (prometheus::Collectable) builds its
// families from the live counters it is given, so nothing is registered per job or per thread
// and labels stay bounded by what exists at scrape time.
//
// Thread-safety: the collectors' Collect() runs on the HTTP server's threads, one scrape at a
// time or concurrently: they must be safe to call from any thread while the program runs.
// Destroying the server stops serving and waits for scrapes under way, so a collector's data
// must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchml/status.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace switchml::metrics {

struct MetricsServerOptions {
  // IPv4 address to listen on; "0.0.0.0" for every interface.
  std::string bind_address = "127.0.0.1";
  uint16_t port = 0;  // 0: pick a free port (MetricsServer::port() tells)
  Status Validate() const;
};

class MetricsServer {
 public:
  // Listens and serves /metrics from `collectors` (kept alive by the server). Fails, naming the
  // address, when it cannot listen there.
  static Result<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectors);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  uint16_t port() const { return port_; }
  // "http://ADDRESS:PORT/metrics"
  std::string url() const;

 private:
  MetricsServer() = default;
  std::string bind_address_;
  uint16_t port_ = 0;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectors_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

// Prometheus's standard process metrics of this process, read from /proc at scrape time:
// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_start_time_seconds.
std::shared_ptr<prometheus::Collectable> ProcessCollector();

}  // namespace switchml::metrics
