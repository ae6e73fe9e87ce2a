#include "runtime/worker_thread.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <thread>
#include <vector>

#include "base/affinity.h"
#include "base/check.h"
#include "base/logging.h"
#include "proto/wire.h"

namespace switchml::runtime {
namespace {

// Datagrams per send: one segmented send (UDP GSO) carries up to 64 datagrams of 1034 bytes.
constexpr size_t kTxBatch = 63;
// Datagrams per receive.
constexpr size_t kRxBatch = 256;
// Receives that may empty the socket before timeouts are handled (far more than a socket
// buffer holds).
constexpr size_t kMaxDrainBatches = 64;
// Wake-up batching (WaitOptions::wake_batch): the arrival rate is measured over periods at least
// this long (several of the kernel's coalesced receive runs at 1 Gbit/s); naps shorter than
// kMinNap are not taken (the timer's slack is 50 us, and a result is usually that close);
// naps are at most kMaxNap and a quarter of the retransmission timeout.
constexpr worker::Nanos kRatePeriod = std::chrono::milliseconds(2);
constexpr worker::Nanos kMinNap = std::chrono::microseconds(100);
constexpr worker::Nanos kMaxNap = std::chrono::milliseconds(5);

worker::Nanos Now() {
  return std::chrono::duration_cast<worker::Nanos>(
      std::chrono::steady_clock::now().time_since_epoch());
}

// A datagram as the session should see it: an oversized one (truncated by the receive buffer)
// is not a SwitchML packet, so it is passed on empty and counted as malformed.
std::span<const uint8_t> Contents(const transport::RxDatagram& d) {
  return d.truncated ? std::span<const uint8_t>() : d.data;
}

}  // namespace

void FailureLatch::Set(const Status& failure) {
  std::lock_guard<std::mutex> lock(mu_);
  if (set_.load(std::memory_order_relaxed)) return;
  failure_ = failure;
  set_.store(true, std::memory_order_release);
}

Status FailureLatch::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

WorkerThread::WorkerThread(WorkerThreadOptions options,
                           std::unique_ptr<transport::Transport> transport,
                           std::shared_ptr<FailureLatch> failure)
    : transport_(std::move(transport)),
      switches_(std::move(options.switches)),
      failure_(std::move(failure)),
      session_(options.session),
      wait_(options.wait),
      cpu_(options.cpu),
      expected_group_(std::move(options.expected_group)),
      explain_stall_(std::move(options.explain_stall)),
      group_required_(options.group_required),
      group_seen_(expected_group_.empty()),
      tx_(kTxBatch),
      rx_(kRxBatch) {
  CHECK_EQ(switches_.size(), options.session.num_hosts);
  CHECK_LE(proto::DatagramBytes(options.session.session.size), transport_->max_datagram_bytes());
  transport_->TxBuffer(0);  // the transport's transmit memory, allocated and touched now
  thread_ = std::thread([this] { Run(); });
}

WorkerThread::~WorkerThread() { Stop(); }

void WorkerThread::Submit(const worker::Slice& slice, SliceDone done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      queue_.push_back(Pending{slice, std::move(done)});
      transport_->Wake();
      return;
    }
  }
  done(CancelledError("the context is shutting down"));
}

void WorkerThread::MoveOff(uint32_t host) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    moves_.push_back(host);
  }
  move_pending_.store(true, std::memory_order_release);
  transport_->Wake();
}

void WorkerThread::ApplyMoves() {
  std::vector<uint32_t> moves;
  {
    std::lock_guard<std::mutex> lock(mu_);
    moves.swap(moves_);
    move_pending_.store(false, std::memory_order_relaxed);
  }
  for (uint32_t host : moves) {
    const size_t before = session_.live_hosts().size();
    const Status st = session_.Failover(host, Now());
    if (!st.ok()) {
      LOG(kError, kWorker) << "cannot move off switch host " << switches_[host].name << ": "
                           << st.message();
      failure_->Set(st);
      continue;
    }
    if (session_.live_hosts().size() == before) continue;  // off it already
    move_started_ = Now();
    LOG(kWarning, kWorker) << "switch host " << switches_[host].name
                           << " is gone: moving this thread's share to the "
                           << session_.live_hosts().size() << " hosts left (slot range "
                           << session_.generation() << ")";
  }
}

