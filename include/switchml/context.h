// Context: one worker's membership in a SwitchML job, and its all-reduce operations.
//
//   switchml::Config config;  config.rank = r;  config.num_workers = n;  ...
//   auto ctx = switchml::Context::Create(config);      // joins the job on the switch
//   if (!ctx.ok()) { std::cerr << ctx.status().ToString(); ... }
//   Status st = (*ctx)->AllReduce(in, out, count, switchml::DataType::kFloat32);
//
// Not a singleton: several contexts may live in one process (each is its own worker).
// Thread-safety: all methods may be called from any thread; all-reduces are carried out in the
// order they were submitted, which must be the same order on every worker of the job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "switchml/config.h"
#include "switchml/export.h"
#include "switchml/rendezvous.h"
#include "switchml/stats.h"
#include "switchml/status.h"
#include "switchml/types.h"

namespace switchml {

class Context;

// The handle of an asynchronous all-reduce. Copyable; all copies refer to the same operation.
class SWITCHML_EXPORT AllReduceHandle {
 public:
  AllReduceHandle() = default;
  // Blocks until the operation ends; returns its outcome.
  Status Wait() const;
  // True when the operation has ended (then Wait() does not block).
  bool Test() const;

 private:
  friend class Context;
  struct State;
  explicit AllReduceHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

class SWITCHML_EXPORT Context {
 public:
  // Validates the config, opens the data-plane transports (one per worker thread) and registers
  // this worker in the job on the switch (on every host of a striped job), meeting the other
  // workers (blocks until every worker has joined, or setup_timeout).
  static Result<std::unique_ptr<Context>> Create(const Config& config);
  // The same, meeting the other workers through `rendezvous` (session-id broadcast, setup
  // barriers, Barrier()) instead of the switch's control plane; null means the control plane.
  // The Context keeps it until destroyed.
  static Result<std::unique_ptr<Context>> Create(const Config& config,
                                                 std::shared_ptr<Rendezvous> rendezvous);
  ~Context();  // stops the worker threads; pending operations fail with CANCELLED

  // Sums `count` elements of every worker's `in` into every worker's `out` (in == out allowed;
  // buffers that overlap otherwise are refused with INVALID_ARGUMENT).
  // Blocks until done. int32 sums are exact (32-bit wrap-around); float32 sums are quantized.
  Status AllReduce(const void* in, void* out, size_t count, DataType dtype);
  // Starts an all-reduce and returns at once; the buffers must stay valid until it ends.
  Result<AllReduceHandle> AllReduceAsync(const void* in, void* out, size_t count, DataType dtype);
  // Waits for every operation submitted so far; returns the first failure, if any.
  Status WaitForAll();
  // A barrier among the job's workers through the rendezvous (by default the switch's control
  // plane).
  Status Barrier();

  uint64_t session_id() const;
  const Config& config() const;
  ContextStats stats() const;

  class Impl;

 private:
  explicit Context(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchml
