// Switch: config validation, the job table (creation, registration, refusals), isolation between
// jobs, drop accounting, arithmetic edge cases and counter formatting.
#include "dataplane/switch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <vector>

// Counts heap allocations so a test can check that Process() makes none.
namespace {
std::atomic<uint64_t> g_allocations{0};
}  // namespace
void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace switchml::dataplane {
namespace {

using proto::SlotId;

constexpr uint32_t kIpA = 0x0a000001;  // 10.0.0.1
constexpr uint32_t kIpB = 0x0a000002;
constexpr uint32_t kIpC = 0x0a000003;
constexpr uint32_t kIpD = 0x0a000004;
constexpr uint32_t kIpE = 0x0a000005;

SwitchConfig SmallConfig() {
  SwitchConfig c;
  c.max_workers_per_job = 32;
  c.slots_per_job = 16;
  c.max_jobs = 4;
  return c;
}

JobSpec Spec(uint64_t session, uint32_t n, proto::SizeCode size = proto::SizeCode::k256B,
             uint32_t num_ports = 1) {
  JobSpec s;
  s.job_id = session;
  s.num_workers = n;
  s.size = size;
  s.num_ports = num_ports;
  s.max_outstanding_packets = 8;
  return s;
}

// A worker's packet. As real workers do, every contribution to one round of a slot must carry
// the same (job_number, tsi), and each later round of the slot a new tsi: the switch drops a
// packet that breaks this as a late duplicate (see WorkerCounterStage). Tests that reuse a slot
// pass the round's tsi.
std::vector<uint8_t> Datagram(SlotId slot, std::vector<int32_t> values, int8_t e0 = 0,
                              int8_t e1 = 0, uint32_t tsi = 0, uint8_t job_number = 0) {
  proto::SizeCode size;
  EXPECT_TRUE(proto::SizeCodeForNumel(values.size(), &size));
  proto::Header h{proto::kMsgTypeData, size, job_number, tsi, slot, e0, e1};
  std::vector<uint8_t> out(proto::DatagramBytes(size));
  proto::Encode(h, values, out);
  return out;
}

std::vector<int32_t> Fill(int32_t v, size_t numel = 64) { return std::vector<int32_t>(numel, v); }

proto::Packet Reply(const Action& a) {
  proto::Packet p;
  EXPECT_EQ(proto::Decode(a.reply, &p), proto::DecodeError::kOk);
  return p;
}

uint64_t Dropped(const JobCounters& c, DropReason r) { return c.dropped[static_cast<int>(r)]; }

// ---- Config and names ----

TEST(SwitchConfigTest, Validate) {
  EXPECT_TRUE(SwitchConfig{}.Validate().ok());
  SwitchConfig c;
  c.max_workers_per_job = 256;
  EXPECT_TRUE(c.Validate().ok());
  c.max_workers_per_job = 257;
  EXPECT_EQ(c.Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.Validate().message().find("max_workers_per_job must be in 1..256"), std::string::npos)
      << c.Validate().message();
  c.max_workers_per_job = 0;
  EXPECT_FALSE(c.Validate().ok());
  c = SwitchConfig{};
  c.slots_per_job = proto::kMaxSlots;
  EXPECT_TRUE(c.Validate().ok());
  c.slots_per_job = proto::kMaxSlots + 1;
  EXPECT_NE(c.Validate().message().find("slots_per_job must be in 1..16384"), std::string::npos);
  c.slots_per_job = 0;
  EXPECT_FALSE(c.Validate().ok());
  c = SwitchConfig{};
  c.max_jobs = 0;
  EXPECT_NE(c.Validate().message().find("max_jobs"), std::string::npos);
}

TEST(SwitchConfigDeathTest, SwitchRequiresValidConfig) {
  SwitchConfig c;
  c.max_workers_per_job = 257;
  EXPECT_DEATH({ Switch sw(c); }, "max_workers_per_job must be in 1..256");
}

TEST(SwitchTest, DropReasonNames) {
  EXPECT_STREQ(DropReasonName(DropReason::kNone), "none");
  EXPECT_STREQ(DropReasonName(DropReason::kMalformed), "malformed");
  EXPECT_STREQ(DropReasonName(DropReason::kUnknownSource), "unknown_source");
  EXPECT_STREQ(DropReasonName(DropReason::kJobNotReady), "job_not_ready");
  EXPECT_STREQ(DropReasonName(DropReason::kWrongSize), "wrong_size");
  EXPECT_STREQ(DropReasonName(DropReason::kSlotOutOfRange), "slot_out_of_range");
  EXPECT_STREQ(DropReasonName(DropReason::kDuplicate), "duplicate");
}

// ---- Jumbo packets (docs/protocol.md 2.6) ----

TEST(SwitchConfigTest, MaxPacketNumel) {
  SwitchConfig c;
  EXPECT_EQ(c.max_packet_numel, 256u);
  EXPECT_EQ(MaxDatagramBytes(c), proto::kReferenceMaxDatagramBytes);
  EXPECT_FALSE(AcceptsSize(c, proto::SizeCode::k2048B));
  EXPECT_TRUE(AcceptsSize(c, proto::SizeCode::k256B));
  for (uint32_t bad : {0u, 64u, 100u, 4096u}) {
    c.max_packet_numel = bad;
    EXPECT_NE(c.Validate().message().find("max_packet_numel must be 256, 512, 1024 or 2048"),
              std::string::npos)
        << bad;
  }
  c.max_packet_numel = 1024;
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_EQ(MaxDatagramBytes(c), 4106u);
  EXPECT_TRUE(AcceptsSize(c, proto::SizeCode::k4096B));
  EXPECT_FALSE(AcceptsSize(c, proto::SizeCode::k8192B));
  // A jumbo job's pool holds the bytes of slots_per_job 256-element slots.
  c.slots_per_job = 8192;
  EXPECT_EQ(JobSlots(c, proto::SizeCode::k1024B), 8192u);
  EXPECT_EQ(JobSlots(c, proto::SizeCode::k256B), 8192u);
  EXPECT_EQ(JobSlots(c, proto::SizeCode::k2048B), 4096u);
  EXPECT_EQ(JobSlots(c, proto::SizeCode::k8192B), 1024u);
  c.slots_per_job = 3;
  EXPECT_EQ(JobSlots(c, proto::SizeCode::k8192B), 1u);
}

SwitchConfig JumboConfig() {
  SwitchConfig c = SmallConfig();
  c.slots_per_job = 64;  // 8 slots of 2048 elements
  c.max_packet_numel = 2048;
  return c;
}

// Given a switch that enables 2048-element packets, a 2048-element job of three workers and a
// 64-element job of two beside it, Expect each job's sums exact with 32-bit wrap-around, the
// reply the size of its job's packets, and a packet of the other job's size dropped as
// wrong_size. And Expect the jumbo job's window bounded by its pool (64 x 256 / 2048 = 8 slots).
TEST(SwitchJumboTest, JumboJobBesideAReferenceJobSumsExactly) {
  Switch sw(JumboConfig());
  JobSpec big = Spec(1, 3, proto::SizeCode::k8192B);
  big.max_outstanding_packets = 9;
  EXPECT_NE(sw.CreateJob(big).message().find(
                "max_outstanding_packets 9 must be in 1..8 (this switch's slots per job of "
                "2048-element packets)"),
            std::string::npos);
  big.max_outstanding_packets = 8;
  ASSERT_TRUE(sw.CreateJob(big).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(2, 2, proto::SizeCode::k256B)).ok());
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(sw.AddWorker(1, r, {kIpA + r, 1000}).ok());
  for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(sw.AddWorker(2, r, {kIpD + r, 1000}).ok());
  EXPECT_EQ(sw.slot_counters(1).size(), 8u);
  EXPECT_EQ(sw.slot_counters(2).size(), 64u);

  std::vector<std::vector<int32_t>> in(3, std::vector<int32_t>(2048));
  std::vector<int32_t> want(2048);
  for (size_t i = 0; i < 2048; ++i) {
    for (uint32_t r = 0; r < 3; ++r) {
      in[r][i] = static_cast<int32_t>((i + 1) * 2654435761u * (r + 1));
      want[i] =
          static_cast<int32_t>(static_cast<uint32_t>(want[i]) + static_cast<uint32_t>(in[r][i]));
    }
  }
  const SlotId slot{7, 1};
  // The reference job's packets interleave with the jumbo job's.
  EXPECT_EQ(sw.Process({kIpD, 1000}, Datagram(slot, Fill(5))).reason, DropReason::kNone);
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram(slot, in[0], 3, 0, 7)).reason, DropReason::kNone);
  EXPECT_EQ(sw.Process({kIpB, 1000}, Datagram(slot, Fill(1))).reason, DropReason::kWrongSize);
  EXPECT_EQ(sw.Process({kIpE, 1000}, Datagram(slot, in[0], 0, 0, 7)).reason,
            DropReason::kWrongSize);
  EXPECT_EQ(sw.Process({kIpB, 1000}, Datagram(slot, in[1], -2, 0, 7)).reason, DropReason::kNone);
  EXPECT_EQ(sw.Process({kIpB, 1000}, Datagram(SlotId{8, 0}, in[1], 0, 0, 8)).reason,
            DropReason::kSlotOutOfRange);
  {
    const Action& a = sw.Process({kIpC, 1000}, Datagram(slot, in[2], 9, 0, 7));
    ASSERT_EQ(a.kind, Action::Kind::kMulticast);
    ASSERT_EQ(a.reply.size(), 8202u);
    const proto::Packet p = Reply(a);
    EXPECT_EQ(p.header.size, proto::SizeCode::k8192B);
    EXPECT_EQ(p.header.e0, 9);
    EXPECT_EQ(p.header.slot, slot);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), p.payload().begin()));
  }
  const Action& b = sw.Process({kIpE, 1000}, Datagram(slot, Fill(-7)));
  ASSERT_EQ(b.kind, Action::Kind::kMulticast);
  ASSERT_EQ(b.reply.size(), 266u);
  const proto::Packet q = Reply(b);
  for (int32_t v : q.payload()) ASSERT_EQ(v, -2);
  EXPECT_EQ(Dropped(*sw.job_counters(2), DropReason::kWrongSize), 1u);
  EXPECT_EQ(Dropped(*sw.job_counters(1), DropReason::kWrongSize), 1u);
}

