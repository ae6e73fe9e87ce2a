// Uplink without a network: rack placement and the rewriting (or refusal) of a worker's
// registration at a top-of-rack switch.
#include "runtime/uplink.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/endpoint.h"
#include "control/control_client.h"
#include "control/control_server.h"
#include "control/switchml.pb.h"
#include "testing/forge.h"

namespace switchml::runtime {
namespace {

// A caller without a deadline.
constexpr auto kNoDeadline = std::chrono::system_clock::time_point::max();

TEST(PlaceRackTest, ContiguousRanksSizesDifferingByAtMostOne) {
  // 5 workers over 2 racks: 0-1 and 2-4.
  auto r0 = PlaceRack(5, 2, 0), r1 = PlaceRack(5, 2, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(r0->first_rank, 0u);
  EXPECT_EQ(r0->num_workers, 2u);
  EXPECT_EQ(r1->first_rank, 2u);
  EXPECT_EQ(r1->num_workers, 3u);
  // Every rank in exactly one rack, for many shapes.
  for (uint32_t n = 1; n <= 70; ++n) {
    for (uint32_t racks = 1; racks <= n; ++racks) {
      uint32_t next = 0;
      for (uint32_t r = 0; r < racks; ++r) {
        auto p = PlaceRack(n, racks, r);
        ASSERT_TRUE(p.ok());
        EXPECT_EQ(p->first_rank, next);
        EXPECT_GE(p->num_workers, n / racks);
        EXPECT_LE(p->num_workers, n / racks + 1);
        next += p->num_workers;
      }
      EXPECT_EQ(next, n);
    }
  }
  EXPECT_FALSE(PlaceRack(3, 4, 0).ok());  // fewer workers than racks
  EXPECT_FALSE(PlaceRack(8, 2, 2).ok());  // no such rack
}

// Options of rack `rack_index` of `racks` whose upstream switch is never contacted here (its
// registrations time out after 50 ms).
UplinkOptions UnreachableUpstream(uint32_t racks, uint32_t rack_index) {
  UplinkOptions o;
  o.upstream = "127.0.0.1:1";
  o.racks = racks;
  o.rack_index = rack_index;
  o.data_port = 48864;
  o.timeout = std::chrono::milliseconds(50);
  EXPECT_TRUE(o.Validate().ok());
  return o;
}

TEST(UplinkTest, MapsGlobalRanksToTheRackAndRefusesOtherRacks) {
  dataplane::LockedSwitch sw(dataplane::SwitchConfig{});
  Uplink uplink(UnreachableUpstream(3, 1), &sw);
  // 7 workers over 3 racks: 0-1, 2-3, 4-6. Rank 2 is rack 1's local rank 0.
  switchml_proto::UdpSessionRequest req;
  req.set_session_id(5);
  req.set_rank(2);
  req.set_num_workers(7);
  ASSERT_TRUE(uplink.BeforeUdpSession(&req, kNoDeadline).ok());
  EXPECT_EQ(req.rank(), 0u);
  EXPECT_EQ(req.num_workers(), 2u);
  // Rank 5 belongs to rack 2: refused, naming its rack.
  req.set_rank(5);
  req.set_num_workers(7);
  const Status st = uplink.BeforeUdpSession(&req, kNoDeadline);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("belongs to rack 2"), std::string::npos) << st.message();
  // Rank 3 (local rank 1) waits for local rank 0's upstream registration, which never comes.
  req.set_rank(3);
  req.set_num_workers(7);
  EXPECT_EQ(uplink.BeforeUdpSession(&req, kNoDeadline).code(), StatusCode::kDeadlineExceeded);
  // After shutdown, waiting ones fail at once.
  uplink.Shutdown();
  req.set_rank(3);
  req.set_num_workers(7);
  EXPECT_EQ(uplink.BeforeUdpSession(&req, kNoDeadline).code(), StatusCode::kUnavailable);
}

// A worker's Attach stream and Close at a top-of-rack switch: the global rank becomes the
// rack's, the stream is named by the global rank, and other racks' ranks are refused.
TEST(UplinkTest, MapsAttachAndCloseToTheRack) {
  dataplane::LockedSwitch sw(dataplane::SwitchConfig{});
  Uplink uplink(UnreachableUpstream(2, 1), &sw);
  switchml_proto::AttachRequest attach;
  attach.set_session_id(9);
  attach.set_rank(2);
  // Before the session is open on this switch: refused.
  EXPECT_EQ(uplink.BeforeAttach(&attach).code(), StatusCode::kFailedPrecondition);
  // 4 workers over 2 racks: this one holds ranks 2-3.
  switchml_proto::UdpSessionRequest req;
  req.set_session_id(9);
  req.set_rank(2);
  req.set_num_workers(4);
  const switchml_proto::UdpSessionRequest sent = req;
  ASSERT_TRUE(uplink.BeforeUdpSession(&req, kNoDeadline).ok());
  // Registered (here without a registry): the session is open on this ToR, though its upstream
  // cannot open (the upstream is unreachable).
  EXPECT_FALSE(uplink.AfterUdpSession(sent, req, kNoDeadline).ok());
  attach.set_rank(3);
  ASSERT_TRUE(uplink.BeforeAttach(&attach).ok());
  EXPECT_EQ(attach.rank(), 1u);
  EXPECT_EQ(attach.member(), "rank 3");
  attach.set_rank(1);
  EXPECT_EQ(uplink.BeforeAttach(&attach).code(), StatusCode::kInvalidArgument);
  switchml_proto::CloseRequest close;
  close.set_session_id(9);
  close.set_rank(3);
  ASSERT_TRUE(uplink.BeforeClose(&close).ok());
  EXPECT_EQ(close.rank(), 1u);
  close.set_rank(0);
  EXPECT_EQ(uplink.BeforeClose(&close).code(), StatusCode::kInvalidArgument);
  close.clear_rank();  // the whole job: passed on as it is
  EXPECT_TRUE(uplink.BeforeClose(&close).ok());
  // Once its job ended here, the session is forgotten.
  uplink.OnJobEnded(9, Status::Ok());
  attach.set_rank(3);
  EXPECT_EQ(uplink.BeforeAttach(&attach).code(), StatusCode::kFailedPrecondition);
}

TEST(UplinkTest, OptionsAreValidated) {
  UplinkOptions o;
  o.upstream = "spine:50099";
  o.racks = 2;
  o.rack_index = 2;
  o.data_port = 1;
  EXPECT_FALSE(o.Validate().ok());
  o.rack_index = 1;
  EXPECT_TRUE(o.Validate().ok());
  o.upstream = "";
  EXPECT_FALSE(o.Validate().ok());
}

// The rack's first rank refused by the ToR's own registration (here: a window larger than the
// switch's slots): the rack's other ranks, waiting for it, fail at once with why, instead of
// waiting for the uplink's whole timeout and then blaming the first rank for not showing up.
TEST(UplinkTest, RackStopsWaitingWhenItsFirstRankIsRefused) {
  using namespace std::chrono_literals;
  dataplane::SwitchConfig config;
  config.slots_per_job = 64;
  dataplane::LockedSwitch sw(config);
  UplinkOptions uo = UnreachableUpstream(2, 1);
  uo.timeout = 10s;
  Uplink uplink(uo, &sw);
  control::ControlServerOptions so;
  so.bind_address = "127.0.0.1";
  so.port = 0;
  so.hooks = &uplink;
  auto server = control::ControlServer::Start(so, &sw);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  uplink.set_registry(&(*server)->registry());
  const std::string target = "127.0.0.1:" + std::to_string((*server)->port());
  control::ControlClient first(target, 30s), second(target, 30s);
  // 4 workers over 2 racks: this ToR holds ranks 2-3.
  control::UdpSessionArgs a;
  a.job_id = 11;
  a.num_workers = 4;
  a.ipv4 = kLoopbackIpv4;
  a.max_outstanding_packets = 128;  // more than the 64 slots: refused
  a.job_secret = "s";
  // Rank 3 first: it waits for rank 2, which is then refused.
  control::UdpSessionArgs b = a;
  b.rank = 3;
  b.udp_port = 41002;
  const auto start = std::chrono::steady_clock::now();
  auto waiting = std::async(std::launch::async, [&] { return second.UdpSession(b).status(); });
  std::this_thread::sleep_for(300ms);
  a.rank = 2;
  a.udp_port = 41000;
  EXPECT_EQ(first.UdpSession(a).status().code(), StatusCode::kInvalidArgument);
  const Status st = waiting.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "rank 3 waited for the timeout";
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("rank 2 (the first of rack 1) was refused by its top-of-rack"),
            std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("max_outstanding_packets 128"), std::string::npos) << st.ToString();
  (*server)->Shutdown();
  uplink.Shutdown();
}

// Given a ToR whose upstream does not answer, expect a worker whose setup gives up first to say
// that the ToR took its call (not that no switch runs there, as it said before) and to point at
// the upstream.
TEST(UplinkTest, WorkerTimingOutAtATorSaysItsUpstreamDidNotAnswer) {
  using namespace std::chrono_literals;
  dataplane::SwitchConfig config;
  config.slots_per_job = 64;
  dataplane::LockedSwitch sw(config);
  UplinkOptions uo = UnreachableUpstream(1, 0);
  uo.timeout = 2s;  // the ToR's own wait for the upstream, longer than the worker's
  Uplink uplink(uo, &sw);
  control::ControlServerOptions so;
  so.bind_address = "127.0.0.1";
  so.port = 0;
  so.hooks = &uplink;
  auto server = control::ControlServer::Start(so, &sw);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  uplink.set_registry(&(*server)->registry());
  control::ControlClient worker("127.0.0.1:" + std::to_string((*server)->port()), 500ms);
  control::UdpSessionArgs a;
  a.job_id = 12;
  a.num_workers = 1;
  a.ipv4 = kLoopbackIpv4;
  a.udp_port = 41004;
  a.max_outstanding_packets = 64;
  const Status st = worker.UdpSession(a).status();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("accepted the connection but did not answer within 500 ms"),
            std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("its upstream switch did not answer"), std::string::npos)
      << st.ToString();
  (*server)->Shutdown();
  uplink.Shutdown();
}

