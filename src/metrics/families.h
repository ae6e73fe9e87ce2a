// Small helpers to build prometheus::MetricFamily values by hand in a collector's Collect()
// (metrics_server.h): a family per metric name, one sample per label set.
#pragma once

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace switchml::metrics {

using Labels = std::vector<prometheus::ClientMetric::Label>;

// One family under construction. Counter values must only grow while the labelled thing lives.
class Family {
 public:
  Family(std::string name, std::string help, prometheus::MetricType type) {
    family_.name = std::move(name);
    family_.help = std::move(help);
    family_.type = type;
  }
  Family& Add(double value, Labels labels = {}) {
    prometheus::ClientMetric& m = family_.metric.emplace_back();
    m.label = std::move(labels);
    if (family_.type == prometheus::MetricType::Counter) {
      m.counter.value = value;
    } else if (family_.type == prometheus::MetricType::Gauge) {
      m.gauge.value = value;
    } else {
      m.untyped.value = value;
    }
    return *this;
  }
  // Moves the family into `out` (an empty family too: Prometheus then shows no series).
  void MoveTo(std::vector<prometheus::MetricFamily>* out) { out->push_back(std::move(family_)); }

 private:
  prometheus::MetricFamily family_;
};

inline Family Counter(std::string name, std::string help) {
  return Family(std::move(name), std::move(help), prometheus::MetricType::Counter);
}
inline Family Gauge(std::string name, std::string help) {
  return Family(std::move(name), std::move(help), prometheus::MetricType::Gauge);
}

}  // namespace switchml::metrics