// ---- CreateJob ----

TEST(SwitchJobTableTest, CreateJobRefusals) {
  Switch sw(SmallConfig());
  auto refused = [&](JobSpec spec, StatusCode code, const std::string& message) {
    std::vector<uint64_t> evicted;
    const Status st = sw.CreateJob(spec, &evicted);
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_EQ(st.message(), message);
    EXPECT_FALSE(sw.HasJob(spec.job_id));
    EXPECT_TRUE(evicted.empty());
  };
  refused(Spec(77, 0), StatusCode::kInvalidArgument, "session 77: num_workers must be at least 1");
  refused(Spec(77, 33), StatusCode::kInvalidArgument,
          "session 77: num_workers 33 exceeds this switch's limit of 32 workers per job");
  refused(Spec(77, 2, proto::SizeCode::k512B), StatusCode::kInvalidArgument,
          "session 77: packet size code 2 is not supported; this switch takes 64 to 256 elements "
          "per packet");
  // Jumbo sizes only where max_packet_numel enables them (docs/protocol.md 2.6).
  refused(Spec(77, 2, proto::SizeCode::k2048B), StatusCode::kInvalidArgument,
          "session 77: packet size code 4 is not supported; this switch takes 64 to 256 elements "
          "per packet");
  refused(Spec(77, 2, proto::SizeCode::k256B, 0), StatusCode::kInvalidArgument,
          "session 77: num_ports must be at least 1");
  JobSpec spec = Spec(77, 2);
  spec.max_outstanding_packets = 0;
  refused(spec, StatusCode::kInvalidArgument,
          "session 77: max_outstanding_packets 0 must be in 1..16 (this switch's slots per job)");
  spec.max_outstanding_packets = 17;
  refused(spec, StatusCode::kInvalidArgument,
          "session 77: max_outstanding_packets 17 must be in 1..16 (this switch's slots per job)");
  spec.max_outstanding_packets = 16;
  EXPECT_TRUE(sw.CreateJob(spec).ok());

  // With the table full, an invalid spec is still refused and evicts nothing.
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(sw.CreateJob(Spec(id, 2)).ok());
  refused(Spec(5, 0), StatusCode::kInvalidArgument, "session 5: num_workers must be at least 1");
  // Re-creating an existing session at the limit replaces it, evicting nothing.
  std::vector<uint64_t> evicted;
  EXPECT_TRUE(sw.CreateJob(Spec(3, 4), &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(sw.FindJob(3)->num_workers, 4u);
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{1, 2, 3, 77}));
  // Below the limit nothing is evicted either.
  ASSERT_TRUE(sw.RemoveJob(1).ok());
  EXPECT_TRUE(sw.CreateJob(Spec(5, 2), &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{2, 3, 5, 77}));
  EXPECT_EQ(sw.counters().jobs_evicted, 0u);
}

// Given: a full table (max_jobs 4) of jobs 1, 2, 3 (one worker each) and 4 (two workers, only
// rank 0 registered), created in that order; then job 1 completes a round, job 4's worker sends
// a packet (dropped as not ready, but attributed to job 4), job 3 completes a round, and an
// unknown host sends a packet (attributed to no job).
// Expect: creating job 5 evicts job 2 (never active since its creation) and creating job 6 evicts
// job 1 (its datagram is older than job 4's); each eviction is appended to the out-parameter and
// counted; the evicted jobs' workers become unknown sources and their addresses are free; job 3
// keeps its counters and stored result, and its retransmission makes it the most recent, so job 7
// (created without an out-parameter, still counted) evicts job 4 and job 8 evicts job 5 (a
// worker's registration is not activity).
TEST(SwitchEvictionTest, CreateJobEvictsLeastRecentlyActiveJob) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 1)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(2, 1)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(3, 1)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(4, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 0, {kIpB, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(3, 0, {kIpC, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(4, 0, {kIpD, 1000}).ok());

  ASSERT_EQ(sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(1))).kind, Action::Kind::kMulticast);
  ASSERT_EQ(sw.Process({kIpD, 1000}, Datagram({0, 0}, Fill(1))).reason, DropReason::kJobNotReady);
  ASSERT_EQ(sw.Process({kIpC, 1000}, Datagram({0, 0}, Fill(3))).kind, Action::Kind::kMulticast);
  ASSERT_EQ(sw.Process({kIpE, 1000}, Datagram({0, 0}, Fill(1))).reason, DropReason::kUnknownSource);

  std::vector<uint64_t> evicted = {999};  // appended to, never cleared
  ASSERT_TRUE(sw.CreateJob(Spec(5, 1), &evicted).ok());
  EXPECT_EQ(evicted, (std::vector<uint64_t>{999, 2}));
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{1, 3, 4, 5}));
  EXPECT_EQ(sw.counters().jobs_evicted, 1u);
  EXPECT_EQ(sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(1))).reason, DropReason::kUnknownSource);
  ASSERT_TRUE(sw.AddWorker(5, 0, {kIpB, 1000}).ok());

  ASSERT_TRUE(sw.CreateJob(Spec(6, 1), &evicted).ok());
  EXPECT_EQ(evicted, (std::vector<uint64_t>{999, 2, 1}));
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{3, 4, 5, 6}));
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(1))).reason, DropReason::kUnknownSource);

  // Job 3 is untouched by all of this: its counters and its stored result are intact.
  const JobCounters& three = *sw.job_counters(3);
  EXPECT_EQ(three.received, 1u);
  EXPECT_EQ(three.completed, 1u);
  const Action& again = sw.Process({kIpC, 1000}, Datagram({0, 0}, Fill(3)));
  ASSERT_EQ(again.kind, Action::Kind::kUnicast);
  EXPECT_EQ(Reply(again).values[0], 3);
  EXPECT_EQ(sw.job_counters(4)->received, 1u);

  ASSERT_TRUE(sw.CreateJob(Spec(7, 1)).ok());
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{3, 5, 6, 7}));
  EXPECT_EQ(sw.counters().jobs_evicted, 3u);
  EXPECT_EQ(sw.Process({kIpD, 1000}, Datagram({0, 0}, Fill(1))).reason, DropReason::kUnknownSource);

  ASSERT_TRUE(sw.CreateJob(Spec(8, 1), &evicted).ok());
  EXPECT_EQ(evicted, (std::vector<uint64_t>{999, 2, 1, 5}));
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{3, 6, 7, 8}));
  EXPECT_EQ(sw.counters().jobs_evicted, 4u);
  EXPECT_EQ(sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(1))).reason, DropReason::kUnknownSource);
  EXPECT_NE(sw.FormatCounters(false).find("jobs_evicted 4"), std::string::npos)
      << sw.FormatCounters(false);
}

// ---- AddWorker ----