// Spine-side hooks (a spine's ControlServerOptions::hooks) that pass everything through and
// leave Barrier and Broadcast to the registry; the tests' hooks override what they change.
class PassThroughHooks : public control::SessionHooks {
 public:
  Status BeforeUdpSession(switchml_proto::UdpSessionRequest*,
                          std::chrono::system_clock::time_point) override {
    return Status::Ok();
  }
  Status AfterUdpSession(const switchml_proto::UdpSessionRequest&,
                         const switchml_proto::UdpSessionRequest&,
                         std::chrono::system_clock::time_point) override {
    return Status::Ok();
  }
  void UdpSessionRefused(const switchml_proto::UdpSessionRequest&,
                         const switchml_proto::UdpSessionRequest&, const Status&) override {}
  Status BeforeAttach(switchml_proto::AttachRequest*) override { return Status::Ok(); }
  Status BeforeClose(switchml_proto::CloseRequest*) override { return Status::Ok(); }
  bool ForwardsSync() const override { return false; }
  Status Barrier(const switchml_proto::BarrierRequest&, std::chrono::system_clock::time_point,
                 control::ErrorReason*) override {
    return InternalError("not forwarded");
  }
  Result<uint64_t> Broadcast(const switchml_proto::BroadcastRequest&,
                             std::chrono::system_clock::time_point,
                             control::ErrorReason*) override {
    return InternalError("not forwarded");
  }
};

