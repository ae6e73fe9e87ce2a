#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/collectable.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "metrics/context_metrics.h"
#include "metrics/families.h"
#include "metrics/metrics_server.h"

namespace switchml::metrics {
namespace {

using ::testing::HasSubstr;

// GET path from 127.0.0.1:port over a plain socket; the whole response (headers and body).
std::string HttpGet(uint16_t port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "";
  }
  const std::string req =
      "GET " + path + " HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// Given: a collector whose value changes between scrapes.
class Changing final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    Counter("test_things_total", "Things.")
        .Add(static_cast<double>(++calls_), {{"k", "v"}})
        .MoveTo(&out);
    return out;
  }
  mutable int calls_ = 0;
};

TEST(MetricsServer, ServesWhatTheCollectorReadsAtEachScrape) {
  auto c = std::make_shared<Changing>();
  auto s = MetricsServer::Start({"127.0.0.1", 0}, {c, ProcessCollector()});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_NE((*s)->port(), 0);
  const std::string first = HttpGet((*s)->port(), "/metrics");
  EXPECT_THAT(first, HasSubstr("200 OK"));
  EXPECT_THAT(first, HasSubstr("# TYPE test_things_total counter"));
  EXPECT_THAT(first, HasSubstr("test_things_total{k=\"v\"} 1"));
  EXPECT_THAT(HttpGet((*s)->port(), "/metrics"), HasSubstr("test_things_total{k=\"v\"} 2"));
  EXPECT_THAT(first, HasSubstr("process_resident_memory_bytes "));
  EXPECT_THAT(first, HasSubstr("process_open_fds "));
  EXPECT_EQ((*s)->url(), "http://127.0.0.1:" + std::to_string((*s)->port()) + "/metrics");
}

TEST(MetricsServer, RefusesABadAddressAndAPortInUse) {
  auto bad = MetricsServer::Start({"localhost:80", 0}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("is not an IPv4 address"));
  auto first = MetricsServer::Start({"127.0.0.1", 0}, {});
  ASSERT_TRUE(first.ok());
  auto second = MetricsServer::Start({"127.0.0.1", (*first)->port()}, {});
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics-port"));
}

TEST(ContextStatsCollector, ExposesEveryCounterInSecondsAndTotals) {
  ContextStats s;
  s.packets_sent = 12;
  s.packets_retransmitted = 3;
  s.srtt_us = 250;
  s.sparse_union_blocks = 7;
  s.sparse_dense_shares = 2;
  auto c = ContextStatsCollector([s] { return s; });
  bool sent = false, retransmitted = false, srtt = false, union_blocks = false, dense = false;
  for (const prometheus::MetricFamily& f : c->Collect()) {
    ASSERT_EQ(f.metric.size(), 1u) << f.name;
    if (f.name == "switchml_worker_packets_sent_total") sent = f.metric[0].counter.value == 12;
    if (f.name == "switchml_worker_packets_retransmitted_total") {
      retransmitted = f.metric[0].counter.value == 3;
    }
    if (f.name == "switchml_worker_srtt_seconds") srtt = f.metric[0].gauge.value == 250e-6;
    if (f.name == "switchml_worker_sparse_union_blocks_total") {
      union_blocks = f.metric[0].counter.value == 7;
    }
    if (f.name == "switchml_worker_sparse_dense_shares_total") {
      dense = f.metric[0].counter.value == 2;
    }
  }
  EXPECT_TRUE(sent);
  EXPECT_TRUE(retransmitted);
  EXPECT_TRUE(srtt);
  EXPECT_TRUE(union_blocks);
  EXPECT_TRUE(dense);
}

}  // namespace
}  // namespace switchml::metrics