// Given: sessions 77 (4 workers, 2 ports each) and 12 (3 workers, 2 ports each) register workers
// whose addresses clash in every way that cannot be a takeover (see AddWorkerEvictsSessionWhose
// PortsItTakesOver for the one that is).
// Expect: each clash is refused with a message naming both addresses, and nothing is evicted.
TEST(SwitchJobTableTest, AddWorkerRefusals) {
  Switch sw(SmallConfig());
  std::vector<uint64_t> evicted;
  Status st = sw.AddWorker(77, 0, {kIpA, 40000}, &evicted);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "session 77 does not exist: rank 0 must open it first");

  ASSERT_TRUE(sw.CreateJob(Spec(77, 4, proto::SizeCode::k256B, 2)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(12, 3, proto::SizeCode::k256B, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(12, 1, {kIpA, 0}).ok());      // any port of 10.0.0.1
  ASSERT_TRUE(sw.AddWorker(12, 0, {kIpD, 40001}).ok());  // owns 40001-40002

  st = sw.AddWorker(77, 5, {kIpB, 40000}, &evicted);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "rank 5 out of range: session 77 has 4 workers (ranks 0-3)");

  ASSERT_TRUE(sw.AddWorker(77, 3, {kIpB, 40000}).ok());
  st = sw.AddWorker(77, 3, {kIpC, 40000}, &evicted);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(), "rank 3 is already registered in session 77");

  // Port 0 of another session does not conflict with an explicit range on the same IP, either
  // way (exact ports are looked up first; issue 28, found 7: a port-0 registration made every
  // later worker on its address fail) ... (see AnyPortOfAnotherSessionLeavesExplicitPortsAlone)
  // Overlapping a worker of the same job.
  st = sw.AddWorker(77, 0, {kIpB, 39999}, &evicted);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(),
            "address 10.0.0.2:39999-40000 is already used by rank 3 of session 77 "
            "(10.0.0.2:40000-40001)");
  // Overlapping both a worker of the same job and another session's explicit range: refused,
  // and the other session, which a lone overlap would have evicted, is kept.
  ASSERT_TRUE(sw.AddWorker(12, 2, {kIpB, 40002}).ok());
  st = sw.AddWorker(77, 0, {kIpB, 40001}, &evicted);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(),
            "address 10.0.0.2:40001-40002 is already used by rank 3 of session 77 "
            "(10.0.0.2:40000-40001)");
  // Port 0 against an explicit range of the same session, and port 0 against another session's
  // port 0.
  ASSERT_TRUE(sw.AddWorker(77, 1, {kIpC, 0}).ok());
  st = sw.AddWorker(77, 2, {kIpC, 50000}, &evicted);
  EXPECT_EQ(st.message(),
            "address 10.0.0.3:50000-50001 is already used by rank 1 of session 77 "
            "(10.0.0.3 (any port))");
  st = sw.AddWorker(77, 2, {kIpA, 0}, &evicted);
  EXPECT_EQ(st.message(),
            "address 10.0.0.1 (any port) is already used by rank 1 of session 12 "
            "(10.0.0.1 (any port))");
  // A range running past port 65535.
  st = sw.AddWorker(77, 2, {kIpE, 65535}, &evicted);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "rank 2 of session 77: ports 65535-65536 go past 65535; choose a lower "
            "base port");
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(sw.counters().jobs_evicted, 0u);
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{12, 77}));

  // Adjacent ranges and the same port on another IP are fine, and evict nothing.
  EXPECT_TRUE(sw.AddWorker(77, 0, {kIpD, 40003}, &evicted).ok());
  EXPECT_TRUE(sw.AddWorker(77, 2, {kIpD, 39999}, &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{12, 77}));
  EXPECT_EQ(sw.FindJob(12)->num_workers, 3u);
}

// Issue 28, found 7: a registration with port 0 ("any port") from a host made every later
// worker on that address fail with ALREADY_EXISTS. Given session 12 with a port-0 worker on
// 10.0.0.1 (a stranger's) and session 77 registered on 10.0.0.1:40000-40001 after it, Expect
// each session's packets to reach its own job only: the exact ports to 77, every other port of
// the address to 12; and a second port-0 registration of the address still refused.
TEST(SwitchJobTableTest, AnyPortOfAnotherSessionLeavesExplicitPortsAlone) {
  Switch sw(SmallConfig());
  std::vector<uint64_t> evicted;
  ASSERT_TRUE(sw.CreateJob(Spec(12, 1, proto::SizeCode::k256B, 1)).ok());
  ASSERT_TRUE(sw.AddWorker(12, 0, {kIpA, 0}).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(77, 2, proto::SizeCode::k256B, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(77, 0, {kIpA, 40000}, &evicted).ok());
  ASSERT_TRUE(sw.AddWorker(77, 1, {kIpB, 40000}, &evicted).ok());
  EXPECT_TRUE(evicted.empty());
  // An explicit registration before a port-0 one of another session is fine too.
  ASSERT_TRUE(sw.CreateJob(Spec(13, 1, proto::SizeCode::k256B, 1)).ok());
  EXPECT_TRUE(sw.AddWorker(13, 0, {kIpB, 0}).ok());
  // Two port-0 registrations of one address are ambiguous: refused.
  ASSERT_TRUE(sw.CreateJob(Spec(14, 1, proto::SizeCode::k256B, 1)).ok());
  Status st = sw.AddWorker(14, 0, {kIpA, 0}, &evicted);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(),
            "address 10.0.0.1 (any port) is already used by rank 0 of session 12 "
            "(10.0.0.1 (any port))");
  // Session 77's round: from its exact ports only, with its exact sum.
  ASSERT_EQ(sw.Process({kIpA, 40001}, Datagram({0, 0}, Fill(2))).reason, DropReason::kNone);
  const Action& done = sw.Process({kIpB, 40000}, Datagram({0, 0}, Fill(3)));
  ASSERT_EQ(done.kind, Action::Kind::kMulticast);
  EXPECT_EQ(Reply(done).values[0], 5);
  // Session 12 (one worker): every other port of 10.0.0.1 is its worker's.
  const Action& own = sw.Process({kIpA, 50000}, Datagram({0, 0}, Fill(7)));
  ASSERT_EQ(own.kind, Action::Kind::kMulticast);
  EXPECT_EQ(Reply(own).values[0], 7);
  EXPECT_EQ(sw.job_counters(77)->received, 2u);
  EXPECT_EQ(sw.job_counters(12)->received, 1u);
}

// Given: jobs 12 (two workers on 10.0.0.1, ports 40000-40001 and 40004-40005), 13 (one worker,
// 10.0.0.1:40002-40003) and 14 (10.0.0.1:40010 and 10.0.0.3:40000, one port each; one
// contribution in slot 0) are registered; job 12 is mid-round. A new session 77 (4 ports per
// worker) registers rank 0 at 10.0.0.1:40001-40004, overlapping both ranks of job 12 and job 13.
// Expect: the registration succeeds and evicts jobs 12 and 13 (each reported once, in id order,
// and counted); their workers' other ports (10.0.0.1:40000, :40005) are now unknown sources while
// 40001-40004 belong to session 77; job 14 completes its round with its exact sum; session 77
// then runs normally.
TEST(SwitchEvictionTest, AddWorkerEvictsSessionWhosePortsItTakesOver) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(12, 2, proto::SizeCode::k256B, 2)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(13, 1, proto::SizeCode::k256B, 2)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(14, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(12, 0, {kIpA, 40000}).ok());
  ASSERT_TRUE(sw.AddWorker(12, 1, {kIpA, 40004}).ok());
  ASSERT_TRUE(sw.AddWorker(13, 0, {kIpA, 40002}).ok());
  ASSERT_TRUE(sw.AddWorker(14, 0, {kIpA, 40010}).ok());
  ASSERT_TRUE(sw.AddWorker(14, 1, {kIpC, 40000}).ok());
  ASSERT_EQ(sw.Process({kIpA, 40000}, Datagram({0, 0}, Fill(1))).reason, DropReason::kNone);
  ASSERT_EQ(sw.Process({kIpA, 40010}, Datagram({0, 0}, Fill(5))).reason, DropReason::kNone);

  ASSERT_TRUE(sw.CreateJob(Spec(77, 2, proto::SizeCode::k256B, 4)).ok());
  std::vector<uint64_t> evicted;
  const Status st = sw.AddWorker(77, 0, {kIpA, 40001}, &evicted);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(evicted, (std::vector<uint64_t>{12, 13}));
  EXPECT_EQ(sw.counters().jobs_evicted, 2u);
  EXPECT_EQ(sw.job_ids(), (std::vector<uint64_t>{14, 77}));

  EXPECT_EQ(sw.Process({kIpA, 40000}, Datagram({0, 0}, Fill(1))).reason,
            DropReason::kUnknownSource);
  EXPECT_EQ(sw.Process({kIpA, 40005}, Datagram({0, 0}, Fill(1))).reason,
            DropReason::kUnknownSource);
  for (uint16_t port = 40001; port <= 40004; ++port) {
    EXPECT_EQ(sw.Process({kIpA, port}, Datagram({0, 0}, Fill(1))).reason, DropReason::kJobNotReady)
        << port;
  }
  EXPECT_EQ(sw.job_counters(77)->received, 4u);

  const Action& fourteen = sw.Process({kIpC, 40000}, Datagram({0, 0}, Fill(6)));
  ASSERT_EQ(fourteen.kind, Action::Kind::kMulticast);
  EXPECT_EQ(Reply(fourteen).values[0], 11);
  EXPECT_EQ(sw.job_counters(14)->received, 2u);

  ASSERT_TRUE(sw.AddWorker(77, 1, {kIpB, 0}, &evicted).ok());
  EXPECT_EQ(evicted, (std::vector<uint64_t>{12, 13}));
  EXPECT_EQ(sw.Process({kIpA, 40003}, Datagram({0, 0}, Fill(7))).reason, DropReason::kNone);
  const Action& done = sw.Process({kIpB, 9}, Datagram({0, 0}, Fill(8)));
  ASSERT_EQ(done.kind, Action::Kind::kMulticast);
  EXPECT_EQ(Reply(done).values[0], 15);
  EXPECT_EQ(std::vector<Endpoint>(done.destinations.begin(), done.destinations.end()),
            (std::vector<Endpoint>{{kIpA, 40001}, {kIpB, 9}}));
  EXPECT_EQ(sw.counters().jobs_evicted, 2u);
}

TEST(SwitchJobTableTest, JobNotReadyUntilAllWorkersRegistered) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 1000}).ok());
  const Action& a = sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(1)));
  EXPECT_EQ(a.kind, Action::Kind::kDrop);
  EXPECT_EQ(a.reason, DropReason::kJobNotReady);
  EXPECT_EQ(Dropped(*sw.job_counters(1), DropReason::kJobNotReady), 1u);
  ASSERT_TRUE(sw.AddWorker(1, 1, {kIpB, 1000}).ok());
  // The early packet left no trace: a full reduction yields exactly 1 + 2.
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(1))).reason, DropReason::kNone);
  const Action& done = sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(2)));
  ASSERT_EQ(done.kind, Action::Kind::kMulticast);
  EXPECT_EQ(Reply(done).values[0], 3);
  EXPECT_EQ(sw.job_counters(1)->received, 3u);
  EXPECT_EQ(sw.slot_counters(1)[0].received, 2u);
}

// ---- Isolation between jobs ----

TEST(SwitchJobTableTest, TwoConcurrentJobsKeepSeparatePools) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 2)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(2, 3)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(1, 1, {kIpB, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 0, {kIpA, 2000}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 1, {kIpB, 2000}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 2, {kIpC, 0}).ok());

  // Both jobs use slot 0 set 0 at the same time, interleaved; each job's round has its own
  // (job_number, tsi): job 1's is (1, 100), job 2's (2, 200).
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(1), 1, 0, 100, 1)).reason,
            DropReason::kNone);
  EXPECT_EQ(sw.Process({kIpA, 2000}, Datagram({0, 0}, Fill(10), 2, 0, 200, 2)).reason,
            DropReason::kNone);
  EXPECT_EQ(sw.Process({kIpB, 2000}, Datagram({0, 0}, Fill(20), 3, 0, 200, 2)).reason,
            DropReason::kNone);
  const Action& one = sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(2), 4, 0, 100, 1));
  ASSERT_EQ(one.kind, Action::Kind::kMulticast);
  proto::Packet p = Reply(one);
  EXPECT_EQ(p.values[0], 3);
  EXPECT_EQ(p.header.e0, 4);
  EXPECT_EQ(p.header.tsi, 100u);
  EXPECT_EQ(p.header.job_number, 1);
  EXPECT_EQ(std::vector<Endpoint>(one.destinations.begin(), one.destinations.end()),
            (std::vector<Endpoint>{{kIpA, 1000}, {kIpB, 1000}}));
  const Action& two = sw.Process({kIpC, 7777}, Datagram({0, 0}, Fill(30), 1, 0, 200, 2));
  ASSERT_EQ(two.kind, Action::Kind::kMulticast);
  p = Reply(two);
  EXPECT_EQ(p.values[63], 60);
  EXPECT_EQ(p.header.e0, 3);
  EXPECT_EQ(p.header.tsi, 200u);
  EXPECT_EQ(p.header.job_number, 2);
  EXPECT_EQ(std::vector<Endpoint>(two.destinations.begin(), two.destinations.end()),
            (std::vector<Endpoint>{{kIpA, 2000}, {kIpB, 2000}, {kIpC, 7777}}));

  EXPECT_EQ(sw.job_counters(1)->received, 2u);
  EXPECT_EQ(sw.job_counters(1)->multicast_packets, 2u);
  EXPECT_EQ(sw.job_counters(2)->received, 3u);
  EXPECT_EQ(sw.job_counters(2)->multicast_packets, 3u);
}

// Given: job 2 has one of two contributions in slot 0; job 1's worker, an unknown host and a
// job-1 packet carrying job 2's job_number all send to slot 0.
// Expect: job 2's slot is untouched: its second worker completes it with job 2's sum only.
TEST(SwitchJobTableTest, ForeignPacketNeverTouchesAnotherJob) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 2)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(2, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(1, 1, {kIpA, 1001}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 0, {kIpB, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 1, {kIpB, 1001}).ok());

  EXPECT_EQ(sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(5), 0, 0, 0, 2)).reason,
            DropReason::kNone);
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(1000), 90, 90, 0, 2)).reason,
            DropReason::kNone);
  EXPECT_EQ(sw.Process({kIpD, 1000}, Datagram({0, 0}, Fill(1000), 90, 90)).reason,
            DropReason::kUnknownSource);
  EXPECT_EQ(sw.Process({kIpB, 1002}, Datagram({0, 0}, Fill(1000), 90, 90)).reason,
            DropReason::kUnknownSource);
  const Action& a = sw.Process({kIpB, 1001}, Datagram({0, 0}, Fill(6), 1, 1, 0, 2));
  ASSERT_EQ(a.kind, Action::Kind::kMulticast);
  const proto::Packet p = Reply(a);
  EXPECT_EQ(p.values[0], 11);
  EXPECT_EQ(p.header.e0, 1);
  EXPECT_EQ(sw.job_counters(2)->received, 2u);
  EXPECT_EQ(sw.job_counters(1)->received, 1u);
  EXPECT_EQ(sw.job_counters(1)->aggregated, 1u);
  EXPECT_EQ(sw.counters().dropped_unknown_source, 2u);
}

// Given: jobs 1 and 2 each have a partial slot 0; job 2 is re-created (its workers re-register,
// one on a new address).
// Expect: job 1 completes with its exact sum; job 2 starts empty; job 2's old address is no
// longer routed.
TEST(SwitchJobTableTest, RecreatingOneSessionLeavesOthersIntact) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 2)).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(2, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(1, 1, {kIpA, 1001}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 0, {kIpB, 0}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 1, {kIpC, 1000}).ok());
  sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(1)));
  sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(100)));

  ASSERT_TRUE(sw.CreateJob(Spec(2, 2)).ok());
  EXPECT_EQ(sw.job_counters(2)->received, 0u);
  EXPECT_EQ(sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(100))).reason,
            DropReason::kUnknownSource);
  ASSERT_TRUE(sw.AddWorker(2, 0, {kIpB, 0}).ok());
  ASSERT_TRUE(sw.AddWorker(2, 1, {kIpD, 1000}).ok());
  EXPECT_EQ(sw.Process({kIpC, 1000}, Datagram({0, 0}, Fill(100))).reason,
            DropReason::kUnknownSource);

  const Action& one = sw.Process({kIpA, 1001}, Datagram({0, 0}, Fill(2)));
  ASSERT_EQ(one.kind, Action::Kind::kMulticast);
  EXPECT_EQ(Reply(one).values[0], 3);

  EXPECT_EQ(sw.Process({kIpB, 9}, Datagram({0, 0}, Fill(7))).reason, DropReason::kNone);
  const Action& two = sw.Process({kIpD, 1000}, Datagram({0, 0}, Fill(8)));
  ASSERT_EQ(two.kind, Action::Kind::kMulticast);
  EXPECT_EQ(Reply(two).values[0], 15);
}

// ---- Drops and counters ----

TEST(SwitchDropTest, MalformedCountedByDecodeError) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 1)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 0}).ok());
  const std::vector<uint8_t> good = Datagram({0, 0}, Fill(1));
  auto expect = [&](std::vector<uint8_t> d, proto::DecodeError e) {
    const Action& a = sw.Process({kIpA, 1}, d);
    EXPECT_EQ(a.kind, Action::Kind::kDrop);
    EXPECT_EQ(a.reason, DropReason::kMalformed);
    EXPECT_EQ(a.decode_error, e);
  };
  expect({}, proto::DecodeError::kTooShort);
  expect({0x11, 0, 0, 0}, proto::DecodeError::kTooShort);
  std::vector<uint8_t> d = good;
  d[0] = 0x01;  // msg_type 0
  expect(d, proto::DecodeError::kBadMsgType);
  d = good;
  d[0] = 0x12;  // size code 2
  expect(d, proto::DecodeError::kUnsupportedSize);
  d = good;
  d.push_back(0);
  expect(d, proto::DecodeError::kLengthMismatch);
  d = good;
  d[6] |= 0x40;  // pool_index bit 14
  expect(d, proto::DecodeError::kReservedBit);
  d = good;
  d[0] |= 0x08;  // the unused bit of byte 0
  expect(d, proto::DecodeError::kReservedBit);

  const SwitchCounters& c = sw.counters();
  EXPECT_EQ(c.received, 7u);
  EXPECT_EQ(c.dropped_malformed[static_cast<int>(proto::DecodeError::kTooShort)], 2u);
  EXPECT_EQ(c.dropped_malformed[static_cast<int>(proto::DecodeError::kBadMsgType)], 1u);
  EXPECT_EQ(c.dropped_malformed[static_cast<int>(proto::DecodeError::kUnsupportedSize)], 1u);
  EXPECT_EQ(c.dropped_malformed[static_cast<int>(proto::DecodeError::kLengthMismatch)], 1u);
  EXPECT_EQ(c.dropped_malformed[static_cast<int>(proto::DecodeError::kReservedBit)], 2u);
  EXPECT_EQ(sw.job_counters(1)->received, 0u);
  // The job's state is untouched: a single-worker job's first packet completes at once.
  const Action& a = sw.Process({kIpA, 1}, good);
  EXPECT_EQ(a.kind, Action::Kind::kMulticast);
}

TEST(SwitchDropTest, WrongSizeAndSlotOutOfRange) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 1, proto::SizeCode::k1024B)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 1000}).ok());
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(1, 64))).reason, DropReason::kWrongSize);
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({16, 0}, Fill(1, 256))).reason,
            DropReason::kSlotOutOfRange);
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({proto::kMaxSlots - 1, 1}, Fill(1, 256))).reason,
            DropReason::kSlotOutOfRange);
  const Action& a = sw.Process({kIpA, 1000}, Datagram({15, 1}, Fill(1, 256)));
  EXPECT_EQ(a.kind, Action::Kind::kMulticast);
  EXPECT_EQ(a.reply.size(), proto::DatagramBytes(proto::SizeCode::k1024B));
  const JobCounters& c = *sw.job_counters(1);
  EXPECT_EQ(c.received, 4u);
  EXPECT_EQ(Dropped(c, DropReason::kWrongSize), 1u);
  EXPECT_EQ(Dropped(c, DropReason::kSlotOutOfRange), 2u);
  EXPECT_EQ(Dropped(c, DropReason::kNone), 0u);
  EXPECT_EQ(c.completed, 1u);
  EXPECT_EQ(sw.slot_counters(1)[15].completed, 1u);
}

// ---- Arithmetic ----

TEST(SwitchArithmeticTest, ExponentMaxPerExponentIncludingNegatives) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 3)).ok());
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(sw.AddWorker(1, r, {kIpA + r, 1000}).ok());
  sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(0), -5, -1));
  sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(0), -3, -7));
  const Action& a = sw.Process({kIpC, 1000}, Datagram({0, 0}, Fill(0), -9, -2));
  ASSERT_EQ(a.kind, Action::Kind::kMulticast);
  proto::Packet p = Reply(a);
  EXPECT_EQ(p.header.e0, -3);
  EXPECT_EQ(p.header.e1, -1);
  // The next round (tsi 1) on set 1 starts from its own first exponents, not from set 0's.
  sw.Process({kIpA, 1000}, Datagram({0, 1}, Fill(0), -128, 127, 1));
  sw.Process({kIpB, 1000}, Datagram({0, 1}, Fill(0), -100, -128, 1));
  const Action& b = sw.Process({kIpC, 1000}, Datagram({0, 1}, Fill(0), -120, 0, 1));
  ASSERT_EQ(b.kind, Action::Kind::kMulticast);
  p = Reply(b);
  EXPECT_EQ(p.header.e0, -100);
  EXPECT_EQ(p.header.e1, 127);
}

TEST(SwitchArithmeticTest, Int32WrapAround) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 3)).ok());
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(sw.AddWorker(1, r, {kIpA + r, 1000}).ok());
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  std::vector<int32_t> a(64, kMax), b(64, 1), c(64, kMin);
  b[1] = kMax;
  c[2] = -1;
  sw.Process({kIpA, 1000}, Datagram({0, 0}, a));
  sw.Process({kIpB, 1000}, Datagram({0, 0}, b));
  const Action& done = sw.Process({kIpC, 1000}, Datagram({0, 0}, c));
  const proto::Packet p = Reply(done);
  EXPECT_EQ(p.values[0], 0);         // kMax + 1 = kMin; kMin + kMin = 0
  EXPECT_EQ(p.values[1], kMax - 1);  // kMax + kMax = -2; -2 + kMin = kMax - 1
  EXPECT_EQ(p.values[2], kMax);      // kMax + 1 = kMin; kMin - 1 = kMax
  EXPECT_EQ(p.values[63], 0);
}

// ---- Special cases ----

// Given: a one-worker job uses slot 3 for four rounds (tsi = round), alternating sets, then
// retransmits the last round's packet (with a different payload, which must be ignored).
// Expect: every packet completes its round at once with its own values; the retransmission is
// answered with the stored result of round 3.
TEST(SwitchSpecialCaseTest, SingleWorkerJobCompletesEveryPacket) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 1)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 1000}).ok());
  for (uint8_t round = 0; round < 4; ++round) {
    const Action& a =
        sw.Process({kIpA, 1000}, Datagram({3, uint8_t(round % 2)}, Fill(round), 0, 0, round));
    ASSERT_EQ(a.kind, Action::Kind::kMulticast);
    ASSERT_EQ(a.destinations.size(), 1u);
    EXPECT_EQ(a.destinations[0], (Endpoint{kIpA, 1000}));
    EXPECT_EQ(Reply(a).values[0], round);
  }
  const Action& a = sw.Process({kIpA, 1000}, Datagram({3, 1}, Fill(99), 0, 0, 3));
  ASSERT_EQ(a.kind, Action::Kind::kUnicast);
  EXPECT_EQ(Reply(a).values[0], 3);
  EXPECT_EQ(Reply(a).header.tsi, 3u);
}

// Every bitmap word: 64 workers (one word) and 256 (four; ranks cross word boundaries).
TEST(SwitchSpecialCaseTest, SixtyFourAndTwoHundredFiftySixWorkers) {
  for (uint32_t n : {64u, 256u}) {
    SCOPED_TRACE(std::to_string(n) + " workers");
    SwitchConfig config = SmallConfig();
    config.max_workers_per_job = n;
    Switch sw(config);
    ASSERT_TRUE(sw.CreateJob(Spec(1, n)).ok());
    for (uint32_t r = 0; r < n; ++r)
      ASSERT_TRUE(sw.AddWorker(1, r, {kIpA, uint16_t(1000 + r)}).ok());
    for (uint32_t r = 0; r + 1 < n; ++r) {
      EXPECT_EQ(sw.Process({kIpA, uint16_t(1000 + r)}, Datagram({0, 0}, Fill(r))).reason,
                DropReason::kNone);
    }
    // The last rank (the bitmap's top bit) retransmits nothing yet; ranks 0 and 64 (the first
    // bit of a word) are duplicates.
    EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({0, 0}, Fill(0))).reason, DropReason::kDuplicate);
    if (n > 64) {
      EXPECT_EQ(sw.Process({kIpA, 1064}, Datagram({0, 0}, Fill(64))).reason,
                DropReason::kDuplicate);
    }
    const uint16_t last = uint16_t(1000 + n - 1);
    const Action& a = sw.Process({kIpA, last}, Datagram({0, 0}, Fill(int32_t(n - 1))));
    ASSERT_EQ(a.kind, Action::Kind::kMulticast);
    EXPECT_EQ(a.destinations.size(), n);
    EXPECT_EQ(Reply(a).values[0], int32_t((n - 1) * n / 2));
    EXPECT_EQ(sw.Process({kIpA, last}, Datagram({0, 0}, Fill(int32_t(n - 1)))).kind,
              Action::Kind::kUnicast);
  }
}

// Given: 2 workers complete round 0 on slot 0 set 0; worker 0 receives the result and sends
// round 1 on set 1; then a late network copy of worker 0's round-0 packet arrives.
// Expect: the stale copy is dropped as a duplicate and changes nothing: worker 1's retransmission
// of round 0 still gets round 0's result, and worker 1's round-1 packet completes set 1 with
// round 1's exact sum.
TEST(SwitchSpecialCaseTest, StaleCopyAfterSenderMovedOn) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kIpA, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(1, 1, {kIpB, 1000}).ok());
  // Round 0 carries tsi 10, round 1 tsi 20, from both workers.
  const auto w0_round0 = Datagram({0, 0}, Fill(1), 0, 0, 10);
  sw.Process({kIpA, 1000}, w0_round0);
  ASSERT_EQ(sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(2), 0, 0, 10)).kind,
            Action::Kind::kMulticast);
  EXPECT_EQ(sw.Process({kIpA, 1000}, Datagram({0, 1}, Fill(10), 0, 0, 20)).reason,
            DropReason::kNone);

  const Action& stale = sw.Process({kIpA, 1000}, w0_round0);
  EXPECT_EQ(stale.kind, Action::Kind::kDrop);
  EXPECT_EQ(stale.reason, DropReason::kDuplicate);

  const Action& again = sw.Process({kIpB, 1000}, Datagram({0, 0}, Fill(2), 0, 0, 10));
  ASSERT_EQ(again.kind, Action::Kind::kUnicast);
  EXPECT_EQ(Reply(again).values[0], 3);
  EXPECT_EQ(Reply(again).header.tsi, 10u);
  const Action& next = sw.Process({kIpB, 1000}, Datagram({0, 1}, Fill(20), 0, 0, 20));
  ASSERT_EQ(next.kind, Action::Kind::kMulticast);
  EXPECT_EQ(Reply(next).values[0], 30);
  EXPECT_EQ(sw.job_counters(1)->aggregated, 4u);
  EXPECT_EQ(Dropped(*sw.job_counters(1), DropReason::kDuplicate), 1u);
}

TEST(SwitchSpecialCaseTest, ProcessDoesNotAllocate) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(1, 3, proto::SizeCode::k1024B)).ok());
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(sw.AddWorker(1, r, {kIpA + r, 1000}).ok());
  std::vector<std::vector<uint8_t>> packets;
  for (uint32_t round = 0; round < 4; ++round) {
    packets.push_back(Datagram({1, uint8_t(round % 2)}, Fill(1, 256), 0, 0, round));
  }
  const std::vector<uint8_t> garbage = {1, 2, 3};
  const uint64_t before = g_allocations.load();
  uint64_t multicasts = 0;
  for (const auto& d : packets) {
    for (uint32_t r = 0; r < 3; ++r) {
      multicasts += sw.Process({kIpA + r, 1000}, d).kind == Action::Kind::kMulticast;
      sw.Process({kIpA + r, 1000}, d);  // retransmission
    }
    sw.Process({kIpA, 1000}, garbage);
    sw.Process({kIpD, 1000}, d);
  }
  EXPECT_EQ(g_allocations.load(), before);
  EXPECT_EQ(multicasts, 4u);
}

// Given a job of 2 workers, when the data path passes its transmit buffer to Process,
// expect the reply encoded there (the same bytes the 2-argument form gives), the buffer untouched
// by a packet without a reply, and no allocation.
TEST(SwitchSpecialCaseTest, ProcessEncodesTheReplyIntoTheCallersBuffer) {
  Switch with_buffer(SmallConfig());
  Switch without(SmallConfig());
  for (Switch* sw : {&with_buffer, &without}) {
    ASSERT_TRUE(sw->CreateJob(Spec(1, 2, proto::SizeCode::k1024B)).ok());
    for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(sw->AddWorker(1, r, {kIpA + r, 1000}).ok());
  }
  const std::vector<uint8_t> a = Datagram({3, 1}, Fill(5, 256), 2, 0, 9);
  const std::vector<uint8_t> b = Datagram({3, 1}, Fill(-7, 256), 4, 0, 9);
  std::vector<uint8_t> transmit(proto::kMaxDatagramBytes + 16, 0xee);
  const uint64_t before = g_allocations.load();
  EXPECT_EQ(with_buffer.Process({kIpA, 1000}, a, transmit).reason, DropReason::kNone);
  const bool untouched =
      std::all_of(transmit.begin(), transmit.end(), [](uint8_t x) { return x == 0xee; });
  const Action& done = with_buffer.Process({kIpB, 1000}, b, transmit);
  EXPECT_EQ(g_allocations.load(), before);
  ASSERT_EQ(done.kind, Action::Kind::kMulticast);
  EXPECT_EQ(done.reply.data(), transmit.data());
  const std::vector<uint8_t> got(done.reply.begin(), done.reply.end());
  without.Process({kIpA, 1000}, a);
  const Action& expected = without.Process({kIpB, 1000}, b);
  EXPECT_EQ(got, std::vector<uint8_t>(expected.reply.begin(), expected.reply.end()));
  EXPECT_EQ(Reply(expected).values[255], -2);
  EXPECT_EQ(Reply(expected).header.e0, 4);
  EXPECT_TRUE(untouched);
}

// Given jobs of 1 and 3 workers, when each datagram's reply is built over the datagram itself
// (the daemon's form with a transport that lends received buffers for replies), expect the bytes
// of the 2-argument form: for the completing contribution (added, or only loaded in a 1-worker
// job, with the reply's payload in the same pass), for a retransmission into the complete set
// (the stored result), and a consumed packet's memory untouched.
TEST(SwitchSpecialCaseTest, ProcessBuildsTheReplyOverTheDatagramItAnswers) {
  for (uint32_t n : {1u, 3u}) {
    SCOPED_TRACE(n);
    Switch in_place(SmallConfig());
    Switch reference(SmallConfig());
    for (Switch* sw : {&in_place, &reference}) {
      ASSERT_TRUE(sw->CreateJob(Spec(1, n, proto::SizeCode::k1024B)).ok());
      for (uint32_t r = 0; r < n; ++r) ASSERT_TRUE(sw->AddWorker(1, r, {kIpA + r, 1000}).ok());
    }
    for (uint32_t round = 0; round < 3; ++round) {
      const SlotId slot{2, static_cast<uint8_t>(round % 2)};
      for (uint32_t r = 0; r <= n; ++r) {  // r == n: rank 0 retransmits into the complete set
        const uint32_t rank = r % n;
        std::vector<int32_t> values(256);
        for (size_t i = 0; i < values.size(); ++i) {
          values[i] = static_cast<int32_t>(i * 7919 + rank * 104729 + round) * (i % 2 ? -1 : 1);
        }
        const std::vector<uint8_t> d =
            Datagram(slot, values, static_cast<int8_t>(rank), 0, round * 10);
        std::vector<uint8_t> buffer(proto::kMaxDatagramBytes, 0);
        std::copy(d.begin(), d.end(), buffer.begin());
        const Endpoint from{kIpA + rank, 1000};
        const Action& got =
            in_place.Process(from, std::span<const uint8_t>(buffer.data(), d.size()), buffer);
        const Action& want = reference.Process(from, d);
        ASSERT_EQ(got.kind, want.kind) << "round " << round << " r " << r;
        if (want.kind == Action::Kind::kDrop) {
          EXPECT_TRUE(std::equal(d.begin(), d.end(), buffer.begin()));
          continue;
        }
        EXPECT_EQ(got.reply.data(), buffer.data());
        EXPECT_EQ(std::vector<uint8_t>(got.reply.begin(), got.reply.end()),
                  std::vector<uint8_t>(want.reply.begin(), want.reply.end()));
      }
    }
  }
}

// The completing contribution adds (or, in a 1-worker job, loads) and writes the reply's payload
// in one pass, into whatever buffer the caller passes (proto::AddPayloadAndStore /
// LoadPayloadAndCopy). Given jobs of 1 to 4 workers, both packet sizes, values at the int32
// extremes (the sums wrap around) and transmit buffers filled with garbage, rounds on both sets of
// a slot: expect each result equal to the exact wrap-around sum computed here element by element
// (not by the switch's kernels), the max exponents and the completing packet's tsi, and each
// retransmission into the complete set answered with the same bytes (the shadow copy).
TEST(SwitchArithmeticTest, FusedReplyIntoATransmitBufferIsTheExactSum) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  for (proto::SizeCode size : {proto::SizeCode::k256B, proto::SizeCode::k1024B}) {
    const size_t numel = proto::NumelOf(size);
    for (uint32_t n = 1; n <= 4; ++n) {
      SCOPED_TRACE(testing::Message() << "numel " << numel << " workers " << n);
      Switch sw(SmallConfig());
      ASSERT_TRUE(sw.CreateJob(Spec(1, n, size)).ok());
      for (uint32_t r = 0; r < n; ++r) ASSERT_TRUE(sw.AddWorker(1, r, {kIpA + r, 1000}).ok());
      for (uint32_t round = 1; round <= 4; ++round) {
        const SlotId slot{5, static_cast<uint8_t>(round % 2)};
        std::vector<uint32_t> expected(numel, 0);
        std::vector<uint8_t> multicast;
        for (uint32_t r = 0; r < n; ++r) {
          std::vector<int32_t> values(numel);
          for (size_t i = 0; i < numel; ++i) {
            const uint32_t k = static_cast<uint32_t>(i * 2654435761u + r * 40503u + round);
            values[i] = k % 5 == 0   ? kMax
                        : k % 5 == 1 ? kMin
                        : k % 5 == 2 ? -1
                                     : static_cast<int32_t>(k);
            expected[i] += static_cast<uint32_t>(values[i]);
          }
          std::vector<uint8_t> transmit(proto::kMaxDatagramBytes, static_cast<uint8_t>(0xa5 + r));
          const Action& a = sw.Process({kIpA + r, 1000},
                                       Datagram(slot, values, static_cast<int8_t>(r) - 2,
                                                static_cast<int8_t>(-r), round * 100, 3),
                                       transmit);
          if (r + 1 < n) {
            ASSERT_EQ(a.kind, Action::Kind::kDrop) << "round " << round << " rank " << r;
            ASSERT_EQ(a.reason, DropReason::kNone);
            continue;
          }
          ASSERT_EQ(a.kind, Action::Kind::kMulticast) << "round " << round;
          ASSERT_EQ(a.reply.data(), transmit.data());
          ASSERT_EQ(a.reply.size(), proto::DatagramBytes(size));
          const proto::Packet p = Reply(a);
          EXPECT_EQ(p.header.tsi, round * 100);
          EXPECT_EQ(p.header.job_number, 3);
          EXPECT_EQ(p.header.slot, slot);
          EXPECT_EQ(p.header.e0, static_cast<int8_t>(n - 1) - 2);
          EXPECT_EQ(p.header.e1, 0);
          for (size_t i = 0; i < numel; ++i) {
            ASSERT_EQ(static_cast<uint32_t>(p.values[i]), expected[i])
                << "round " << round << " i " << i;
          }
          multicast.assign(a.reply.begin(), a.reply.end());
        }
        // Every rank retransmits (another payload, ignored): the stored result, byte for byte.
        for (uint32_t r = 0; r < n; ++r) {
          std::vector<uint8_t> transmit(proto::kMaxDatagramBytes, 0x5a);
          const Action& a = sw.Process(
              {kIpA + r, 1000}, Datagram(slot, Fill(7, numel), 0, 0, round * 100, 3), transmit);
          ASSERT_EQ(a.kind, Action::Kind::kUnicast) << "round " << round << " rank " << r;
          EXPECT_EQ(std::vector<uint8_t>(a.reply.begin(), a.reply.end()), multicast);
        }
      }
    }
  }
}

TEST(SwitchCountersTest, FormatCounters) {
  Switch sw(SmallConfig());
  ASSERT_TRUE(sw.CreateJob(Spec(77, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(77, 0, {kIpA, 1000}).ok());
  ASSERT_TRUE(sw.AddWorker(77, 1, {kIpB, 1000}).ok());
  ASSERT_TRUE(sw.CreateJob(Spec(5, 2)).ok());
  sw.Process({kIpA, 1000}, Datagram({3, 0}, Fill(1)));
  sw.Process({kIpA, 1000}, Datagram({3, 0}, Fill(1)));
  sw.Process({kIpB, 1000}, Datagram({3, 0}, Fill(1)));
  sw.Process({kIpB, 1000}, Datagram({3, 0}, Fill(1)));
  sw.Process({kIpA, 1000}, std::vector<uint8_t>{1});
  sw.Process({kIpC, 1000}, Datagram({3, 0}, Fill(1)));

  const std::string brief = sw.FormatCounters(false);
  EXPECT_NE(brief.find("switch: 2 jobs, received 6, malformed 1, unknown_source 1"),
            std::string::npos)
      << brief;
  EXPECT_NE(brief.find("malformed too_short"), std::string::npos) << brief;
  EXPECT_NE(brief.find("session 5: 0/2 workers registered"), std::string::npos) << brief;
  EXPECT_NE(brief.find("session 77: 2/2 workers registered, size 256B"), std::string::npos);
  EXPECT_NE(brief.find("dropped duplicate"), std::string::npos) << brief;
  EXPECT_LT(brief.find("session 5:"), brief.find("session 77:"));
  EXPECT_EQ(brief.find("slot"), std::string::npos) << brief;

  const std::string full = sw.FormatCounters(true);
  EXPECT_NE(full.find("slot"), std::string::npos) << full;
  // One line for slot 3: received 4, completed 1, retransmitted 1, duplicates 1.
  EXPECT_NE(full.find("       3            4            1              1            1"),
            std::string::npos)
      << full;
}

TEST(SwitchCountersTest, LockedSwitchWrapsASwitch) {
  LockedSwitch locked(SmallConfig());
  std::lock_guard<std::mutex> lock(locked.mu);
  EXPECT_TRUE(locked.sw.CreateJob(Spec(1, 1)).ok());
  EXPECT_EQ(locked.sw.config().slots_per_job, 16u);
}

}  // namespace
}  // namespace switchml::dataplane

