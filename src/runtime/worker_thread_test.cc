// WorkerThread over the in-memory network, against a test switch of one worker (the result of a
// one-worker job is the worker's own packet, so the test switch echoes), with a transport
// wrapper that stands in for the host's scheduler.
#include "runtime/worker_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "transport/memory.h"

namespace switchml::runtime {
namespace {

using std::chrono::milliseconds;

constexpr Endpoint kSwitch{0x0a000001, 2000};
constexpr Endpoint kWorker{0x0a000002, 3000};

// Passes everything through to the wrapped transport, counting receives that returned
// datagrams. Once `stall_after_sent` datagrams have been sent, the next receive that would wait
// first sleeps for `stall` (the thread "not scheduled" while results queue up).
class SchedulerTransport : public transport::Transport {
 public:
  SchedulerTransport(std::unique_ptr<transport::Transport> inner, size_t stall_after_sent,
                     std::chrono::nanoseconds stall)
      : inner_(std::move(inner)), stall_after_sent_(stall_after_sent), stall_(stall) {}
  Endpoint local_endpoint() const override { return inner_->local_endpoint(); }
  size_t max_datagram_bytes() const override { return inner_->max_datagram_bytes(); }
  Result<size_t> Send(std::span<const transport::TxDatagram> batch) override {
    auto r = inner_->Send(batch);
    if (r.ok()) sent_ += *r;
    return r;
  }
  Result<size_t> Receive(std::span<transport::RxDatagram> batch,
                         std::chrono::nanoseconds timeout) override {
    if (!stalled_ && stall_after_sent_ > 0 && sent_ >= stall_after_sent_ &&
        timeout > timeout.zero()) {
      stalled_ = true;
      std::this_thread::sleep_for(stall_);
    }
    auto r = inner_->Receive(batch, timeout);
    if (r.ok() && *r > 0) {
      nonempty_receives_.fetch_add(1);
      received_.fetch_add(*r);
    }
    return r;
  }
  void Wake() override { inner_->Wake(); }
  std::span<uint8_t> TxBuffer(size_t index) override { return inner_->TxBuffer(index); }
  transport::TransportCounters counters() const override { return inner_->counters(); }
  std::string name() const override { return "scheduler(" + inner_->name() + ")"; }

  uint64_t nonempty_receives() const { return nonempty_receives_.load(); }
  uint64_t received() const { return received_.load(); }

 private:
  std::unique_ptr<transport::Transport> inner_;
  const size_t stall_after_sent_;
  const std::chrono::nanoseconds stall_;
  size_t sent_ = 0;  // (the worker thread's)
  bool stalled_ = false;
  std::atomic<uint64_t> nonempty_receives_{0}, received_{0};
};

// The switch of a one-worker job: echoes every datagram to its source. It holds the first
// `hold` datagrams until all of them came, then answers them at once; after that it answers
// each datagram `gap` after the previous answer (a link's rate). With `stray`, when the first
// datagram comes it first makes a stranger (another address, as any host of the LAN) send that
// many datagrams to the worker: they reach it before any result.
class EchoSwitch {
 public:
  EchoSwitch(transport::MemoryNetwork* net, size_t hold, std::chrono::nanoseconds gap,
             size_t stray = 0)
      : transport_(net->Attach(kSwitch)),
        stranger_(stray > 0 ? net->Attach(Endpoint{0x0a000009, 4000}) : nullptr),
        hold_(hold),
        gap_(gap),
        stray_(stray) {
    thread_ = std::thread([this] { Run(); });
  }
  ~EchoSwitch() {
    stop_.store(true);
    transport_->Wake();
    thread_.join();
  }

