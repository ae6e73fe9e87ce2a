// WorkerThread: pumps one WorkerSession through one Transport on a thread of its own.
//
// Owns the thread, the transport and the session. Slices are queued with Submit() and carried
// out in order; each reports its outcome through its SliceDone callback. Thread-safe: Submit()
// and Stop() may be called from any thread.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "base/endpoint.h"
#include "transport/transport.h"
#include "worker/session.h"

namespace switchml::runtime {

class WorkerThread {
 public:
  using SliceDone = std::function<void(const Status&)>;

  WorkerThread(const worker::SessionConfig& config, std::unique_ptr<transport::Transport> transport,
               Endpoint switch_data);
  ~WorkerThread();  // Stop()s

  void Submit(const worker::SliceJob& job, SliceDone done);
  // Ends the thread; queued slices are reported as CANCELLED.
  void Stop();

  worker::SessionCounters counters() const;

 private:
  struct Pending {
    worker::SliceJob job;
    SliceDone done;
  };
  void Run();
  bool RunSlice(const Pending& p);  // false when stopping

  std::unique_ptr<transport::Transport> transport_;
  Endpoint switch_data_;
  worker::WorkerSession session_;
  mutable std::mutex mu_;
  std::deque<Pending> queue_;
  worker::SessionCounters published_;  // a copy of the session's counters, under mu_
  Status broken_;  // a transport failure ends this thread's usefulness (thread-local)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace switchml::runtime
