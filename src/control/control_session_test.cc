// Session setup through the gRPC control plane against a real dataplane::LockedSwitch.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <thread>
#include <vector>

#include "base/endpoint.h"
#include "control/control_client.h"
#include "control/control_server.h"
#include "control/switchml.grpc.pb.h"
#include "dataplane/switch.h"
#include "proto/wire.h"

namespace switchml::control {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kIpBase = 0x0a000001;  // 10.0.0.1

class ControlSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sw_ = std::make_unique<dataplane::LockedSwitch>(dataplane::SwitchConfig{});
    ControlServerOptions options;
    options.bind_address = "127.0.0.1";
    options.port = 0;
    options.switch_ipv4 = kLoopbackIpv4;
    // These tests register many hosts' addresses from one client.
    options.registry.allow_foreign_address = true;
    // Registered ranks count as alive only through an attached stream (these tests attach
    // none), so that rank 0 may re-create a session (registry_test covers the grace).
    options.registry.attach_grace = 0ms;
    auto server = ControlServer::Start(options, sw_.get());
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    target_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  ControlClient Client(std::chrono::milliseconds timeout = 10s) {
    return ControlClient(target_, timeout);
  }

  static UdpSessionArgs Args(uint64_t session, uint32_t rank, uint32_t n) {
    UdpSessionArgs a;
    a.job_id = session;
    a.rank = rank;
    a.num_workers = n;
    a.ipv4 = kIpBase + static_cast<uint32_t>(session % 1000) * 256 + rank;
    a.size = proto::SizeCode::k256B;
    return a;
  }

  // Opens a whole session, rank 0 first.
  void OpenSession(uint64_t session, uint32_t n) {
    ControlClient client = Client();
    for (uint32_t r = 0; r < n; ++r) {
      auto reply = client.UdpSession(Args(session, r, n));
      ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    }
  }

  // Feeds one packet per worker for slot 0 into the switch; returns the multicast destinations
  // of the completing packet (empty when the slot did not complete).
  std::vector<Endpoint> CompleteSlot0(uint64_t session, uint32_t n) {
    std::lock_guard lock(sw_->mu);
    std::vector<Endpoint> dests;
    for (uint32_t r = 0; r < n; ++r) {
      proto::Header h;
      h.size = proto::SizeCode::k256B;
      h.job_number = static_cast<uint8_t>(session);
      std::vector<int32_t> values(proto::NumelOf(h.size), 1);
      std::vector<uint8_t> datagram(proto::DatagramBytes(h.size));
      proto::Encode(h, values, datagram);
      const Endpoint source{Args(session, r, n).ipv4, 40000};
      const dataplane::Action& action = sw_->sw.Process(source, datagram);
      if (action.kind == dataplane::Action::Kind::kMulticast) {
        dests.assign(action.destinations.begin(), action.destinations.end());
      }
    }
    return dests;
  }

  std::unique_ptr<dataplane::LockedSwitch> sw_;
  std::unique_ptr<ControlServer> server_;
  std::string target_;
};

// Given four workers ranks 0..3, expect the switch to hold the job with all four registered.
TEST_F(ControlSessionTest, FourWorkersOpenASession) {
  ControlClient client = Client();
  for (uint32_t r = 0; r < 4; ++r) {
    UdpSessionArgs args = Args(77, r, 4);
    args.max_outstanding_packets = 128;
    auto reply = client.UdpSession(args);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->job_id, 77u);
    EXPECT_EQ(reply->switch_ipv4, kLoopbackIpv4);
    EXPECT_EQ(reply->data_port, 48864);
    EXPECT_EQ(reply->max_workers, 32u);
    EXPECT_EQ(reply->num_slots, 8192u);
  }
  {
    std::lock_guard lock(sw_->mu);
    const dataplane::JobSpec* job = sw_->sw.FindJob(77);
    ASSERT_NE(job, nullptr);
    EXPECT_EQ(job->num_workers, 4u);
    EXPECT_EQ(job->size, proto::SizeCode::k256B);
    EXPECT_EQ(job->num_ports, 1u);
    EXPECT_EQ(job->max_outstanding_packets, 128u);
  }
  std::vector<Endpoint> dests = CompleteSlot0(77, 4);
  ASSERT_EQ(dests.size(), 4u);
  std::set<uint32_t> ips;
  for (const Endpoint& e : dests) ips.insert(e.ipv4);
  EXPECT_EQ(ips, (std::set<uint32_t>{Args(77, 0, 4).ipv4, Args(77, 1, 4).ipv4, Args(77, 2, 4).ipv4,
                                     Args(77, 3, 4).ipv4}));
}