// A spine and a one-rack ToR with an Uplink, on loopback. `spine_registry`: the spine's
// registry options (its leases); `spine_hooks`: the spine server's hooks (not owned), if any.
struct TwoLevels {
  // The ToR: `tor_config`, rack `rack_index` of `racks`.
  explicit TwoLevels(const control::RegistryOptions& spine_registry = {},
                     control::SessionHooks* spine_hooks = nullptr,
                     const dataplane::SwitchConfig& tor_config = {}, uint32_t racks = 1,
                     uint32_t rack_index = 0)
      : tor_sw(tor_config) {
    using namespace std::chrono_literals;
    control::ControlServerOptions so;
    so.bind_address = "127.0.0.1";
    so.port = 0;
    so.registry = spine_registry;
    so.hooks = spine_hooks;
    auto s = control::ControlServer::Start(so, &spine_sw);
    so.registry = {};
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    spine = std::move(s).value();
    UplinkOptions uo = UnreachableUpstream(racks, rack_index);
    uo.upstream = "127.0.0.1:" + std::to_string(spine->port());
    uo.timeout = 5s;
    uplink = std::make_unique<Uplink>(uo, &tor_sw);
    so.hooks = uplink.get();
    // As the switch daemon wires them.
    so.registry_hooks.job_ended = [u = uplink.get()](uint64_t id, const Status& why) {
      u->OnJobEnded(id, why);
    };
    so.registry_hooks.check_agreed = [u = uplink.get()](uint64_t id, uint64_t op, uint64_t count,
                                                        uint32_t dtype) {
      u->OnCheckAgreed(id, op, count, dtype);
    };
    auto t = control::ControlServer::Start(so, &tor_sw);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    tor = std::move(t).value();
    uplink->set_registry(&tor->registry());
  }
  ~TwoLevels() {
    // As the switch daemon: the uplink releases its waiting calls, which the ToR's Shutdown
    // waits for.
    uplink->Shutdown();
    tor->Shutdown();
    spine->Shutdown();
  }
  std::string tor_target() const { return "127.0.0.1:" + std::to_string(tor->port()); }
  std::string spine_target() const { return "127.0.0.1:" + std::to_string(spine->port()); }
  dataplane::LockedSwitch spine_sw{dataplane::SwitchConfig{}};
  dataplane::LockedSwitch tor_sw;
  std::unique_ptr<control::ControlServer> spine;
  std::unique_ptr<Uplink> uplink;
  std::unique_ptr<control::ControlServer> tor;
};

