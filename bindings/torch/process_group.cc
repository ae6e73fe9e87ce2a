#include "bindings/torch/process_group.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>

#include <cstdio>
#include <random>
#include <stdexcept>

namespace switchml::torch_backend {
namespace {

// The workers' meeting point through the c10d store (each process group has its own prefix).
// Barrier: every rank adds 1 to a counter; the last one sets a done key that all wait for.
// Broadcast: rank 0 sets a key that the others read (Store::get waits for it).
class StoreRendezvous final : public Rendezvous {
 public:
  StoreRendezvous(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                  std::chrono::milliseconds timeout)
      : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}

  Status Barrier() override {
    const std::string key = "barrier/" + std::to_string(generation_++);
    try {
      if (store_->add(key, 1) == size_) store_->set(key + "/done", {1});
      store_->wait({key + "/done"}, timeout_);
    } catch (const std::exception& e) {
      return DeadlineExceededError("barrier through the c10d store: " + std::string(e.what()));
    }
    return Status();
  }

  Result<uint64_t> Broadcast(uint64_t value) override {
    const std::string key = "broadcast/" + std::to_string(generation_++);
    try {
      if (rank_ == 0) {
        std::vector<uint8_t> bytes(8);
        for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(value >> (8 * i));
        store_->set(key, bytes);
      }
      store_->wait({key}, timeout_);
      const std::vector<uint8_t> bytes = store_->get(key);
      if (bytes.size() != 8) return InternalError("broadcast key " + key + " holds a bad value");
      uint64_t out = 0;
      for (int i = 0; i < 8; ++i) out |= uint64_t{bytes[i]} << (8 * i);
      return out;
    } catch (const std::exception& e) {
      return DeadlineExceededError("broadcast through the c10d store: " + std::string(e.what()));
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  uint64_t generation_ = 0;
};

bool SwitchDtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kInt || t == at::kHalf || t == at::kBFloat16;
}

}  // namespace

bool SwitchServes(const std::vector<at::Tensor>& tensors, c10d::ReduceOp op) {
  if (op.op_ != c10d::ReduceOp::SUM || tensors.empty()) return false;
  const at::ScalarType dtype = tensors[0].scalar_type();
  if (!SwitchDtype(dtype)) return false;
  for (const at::Tensor& t : tensors) {
    if (!t.device().is_cpu() || t.layout() != at::kStrided || t.scalar_type() != dtype)
      return false;
  }
  return true;
}

// One switch all-reduce: the caller's tensors and, unless a single contiguous float32/int32
// tensor is reduced in place, a flat staging tensor of float32 or int32.
class SwitchmlWork final : public c10d::Work {
 public:
  SwitchmlWork(int rank, c10d::OpType type, std::vector<at::Tensor> tensors)
      : Work(rank, type),
        tensors_(std::move(tensors)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

  std::vector<at::Tensor> result() override { return tensors_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Fills the staging tensor, or returns false when the single tensor is used in place.
  bool Stage() {
    const at::Tensor& first = tensors_[0];
    const bool int32 = first.scalar_type() == at::kInt;
    if (tensors_.size() == 1 && first.is_contiguous() &&
        (int32 || first.scalar_type() == at::kFloat)) {
      return false;
    }
    int64_t total = 0;
    for (const at::Tensor& t : tensors_) total += t.numel();
    at::NoGradGuard no_grad;
    staging_ = at::empty({total}, first.options().dtype(int32 ? at::kInt : at::kFloat));
    int64_t offset = 0;
    for (const at::Tensor& t : tensors_) {
      staging_.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
      offset += t.numel();
    }
    return true;
  }

  void* data() { return staging_.defined() ? staging_.data_ptr() : tensors_[0].data_ptr(); }
  size_t count() const {
    return staging_.defined() ? staging_.numel() : static_cast<size_t>(tensors_[0].numel());
  }
  DataType dtype() const {
    return tensors_[0].scalar_type() == at::kInt ? DataType::kInt32 : DataType::kFloat32;
  }

  // Copies staged results back (on success), then completes the Work and its Future.
  void Complete(const Status& st) {
    std::exception_ptr error;
    if (st.ok()) {
      try {
        if (staging_.defined()) {
          at::NoGradGuard no_grad;
          int64_t offset = 0;
          for (at::Tensor& t : tensors_) {
            t.copy_(staging_.narrow(0, offset, t.numel()).view(t.sizes()));
            offset += t.numel();
          }
          staging_ = at::Tensor();
        }
      } catch (...) {
        error = std::current_exception();
      }
    } else {
      error = std::make_exception_ptr(
          std::runtime_error("switchml all-reduce failed: " + st.ToString()));
    }
    finish(error);
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(tensors_));
    }
  }

  AllReduceHandle handle;
  bool submitted = false;  // false: nothing to reduce (no elements), complete at once