// Given two sessions opened concurrently, expect both jobs; when rank 0 of one re-creates its
// session, expect the other intact.
TEST_F(ControlSessionTest, ConcurrentSessionsAndRecreation) {
  auto a = std::async(std::launch::async, [&] { OpenSession(77, 3); });
  auto b = std::async(std::launch::async, [&] { OpenSession(88, 3); });
  a.get();
  b.get();
  EXPECT_EQ(CompleteSlot0(77, 3).size(), 3u);
  EXPECT_EQ(CompleteSlot0(88, 3).size(), 3u);

  ControlClient client = Client();
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 3)).ok());
  // Session 77 is fresh: rank 1 can register again. Session 88 still holds its rank 1.
  EXPECT_TRUE(client.UdpSession(Args(77, 1, 3)).ok());
  auto again = client.UdpSession(Args(88, 1, 3));
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();
  std::lock_guard lock(sw_->mu);
  // Like any refusal of one of its own, that fails (and removes) session 88; 77 is untouched.
  EXPECT_FALSE(sw_->sw.HasJob(88));
  EXPECT_TRUE(sw_->sw.HasJob(77));
}

TEST_F(ControlSessionTest, RefusesDuplicateRank) {
  ControlClient client = Client();
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 4)).ok());
  ASSERT_TRUE(client.UdpSession(Args(77, 1, 4)).ok());
  UdpSessionArgs dup = Args(77, 1, 4);
  dup.ipv4 = 0x0b000001;
  auto reply = client.UdpSession(dup);
  EXPECT_EQ(reply.status().code(), StatusCode::kAlreadyExists) << reply.status().ToString();
  EXPECT_NE(reply.status().message().find("rank 1 is already registered"), std::string::npos)
      << reply.status().message();
}

TEST_F(ControlSessionTest, RefusesRankOutOfRange) {
  ControlClient client = Client();
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 4)).ok());
  auto reply = client.UdpSession(Args(77, 4, 4));
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find("rank 4 is out of range for 4 workers"),
            std::string::npos)
      << reply.status().message();
}

TEST_F(ControlSessionTest, RefusesNumWorkersMismatch) {
  ControlClient client = Client();
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 4)).ok());
  auto reply = client.UdpSession(Args(77, 1, 3));
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find(
                "num_workers 3 does not match session 77's 4 (set by rank 0): start every "
                "worker with the same --workers"),
            std::string::npos)
      << reply.status().message();
}

TEST_F(ControlSessionTest, RefusesOtherSpecMismatches) {
  ControlClient client = Client();
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 4)).ok());
  UdpSessionArgs size = Args(77, 1, 4);
  size.size = proto::SizeCode::k1024B;
  auto reply = client.UdpSession(size);
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find("packet size MTU_1024 does not match"), std::string::npos)
      << reply.status().message();

  ASSERT_TRUE(client.UdpSession(Args(77, 0, 4)).ok());
  UdpSessionArgs ports = Args(77, 1, 4);
  ports.num_udp_ports = 2;
  ports.udp_port = 5000;
  reply = client.UdpSession(ports);
  EXPECT_NE(reply.status().message().find("num_udp_ports 2 does not match"), std::string::npos)
      << reply.status().message();

  ASSERT_TRUE(client.UdpSession(Args(77, 0, 4)).ok());
  UdpSessionArgs window = Args(77, 1, 4);
  window.max_outstanding_packets = 64;
  reply = client.UdpSession(window);
  EXPECT_NE(reply.status().message().find("max_outstanding_packets 64 does not match"),
            std::string::npos)
      << reply.status().message();

  ASSERT_TRUE(client.UdpSession(Args(77, 0, 4)).ok());
  UdpSessionArgs reference_tsi = Args(77, 1, 4);
  reference_tsi.running_tsi = false;
  reply = client.UdpSession(reference_tsi);
  EXPECT_NE(reply.status().message().find("running_tsi false does not match"), std::string::npos)
      << reply.status().message();
}