control::UdpSessionArgs RankZeroOfOne(uint64_t job_id, const std::string& secret) {
  control::UdpSessionArgs a;
  a.job_id = job_id;
  a.num_workers = 1;
  a.ipv4 = kLoopbackIpv4;
  a.udp_port = 41000;
  a.job_secret = secret;
  return a;
}

// Rank 0 of job_id from another job (another secret, another port).
control::UdpSessionArgs StrangersRankZero(uint64_t job_id) {
  control::UdpSessionArgs a = RankZeroOfOne(job_id, "a stranger's");
  a.udp_port = 41100;
  return a;
}

// The job of job_id is still open at both levels once a stream that a refused request
// ended would have been noticed.
void ExpectJobKeptAtBothLevels(const TwoLevels& h, uint64_t job_id) {
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(h.spine->registry().HasJob(job_id)) << "the spine lost the job";
  EXPECT_TRUE(h.tor->registry().HasJob(job_id)) << "the ToR lost the job";
}

// A second rank 0 of a job whose upstream is open (two workers started as rank 0) is refused;
// the ToR's control plane used to deadlock on it (the Uplink's mutex locked twice), so the call
// timed out and every later call to the ToR hung.
TEST(UplinkTest, SecondRankZeroAtTheTorIsAnsweredAndTheTorGoesOn) {
  using namespace std::chrono_literals;
  TwoLevels h;
  control::ControlClient worker(h.tor_target(), 5s);
  ASSERT_TRUE(worker.UdpSession(RankZeroOfOne(12, "s")).ok());
  control::UdpSessionArgs again = RankZeroOfOne(12, "s");
  again.udp_port = 41100;
  EXPECT_EQ(worker.UdpSession(again).status().code(), StatusCode::kAlreadyExists);
  // The refusal ended session 12's upstream (on the Uplink's thread), at the spine too, whose
  // registration of it held the ToR's data address, which session 13 needs too (ToR-side,
  // session 13's registration at the spine waits for that end).
  // The ToR still answers.
  EXPECT_TRUE(worker.UdpSession(RankZeroOfOne(13, "s")).ok());
}

// Spine-side hooks that pass everything through, except the first Attach stream of
// `job_id`: held for `hold` (its gRPC thread waits: a ToR's upstream stream that has not
// attached at the spine yet), then refused when `refuse`.
class FirstAttach final : public PassThroughHooks {
 public:
  FirstAttach(uint64_t job_id, std::chrono::milliseconds hold, bool refuse)
      : session_id_(job_id), hold_(hold), refuse_(refuse) {}
  Status BeforeAttach(switchml_proto::AttachRequest* request) override {
    if (request->session_id() != session_id_ || seen_.exchange(true)) return Status::Ok();
    std::this_thread::sleep_for(hold_);
    if (refuse_) return UnavailableError("the test's spine refuses this stream");
    return Status::Ok();
  }
  bool seen() const { return seen_.load(); }

 private:
  const uint64_t session_id_;
  const std::chrono::milliseconds hold_;
  const bool refuse_;
  std::atomic<bool> seen_{false};
};

