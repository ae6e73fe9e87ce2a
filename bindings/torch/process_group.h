// ProcessGroupSwitchML: a c10d::ProcessGroup (PyTorch 1.13) whose all-reduces with SUM on CPU
// float32, int32, float16 and bfloat16 tensors go through a SwitchML switch; every other
// collective, reduce op, dtype or device is served by a Gloo process group made on the same
// store, so nothing a user or DDP calls fails.
//
// Rendezvous: through the c10d store (StoreRendezvous): rank 0 picks a random session id and
// every worker reads it, so concurrent process groups (each with its own prefix store) get
// their own switch sessions.
// Ordering: switchml all-reduces complete in submission order on one completion thread, which
// copies staged results back and then completes the Work and its Future. barrier() first waits
// for the pending switchml work, then runs Gloo's barrier.
// Thread-safety: the c10d contract (collectives issued in the same order on every rank).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "switchml/context.h"

namespace switchml::torch_backend {

class SwitchmlWork;

class ProcessGroupSwitchML final : public c10d::ProcessGroup {
 public:
  // Sets up the switch session (blocks until every rank joined, or throws c10::Error with the
  // library's message). `config.rank`, `num_workers` and `session_id` are filled in here.
  ProcessGroupSwitchML(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       Config config, c10::intrusive_ptr<c10d::ProcessGroup> fallback);
  ~ProcessGroupSwitchML() override;

  const std::string getBackendName() const override { return "switchml"; }
  uint64_t session_id() const { return context_->session_id(); }
  const Config& config() const { return context_->config(); }
  ContextStats stats() const { return context_->stats(); }
  // All-reduces that went through the switch / were handed to the fallback (for tests).
  uint64_t switch_calls() const { return switch_calls_; }
  uint64_t fallback_calls() const { return fallback_calls_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Served by the fallback.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

 private:
  // Starts one switch all-reduce summing each tensor of `tensors` separately (they share one
  // dtype); the result lands in the tensors themselves.
  c10::intrusive_ptr<c10d::Work> SwitchAllReduce(const std::vector<at::Tensor>& tensors,
                                                 c10d::OpType op_type);
  void CompletionLoop();

  std::unique_ptr<Context> context_;
  c10::intrusive_ptr<c10d::ProcessGroup> fallback_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<SwitchmlWork>> queue_;  // submitted, not yet completed
  size_t in_flight_ = 0;                                // queued or being completed
  bool stop_ = false;
  std::atomic<uint64_t> switch_calls_{0}, fallback_calls_{0};
  std::thread completer_;
};

// True when the switch serves an all-reduce of these tensors with this op (else the fallback).
bool SwitchServes(const std::vector<at::Tensor>& tensors, c10d::ReduceOp op);

}  // namespace switchml::torch_backend