 private:
  std::vector<at::Tensor> tensors_;
  at::Tensor staging_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

ProcessGroupSwitchML::ProcessGroupSwitchML(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, Config config,
                                           c10::intrusive_ptr<c10d::ProcessGroup> fallback)
    : ProcessGroup(rank, size), fallback_(std::move(fallback)) {
  TORCH_CHECK(fallback_, "switchml: the process group needs a fallback process group");
  config.rank = static_cast<uint32_t>(rank);
  config.num_workers = static_cast<uint32_t>(size);
  auto rendezvous = std::make_shared<StoreRendezvous>(store, rank, size, config.setup_timeout);
  if (config.session_id == 0) {
    // A random id from rank 0, so that concurrent groups and jobs on one switch differ.
    std::random_device rd;
    const uint64_t pick = (uint64_t{rd()} << 32 | rd()) | 1;
    Result<uint64_t> id = rendezvous->Broadcast(pick);
    TORCH_CHECK(id.ok(), "switchml: cannot agree on a session id: ", id.status().ToString());
    config.session_id = *id;
  }
  if (config.job_secret.empty()) {
    // The job's secret (docs/security.md): 128 random bits from rank 0, shared through the
    // store, which only this job's processes reach.
    std::random_device rd;
    char hex[33];
    for (int half = 0; half < 2; ++half) {
      Result<uint64_t> part = rendezvous->Broadcast(uint64_t{rd()} << 32 | rd());
      TORCH_CHECK(part.ok(), "switchml: cannot share the job secret: ", part.status().ToString());
      std::snprintf(hex + 16 * half, 17, "%016llx", static_cast<unsigned long long>(*part));
    }
    config.job_secret.assign(hex, 32);
  }
  Result<std::unique_ptr<Context>> ctx = Context::Create(config, rendezvous);
  std::string where = config.switch_host + ":" + std::to_string(config.control_port);
  if (!config.switch_hosts.empty()) {
    where.clear();
    for (const std::string& h : config.switch_hosts) where += (where.empty() ? "" : ",") + h;
  }
  TORCH_CHECK(ctx.ok(), "switchml: cannot join the switch at ", where, ": ",
              ctx.status().ToString());
  context_ = std::move(ctx).value();
  completer_ = std::thread([this] { CompletionLoop(); });
}

ProcessGroupSwitchML::~ProcessGroupSwitchML() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  completer_.join();  // completes what was submitted (or fails it after the peer timeout)
  context_.reset();
}

void ProcessGroupSwitchML::CompletionLoop() {
  while (true) {
    c10::intrusive_ptr<SwitchmlWork> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      work = queue_.front();
      queue_.pop_front();
    }
    work->Complete(work->submitted ? work->handle.Wait() : Status());
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
    }
    cv_.notify_all();
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::SwitchAllReduce(
    const std::vector<at::Tensor>& tensors, c10d::OpType op_type) {
  auto work = c10::make_intrusive<SwitchmlWork>(rank_, op_type, tensors);
  work->Stage();
  std::lock_guard<std::mutex> lock(mu_);
  if (work->count() > 0) {
    // Submitted under mu_ so that the queue's order is the switch's order.
    Result<AllReduceHandle> h =
        context_->AllReduceAsync(work->data(), work->data(), work->count(), work->dtype());
    TORCH_CHECK(h.ok(), "switchml all-reduce failed: ", h.status().ToString());
    work->handle = std::move(h).value();
    work->submitted = true;
  }
  queue_.push_back(work);
  ++in_flight_;
  ++switch_calls_;
  cv_.notify_all();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::allreduce(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  // Several tensors in one allreduce call are c10d's one-tensor-per-device form: Gloo's.
  if (tensors.size() != 1 || !SwitchServes(tensors, opts.reduceOp)) {
    ++fallback_calls_;
    return fallback_->allreduce(tensors, opts);
  }
  return SwitchAllReduce(tensors, c10d::OpType::ALLREDUCE);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (!SwitchServes(tensors, opts.reduceOp)) {
    ++fallback_calls_;
    return fallback_->allreduce_coalesced(tensors, opts);
  }
  return SwitchAllReduce(tensors, c10d::OpType::ALLREDUCE_COALESCED);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::barrier(const c10d::BarrierOptions& opts) {
  {
    // Everything submitted before the barrier has ended first.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
  }
  return fallback_->barrier(opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::broadcast(std::vector<at::Tensor>& tensors,
                                                               const c10d::BroadcastOptions& opts) {
  return fallback_->broadcast(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  return fallback_->reduce(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return fallback_->allgather(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return fallback_->_allgather_base(output, input, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return fallback_->allgather_coalesced(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return fallback_->gather(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return fallback_->scatter(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return fallback_->reduce_scatter(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return fallback_->_reduce_scatter_base(output, input, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return fallback_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::alltoall(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllToAllOptions& opts) {
  return fallback_->alltoall(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::send(std::vector<at::Tensor>& tensors,
                                                          int dst_rank, int tag) {
  return fallback_->send(tensors, dst_rank, tag);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::recv(std::vector<at::Tensor>& tensors,
                                                          int src_rank, int tag) {
  return fallback_->recv(tensors, src_rank, tag);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupSwitchML::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                   int tag) {
  return fallback_->recvAnysource(tensors, tag);
}
void ProcessGroupSwitchML::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  fallback_->monitoredBarrier(opts, wait_all_ranks);
}
void ProcessGroupSwitchML::setSequenceNumberForGroup() { fallback_->setSequenceNumberForGroup(); }
uint64_t ProcessGroupSwitchML::getSequenceNumberForGroup() {
  return fallback_->getSequenceNumberForGroup();
}

}  // namespace switchml::torch_backend
