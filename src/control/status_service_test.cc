// Monitor.Status through the gRPC control plane: who may see what, and the call counters.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "base/endpoint.h"
#include "control/control_client.h"
#include "control/control_server.h"
#include "control/switchml.grpc.pb.h"
#include "dataplane/switch.h"
#include "proto/wire.h"

namespace switchml::control {
namespace {

using namespace std::chrono_literals;

class StatusServiceTest : public ::testing::Test {
 protected:
  void Start(bool require_secret) {
    sw_ = std::make_unique<dataplane::LockedSwitch>(dataplane::SwitchConfig{});
    ControlServerOptions options;
    options.bind_address = "127.0.0.1";
    options.port = 0;
    options.registry.allow_foreign_address = true;
    options.registry.require_secret = require_secret;
    options.snapshot = [this] {
      SwitchSnapshot s;
      s.transport = "test";
      s.data_port = 4242;
      s.uptime = 7s;
      s.config.max_packet_numel = 1024;
      s.threads.emplace_back().port = 4242;
      s.threads[0].received = 99;
      s.threads[0].dropped[static_cast<int>(dataplane::DropReason::kDuplicate)] = 3;
      JobDataSnapshot& j = s.jobs[11];
      j.counters.completed = 5;
      j.elements_per_packet = 64;
      j.spec.max_outstanding_packets = 128;
      return s;
    };
    auto server = ControlServer::Start(options, sw_.get());
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    target_ = "127.0.0.1:" + std::to_string(server_->port());
    stub_ = switchml_proto::Monitor::NewStub(
        grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  }

  // Registers every rank of a job, rank 0 first.
  void Open(uint64_t session, uint32_t n, const std::string& secret) {
    ControlClient client(target_, 10s);
    for (uint32_t r = 0; r < n; ++r) {
      UdpSessionArgs a;
      a.job_id = session;
      a.rank = r;
      a.num_workers = n;
      a.ipv4 = 0x0a000001 + static_cast<uint32_t>(session) * 256 + r;
      a.size = proto::SizeCode::k256B;
      a.job_secret = secret;
      auto reply = client.UdpSession(a);
      ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    }
  }

  grpc::Status Ask(const std::string& secret, switchml_proto::StatusResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    switchml_proto::StatusRequest req;
    req.set_job_secret(secret);
    return stub_->Status(&ctx, req, out);
  }

  std::unique_ptr<dataplane::LockedSwitch> sw_;
  std::unique_ptr<ControlServer> server_;
  std::string target_;
  std::unique_ptr<switchml_proto::Monitor::Stub> stub_;
};

TEST_F(StatusServiceTest, ShowsOwnAndUnprotectedJobsInFullAndCountsTheOthers) {
  Start(/*require_secret=*/false);
  Open(11, 2, "mine");
  Open(12, 3, "theirs");
  Open(13, 1, "");  // no secret: anyone could join it, anyone sees it
  switchml_proto::StatusResponse s;
  ASSERT_TRUE(Ask("mine", &s).ok());
  ASSERT_EQ(s.jobs_size(), 2);
  EXPECT_EQ(s.other_jobs(), 1u);
  EXPECT_EQ(s.jobs(0).session_id(), 11u);
  EXPECT_EQ(s.jobs(0).num_workers(), 2u);
  EXPECT_EQ(s.jobs(0).workers_registered(), 2u);
  EXPECT_TRUE(s.jobs(0).has_secret());
  // The data plane's figures of the job come from the snapshot.
  EXPECT_EQ(s.jobs(0).elements_aggregated(), 5u * 64);
  EXPECT_EQ(s.jobs(0).window(), 128u);
  EXPECT_EQ(s.jobs(1).session_id(), 13u);
  EXPECT_FALSE(s.jobs(1).has_secret());
  ASSERT_EQ(s.threads_size(), 1);
  EXPECT_EQ(s.threads(0).packets_received(), 99u);
  EXPECT_EQ(s.threads(0).packets_dropped(), 3u);
  EXPECT_EQ(s.transport(), "test");
  EXPECT_EQ(s.uptime_ms(), 7000u);
  EXPECT_EQ(s.max_packet_numel(), 1024u);  // a worker's automatic packet size takes at most it

  // Without a secret: only the unprotected job.
  switchml_proto::StatusResponse anonymous;
  ASSERT_TRUE(Ask("", &anonymous).ok());
  ASSERT_EQ(anonymous.jobs_size(), 1);
  EXPECT_EQ(anonymous.jobs(0).session_id(), 13u);
  EXPECT_EQ(anonymous.other_jobs(), 2u);
}

TEST_F(StatusServiceTest, RefusedWithoutASecretWhenTheSwitchRequiresOne) {
  Start(/*require_secret=*/true);
  Open(11, 2, "mine");
  switchml_proto::StatusResponse s;
  grpc::Status st = Ask("", &s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("--require-secret"), std::string::npos) << st.error_message();
  ASSERT_TRUE(Ask("stranger", &s).ok());
  EXPECT_EQ(s.jobs_size(), 0);
  EXPECT_EQ(s.other_jobs(), 1u);
}

TEST_F(StatusServiceTest, CountsEveryCallByMethodAndCode) {
  Start(/*require_secret=*/true);
  Open(11, 2, "mine");
  switchml_proto::StatusResponse s;
  Ask("", &s);  // refused
  ASSERT_TRUE(Ask("mine", &s).ok());
  std::map<std::string, uint64_t> counts;
  for (const auto& c : s.calls()) counts[c.method() + " " + c.code()] = c.count();
  EXPECT_EQ(counts["Session/UdpSession OK"], 2u);
  EXPECT_EQ(counts["Monitor/Status PERMISSION_DENIED"], 1u);
  // The answer is built before its own call is counted.
  EXPECT_EQ(counts.count("Monitor/Status OK"), 0u);
  bool seen = false;
  for (const CallStats::Entry& e : server_->call_stats().Read()) {
    if (e.method == "Monitor/Status" && e.code == "OK") seen = e.count == 1;
  }
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace switchml::control
