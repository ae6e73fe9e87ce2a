// Switch::MirrorJobs and mutations(): the replication a multi-threaded data plane relies on.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dataplane/switch.h"
#include "proto/wire.h"

namespace switchml::dataplane {
namespace {

constexpr uint32_t kIp = 0x0a000001;

SwitchConfig Config() {
  SwitchConfig c;
  c.slots_per_job = 16;
  c.max_jobs = 4;
  return c;
}

JobSpec Spec(uint64_t session, uint32_t n) {
  JobSpec s;
  s.job_id = session;
  s.num_workers = n;
  s.size = proto::SizeCode::k256B;
  s.max_outstanding_packets = 16;
  return s;
}

std::vector<uint8_t> Packet(uint16_t slot, int32_t value) {
  proto::Packet p;
  p.header.size = proto::SizeCode::k256B;
  p.header.slot = proto::SlotId{slot, 0};
  for (int32_t& v : p.payload()) v = value;
  std::vector<uint8_t> out(proto::DatagramBytes(p.header.size));
  proto::Encode(p, out);
  return out;
}

Endpoint Worker(uint32_t rank) { return Endpoint{kIp, static_cast<uint16_t>(1000 + rank)}; }

// Given a master with a two-worker job, a mirror aggregates that job's packets like the master
// would, and keeps its partial state across a mirror of an unchanged master.
TEST(SwitchMirrorTest, MirrorServesTheMastersJobsAndKeepsStateWhileUnchanged) {
  Switch master(Config()), mirror(Config());
  const uint64_t before = master.mutations();
  ASSERT_TRUE(master.CreateJob(Spec(7, 2)).ok());
  ASSERT_TRUE(master.AddWorker(7, 0, {kIp, 1000}).ok());
  ASSERT_TRUE(master.AddWorker(7, 1, {kIp, 1001}).ok());
  EXPECT_EQ(master.mutations(), before + 3);

  mirror.MirrorJobs(master);
  ASSERT_TRUE(mirror.HasJob(7));
  EXPECT_EQ(mirror.Process(Worker(0), Packet(3, 5)).kind, Action::Kind::kDrop);  // consumed
  mirror.MirrorJobs(master);  // nothing changed: the half-aggregated slot survives
  const Action& a = mirror.Process(Worker(1), Packet(3, 6));
  ASSERT_EQ(a.kind, Action::Kind::kMulticast);
  proto::Packet reply;
  ASSERT_EQ(proto::Decode(a.reply, &reply), proto::DecodeError::kOk);
  EXPECT_EQ(reply.payload()[0], 11);
  EXPECT_EQ(mirror.job_counters(7)->completed, 1u);
  EXPECT_EQ(master.job_counters(7)->completed, 0u);  // the master saw no data
}

// Given a job re-created in the master (same job id), the mirror drops its old state; a
// job removed from the master disappears from the mirror; a new one appears.
TEST(SwitchMirrorTest, RecreatedRemovedAndNewJobsFollowTheMaster) {
  Switch master(Config()), mirror(Config());
  ASSERT_TRUE(master.CreateJob(Spec(7, 2)).ok());
  ASSERT_TRUE(master.AddWorker(7, 0, {kIp, 1000}).ok());
  ASSERT_TRUE(master.AddWorker(7, 1, {kIp, 1001}).ok());
  mirror.MirrorJobs(master);
  mirror.Process(Worker(0), Packet(3, 5));  // half of slot 3 (set 0)

  ASSERT_TRUE(master.CreateJob(Spec(7, 2)).ok());  // rank 0 re-creates the session
  ASSERT_TRUE(master.AddWorker(7, 0, {kIp, 1000}).ok());
  mirror.MirrorJobs(master);
  // Rank 1 is not registered again yet: the job is not ready and its packets are not summed.
  EXPECT_EQ(mirror.Process(Worker(0), Packet(3, 5)).reason, DropReason::kJobNotReady);
  EXPECT_EQ(mirror.Process(Worker(1), Packet(3, 5)).reason, DropReason::kUnknownSource);
  ASSERT_TRUE(master.AddWorker(7, 1, {kIp, 1001}).ok());
  mirror.MirrorJobs(master);
  // A fresh slot: the old half-sum (5) is gone.
  EXPECT_EQ(mirror.Process(Worker(0), Packet(3, 1)).kind, Action::Kind::kDrop);
  const Action& a = mirror.Process(Worker(1), Packet(3, 2));
  ASSERT_EQ(a.kind, Action::Kind::kMulticast);
  proto::Packet reply;
  ASSERT_EQ(proto::Decode(a.reply, &reply), proto::DecodeError::kOk);
  EXPECT_EQ(reply.payload()[0], 3);

  ASSERT_TRUE(master.RemoveJob(7).ok());
  ASSERT_TRUE(master.CreateJob(Spec(9, 1)).ok());
  ASSERT_TRUE(master.AddWorker(9, 0, {kIp, 2000}).ok());
  mirror.MirrorJobs(master);
  EXPECT_FALSE(mirror.HasJob(7));
  EXPECT_EQ(mirror.Process(Worker(0), Packet(3, 1)).reason, DropReason::kUnknownSource);
  EXPECT_EQ(mirror.Process(Endpoint{kIp, 2000}, Packet(4, 9)).kind, Action::Kind::kMulticast);
}

// Given a job that completed a slot on a mirror and was then removed from the master (its
// workers closed it), Expect the mirror's counters to still show its table, marked closed, once
// it mirrors the removal (a datagram after the close makes a data-plane thread do so), next to
// the jobs still running; a job that never saw traffic leaves nothing behind.
TEST(SwitchMirrorTest, ClosedJobsStayInTheCounters) {
  Switch master(Config()), mirror(Config());
  ASSERT_TRUE(master.CreateJob(Spec(7, 1)).ok());
  ASSERT_TRUE(master.AddWorker(7, 0, {kIp, 1000}).ok());
  ASSERT_TRUE(master.CreateJob(Spec(8, 1)).ok());
  ASSERT_TRUE(master.AddWorker(8, 0, {kIp, 1001}).ok());
  mirror.MirrorJobs(master);
  ASSERT_EQ(mirror.Process(Worker(0), Packet(3, 5)).kind, Action::Kind::kMulticast);
  ASSERT_TRUE(master.RemoveJob(7).ok());
  ASSERT_TRUE(master.RemoveJob(8).ok());
  ASSERT_TRUE(master.CreateJob(Spec(9, 1)).ok());
  mirror.MirrorJobs(master);
  EXPECT_FALSE(mirror.HasJob(7));
  const std::string out = mirror.FormatCounters(false);
  EXPECT_NE(out.find("session 7 (closed): 1/1 workers registered"), std::string::npos) << out;
  EXPECT_NE(out.find("session 9: 0/1 workers registered"), std::string::npos) << out;
  EXPECT_EQ(out.find("session 8"), std::string::npos) << out;
}

}  // namespace
}  // namespace switchml::dataplane