void WorkerThread::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  stop_.store(true);
  transport_->Wake();
  if (thread_.joinable()) thread_.join();
  std::deque<Pending> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    rest.swap(queue_);
  }
  for (auto& p : rest)
    p.done(CancelledError("the context was destroyed before this all-reduce ran"));
}

worker::SessionCounters WorkerThread::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

worker::FailoverCounters WorkerThread::failover_counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_failover_;
}

worker::SparseCounters WorkerThread::sparse_counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_sparse_;
}

bool WorkerThread::FromSwitch(const Endpoint& source) const {
  // A switch bound to every address answers from whichever local address the kernel picks for
  // the route back: on one host that may be any loopback address (127.0.1.1 for the host name,
  // 127.0.0.1 for the reply). Loopback sources can only come from this host (the kernel drops
  // them arriving from outside), and this host's other processes cannot bind the switch's ports.
  constexpr uint32_t kLoopbackNet = 0x7f000000, kLoopbackMask = 0xff000000;
  for (uint32_t h : session_.live_hosts()) {
    const SwitchRoute& r = switches_[h];
    const bool loopback = (r.data.ipv4 & kLoopbackMask) == kLoopbackNet &&
                          (source.ipv4 & kLoopbackMask) == kLoopbackNet;
    if (r.data.ipv4 != 0 && source.ipv4 != r.data.ipv4 && !loopback) continue;
    const uint32_t first = r.ports == 0 ? r.data.port : r.ports_first;
    const uint32_t count = r.ports == 0 ? 1 : r.ports;
    if (source.port >= first && source.port < first + count) return true;
  }
  return false;
}

void WorkerThread::MeasureArrivals(size_t received, worker::Nanos now) {
  last_arrival_ = now;
  period_count_ += received;
  const worker::Nanos elapsed = now - period_start_;
  if (elapsed < kRatePeriod) return;
  const double sample = static_cast<double>(period_count_) * 1e9 / elapsed.count();
  arrival_rate_ = arrival_rate_ == 0 ? sample : 0.5 * (arrival_rate_ + sample);
  period_start_ = now;
  period_count_ = 0;
}

void WorkerThread::NapForBatch() {
  // The rate includes the naps themselves, which keeps this stable: a nap too long for the rate
  // finds every packet in flight answered, the rate it then measures is lower than the
  // network's by the idle part, and the next nap is shorter by as much; too short a nap costs
  // only a wake-up.
  if (arrival_rate_ <= 0) return;
  const double in_flight =
      static_cast<double>(std::min<size_t>(session_.config().window, session_.remaining()));
  worker::Nanos nap{static_cast<int64_t>(wait_.wake_batch * in_flight / arrival_rate_ * 1e9)};
  nap = std::min({nap, kMaxNap, session_.counters().rto / 4});
  worker::Nanos wake = last_arrival_ + nap;
  if (auto deadline = session_.PollTimeout()) wake = std::min(wake, *deadline);
  const worker::Nanos now = Now();
  if (wake - now < kMinNap) return;
  std::this_thread::sleep_for(wake - now);
}