 private:
  void Run() {
    std::vector<transport::RxDatagram> rx(64);
    std::vector<std::vector<uint8_t>> held;
    const std::vector<uint8_t> junk(64, 0xee);
    while (!stop_.load()) {
      auto r = transport_->Receive(rx, milliseconds(20));
      if (!r.ok()) return;
      for (size_t i = 0; i < *r; ++i) {
        if (stray_ > 0) {
          std::vector<transport::TxDatagram> tx(stray_, transport::TxDatagram{rx[i].source, junk});
          ASSERT_TRUE(stranger_->Send(tx).ok());
          stray_ = 0;
        }
        if (held.size() < hold_ && !released_) {
          held.emplace_back(rx[i].data.begin(), rx[i].data.end());
          if (held.size() == hold_) {
            released_ = true;
            for (const auto& d : held) Echo(rx[i].source, d);
          }
          continue;
        }
        if (gap_ > gap_.zero()) std::this_thread::sleep_for(gap_);
        Echo(rx[i].source, {rx[i].data.begin(), rx[i].data.end()});
      }
    }
  }
  void Echo(const Endpoint& to, const std::vector<uint8_t>& d) {
    const transport::TxDatagram tx{to, d};
    ASSERT_TRUE(transport_->Send({&tx, 1}).ok());
  }

  std::unique_ptr<transport::Transport> transport_, stranger_;
  const size_t hold_;
  const std::chrono::nanoseconds gap_;
  size_t stray_;  // (the switch thread's)
  bool released_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A thread of a one-worker job with one switch (kSwitch); results expected on `group` when it
// is not empty.
WorkerThreadOptions OneWorker(uint32_t window, milliseconds rto, WaitOptions wait = {},
                              std::string group = {}, bool group_required = true) {
  WorkerThreadOptions o;
  worker::SessionConfig& c = o.session.session;
  c.num_workers = 1;
  c.window = window;
  c.retransmit.timeout = rto;
  c.retransmit.min_timeout = rto;
  c.retransmit.peer_timeout = std::chrono::seconds(10);
  o.switches.push_back(SwitchRoute{kSwitch, 0, 0, "test switch"});
  o.wait = wait;
  o.expected_group = std::move(group);
  o.group_required = group_required;
  return o;
}

// Runs one int32 slice of in through the thread into out (of in's size); its status.
Status SubmitSlice(WorkerThread* thread, const std::vector<int32_t>& in,
                   std::vector<int32_t>* out) {
  worker::Slice slice;
  slice.allreduce = 1;
  slice.dtype = DataType::kInt32;
  slice.in = in.data();
  slice.out = out->data();
  slice.count = in.size();
  std::promise<Status> done;
  thread->Submit(slice, [&](const Status& st) { done.set_value(st); });
  return done.get_future().get();
}

// Runs one int32 slice of `count` elements through the thread; its status, with the output
// checked against the input.
Status RunSlice(WorkerThread* thread, size_t count) {
  std::vector<int32_t> in(count), out(count, -1);
  std::iota(in.begin(), in.end(), 7);
  Status st = SubmitSlice(thread, in, &out);
  EXPECT_EQ(out, in);
  return st;
}

// Given: a window of 1024 packets, all answered while the worker thread is not scheduled for
// three retransmission timeouts (more results queued than one receive takes). (An RTO of
// 200 ms: sending the window must take less, also under a sanitizer on a loaded machine.)
// Expect: the thread takes every queued result before it calls a packet late: no timeout (which
// would count toward backing off) and nothing retransmitted.
TEST(WorkerThreadTest, ResultsQueuedWhileNotScheduledAreNotRetransmitted) {
  transport::MemoryNetwork net;
  constexpr uint32_t kWindow = 1024;
  EchoSwitch sw(&net, kWindow, std::chrono::nanoseconds(0));
  auto t = std::make_unique<SchedulerTransport>(net.Attach(kWorker), kWindow, milliseconds(600));
  WorkerThread thread(OneWorker(kWindow, milliseconds(200)), std::move(t),
                      std::make_shared<FailureLatch>());
  ASSERT_TRUE(RunSlice(&thread, 2 * kWindow * 256).ok());
  const worker::SessionCounters c = thread.counters();
  EXPECT_EQ(c.results, 2 * kWindow);
  EXPECT_EQ(c.timeouts, 0u);  // (each would count toward doubling the RTO)
  EXPECT_EQ(c.retransmitted, 0u);
}

// Given: results that arrive one at a time at a steady rate (every 20 us), a window of 256.
// Expect: with wake-up batching the thread sleeps between receives and takes many results per
// receive (about half its window at each; at least 8 on average, where a thread woken for
// every arrival measured 1.1), and the slice completes exactly.
TEST(WorkerThreadTest, WakeBatchingTakesSeveralResultsPerWakeUp) {
  transport::MemoryNetwork net;
  constexpr uint32_t kWindow = 256;
  EchoSwitch sw(&net, 0, std::chrono::microseconds(20));
  auto owned = std::make_unique<SchedulerTransport>(net.Attach(kWorker), 0, milliseconds(0));
  SchedulerTransport* t = owned.get();
  WaitOptions wait;
  wait.wake_batch = 0.5;
  WorkerThread thread(OneWorker(kWindow, milliseconds(10), wait), std::move(owned),
                      std::make_shared<FailureLatch>());
  ASSERT_TRUE(RunSlice(&thread, 16 * kWindow * 256).ok());
  ASSERT_GT(t->nonempty_receives(), 0u);
  const double per_receive =
      static_cast<double>(t->received()) / static_cast<double>(t->nonempty_receives());
  EXPECT_GE(per_receive, 8.0) << t->received() << " results in " << t->nonempty_receives()
                              << " receives";
}

// Reports every datagram it receives as having come through a multicast group, or none, as a
// kernel UDP transport that joined a LAN group counts them (TransportCounters).
class GroupCountingTransport : public SchedulerTransport {
 public:
  GroupCountingTransport(std::unique_ptr<transport::Transport> inner, bool through_group)
      : SchedulerTransport(std::move(inner), 0, milliseconds(0)), through_group_(through_group) {}
  transport::TransportCounters counters() const override {
    transport::TransportCounters c = SchedulerTransport::counters();
    c.group_datagrams_received = through_group_ ? c.datagrams_received : 0;
    return c;
  }