// A spine whose every Barrier fails at once with DEADLINE_EXCEEDED, `message`, and, when
// `with_reason`, the typed reason ROUND_EXPIRED (as the spine's registry ends a wait at its
// deadline, whatever its words).
class ExpiringSpine final : public PassThroughHooks {
 public:
  ExpiringSpine(std::string message, bool with_reason)
      : message_(std::move(message)), with_reason_(with_reason) {}
  bool ForwardsSync() const override { return true; }
  Status Barrier(const switchml_proto::BarrierRequest&, std::chrono::system_clock::time_point,
                 control::ErrorReason* reason) override {
    if (with_reason_) *reason = control::ErrorReason::kRoundExpired;
    return DeadlineExceededError(message_);
  }

 private:
  const std::string message_;
  const bool with_reason_;
};

// Given a switch that ends a barrier with the reason ROUND_EXPIRED and words that name nobody,
// and one that sends the words the switch's expiry uses ("rank 1 did not arrive within") without
// the reason (as a reference switch, or ours before the reason, would), expect the worker to keep
// the first's message and to put its own in place of the second's: the reason decides, not the
// text. Both straight from the switch and through a top-of-rack switch, which passes the reason
// on (the spine is the ExpiringSpine, the ToR forwards the barrier to it).
TEST(UplinkTest, TheReasonNotTheTextMakesAnExpiryTheSwitchs) {
  using namespace std::chrono_literals;
  const std::string kExpiryWords =
      "barrier of session 5 (2 workers): rank 1 did not arrive within 1 s (waiting: rank 0): did "
      "it fail or start with other arguments?";
  for (const bool with_reason : {true, false}) {
    ExpiringSpine hooks(with_reason ? "words that name nobody" : kExpiryWords, with_reason);
    TwoLevels h({}, &hooks);
    for (const std::string& target : {h.spine_target(), h.tor_target()}) {
      SCOPED_TRACE((with_reason ? "with the reason, at " : "without it, at ") + target);
      control::ControlClient worker(target, 5s);
      const Status st = worker.Barrier(5, 2, "s", 0u);
      EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
      if (with_reason) {
        EXPECT_EQ(st.message(), "words that name nobody");
      } else {
        EXPECT_EQ(st.message(),
                  "barrier of session 5 (2 workers) timed out after 5 s: a peer worker did not "
                  "arrive (did it fail or start with other arguments?)");
      }
    }
  }
}

// Given: session 12's upstream stream has not attached at the spine yet (held there for 1 s)
// when a second rank 0 at the ToR makes the ToR drop that upstream. Expect: the ToR ends its
// job at the spine, so the ToR's next job (session 13, which needs the ToR's data address that
// session 12 holds at the spine) is accepted within about that second, not after the spine's
// lease (60 s); it used to be refused at once ("is registered to rank 0 of session 12, a live
// job"), and the spine kept session 12 until its lease.
TEST(UplinkTest, UpstreamDroppedBeforeItsStreamAttachedEndsAtTheSpine) {
  using namespace std::chrono_literals;
  FirstAttach spine_hooks(12, 1s, /*refuse=*/false);
  TwoLevels h({}, &spine_hooks);
  control::ControlClient worker(h.tor_target(), 10s);
  ASSERT_TRUE(worker.UdpSession(RankZeroOfOne(12, "s")).ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return spine_hooks.seen(); }, 5s));
  control::UdpSessionArgs again = RankZeroOfOne(12, "s");
  again.udp_port = 41100;
  EXPECT_EQ(worker.UdpSession(again).status().code(), StatusCode::kAlreadyExists);
  const auto start = std::chrono::steady_clock::now();
  const auto next = worker.UdpSession(RankZeroOfOne(13, "s"));
  EXPECT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_FALSE(h.spine->registry().HasJob(12));
}