namespace switchml::dataplane {
namespace {

constexpr uint32_t kLoopback = 0x7f000001;
const Endpoint kGroup{0xef010203, 12000};  // 239.1.2.3

SwitchConfig MulticastConfig() {
  SwitchConfig c = SmallConfig();
  c.loopback_multicast = true;
  return c;
}

JobSpec GroupSpec(uint64_t session, uint32_t n) {
  JobSpec s = Spec(session, n);
  s.num_ports = 2;
  s.multicast_group = kGroup;
  return s;
}

// Given: a job whose two workers (two ports each) both registered with the job's loopback group.
// Expect: a completed slot's result goes once, to the group's port of the completer's port
// offset; a retransmission into the completed slot is still answered to its sender alone.
TEST(SwitchLoopbackMulticastTest, ResultGoesOnceToTheGroup) {
  Switch sw(MulticastConfig());
  ASSERT_TRUE(sw.CreateJob(GroupSpec(1, 2)).ok());
  EXPECT_EQ(sw.FindJob(1)->multicast_group, kGroup);
  ASSERT_TRUE(sw.AddWorker(1, 0, {kLoopback, 20000}, nullptr, kGroup).ok());
  ASSERT_TRUE(sw.AddWorker(1, 1, {kLoopback, 21000}, nullptr, kGroup).ok());
  ASSERT_EQ(sw.Process({kLoopback, 20001}, Datagram({0, 0}, Fill(1))).kind, Action::Kind::kDrop);
  const Action& a = sw.Process({kLoopback, 21001}, Datagram({0, 0}, Fill(2)));
  ASSERT_EQ(a.kind, Action::Kind::kMulticast);
  ASSERT_EQ(a.destinations.size(), 1u);
  EXPECT_EQ(a.destinations[0], (Endpoint{kGroup.ipv4, 12001}));
  EXPECT_EQ(sw.job_counters(1)->multicast_packets, 2u);  // one per worker, as without the group
  const Action& again = sw.Process({kLoopback, 20001}, Datagram({0, 0}, Fill(1)));
  ASSERT_EQ(again.kind, Action::Kind::kUnicast);
  EXPECT_EQ(again.destinations[0], (Endpoint{kLoopback, 20001}));
}

// Given: a job with a worker registered without the group (a reference worker); a second job
// naming a group another job holds; a switch whose transport cannot send to groups.
// Expect: the first job's results go once to the group (its member) and to the reference worker
// on its own; the second job's to every worker; only the first job keeps the group.
TEST(SwitchLoopbackMulticastTest, AReferenceWorkerOrATakenGroupGetsResultsOnItsOwn) {
  Switch sw(MulticastConfig());
  ASSERT_TRUE(sw.CreateJob(GroupSpec(1, 2)).ok());
  ASSERT_TRUE(sw.AddWorker(1, 0, {kLoopback, 20000}, nullptr, kGroup).ok());
  ASSERT_TRUE(sw.AddWorker(1, 1, {kLoopback, 21000}).ok());
  sw.Process({kLoopback, 20000}, Datagram({0, 0}, Fill(1)));
  const Action& a = sw.Process({kLoopback, 21000}, Datagram({0, 0}, Fill(2)));
  ASSERT_EQ(a.destinations.size(), 2u);
  EXPECT_EQ(a.destinations[0], kGroup);
  EXPECT_EQ(a.destinations[1], (Endpoint{kLoopback, 21000}));

  ASSERT_TRUE(sw.CreateJob(GroupSpec(2, 2)).ok());
  EXPECT_EQ(sw.FindJob(2)->multicast_group, Endpoint{});  // job 1 holds it
  ASSERT_TRUE(sw.AddWorker(2, 0, {kLoopback, 22000}, nullptr, kGroup).ok());
  ASSERT_TRUE(sw.AddWorker(2, 1, {kLoopback, 23000}, nullptr, kGroup).ok());
  sw.Process({kLoopback, 22000}, Datagram({0, 0}, Fill(1)));
  EXPECT_EQ(sw.Process({kLoopback, 23000}, Datagram({0, 0}, Fill(2))).destinations.size(), 2u);

  Switch plain(SmallConfig());  // loopback_multicast off
  ASSERT_TRUE(plain.CreateJob(GroupSpec(3, 1)).ok());
  EXPECT_EQ(plain.FindJob(3)->multicast_group, Endpoint{});
}

// Given: a replica that mirrors a master whose job uses its group.
// Expect: the replica sends the job's results to the group too.
TEST(SwitchLoopbackMulticastTest, MirrorKeepsTheGroup) {
  Switch master(MulticastConfig());
  ASSERT_TRUE(master.CreateJob(GroupSpec(1, 2)).ok());
  ASSERT_TRUE(master.AddWorker(1, 0, {kLoopback, 20000}, nullptr, kGroup).ok());
  ASSERT_TRUE(master.AddWorker(1, 1, {kLoopback, 21000}, nullptr, kGroup).ok());
  Switch replica(MulticastConfig());
  replica.MirrorJobs(master);
  replica.Process({kLoopback, 20000}, Datagram({0, 0}, Fill(1)));
  const Action& a = replica.Process({kLoopback, 21000}, Datagram({0, 0}, Fill(2)));
  ASSERT_EQ(a.destinations.size(), 1u);
  EXPECT_EQ(a.destinations[0], kGroup);
}

// The switch and jobs of SwitchLanMulticastTest: a switch that sends groups on its LAN
// interface (no loopback scope), and jobs whose worker w is at host kHost + first + w, port
// 30000, registered with the job's group (but rank `reference`: without, as a reference worker).
class SwitchLanMulticastTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kHost = 0x0a63000a;  // 10.99.0.10
  static SwitchConfig LanConfig() {
    SwitchConfig config = SmallConfig();
    config.lan_multicast = true;
    return config;
  }
  void OpenJob(const JobSpec& spec, uint32_t first, int64_t reference = -1) {
    ASSERT_TRUE(sw.CreateJob(spec).ok());
    for (uint32_t w = 0; w < spec.num_workers; ++w) {
      const Endpoint group = w == reference ? Endpoint{} : spec.multicast_group;
      ASSERT_TRUE(
          sw.AddWorker(spec.job_id, w, {kHost + first + w, 30000}, nullptr, group).ok());
    }
  }
  Switch sw{LanConfig()};
};

// Given: a job of four workers on four hosts, all registered with the job's group; then a job of
// four where one worker registered without it (a reference worker). Expect: each completed slot of
// the first job leaves once, to the group's port of the completer's offset, and group_sends counts
// it once (multicast_packets still num_workers per result); the second job's results go once to the
// group and once to the reference worker.
TEST_F(SwitchLanMulticastTest, EachResultLeavesOnceAndAReferenceWorkerGetsUnicast) {
  const Endpoint lan_group{0xefc00203, 14000};
  JobSpec spec = Spec(1, 4);
  spec.num_ports = 2;
  spec.multicast_group = lan_group;
  OpenJob(spec, 0);
  for (uint16_t slot = 0; slot < 3; ++slot) {
    for (uint32_t w = 0; w < 3; ++w) {
      ASSERT_EQ(sw.Process({kHost + w, 30001}, Datagram({slot, 0}, Fill(1))).kind,
                Action::Kind::kDrop);
    }
    const Action& a = sw.Process({kHost + 3, 30001}, Datagram({slot, 0}, Fill(1)));
    ASSERT_EQ(a.kind, Action::Kind::kMulticast);
    ASSERT_EQ(a.destinations.size(), 1u);
    EXPECT_EQ(a.destinations[0], (Endpoint{lan_group.ipv4, 14001}));
  }
  EXPECT_EQ(sw.job_counters(1)->completed, 3u);
  EXPECT_EQ(sw.job_counters(1)->group_sends, 3u);
  EXPECT_EQ(sw.job_counters(1)->multicast_packets, 12u);
  const std::string text = sw.FormatCounters(false);
  EXPECT_NE(text.find("group_sends"), std::string::npos) << text;
  EXPECT_NE(text.find("239.192.2.3:14000"), std::string::npos) << text;

  JobSpec mixed = spec;
  mixed.job_id = 2;
  mixed.multicast_group = Endpoint{0xefc00204, 14000};
  OpenJob(mixed, 10, /*reference=*/2);
  for (uint32_t w = 0; w < 3; ++w) sw.Process({kHost + 10 + w, 30000}, Datagram({0, 0}, Fill(1)));
  const Action& a = sw.Process({kHost + 13, 30000}, Datagram({0, 0}, Fill(1)));
  ASSERT_EQ(a.kind, Action::Kind::kMulticast);
  ASSERT_EQ(a.destinations.size(), 2u);
  EXPECT_EQ(a.destinations[0], mixed.multicast_group);
  EXPECT_EQ(a.destinations[1], (Endpoint{kHost + 12, 30000}));
  EXPECT_EQ(sw.job_counters(2)->group_sends, 1u);
}

// Given: a job of three workers on three hosts, all registered with the job's LAN group; the
// group does not reach rank 2 (it retransmits every slot it contributed to once the slot is
// complete), rank 0 loses one result in 16 (it retransmits those), and rank 1 times out early
// on 300 results in a row in each of its first two checks (bursts of spurious retransmissions,
// more than half of each check).
// Expect: results leave once, to the group, until rank 2's fresh contribution that ends its
// kGroupCheckStrikes-th check; from then on they go to the group and to rank 2 on its own, and
// group_demoted counts it once; ranks 0 and 1 stay members; the counters' table names it.
TEST_F(SwitchLanMulticastTest, AMemberTheGroupDoesNotReachGetsItsOwnCopy) {
  const Endpoint group{0xefc00205, 14000};
  JobSpec spec = Spec(1, 3);
  spec.multicast_group = group;
  OpenJob(spec, 0);
  const uint32_t check = Switch::GroupCheckContributions(spec);
  ASSERT_EQ(check, Switch::kGroupCheckContributions);
  const uint32_t demoted_at = check * Switch::kGroupCheckStrikes - 1;
  const uint32_t rounds = demoted_at + 64;
  for (uint32_t r = 0; r < rounds; ++r) {
    const SlotId slot{static_cast<uint16_t>(r % 16), static_cast<uint8_t>((r / 16) % 2)};
    const auto packet = Datagram(slot, Fill(1), 0, 0, r);
    ASSERT_EQ(sw.Process({kHost + 0, 30000}, packet).kind, Action::Kind::kDrop) << r;
    ASSERT_EQ(sw.Process({kHost + 1, 30000}, packet).kind, Action::Kind::kDrop) << r;
    const Action& a = sw.Process({kHost + 2, 30000}, packet);
    ASSERT_EQ(a.kind, Action::Kind::kMulticast) << r;
    if (r < demoted_at) {
      ASSERT_EQ(a.destinations.size(), 1u) << r;
    } else {
      ASSERT_EQ(a.destinations.size(), 2u) << r;
      EXPECT_EQ(a.destinations[1], (Endpoint{kHost + 2, 30000})) << r;
    }
    EXPECT_EQ(a.destinations[0], group) << r;
    ASSERT_EQ(sw.Process({kHost + 2, 30000}, packet).kind, Action::Kind::kUnicast) << r;
    if (r % 16 == 0) {
      ASSERT_EQ(sw.Process({kHost + 0, 30000}, packet).kind, Action::Kind::kUnicast) << r;
    }
    if (r % check >= 100 && r % check < 400 && r < 2 * check) {
      ASSERT_EQ(sw.Process({kHost + 1, 30000}, packet).kind, Action::Kind::kUnicast) << r;
    }
  }
  EXPECT_EQ(sw.job_counters(1)->group_demoted, 1u);
  EXPECT_EQ(sw.job_counters(1)->group_sends, rounds);
  const std::string text = sw.FormatCounters(false);
  EXPECT_NE(text.find("group_demoted"), std::string::npos) << text;
}

}  // namespace
}  // namespace switchml::dataplane