// Given a job opened with sparse (block-sparse all-reduces, docs/protocol.md 2.5), Expect every
// rank that asks the same to get sparse confirmed, a rank that differs from rank 0 either way to
// be refused naming the field, and a dense job's ranks to get sparse false.
TEST_F(ControlSessionTest, SparseIsPartOfTheJobSpecAndConfirmed) {
  ControlClient client = Client();
  for (bool sparse : {true, false}) {
    const uint64_t session = sparse ? 81 : 82;
    UdpSessionArgs a = Args(session, 0, 3);
    a.sparse = sparse;
    auto reply = client.UdpSession(a);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->sparse, sparse);
    UdpSessionArgs other = Args(session, 1, 3);
    other.sparse = !sparse;
    auto refused = client.UdpSession(other);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(std::string("sparse ") + (sparse ? "false" : "true") +
                                              " does not match"),
              std::string::npos)
        << refused.status().message();
  }
  // The refusal failed those jobs; a new one whose ranks agree.
  for (uint32_t r = 0; r < 2; ++r) {
    UdpSessionArgs a = Args(83, r, 2);
    a.sparse = true;
    auto reply = client.UdpSession(a);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_TRUE(reply->sparse);
  }
}

// Given a sparse job opened with or without the auto rule, Expect ranks that ask the same to get
// it confirmed and a rank that differs to be refused naming sparse_auto (the rule decides how many
// packets each worker sends, so every worker must apply it alike).
TEST_F(ControlSessionTest, SparseAutoIsPartOfTheJobSpec) {
  ControlClient client = Client();
  for (bool automatic : {true, false}) {
    const uint64_t session = automatic ? 84 : 85;
    UdpSessionArgs a = Args(session, 0, 3);
    a.sparse = true;
    a.sparse_auto = automatic;
    auto reply = client.UdpSession(a);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_TRUE(reply->sparse);
    EXPECT_EQ(reply->sparse_auto, automatic);
    UdpSessionArgs same = Args(session, 1, 3);
    same.sparse = true;
    same.sparse_auto = automatic;
    ASSERT_TRUE(client.UdpSession(same).ok());
    UdpSessionArgs other = Args(session, 2, 3);
    other.sparse = true;
    other.sparse_auto = !automatic;
    auto refused = client.UdpSession(other);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(std::string("sparse_auto ") +
                                              (automatic ? "false" : "true") + " does not match"),
              std::string::npos)
        << refused.status().message();
  }
  UdpSessionArgs alone = Args(86, 0, 2);
  alone.sparse_auto = true;
  auto refused = client.UdpSession(alone);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("sparse_auto without sparse"), std::string::npos)
      << refused.status().message();
}

// A controller that knows none of our extension fields, as the reference's: it answers
// UdpSession with the reference's fields only.
class ReferenceLikeSession final : public switchml_proto::Session::Service {
  grpc::Status UdpSession(grpc::ServerContext*, const switchml_proto::UdpSessionRequest* request,
                          switchml_proto::UdpSessionResponse* response) override {
    response->set_session_id(request->session_id());
    return grpc::Status::OK;
  }
};