 private:
  const bool through_group_;
};

// Given: a thread that expects its results on a LAN multicast group, and a network that
// delivers results only as unicast (the group's datagrams are dropped somewhere).
// Expect: the slice fails with FAILED_PRECONDITION naming the group, once a window's worth has
// arrived, instead of crawling on; the failure is latched for the other threads.
// Given then: the same where the results do come through the group. Expect: the slice completes.
// Given then: the network that drops the group, for a thread that does not require it (the
// default, --multicast auto). Expect: the slice completes on the unicast results, the latch
// stays clear.
TEST(WorkerThreadTest, ResultsThatNeverComeThroughTheExpectedGroupFailTheSlice) {
  constexpr uint32_t kWindow = 64;
  {
    transport::MemoryNetwork net;
    EchoSwitch sw(&net, 0, std::chrono::nanoseconds(0));
    auto latch = std::make_shared<FailureLatch>();
    WorkerThread thread(OneWorker(kWindow, milliseconds(10), {}, "239.192.1.2:12000 on eth0"),
                        std::make_unique<GroupCountingTransport>(net.Attach(kWorker), false),
                        latch);
    std::vector<int32_t> in(64 * kWindow * 256, 1), out(in.size());
    const Status st = SubmitSlice(&thread, in, &out);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
    EXPECT_NE(st.message().find("239.192.1.2:12000 on eth0"), std::string::npos) << st.message();
    EXPECT_TRUE(latch->is_set());
    EXPECT_LT(thread.counters().results, 16 * kWindow);  // stopped early (of 64 windows)
  }
  {
    transport::MemoryNetwork net;
    EchoSwitch sw(&net, 0, std::chrono::nanoseconds(0));
    WorkerThread thread(OneWorker(kWindow, milliseconds(10), {}, "239.192.1.2:12000 on eth0"),
                        std::make_unique<GroupCountingTransport>(net.Attach(kWorker), true),
                        std::make_shared<FailureLatch>());
    EXPECT_TRUE(RunSlice(&thread, 8 * kWindow * 256).ok());
  }
  {
    transport::MemoryNetwork net;
    EchoSwitch sw(&net, 0, std::chrono::nanoseconds(0));
    auto latch = std::make_shared<FailureLatch>();
    WorkerThread thread(OneWorker(kWindow, milliseconds(10), {}, "239.192.1.2:12000 on eth0",
                                  /*group_required=*/false),
                        std::make_unique<GroupCountingTransport>(net.Attach(kWorker), false),
                        latch);
    const Status st = RunSlice(&thread, 64 * kWindow * 256);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_FALSE(latch->is_set());
  }
}

// Reports the datagrams received from the switch as having come through the multicast group
// (a LAN group that works), and those from anywhere else as unicast.
class SwitchGroupTransport : public SchedulerTransport {
 public:
  explicit SwitchGroupTransport(std::unique_ptr<transport::Transport> inner)
      : SchedulerTransport(std::move(inner), 0, milliseconds(0)) {}
  Result<size_t> Receive(std::span<transport::RxDatagram> batch,
                         std::chrono::nanoseconds timeout) override {
    auto r = SchedulerTransport::Receive(batch, timeout);
    if (r.ok()) {
      for (size_t i = 0; i < *r; ++i) group_ += batch[i].source == kSwitch ? 1 : 0;
    }
    return r;
  }
  transport::TransportCounters counters() const override {
    transport::TransportCounters c = SchedulerTransport::counters();
    c.group_datagrams_received = group_.load();
    return c;
  }