void WorkerThread::Run() {
  PinDataThread(cpu_, LogSubsystem::kWorker);
  std::array<transport::RxDatagram, 1> idle_rx;
  while (!stop_.load()) {
    if (move_pending_.load(std::memory_order_acquire)) {
      // Failover while idle: the other workers may need this one's results (the agreement).
      ApplyMoves();
      if (session_.state() == worker::SparseSession::State::kRunning && !Pump()) return;
      if (session_.state() == worker::SparseSession::State::kDone && !session_.status().ok()) {
        failure_->Set(session_.status());
      }
      continue;
    }
    Pending p;
    bool have = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty()) {
        p = std::move(queue_.front());
        queue_.pop_front();
        have = true;
      }
    }
    if (!have) {
      // Idle: late duplicates of finished slices may still arrive; read and drop them.
      constexpr auto kIdleWait = std::chrono::milliseconds(100);
      auto r = transport_->Receive(idle_rx, kIdleWait);
      if (!r.ok()) {
        // A hard error returns at once: wait as the receive would have, not retry in a loop
        // that takes a core. (A slice that comes meanwhile fails with the error, as would one
        // that came during a receive.)
        if (!idle_error_logged_) {
          LOG(kError, kWorker) << "receive failed while idle: " << r.status().ToString();
          idle_error_logged_ = true;
        }
        std::this_thread::sleep_for(kIdleWait);
        continue;
      }
      if (*r > 0) {
        if (FromSwitch(idle_rx[0].source)) {
          session_.HandleDatagram(Contents(idle_rx[0]), Now());  // (late: dropped as stale)
        } else {
          foreign_source_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      continue;
    }
    if (!RunSlice(p)) return;
  }
}

Result<size_t> WorkerThread::ReceiveBatch(worker::Nanos wait) {
  auto r = transport_->Receive(rx_, wait);
  if (!r.ok()) {
    LOG(kError, kWorker) << "receive failed: " << r.status().ToString();
    session_.Abort(r.status());
    return r.status();
  }
  const worker::Nanos now = Now();
  if (*r > 0 && wait_.wake_batch > 0) MeasureArrivals(*r, now);
  uint64_t foreign = 0;
  for (size_t i = 0; i < *r; ++i) {
    // Only the switch sends results: anything else could write chosen values into the output.
    if (!FromSwitch(rx_[i].source)) {
      ++foreign;
      continue;
    }
    session_.HandleDatagram(Contents(rx_[i]), now);
  }
  if (foreign > 0) foreign_source_.fetch_add(foreign, std::memory_order_relaxed);
  from_switch_ += *r - foreign;
  if (!group_seen_ && *r > foreign) CheckGroupDelivers();
  return *r;
}

void WorkerThread::CheckGroupDelivers() {
  const transport::TransportCounters c = transport_->counters();
  if (c.group_datagrams_received > 0) {
    group_seen_ = true;
    return;
  }
  // None came through the group yet, so every datagram from the switch came as unicast. (Not
  // the transport's count of datagrams: that holds anyone's, and a stranger's datagrams, dropped
  // by the source check, would fail a job whose group works.)
  const uint64_t unicast = from_switch_;
  if (unicast < std::max<uint64_t>(kGroupCheckDatagrams, session_.config().window)) return;
  const std::string what = "LAN multicast: " + std::to_string(unicast) +
                           " results arrived as unicast retransmission replies and none on "
                           "multicast group " +
                           expected_group_ +
                           ": the network does not deliver the switch's multicast to this worker";
  if (!group_required_) {
    group_seen_ = true;  // said once; the switch sends this worker its own copies once it notices
    LOG(kWarning, kWorker) << what
                           << "; results come one copy per worker once the switch notices (run "
                              "with --multicast local to do without the group from the start)";
    return;
  }
  session_.Abort(FailedPreconditionError(
      what +
      " (a switch that filters multicast or prunes it by IGMP snooping without a querier, a "
      "firewall, the switch on another segment); run the workers with --multicast auto or local "
      "(docs/architecture.md, \"Multicast results\")"));
}