// Given a switch without block-sparse jobs (a reference controller ignores the request's sparse),
// Expect a worker that asked for them to fail with FAILED_PRECONDITION saying so, one that asked
// with the auto rule to be told dense, and one that did not ask to be served as ever.
TEST(ControlReferenceSwitchTest, SparseNeedsASwitchThatConfirmsIt) {
  ReferenceLikeSession service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  ControlClient client("127.0.0.1:" + std::to_string(port), 10s);
  UdpSessionArgs a;
  a.job_id = 5;
  a.num_workers = 2;
  a.size = proto::SizeCode::k256B;
  auto dense = client.UdpSession(a);
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  EXPECT_EQ(dense->data_port, proto::kDefaultDataPort);
  EXPECT_FALSE(dense->sparse);
  a.sparse = true;
  auto sparse = client.UdpSession(a);
  EXPECT_EQ(sparse.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(sparse.status().message().find("does not support block-sparse jobs"), std::string::npos)
      << sparse.status().message();
  // With the auto rule the worker runs dense instead (every worker asks the same switch, and is
  // told the same).
  a.sparse_auto = true;
  auto automatic = client.UdpSession(a);
  ASSERT_TRUE(automatic.ok()) << automatic.status().ToString();
  EXPECT_FALSE(automatic->sparse);
  EXPECT_FALSE(automatic->sparse_auto);
  server->Shutdown();
}

// Given rank 0's running_tsi, Expect the switch's job to carry it (it selects the switch's
// late-duplicate rule); and Expect "any port" with several ports per worker to be refused.
TEST_F(ControlSessionTest, RunningTsiReachesTheSwitchAndAnyPortNeedsOnePort) {
  ControlClient client = Client();
  for (bool running : {true, false}) {
    UdpSessionArgs a = Args(running ? 90 : 91, 0, 1);
    a.running_tsi = running;
    ASSERT_TRUE(client.UdpSession(a).ok());
    std::lock_guard<std::mutex> lock(sw_->mu);
    const dataplane::JobSpec* job = sw_->sw.FindJob(running ? 90 : 91);
    ASSERT_NE(job, nullptr);
    EXPECT_EQ(job->running_tsi, running);
  }
  UdpSessionArgs any = Args(92, 0, 2);
  any.udp_port = 0;
  any.num_udp_ports = 2;
  auto reply = client.UdpSession(any);
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find("register the base port"), std::string::npos)
      << reply.status().message();
}

TEST_F(ControlSessionTest, RefusesNumWorkersOverTheLimit) {
  ControlClient client = Client();
  auto reply = client.UdpSession(Args(77, 0, 33));
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find("limit of 32"), std::string::npos)
      << reply.status().message();
  std::lock_guard lock(sw_->mu);
  EXPECT_FALSE(sw_->sw.HasJob(77));
}

TEST_F(ControlSessionTest, RefusesUnsupportedPacketSize) {
  ControlClient client = Client();
  UdpSessionArgs args = Args(77, 0, 2);
  args.size = proto::SizeCode::k512B;
  auto reply = client.UdpSession(args);
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reply.status().message(),
            "packet size MTU_512 is not supported; use 64, 256, 512, 1024 or 2048 elements per "
            "packet (512 and up where the switch enables them)");
}

// Given a switch that does not enable jumbo packets (max_packet_numel 256, the default), and a
// worker asking for 2048-element packets (PacketSize 6, docs/protocol.md 2.6), Expect
// FAILED_PRECONDITION naming the largest size the switch takes and both ways out, and no job.
TEST_F(ControlSessionTest, RefusesJumboPacketsTheSwitchDoesNotEnable) {
  ControlClient client = Client();
  UdpSessionArgs args = Args(77, 0, 2);
  args.size = proto::SizeCode::k8192B;
  auto reply = client.UdpSession(args);
  EXPECT_EQ(reply.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(reply.status().message(),
            "packet size MTU_8192 (packet_numel 2048) is not enabled on this switch: it takes at "
            "most 256 elements per packet; use packet_numel 256 or less, or start the switch "
            "with --max-packet-numel 2048");
  std::lock_guard lock(sw_->mu);
  EXPECT_FALSE(sw_->sw.HasJob(77));
}

TEST_F(ControlSessionTest, RefusesUnknownSession) {
  ControlClient client = Client();
  auto reply = client.UdpSession(Args(77, 1, 2));
  EXPECT_EQ(reply.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(reply.status().message().find("session 77 does not exist"), std::string::npos)
      << reply.status().message();
  // Rank 0 then opens the session and clears the failure: rank 1 is welcome.
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 2)).ok());
  EXPECT_TRUE(client.UdpSession(Args(77, 1, 2)).ok());
}

