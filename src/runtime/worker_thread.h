// WorkerThread: pumps one WorkerSession through one Transport on a thread of its own.
//
// Owns the thread, the transport and the session. Slices are queued with Submit() and carried
// out in order; each reports its outcome through its SliceDone callback, after which the thread
// no longer touches the slice's buffers. Thread-safe: Submit() and Stop() may be called from any
// thread.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/endpoint.h"
#include "switchml/wait.h"
#include "transport/transport.h"
#include "worker/sparse_session.h"
#include "worker/striped_session.h"

namespace switchml::runtime {

// Shared by the worker threads of one Context: the first protocol failure of any of them (a peer
// timeout, a transport failure). After it the workers' slot states no longer agree, so every
// slice, running or queued, fails at once with it. Thread-safe.
class FailureLatch {
 public:
  // Keeps the first failure; later ones are ignored.
  void Set(const Status& failure);
  bool is_set() const { return set_.load(std::memory_order_acquire); }
  Status Get() const;

 private:
  std::atomic<bool> set_{false};
  mutable std::mutex mu_;
  Status failure_;
};

// One switch host as a worker thread sees it.
struct SwitchRoute {
  // Where the thread sends the packets of the host's slots (the host's data-plane thread for it).
  Endpoint data;
  // Results are accepted only from the host's data endpoints: source address data.ipv4 (any
  // address when it is 0; any loopback address when it is one) and source port in [ports_first,
  // ports_first + ports); ports 0 means data.port alone.
  uint16_t ports_first = 0;
  uint32_t ports = 0;
  std::string name;  // how logs and errors name the host ("10.0.0.1:50099")
};

// What a WorkerThread runs: its protocol core and where it sends.
struct WorkerThreadOptions {
  // The thread's session; session.num_hosts == switches.size() (striping.h: one host for an
  // ordinary job).
  worker::StripedSessionConfig session;
  std::vector<SwitchRoute> switches;
  // How the thread waits for results (Config::wait, whole).
  WaitOptions wait;
  // Config::pin_threads: the CPU the thread runs on (-1: wherever the scheduler puts it).
  int cpu = -1;
  // When not empty, the transport has joined a LAN multicast group where the switch sends every
  // result (Config::lan_multicast), described so ("239.192.1.2:12000 on eth0"); if a window's
  // worth of datagrams (and at least kGroupCheckDatagrams) arrive from the switch and none
  // through the group, the network is not delivering it (only retransmission replies come, as
  // unicast): with group_required the slice fails with FAILED_PRECONDITION naming the group,
  // instead of crawling on retransmissions; without, a warning says so (the switch notices too
  // and sends this worker's results to it alone: dataplane::JobCounters::group_demoted).
  std::string expected_group;
  bool group_required = true;
  // When not empty and a slice fails because no result came for the progress timeout
  // (DEADLINE_EXCEEDED), called with the slice's all-reduce number for a
  // sentence the error adds (the switch's account: which rank has not started it); it may block
  // briefly and returns "" when it knows nothing.
  std::function<std::string(uint64_t allreduce)> explain_stall;
};

class WorkerThread {
 public:
  using SliceDone = std::function<void(const Status&)>;

  // Starts the thread. Every datagram from anywhere but the job's live switch hosts is dropped
  // and counted (foreign_source_dropped()).
  WorkerThread(WorkerThreadOptions options, std::unique_ptr<transport::Transport> transport,
               std::shared_ptr<FailureLatch> failure);
  static constexpr uint64_t kGroupCheckDatagrams = 64;
  ~WorkerThread();  // Stop()s

  // Queues a slice; after Stop() it is reported as CANCELLED at once.
  void Submit(const worker::Slice& slice, SliceDone done);
  // Switch host `host` (index into options.switches) died: the thread moves its slots off it
  // (worker::StripedSession::Failover) as soon as it can; a failure to do so is latched.
  // Thread-safe; does not block.
  void MoveOff(uint32_t host);
  // Ends the thread; a running slice and the queued ones are reported as CANCELLED. Idempotent.
  void Stop();

  worker::SessionCounters counters() const;
  worker::FailoverCounters failover_counters() const;
  worker::SparseCounters sparse_counters() const;
  // Datagrams dropped because their source was not one of the switch's data endpoints (a
  // stray or hostile sender: never handed to the session).
  uint64_t foreign_source_dropped() const {
    return foreign_source_.load(std::memory_order_relaxed);
  }
  transport::TransportCounters transport_counters() const { return transport_->counters(); }

 private:
  struct Pending {
    worker::Slice slice;
    SliceDone done;
  };
  void Run();
  // Runs one slice to its end and reports it; false when stopping.
  bool RunSlice(const Pending& p);
  // Drives the session while it runs (a slice, or failover work); false when stopping.
  bool Pump();
  // Applies the MoveOff requests.
  void ApplyMoves();
  // Whether a datagram from source may be a result of the switch.
  bool FromSwitch(const Endpoint& source) const;
  // Receives one batch, waiting up to `wait`, and feeds the switch's datagrams to the session;
  // how many datagrams came. A transport failure aborts the slice and is returned.
  Result<size_t> ReceiveBatch(worker::Nanos wait);
  // Wake-up batching: counts `received` datagrams that arrived by `now` into the arrival rate;
  // and sleeps, if worthwhile, until the next batch should have arrived.
  void MeasureArrivals(size_t received, worker::Nanos now);
  // The expected_group check: aborts the session (or, without group_required_, warns) when only
  // unicast datagrams arrive.
  void CheckGroupDelivers();
  void NapForBatch();

  std::unique_ptr<transport::Transport> transport_;
  const std::vector<SwitchRoute> switches_;
  std::atomic<uint64_t> foreign_source_{0};
  std::shared_ptr<FailureLatch> failure_;
  worker::SparseSession session_;  // a StripedSession for dense slices
  const WaitOptions wait_;
  const int cpu_;
  const std::string expected_group_;
  const std::function<std::string(uint64_t)> explain_stall_;
  const bool group_required_;
  // MoveOff requests (under mu_) and a flag the thread polls.
  std::vector<uint32_t> moves_;
  std::atomic<bool> move_pending_{false};
  worker::Nanos move_started_{-1};  // the failover under way began (the thread's)
  bool group_seen_;                 // a datagram came through expected_group_ (or none is expected)
  // Datagrams taken from the switch's data endpoints while slices ran (the thread's): until one
  // comes through the group, these are the unicast ones the group check counts. (The transport's
  // own count also holds anyone else's datagrams, which say nothing about the group.)
  uint64_t from_switch_ = 0;
  bool idle_error_logged_ = false;  // a receive failed while idle (logged once)
  // Wake-up batching state (the thread's): datagrams per second arriving while a slice runs,
  // smoothed (0 until measured; kept across slices); the measurement period under way; and
  // when the last receive returned datagrams.
  double arrival_rate_ = 0;
  worker::Nanos period_start_{};
  uint64_t period_count_ = 0;
  worker::Nanos last_arrival_{};
  // Batches of the running slice (used by the thread only); the datagram memory is the
  // transport's, lent and touched once.
  std::vector<transport::TxDatagram> tx_;
  std::vector<transport::RxDatagram> rx_;
  mutable std::mutex mu_;
  std::deque<Pending> queue_;                    // under mu_
  bool stopped_ = false;                         // under mu_: Submit() no longer queues
  worker::SessionCounters published_;            // a copy of the session's counters, under mu_
  worker::FailoverCounters published_failover_;  // under mu_
  worker::SparseCounters published_sparse_;      // under mu_
  std::mutex stop_mu_;                           // serializes Stop()
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace switchml::runtime