bool WorkerThread::Pump() {
  const size_t max_bytes = proto::DatagramBytes(session_.config().size);
  std::vector<transport::TxDatagram>& tx = tx_;
  period_start_ = last_arrival_ = Now();
  period_count_ = 0;
  bool stopping = false;
  while (session_.state() == worker::SparseSession::State::kRunning) {
    if (stop_.load()) {
      session_.Abort(CancelledError("the context was destroyed while this all-reduce ran"));
      stopping = true;
      break;
    }
    if (failure_->is_set()) {  // another thread of this worker failed: this slice cannot finish
      session_.Abort(failure_->Get());
      break;
    }
    if (move_pending_.load(std::memory_order_acquire)) {
      ApplyMoves();
      if (session_.state() != worker::SparseSession::State::kRunning) break;
    }
    if (move_started_.count() >= 0 && !session_.failing_over()) {
      const worker::FailoverCounters f = session_.failover_counters();
      LOG(kWarning, kWorker)
          << "moved off in "
          << std::chrono::duration_cast<std::chrono::milliseconds>(Now() - move_started_).count()
          << " ms (blocks aggregated again so far: " << f.blocks_staged << " staged, "
          << f.blocks_tail << " in place); going on with " << session_.live_hosts().size()
          << " switch hosts";
      move_started_ = worker::Nanos{-1};
    }
    worker::Nanos now = Now();
    size_t n = 0;
    while (n < kTxBatch) {
      const std::optional<uint32_t> host = session_.NextTransmitHost();
      if (!host) break;
      const Endpoint& to = switches_[*host].data;
      // Where the transport lends the switch's own memory (shm), encoded straight into it.
      std::span<uint8_t> buf = transport_->TxBufferTo(n, to).first(max_bytes);
      const size_t len = session_.PollTransmit(now, buf);
      if (len == 0) break;
      tx[n] = transport::TxDatagram{to, buf.first(len)};
      ++n;
    }
    size_t sent = 0;
    for (int attempt = 0; sent < n && attempt < 1000; ++attempt) {
      auto r = transport_->Send(std::span(tx).subspan(sent, n - sent));
      if (!r.ok()) {
        LOG(kError, kWorker) << "send failed: " << r.status().ToString();
        session_.Abort(r.status());
        break;
      }
      sent += *r;
      if (sent < n) std::this_thread::yield();  // socket buffer full: let the kernel drain it
    }
    // (Packets still unsent after that are recovered by the retransmission timeout.)
    if (session_.state() != worker::SparseSession::State::kRunning) break;
    worker::Nanos wait{0};
    if (n < kTxBatch && !wait_.busy_poll) {
      // Everything the results freed is sent: wait for the next ones, handling several of the
      // network's runs per wake-up when batching.
      if (wait_.wake_batch > 0) NapForBatch();
      auto deadline = session_.PollTimeout();
      if (deadline) wait = std::max(worker::Nanos{0}, *deadline - Now());
    }
    if (!ReceiveBatch(wait).ok()) break;
    now = Now();
    auto deadline = session_.PollTimeout();
    if (deadline && *deadline <= now) {
      // Before calling a packet late, take every result already queued: a thread that was not
      // scheduled for a while (a loaded host) finds many waiting beyond one batch, and timing
      // out the packets they answer would only send spurious retransmissions. Bounded, so that
      // a flood cannot hold the timers off.
      bool failed = false;
      for (size_t i = 0; i < kMaxDrainBatches; ++i) {
        if (session_.state() != worker::SparseSession::State::kRunning) break;
        auto got = ReceiveBatch(worker::Nanos{0});
        if (!got.ok()) {
          failed = true;
          break;
        }
        if (*got == 0) break;
      }
      if (failed) break;
      session_.HandleTimeout(Now());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  published_ = session_.counters();
  published_failover_ = session_.failover_counters();
  published_sparse_ = session_.sparse_counters();
  return !stopping;
}

bool WorkerThread::RunSlice(const Pending& p) {
  if (failure_->is_set()) {
    p.done(failure_->Get());
    return true;
  }
  session_.Start(p.slice, Now());
  const bool stopping = !Pump();
  Status st = session_.status();
  if (!stopping && st.code() == StatusCode::kDeadlineExceeded && explain_stall_) {
    // No result for the progress timeout: the switch may know which peer is missing.
    if (std::string why = explain_stall_(p.slice.allreduce); !why.empty()) {
      st = DeadlineExceededError(st.message() + "; the switch says: " + why);
    }
  }
  // A protocol failure leaves the workers' slot states inconsistent: fail everything after it.
  // (Non-finite input is not one: the protocol completed normally.)
  if (!stopping && !st.ok() && st.code() != StatusCode::kInvalidArgument) failure_->Set(st);
  p.done(st);
  return !stopping;
}

}  // namespace switchml::runtime