TEST_F(ControlSessionTest, RefusesAddressConflict) {
  ControlClient client = Client();
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 2)).ok());
  UdpSessionArgs other = Args(88, 0, 2);
  other.ipv4 = Args(77, 0, 2).ipv4;
  auto reply = client.UdpSession(other);
  EXPECT_EQ(reply.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(reply.status().message().find("is registered to rank 0 of session 77"),
            std::string::npos)
      << reply.status().message();
  std::lock_guard lock(sw_->mu);
  EXPECT_FALSE(sw_->sw.HasJob(88)) << "a job whose rank 0 was refused is not kept";
  EXPECT_TRUE(sw_->sw.HasJob(77));
}

TEST_F(ControlSessionTest, RdmaSessionIsUnimplemented) {
  auto channel = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
  auto stub = switchml_proto::Session::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  switchml_proto::RdmaSessionRequest req;
  switchml_proto::RdmaSessionResponse resp;
  grpc::Status st = stub->RdmaSession(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(st.error_message(), "RDMA sessions are not supported by the software switch; use UDP");
}

// Given a session of 3 with a barrier already waiting, when rank 2 is refused, expect the waiting
// barrier released at once with the reason, later barriers and broadcasts of the session failing
// at once, other sessions unaffected, and rank 0 re-creating the session clearing the failure.
TEST_F(ControlSessionTest, RefusalFailsTheSessionsSyncCallsFast) {
  ControlClient client = Client(20s);
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 3)).ok());
  ASSERT_TRUE(client.UdpSession(Args(77, 1, 3)).ok());
  const auto start = std::chrono::steady_clock::now();
  auto waiting = std::async(std::launch::async, [&] { return client.Barrier(77, 3); });
  while (server_->registry().counts().waiting_calls < 1) std::this_thread::sleep_for(5ms);

  UdpSessionArgs bad = Args(77, 2, 3);
  bad.num_workers = 4;
  ASSERT_FALSE(client.UdpSession(bad).ok());

  const Status released = waiting.get();
  EXPECT_EQ(released.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(released.message().find("session 77 failed at setup: rank 2 was refused: "
                                    "num_workers 4 does not match session 77's 3"),
            std::string::npos)
      << released.message();
  Status later = client.Barrier(77, 3);
  EXPECT_EQ(later.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(later.message(), released.message());
  auto bcast = client.Broadcast(77, 5, 0, 3, 0);
  EXPECT_EQ(bcast.status().code(), StatusCode::kFailedPrecondition);
  // A correct rank arriving after the failure is refused with the session's reason.
  auto late = client.UdpSession(Args(77, 2, 3));
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status().message().find("rank 2 was refused"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);

  // Another session's barrier is not affected.
  EXPECT_TRUE(client.Barrier(88, 1).ok());

  // Rank 0 re-creates the session: its barriers work again.
  ASSERT_TRUE(client.UdpSession(Args(77, 0, 3)).ok());
  ASSERT_TRUE(client.UdpSession(Args(77, 1, 3)).ok());
  ASSERT_TRUE(client.UdpSession(Args(77, 2, 3)).ok());
  std::vector<std::future<Status>> barriers;
  for (int i = 0; i < 3; ++i) {
    barriers.push_back(std::async(std::launch::async, [&] { return client.Barrier(77, 3); }));
  }
  for (auto& f : barriers) EXPECT_TRUE(f.get().ok());
}

// Given a session that failed, and a new attempt with the same job id whose rank 1 reaches
// the first barrier before rank 0 re-opens the session, Expect the old failure to stop failing
// calls once the server's failure memory (here 300 ms) has passed.
TEST(ControlFailureMemoryTest, AnOldFailureDoesNotFailANewAttempt) {
  dataplane::LockedSwitch sw(dataplane::SwitchConfig{});
  ControlServerOptions options;
  options.bind_address = "127.0.0.1";
  options.port = 0;
  options.registry.failure_memory = 300ms;
  options.registry.allow_foreign_address = true;
  auto server = ControlServer::Start(options, &sw);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ControlClient client("127.0.0.1:" + std::to_string((*server)->port()), 5s);
  UdpSessionArgs a0;
  a0.job_id = 55;
  a0.rank = 0;
  a0.num_workers = 2;
  a0.ipv4 = 0x0a000101;
  ASSERT_TRUE(client.UdpSession(a0).ok());
  UdpSessionArgs bad = a0;
  bad.rank = 1;
  bad.ipv4 = 0x0a000102;
  bad.num_workers = 3;
  ASSERT_FALSE(client.UdpSession(bad).ok());
  EXPECT_EQ(client.Barrier(55, 2).code(), StatusCode::kFailedPrecondition);
  std::this_thread::sleep_for(400ms);
  // The new attempt: rank 1 waits at the barrier first, then rank 0 arrives; both pass.
  auto rank1 = std::async(std::launch::async, [&] { return client.Barrier(55, 2); });
  while ((*server)->registry().counts().waiting_calls < 1) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(client.Barrier(55, 2).ok());
  EXPECT_TRUE(rank1.get().ok());
}

// Given ipv4 = 0, expect the worker registered at the address its gRPC call came from.
TEST_F(ControlSessionTest, ZeroIpv4MeansThePeerAddress) {
  ControlClient client = Client();
  UdpSessionArgs args = Args(77, 0, 1);
  args.ipv4 = 0;
  ASSERT_TRUE(client.UdpSession(args).ok());
  // The 127.0.0.1 address is now taken by session 77 (any port).
  UdpSessionArgs other = Args(88, 0, 1);
  other.ipv4 = kLoopbackIpv4;
  auto reply = client.UdpSession(other);
  EXPECT_EQ(reply.status().code(), StatusCode::kAlreadyExists) << reply.status().ToString();
  EXPECT_NE(reply.status().message().find("127.0.0.1"), std::string::npos)
      << reply.status().message();
}

// Issue 28, found 6, second part: Attach streams that never sent their first message were not
// counted in any limit (20,000 from one address were accepted; the switch's memory grew from
// 25 MB to 395 MB). Given a switch that allows 8 calls per client, Expect a client's 20 silent
// streams to be 8 open and 12 ended at once with RESOURCE_EXHAUSTED; and a silent stream to end
// after first_message_timeout.
TEST(ControlAbuseTest, StreamsWithoutAFirstMessageAreCountedAndEnded) {
  dataplane::LockedSwitch sw{dataplane::SwitchConfig{}};
  ControlServerOptions o;
  o.bind_address = "127.0.0.1";
  o.port = 0;
  o.registry.max_calls_per_client = 8;
  o.registry.first_message_timeout = 1s;
  auto server = ControlServer::Start(o, &sw);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = switchml_proto::Session::NewStub(channel);
  struct Silent {
    grpc::ClientContext ctx;
    std::unique_ptr<
        grpc::ClientReaderWriter<switchml_proto::AttachRequest, switchml_proto::AttachEvent>>
        stream;
    std::thread reader;
    std::atomic<bool> ended{false};
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Silent>> silent;
  for (int i = 0; i < 20; ++i) {
    auto s = std::make_unique<Silent>();
    s->ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    s->stream = stub->Attach(&s->ctx);
    s->reader = std::thread([p = s.get()] {
      switchml_proto::AttachEvent event;
      while (p->stream->Read(&event)) {
      }
      p->status = p->stream->Finish();
      p->ended = true;
    });
    silent.push_back(std::move(s));
  }
  auto ended = [&] {
    int n = 0;
    for (auto& s : silent) n += s->ended.load();
    return n;
  };
  // The 12 over the limit end at once; the 8 others after the first-message timeout (1 s, at
  // the next once-a-second tick).
  const auto start = std::chrono::steady_clock::now();
  while (ended() < 12 && std::chrono::steady_clock::now() - start < 30s) {
    std::this_thread::sleep_for(10ms);
  }
  int exhausted = 0;
  for (auto& s : silent) {
    exhausted += s->ended && s->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  EXPECT_EQ(exhausted, 12);
  while (ended() < 20 && std::chrono::steady_clock::now() - start < 30s) {
    std::this_thread::sleep_for(10ms);
  }
  int timed_out = 0;
  for (auto& s : silent) {
    if (!s->ended) s->ctx.TryCancel();
    s->reader.join();
    timed_out += s->status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                 s->status.error_message().find("no first message") != std::string::npos;
  }
  EXPECT_EQ(timed_out, 8);
}

// Issue 28, found 1: the switch's own listener bounds connections per address and makes room
// from connections that never carried a call. Given a client whose connection carried a call,
// and a flood of idle connections from its address over the limit, Expect the idle ones closed
// to make room (oldest first) and the client's connection kept (its channel stays ready).
TEST(ControlAbuseTest, ConnectionsThatCarriedCallsAreNeverClosedToMakeRoom) {
  dataplane::LockedSwitch sw{dataplane::SwitchConfig{}};
  ControlServerOptions o;
  o.bind_address = "127.0.0.1";
  o.port = 0;
  o.max_connections_per_address = 3;
  auto server = ControlServer::Start(o, &sw);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string target = "127.0.0.1:" + std::to_string((*server)->port());
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = switchml_proto::Session::NewStub(channel);
  {
    grpc::ClientContext ctx;
    switchml_proto::CloseRequest req;
    req.set_session_id(5);
    switchml_proto::CloseResponse resp;
    EXPECT_EQ(stub->Close(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  std::vector<int> idle;
  for (int i = 0; i < 6; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons((*server)->port());
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
    idle.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  while ((*server)->connection_stats().accepted < 7 &&
         std::chrono::steady_clock::now() - start < 20s) {
    std::this_thread::sleep_for(5ms);
  }
  const ControlServer::ConnectionStats stats = (*server)->connection_stats();
  EXPECT_EQ(stats.accepted, 7u);
  EXPECT_EQ(stats.evicted, 4u);  // the 3rd..6th idle ones each closed the oldest idle one
  EXPECT_EQ(stats.open, 3u);
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  for (int fd : idle) close(fd);
}

TEST(ParsePeerIpv4Test, Forms) {
  uint32_t ip = 0;
  EXPECT_TRUE(ParsePeerIpv4("ipv4:127.0.0.1:5555", &ip));
  EXPECT_EQ(ip, 0x7f000001u);
  EXPECT_TRUE(ParsePeerIpv4("ipv6:[::ffff:10.1.2.3]:5555", &ip));
  EXPECT_EQ(ip, 0x0a010203u);
  EXPECT_TRUE(ParsePeerIpv4("ipv6:%5B::ffff:10.1.2.4%5D:5555", &ip));
  EXPECT_EQ(ip, 0x0a010204u);
  EXPECT_TRUE(ParsePeerIpv4("ipv6:[::1]:80", &ip));
  EXPECT_EQ(ip, 0x7f000001u);
  EXPECT_FALSE(ParsePeerIpv4("ipv6:[2001:db8::1]:80", &ip));
  EXPECT_FALSE(ParsePeerIpv4("unix:/tmp/sock", &ip));
  EXPECT_FALSE(ParsePeerIpv4("ipv4:garbage:1", &ip));
}

TEST(ControlServerStartTest, PortInUseIsAClearError) {
  dataplane::LockedSwitch sw{dataplane::SwitchConfig{}};
  ControlServerOptions options;
  options.bind_address = "127.0.0.1";
  options.port = 0;
  auto first = ControlServer::Start(options, &sw);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  options.port = (*first)->port();
  auto second = ControlServer::Start(options, &sw);
  ASSERT_FALSE(second.ok());
  const std::string address = "127.0.0.1:" + std::to_string(options.port);
  EXPECT_NE(second.status().message().find(address), std::string::npos)
      << second.status().message();
  EXPECT_NE(second.status().message().find("pick another --control-port"), std::string::npos)
      << second.status().message();
}

}  // namespace
}  // namespace switchml::control