// Given: the spine refuses the ToR's upstream stream of session 12, so the ToR's job fails
// with its stream never attached at the spine. Expect: the ToR closes its rank at the spine, and
// its next job (session 13, on the same data address) is accepted; the spine used to keep
// session 12 until its lease (60 s) and refuse session 13 meanwhile.
TEST(UplinkTest, UpstreamThatNeverAttachedIsClosedAtTheSpine) {
  using namespace std::chrono_literals;
  FirstAttach spine_hooks(12, 0ms, /*refuse=*/true);
  TwoLevels h({}, &spine_hooks);
  control::ControlClient worker(h.tor_target(), 10s);
  // (Refused too when the stream's refusal ends the job before the registration returns.)
  worker.UdpSession(RankZeroOfOne(12, "s")).status().IgnoreError();
  ASSERT_TRUE(testing::WaitUntil([&] { return spine_hooks.seen(); }, 5s))
      << "the ToR did not attach its stream at the spine";
  ASSERT_TRUE(testing::WaitUntil([&] { return !h.tor->registry().HasJob(12); }, 5s))
      << "the ToR's job did not fail when the spine refused its stream";
  EXPECT_TRUE(testing::WaitUntil([&] { return !h.spine->registry().HasJob(12); }, 5s))
      << "the spine kept session 12 (until its lease)";
  const auto next = worker.UdpSession(RankZeroOfOne(13, "s"));
  EXPECT_TRUE(next.ok()) << next.status().ToString();
}

// Given a job of 4 workers over 2 racks whose spine job rack 0's ToR has opened, with rank 0
// waiting at the spine in the setup barrier (as the other racks' ranks do), When rack 1's ToR
// refuses rank 2, its rack's first (a window larger than its 64 slots), Expect that barrier to
// fail at once with the ToR's reason, and the spine's job to be gone: the ToR fails the session
// at the spine (Close with a failure). It used to wait until its deadline.
TEST(UplinkTest, RefusedFirstRankOfARackFailsTheSessionAtTheSpine) {
  using namespace std::chrono_literals;
  dataplane::SwitchConfig tor_config;
  tor_config.slots_per_job = 64;
  TwoLevels h({}, nullptr, tor_config, /*racks=*/2, /*rack_index=*/1);
  control::ControlClient spine(h.spine_target(), 10s), worker(h.tor_target(), 10s);
  // Rack 0's ToR, as rank 0 of the spine's job of 2 racks.
  control::UdpSessionArgs rack0 = RankZeroOfOne(21, "s");
  rack0.num_workers = 2;
  rack0.udp_port = 42000;
  ASSERT_TRUE(spine.UdpSession(rack0).ok());
  const auto start = std::chrono::steady_clock::now();
  auto waiting = std::async(std::launch::async, [&] {
    return spine.Barrier(21, 4, "s", 0u, std::chrono::system_clock::now() + 8s);
  });
  std::this_thread::sleep_for(300ms);
  control::UdpSessionArgs a = RankZeroOfOne(21, "s");
  a.rank = 2;
  a.num_workers = 4;
  a.max_outstanding_packets = 128;  // more than the ToR's 64 slots: refused
  EXPECT_EQ(worker.UdpSession(a).status().code(), StatusCode::kInvalidArgument);
  const Status st = waiting.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "rank 0 waited for its deadline";
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("rank 2 (the first of rack 1) was refused by its top-of-rack"),
            std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("max_outstanding_packets 128"), std::string::npos) << st.ToString();
  EXPECT_FALSE(h.spine->registry().HasJob(21));
}

// A stranger's rank-0 registration at a ToR, for a session whose job is open with a secret, is
// refused and changes nothing: it used to end the ToR's stream to the spine before the
// registry refused it, and the spine then failed the job ("rack 0 lost its control
// connection").
TEST(UplinkTest, StrangersRankZeroLeavesTheUpstreamAlone) {
  using namespace std::chrono_literals;
  TwoLevels h;
  control::ControlClient worker(h.tor_target(), 5s);
  ASSERT_TRUE(worker.UdpSession(RankZeroOfOne(12, "the job's")).ok());
  ASSERT_TRUE(h.spine->registry().HasJob(12));
  EXPECT_EQ(worker.UdpSession(StrangersRankZero(12)).status().code(),
            StatusCode::kPermissionDenied);
  ExpectJobKeptAtBothLevels(h, 12);
}

// Given a rack of 4 workers at one ToR, When all 4 call a barrier (forwarded to the spine, where
// the whole job meets), Expect it to complete at once; and while 8 forwarded barriers of another
// job wait at the spine, Expect other calls to the ToR answered at once. Each forwarded call used
// to hold one of gRPC's callback threads while it waited for the spine, and gRPC 1.51 has only
// a few (2 on a 2-core host): the third worker's barrier was never read, so the rack's barrier
// met only at its deadline, and nothing else was answered meanwhile.
TEST(UplinkTest, ForwardedBarriersDoNotHoldTheTorsControlPlane) {
  using namespace std::chrono_literals;
  TwoLevels h;
  constexpr uint32_t kRack = 4;
  std::vector<std::unique_ptr<control::ControlClient>> workers;
  for (uint32_t r = 0; r < 8; ++r) {
    workers.push_back(std::make_unique<control::ControlClient>(h.tor_target(), 10s));
  }
  auto start = std::chrono::steady_clock::now();
  std::vector<std::future<Status>> met;
  for (uint32_t r = 0; r < kRack; ++r) {
    met.push_back(std::async(std::launch::async, [&, r] {
      return workers[r]->Barrier(31, kRack, "s", r, std::chrono::system_clock::now() + 8s);
    }));
  }
  for (auto& f : met) {
    const Status st = f.get();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s) << "the rack's barrier waited";
  // 8 barriers of a job whose other workers never come: they wait at the spine (3 s).
  std::vector<std::future<Status>> waiting;
  for (uint32_t r = 0; r < 8; ++r) {
    waiting.push_back(std::async(std::launch::async, [&, r] {
      return workers[r]->Barrier(32, 20, "s", r, std::chrono::system_clock::now() + 3s);
    }));
  }
  ASSERT_TRUE(
      testing::WaitUntil([&] { return h.spine->registry().counts().waiting_calls >= 8; }, 5s))
      << "the ToR forwarded " << h.spine->registry().counts().waiting_calls << " of 8 barriers";
  control::ControlClient other(h.tor_target(), 10s);
  start = std::chrono::steady_clock::now();
  const Status closed = other.Close(99, "s", std::nullopt, 10s);
  EXPECT_EQ(closed.code(), StatusCode::kNotFound) << closed.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << "the ToR did not answer meanwhile";
  for (auto& f : waiting) EXPECT_EQ(f.get().code(), StatusCode::kDeadlineExceeded);
}

// Issue 28, found 5: a top-of-rack switch had no limit per address and started one thread per
// forwarded call: 300 barriers sent to a ToR started 270 threads there and filled the spine's
// limit per client for the ToR's address, so every job through that rack was refused. (Scaled
// down: the spine allows 64 calls per client, a stranger sends 100 barriers.) Expect the ToR to
// pass at most its limit of a stranger's calls on (the rest refused with RESOURCE_EXHAUSTED at
// the ToR), and the rack's running job to meet in its barriers meanwhile.
TEST(UplinkTest, AStrangersBarriersAtATorAreBoundedAndTheRacksJobRunsOn) {
  using namespace std::chrono_literals;
  control::RegistryOptions spine;
  spine.max_calls_per_client = 64;
  TwoLevels h(spine);
  control::ControlClient worker(h.tor_target(), 10s);
  ASSERT_TRUE(worker.UdpSession(RankZeroOfOne(50, "s")).ok());
  control::ControlClient stranger(h.tor_target(), 30s);
  std::vector<std::future<Status>> flood;
  for (uint32_t i = 0; i < 100; ++i) {
    flood.push_back(std::async(std::launch::async, [&, i] {
      return stranger.Barrier(5000 + i, 20, "x", 0, std::chrono::system_clock::now() + 30s);
    }));
  }
  // The ToR forwards at most 32 of them (its limit per client); the others it refuses.
  auto ready = [&] {
    int n = 0;
    for (auto& f : flood) n += f.wait_for(0s) == std::future_status::ready;
    return n;
  };
  EXPECT_TRUE(testing::WaitUntil([&] { return ready() >= 68; }, 20s)) << ready();
  int refused = 0;
  for (auto& f : flood) {
    if (f.wait_for(0s) != std::future_status::ready) continue;
    const Status st = f.get();
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
    ++refused;
  }
  EXPECT_EQ(refused, 68);
  EXPECT_LE(h.spine->registry().counts().waiting_calls, 32u);
  for (int i = 0; i < 5; ++i) {
    const Status st = worker.Barrier(50, 1, "s", 0, std::chrono::system_clock::now() + 10s);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  stranger.CancelCalls(CancelledError("the test is over"));
  for (auto& f : flood) {  // the barriers still waiting end with the cancellation, none ok
    if (f.valid()) {
      EXPECT_FALSE(f.get().ok());
    }
  }
}

// Spine-side hooks that pass everything through, except that the UdpSession of `job_id`
// waits until release() (the call waits: a slow spine, with a ToR's setup in progress).
class HeldUdpSession final : public PassThroughHooks {
 public:
  explicit HeldUdpSession(uint64_t job_id) : session_id_(job_id) {}
  Status BeforeUdpSession(switchml_proto::UdpSessionRequest* request,
                          std::chrono::system_clock::time_point) override {
    if (request->session_id() != session_id_) return Status::Ok();
    std::unique_lock lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return released_; });
    return Status::Ok();
  }
  bool WaitEntered(std::chrono::milliseconds within) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, within, [&] { return entered_; });
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  const uint64_t session_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false;
  bool released_ = false;
};

// Given: session 12's rank 0 registered at the ToR, whose own registration at the spine is in
// progress (held there), When a stranger's rank 0 (another secret) comes meanwhile, Expect it
// refused with nothing changed: the job opens with its own secret, so the stranger's next try
// is refused before anything changes and the job lives on at both levels. The ToR used to take
// the stranger's secret and rack for the session before its registry refused the request, and
// then let the stranger's next try end the job's upstream (the spine failed the job).
TEST(UplinkTest, RefusedRankZeroDuringSetupChangesNothing) {
  using namespace std::chrono_literals;
  HeldUdpSession spine_hooks(12);
  TwoLevels h({}, &spine_hooks);
  control::ControlClient worker(h.tor_target(), 10s), stranger_client(h.tor_target(), 10s);
  auto first = std::async(std::launch::async, [&] {
    return worker.UdpSession(RankZeroOfOne(12, "the job's")).status();
  });
  ASSERT_TRUE(spine_hooks.WaitEntered(5s)) << "the ToR did not register at the spine";
  const control::UdpSessionArgs stranger = StrangersRankZero(12);
  const Status refused = stranger_client.UdpSession(stranger).status();
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.ToString();
  spine_hooks.Release();
  const Status opened = first.get();
  ASSERT_TRUE(opened.ok()) << opened.ToString();
  ASSERT_TRUE(h.spine->registry().HasJob(12));
  EXPECT_EQ(stranger_client.UdpSession(stranger).status().code(), StatusCode::kPermissionDenied);
  ExpectJobKeptAtBothLevels(h, 12);
}

// Given a slow spine (it reads the ToR's stream of session 12 only after 4 s), When session 12
// fails at the ToR (a second worker started as its rank 0) and the ToR's next job, session 13,
// registers with a 1 s deadline while the end of session 12 (the failure up the stream, then a
// close) still waits for the spine, Expect the ToR to stop waiting at that deadline, refuse
// session 13 saying why, and leave no job 13 at the spine. The wait used to be the uplink's
// own timeout (here 5 s, by default 30 s) whatever the worker's deadline: the worker gave up
// after 1 s, and the ToR then opened session 13 at the spine for nobody.
TEST(UplinkTest, SlowSpineDelaysTheNextRegistrationOnlyUntilItsDeadline) {
  using namespace std::chrono_literals;
  FirstAttach spine_hooks(12, 4s, /*refuse=*/false);
  TwoLevels h({}, &spine_hooks);
  control::ControlClient worker(h.tor_target(), 10s), hasty(h.tor_target(), 1s);
  ASSERT_TRUE(worker.UdpSession(RankZeroOfOne(12, "s")).ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return spine_hooks.seen(); }, 5s));
  control::UdpSessionArgs again = RankZeroOfOne(12, "s");
  again.udp_port = 41100;
  EXPECT_EQ(worker.UdpSession(again).status().code(), StatusCode::kAlreadyExists);
  const auto start = std::chrono::steady_clock::now();
  const auto next = hasty.UdpSession(RankZeroOfOne(13, "s"));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(next.status().code(), StatusCode::kDeadlineExceeded) << next.status().ToString();
  EXPECT_LT(waited, 2s);
  std::this_thread::sleep_for(5s);  // the spine has read session 12's stream by now
  EXPECT_FALSE(h.spine->registry().HasJob(13)) << "the ToR opened session 13 for nobody";
  EXPECT_FALSE(h.tor->registry().HasJob(13));
}

}  // namespace
}  // namespace switchml::runtime
