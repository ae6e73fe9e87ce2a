#include "runtime/worker_thread.h"

#include <array>
#include <chrono>
#include <vector>

#include "base/logging.h"
#include "proto/wire.h"

namespace switchml::runtime {
namespace {

constexpr size_t kBatch = 32;

worker::Nanos Now() {
  return std::chrono::duration_cast<worker::Nanos>(
      std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace

WorkerThread::WorkerThread(const worker::SessionConfig& config,
                           std::unique_ptr<transport::Transport> transport, Endpoint switch_data)
    : transport_(std::move(transport)), switch_data_(switch_data), session_(config) {
  thread_ = std::thread([this] { Run(); });
}

WorkerThread::~WorkerThread() { Stop(); }

void WorkerThread::Submit(const worker::SliceJob& job, SliceDone done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Pending{job, std::move(done)});
  }
  transport_->Wake();
}

void WorkerThread::Stop() {
  if (stop_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  transport_->Wake();
  if (thread_.joinable()) thread_.join();
  std::deque<Pending> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(queue_);
  }
  for (auto& p : rest)
    p.done(CancelledError("the context was destroyed before this all-reduce ran"));
}

worker::SessionCounters WorkerThread::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

void WorkerThread::Run() {
  std::vector<uint8_t> discard(proto::kMaxDatagramBytes);
  std::array<transport::RxDatagram, 1> idle_rx;
  idle_rx[0].buffer = discard;
  while (!stop_.load()) {
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
      // Idle: late duplicates of finished jobs may still arrive; read and drop them.
      auto r = transport_->Receive(idle_rx, std::chrono::milliseconds(100));
      if (r.ok() && *r > 0) session_.HandleDatagram({discard.data(), idle_rx[0].length}, Now());
      continue;
    }
    if (!RunSlice(p)) {
      p.done(CancelledError("the context was destroyed while this all-reduce ran"));
      return;
    }
  }
}

bool WorkerThread::RunSlice(const Pending& p) {
  const size_t max_bytes = proto::DatagramBytes(session_.config().size);
  std::vector<uint8_t> tx_bufs(kBatch * max_bytes);
  std::vector<uint8_t> rx_bufs(kBatch * proto::kMaxDatagramBytes);
  std::array<transport::TxDatagram, kBatch> tx;
  std::array<transport::RxDatagram, kBatch> rx;
  for (size_t i = 0; i < kBatch; ++i) {
    rx[i].buffer = {rx_bufs.data() + i * proto::kMaxDatagramBytes, proto::kMaxDatagramBytes};
  }
  if (!broken_.ok()) {
    p.done(broken_);
    return true;
  }
  session_.Start(p.job, Now());
  Status failure;
  while (session_.state() == worker::WorkerSession::State::kRunning) {
    if (stop_.load()) return false;
    worker::Nanos now = Now();
    size_t n = 0;
    while (n < kBatch) {
      std::span<uint8_t> buf(tx_bufs.data() + n * max_bytes, max_bytes);
      const size_t len = session_.PollTransmit(now, buf);
      if (len == 0) break;
      tx[n] = transport::TxDatagram{switch_data_, buf.first(len)};
      ++n;
    }
    size_t sent = 0;
    for (int attempt = 0; sent < n && attempt < 1000; ++attempt) {
      auto r = transport_->Send(std::span(tx).subspan(sent, n - sent));
      if (!r.ok()) {
        failure = r.status();
        break;
      }
      sent += *r;
      if (sent < n) std::this_thread::yield();  // socket buffer full: let the kernel drain it
    }
    if (!failure.ok()) break;  // unsent packets are recovered by the retransmission timeout
    worker::Nanos wait{0};
    if (n < kBatch) {
      auto deadline = session_.PollTimeout();
      if (deadline) wait = std::max(worker::Nanos{0}, *deadline - Now());
    }
    auto r = transport_->Receive(rx, wait);
    if (!r.ok()) {
      failure = r.status();
      break;
    }
    now = Now();
    for (size_t i = 0; i < *r; ++i) {
      // An oversized datagram is not a SwitchML reply: hand over an empty one, counted as
      // malformed.
      session_.HandleDatagram(
          rx[i].truncated ? std::span<const uint8_t>() : rx[i].buffer.first(rx[i].length), now);
    }
    auto deadline = session_.PollTimeout();
    if (deadline && *deadline <= now) session_.HandleTimeout(now);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    published_ = session_.counters();
  }
  if (!failure.ok()) {
    LOG(kError, kWorker) << "transport failed: " << failure.ToString();
    // The session's state is abandoned with the transport: later slices fail the same way.
    broken_ = failure;
    p.done(failure);
    return true;
  }
  p.done(session_.status());
  return true;
}

}  // namespace switchml::runtime
