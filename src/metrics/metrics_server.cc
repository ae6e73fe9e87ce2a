#include "metrics/metrics_server.h"

#include <dirent.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <fstream>
#include <sstream>

#include "base/endpoint.h"
#include "metrics/families.h"

namespace switchml::metrics {

Status MetricsServerOptions::Validate() const {
  uint32_t ip;
  if (!ParseIpv4(bind_address, &ip)) {
    return InvalidArgumentError("metrics bind address '" + bind_address +
                                "' is not an IPv4 address (use 0.0.0.0 for all, 127.0.0.1 for "
                                "this host only)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectors) {
  if (Status st = options.Validate(); !st.ok()) return st;
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->bind_address_ = options.bind_address;
  s->collectors_ = std::move(collectors);
  const std::string address = options.bind_address + ":" + std::to_string(options.port);
  try {
    // Two HTTP threads: a scrape and a second client (a person with curl) at once.
    s->exposer_ = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return UnavailableError("cannot serve metrics on " + address + " (" + e.what() +
                            "): is the port in use? pick another --metrics-port");
  }
  const std::vector<int> ports = s->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0 || ports[0] > 65535) {
    return UnavailableError("cannot serve metrics on " + address + ": no port was bound");
  }
  s->port_ = static_cast<uint16_t>(ports[0]);
  for (const auto& c : s->collectors_) s->exposer_->RegisterCollectable(c);
  return s;
}

MetricsServer::~MetricsServer() {
  exposer_.reset();  // stops serving (and waits for scrapes) before the collectors go
}

std::string MetricsServer::url() const {
  return "http://" + bind_address_ + ":" + std::to_string(port_) + "/metrics";
}

namespace {

class Process final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    // /proc/self/stat: utime (14) and stime (15) in clock ticks, starttime (22) in ticks since
    // boot, vsize (23) in bytes, rss (24) in pages. Field 2 (comm) may hold spaces: skip past ')'.
    std::ifstream stat("/proc/self/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) return out;
    std::istringstream fields(line.substr(close + 2));
    std::vector<std::string> f;  // f[0] is field 3
    for (std::string x; fields >> x;) f.push_back(x);
    if (f.size() < 22) return out;
    const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    const auto field = [&](int n) { return std::stod(f[n - 3]); };
    Counter("process_cpu_seconds_total", "User and system CPU time of the process, in seconds.")
        .Add((field(14) + field(15)) / tick)
        .MoveTo(&out);
    Gauge("process_resident_memory_bytes", "Resident memory of the process, in bytes.")
        .Add(field(24) * page)
        .MoveTo(&out);
    Gauge("process_virtual_memory_bytes", "Virtual memory of the process, in bytes.")
        .Add(field(23))
        .MoveTo(&out);
    Gauge("process_start_time_seconds", "When the process started, in seconds since the epoch.")
        .Add(BootTime() + field(22) / tick)
        .MoveTo(&out);
    Gauge("process_open_fds", "Open file descriptors of the process.")
        .Add(static_cast<double>(OpenFds()))
        .MoveTo(&out);
    return out;
  }

 private:
  static double BootTime() {
    std::ifstream f("/proc/stat");
    for (std::string key; f >> key;) {
      if (key == "btime") {
        double t = 0;
        f >> t;
        return t;
      }
    }
    return 0;
  }
  static size_t OpenFds() {
    size_t n = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
      while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
      closedir(d);
      if (n > 0) --n;  // the directory's own descriptor
    }
    return n;
  }
};

}  // namespace

std::shared_ptr<prometheus::Collectable> ProcessCollector() { return std::make_shared<Process>(); }

}  // namespace switchml::metrics
