#include "worker/sparse_session.h"

#include <cmath>
#include <cstring>
#include <string>

#include "base/check.h"

namespace switchml::worker {

SparseSession::SparseSession(const StripedSessionConfig& config)
    : inner_(config),
      num_workers_(config.session.num_workers),
      numel_(proto::NumelOf(config.session.size)) {}

void SparseSession::Start(const Slice& slice, Nanos now) {
  CHECK(state() != State::kRunning) << "Start() while a slice is running";
  own_result_ = false;
  if (!slice.sparse) {
    inner_.Start(slice, now);
    return;
  }
  CHECK(slice.lanes >= 1 && slice.lane < slice.lanes)
      << "lane " << slice.lane << " of " << slice.lanes;
  CHECK(slice.count == 0 || (slice.in != nullptr && slice.out != nullptr));
  slice_ = slice;
  share_ = BlockShare{slice.count, numel_, slice.lane, slice.lanes};
  own_result_ = true;
  state_ = State::kRunning;
  status_ = Status();
  const uint64_t blocks = share_.blocks();
  announce_.resize(AnnounceWords(blocks, num_workers_));
  ++sparse_counters_.allreduces;
  sparse_counters_.blocks += blocks;
  sparse_counters_.announce_words += announce_.size();
  sparse_counters_.own_blocks +=
      EncodeAnnouncement(slice.in, slice.dtype, share_, num_workers_, announce_);
  Slice a;
  a.allreduce = slice.allreduce;
  a.dtype = DataType::kInt32;
  a.in = a.out = announce_.data();
  a.count = announce_.size();
  phase_ = Phase::kAnnounce;
  inner_.Start(a, now);
  Advance(now);
}

void SparseSession::HandleDatagram(std::span<const uint8_t> datagram, Nanos now) {
  inner_.HandleDatagram(datagram, now);
  Advance(now);
}

void SparseSession::HandleTimeout(Nanos now) {
  inner_.HandleTimeout(now);
  Advance(now);
}

void SparseSession::Abort(Status status) {
  inner_.Abort(status);
  if (phase_ != Phase::kNone) Finish(std::move(status));
}

Status SparseSession::Failover(uint32_t host, Nanos now) {
  const Status st = inner_.Failover(host, now);
  // Idle: the agreement (and any repair of the last slice) runs as the inner session's work.
  if (phase_ == Phase::kNone && inner_.state() == State::kRunning) own_result_ = false;
  Advance(now);
  return st;
}

void SparseSession::Advance(Nanos now) {
  while (phase_ != Phase::kNone && inner_.state() == State::kDone) {
    if (phase_ == Phase::kUnion) {
      FinishUnion();
      return;
    }
    if (!inner_.status().ok()) {  // (an int32 slice: any failure is the slice's)
      Finish(inner_.status());
      return;
    }
    StartUnion(now);
  }
}

void SparseSession::StartUnion(Nanos now) {
  const uint64_t blocks = share_.blocks();
  UnionBlocks(announce_, blocks, num_workers_, &union_);
  sparse_counters_.union_blocks += union_.size();
  const bool dense =
      union_.size() == blocks || (slice_.sparse_auto && AutoChoosesDense(union_.size(), blocks));
  direct_ = dense && share_.lanes == 1;
  phase_ = Phase::kUnion;
  if (dense) {
    ++sparse_counters_.dense_shares;
    sparse_counters_.aggregated_blocks += blocks;
  } else {
    sparse_counters_.aggregated_blocks += union_.size();
  }
  if (direct_) {
    // The share is the whole tensor: the job itself as a dense slice, in to out.
    Slice d = slice_;
    d.sparse = d.sparse_auto = false;
    inner_.Start(d, now);
    return;
  }
  if (dense) {  // strided: every block of the share through the compact buffer
    union_.resize(blocks);
    for (uint64_t j = 0; j < blocks; ++j) union_[j] = j;
  }
  compact_.resize(union_.size() * numel_ * 4);
  GatherBlocks(slice_.in, share_, union_, compact_);
  Slice u;
  u.allreduce = slice_.allreduce;
  u.dtype = slice_.dtype;
  u.in = u.out = compact_.data();
  u.count = union_.size() * numel_;
  inner_.Start(u, now);
}

void SparseSession::FinishUnion() {
  Status st = inner_.status();
  if (direct_) {  // results in place, and any message already names the tensor's elements
    Finish(std::move(st));
    return;
  }
  // Non-finite input is the caller's, not a protocol failure: the results are written (NaN in
  // the blocks concerned), and the message names the tensor's elements.
  if (!st.ok() && st.code() != StatusCode::kInvalidArgument) {
    Finish(st);
    return;
  }
  ScatterBlocks(compact_, share_, union_, slice_.out, /*zero_others=*/slice_.in != slice_.out);
  if (!st.ok() && slice_.dtype == DataType::kFloat32) {
    for (size_t i = 0; i < union_.size(); ++i) {
      float first;
      std::memcpy(&first, compact_.data() + i * numel_ * 4, 4);
      if (!std::isnan(first)) continue;
      const size_t a = slice_.element_offset + share_.FirstElement(union_[i]);
      const size_t b = a + share_.Elements(union_[i]);
      st = InvalidArgumentError(
          "input contains inf or NaN: elements [" + std::to_string(a) + ", " + std::to_string(b) +
          ") (and possibly others) are not finite on at least one worker; the affected outputs "
          "are set to NaN");
      break;
    }
  }
  Finish(st);
}

void SparseSession::Finish(Status status) {
  phase_ = Phase::kNone;
  state_ = State::kDone;
  status_ = std::move(status);
  slice_.in = nullptr;  // the caller's again
  slice_.out = nullptr;
}

}  // namespace switchml::worker