 private:
  std::atomic<uint64_t> group_{0};
};

// Given: a thread that expects its results on a LAN multicast group, which delivers them, and a
// stranger on the LAN that sends more datagrams to the worker's port than one receive takes,
// before the first result. Expect: the slice completes (the stranger's datagrams, dropped by the
// source check, say nothing about the group: before, they counted as "results that arrived as
// unicast", and the slice failed with FAILED_PRECONDITION blaming the network's multicast).
TEST(WorkerThreadTest, AStrangersDatagramsDoNotFailTheGroupCheck) {
  constexpr uint32_t kWindow = 64;
  transport::MemoryNetwork net;
  EchoSwitch sw(&net, 0, std::chrono::nanoseconds(0), /*stray=*/600);
  WorkerThread thread(OneWorker(kWindow, milliseconds(10), {}, "239.192.1.2:12000 on eth0"),
                      std::make_unique<SwitchGroupTransport>(net.Attach(kWorker)),
                      std::make_shared<FailureLatch>());
  const Status st = RunSlice(&thread, 4 * kWindow * 256);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(thread.foreign_source_dropped(), 600u);
}

// A transport whose every receive fails at once (a hard error: a closed socket, a poll that
// fails), counting the calls.
class FailingReceiveTransport : public SchedulerTransport {
 public:
  explicit FailingReceiveTransport(std::unique_ptr<transport::Transport> inner)
      : SchedulerTransport(std::move(inner), 0, milliseconds(0)) {}
  Result<size_t> Receive(std::span<transport::RxDatagram>, std::chrono::nanoseconds) override {
    calls_.fetch_add(1);
    return InternalError("receive failed (test)");
  }
  uint64_t calls() const { return calls_.load(); }

 private:
  std::atomic<uint64_t> calls_{0};
};

// Given: an idle thread (no slice) whose transport's receive fails at once, every time.
// Expect: the thread waits between tries as it does when the receive waits (about 10 per second
// here), instead of retrying in a loop that takes a core (before: hundreds of thousands of calls
// in 300 ms).
TEST(WorkerThreadTest, AnIdleThreadDoesNotSpinOnAFailingReceive) {
  transport::MemoryNetwork net;
  auto owned = std::make_unique<FailingReceiveTransport>(net.Attach(kWorker));
  FailingReceiveTransport* t = owned.get();
  {
    WorkerThread thread(OneWorker(64, milliseconds(10)), std::move(owned),
                        std::make_shared<FailureLatch>());
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_LT(t->calls(), 100u);
  }
}

}  // namespace
}  // namespace switchml::runtime
