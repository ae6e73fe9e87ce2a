#include "worker/session.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "base/status_macros.h"
#include "quant/quantizer.h"
#include "worker/striping.h"

namespace switchml::worker {
namespace {

// llround for the estimator's non-negative nanosecond values (far below 2^52), inline: the libm
// call was a measurable part of the per-result cost.
int64_t RoundNonNegative(double x) { return static_cast<int64_t>(x + 0.5); }

// Software prefetch of the slice's blocks (a hint: it changes no result). A large slice's input
// and output do not fit in the caches, and each packet touches only one block of each, between
// much other work, so the hardware's stream prefetchers leave most of a block's lines to be
// fetched when the kernel reads them (the exponent scan, the first to read a block, spent 80 %
// of its time waiting on its loads) or writes them (the dequantizer's stores wait for each
// line's read for ownership). Asking for the blocks the next packets will use hides that
// latency behind the current packet's work.
constexpr size_t kCacheLine = 64;
// How many blocks ahead to fetch: a packet's work takes a few hundred ns, about a memory
// latency, so two blocks (2 KiB of 1 KiB blocks) ahead arrive in time with margin.
constexpr uint64_t kPrefetchBlocks = 2;

template <bool kWrite>
void PrefetchBytes(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += kCacheLine) {
    __builtin_prefetch(c + i, kWrite ? 1 : 0, 3);
    // GCC 12 deleted the whole loop where this was inlined into the session (a loop of nothing
    // but prefetches counts as free of side effects there, so as dead); an empty volatile asm
    // keeps it and costs nothing.
    asm volatile("");
  }
}

}  // namespace

template <bool kWrite>
void WorkerSession::PrefetchBlock(const void* base, uint64_t block) const {
  if (block >= blocks_) return;
  const size_t first = block * numel_;
  const size_t n = std::min(numel_, slice_.count - first);
  PrefetchBytes<kWrite>(static_cast<const char*>(base) + 4 * first, 4 * n);
}

// Heap order for the timers: the earliest deadline on top.
bool WorkerSession::LaterDeadline(const Timer& a, const Timer& b) {
  return a.deadline > b.deadline;
}

Status SessionConfig::Validate() const {
  if (num_workers == 0) return InvalidArgumentError("num_workers must be at least 1");
  if (window == 0)
    return InvalidArgumentError("window (outstanding packets per thread) must be at least 1");
  if (uint64_t{slot_start} + window > proto::kMaxSlots) {
    return InvalidArgumentError("slots [" + std::to_string(slot_start) + ", " +
                                std::to_string(slot_start + window) + ") exceed the " +
                                std::to_string(proto::kMaxSlots) + " slot indices of the format");
  }
  if (!proto::IsSupportedSize(size)) {
    return InvalidArgumentError("packet size must be 64, 256, 512, 1024 or 2048 elements");
  }
  RETURN_IF_ERROR(retransmit.Validate());
  if (stripes == 0 || stripes > window) {
    return InvalidArgumentError("stripes must be in 1..window (a slot per switch host at least)");
  }
  return Status();
}

WorkerSession::WorkerSession(const SessionConfig& config)
    : config_(config), numel_(proto::NumelOf(config.size)) {
  Status st = config.Validate();
  CHECK(st.ok()) << st.ToString();
  slots_.resize(config.window);
  next_tsi_.resize(config.window);
  for (uint32_t l = 0; l < config.window; ++l) next_tsi_[l] = l;
  send_queue_.resize(config.window);
  timers_.reserve(std::max<size_t>(16, 4 * size_t{config.window}));
  timer_fifo_.resize(std::bit_ceil(std::max<size_t>(16, 4 * size_t{config.window})));
  scratch_.resize(numel_);
  blocks_done_.resize(config.window);
  first_order_.resize(config.stripes);
  stripe_of_slot_.resize(config.window);
  for (uint32_t l = 0; l < config.window; ++l) {
    stripe_of_slot_[l] = StripeOfSlot(l, config.window, config.stripes);
  }
  if (config.keep_last_inputs) last_inputs_.resize(size_t{config.window} * numel_ * 4);
  current_timeout_ = ClampRto(config.retransmit.timeout);
  next_threshold_ = config.retransmit.timeout_threshold;
  counters_.rto = current_timeout_;
}

bool WorkerSession::PacketExists(uint64_t q) const {
  if (slice_.dtype == DataType::kInt32) return q < blocks_;
  return q < blocks_ || (q >= config_.window && q < config_.window + blocks_);
}

uint32_t WorkerSession::LocalSlot(uint64_t q) const {
  return static_cast<uint32_t>((q + base_) % config_.window);
}

uint32_t WorkerSession::NextTsi(uint32_t local) {
  const uint32_t tsi = next_tsi_[local];
  next_tsi_[local] = tsi + config_.window;  // (mod 2^32)
  return tsi;
}

proto::SlotId WorkerSession::SlotOf(uint64_t q) const {
  const uint64_t i = (q + base_) % (2 * uint64_t{config_.window});
  return proto::SlotId{static_cast<uint16_t>(config_.slot_start + i % config_.window),
                       static_cast<uint8_t>(i >= config_.window ? 1 : 0)};
}

void WorkerSession::Enqueue(uint32_t local) {
  Slot& s = slots_[local];
  if (s.queued) return;
  CHECK(send_size_ < send_queue_.size());
  size_t tail = send_head_ + send_size_;  // (a wrap by compare: no division per packet)
  if (tail >= send_queue_.size()) tail -= send_queue_.size();
  send_queue_[tail] = local;
  ++send_size_;
  s.queued = true;
}

void WorkerSession::Start(const Slice& slice, Nanos now) {
  CHECK(state_ != State::kRunning) << "Start() while a slice is running";
  CHECK(slice.count == 0 || (slice.in != nullptr && slice.out != nullptr));
  CHECK(!slice.sparse) << "a block-sparse slice goes through a SparseSession";
  slice_ = slice;
  state_ = State::kRunning;
  status_ = Status();
  blocks_ = (slice.count + numel_ - 1) / numel_;
  const uint64_t w = config_.window;
  if (slice.dtype == DataType::kInt32) {
    total_packets_ = blocks_;
    span_ = blocks_;
  } else {
    total_packets_ = blocks_ + std::min<uint64_t>(blocks_, w);  // |[0,B) u [W,W+B)|
    // Ids [0, B) u [W, W + B). With B < W the span is 2W, so the slots of the unused ids
    // [B, W) and [W + B, 2W) skip two uses (an even number) and keep their set parity.
    span_ = blocks_ == 0 ? 0 : w + std::max<uint64_t>(blocks_, w);
  }
  CHECK(span_ < (uint64_t{1} << 32)) << "slice too large for 32-bit packet ids";
  completed_packets_ = 0;
  slice_base_ = base_;
  last_backoff_ = now;  // (the RTO and any back-off carry over from the previous slice)
  last_progress_ = now;
  first_non_finite_block_ = UINT64_MAX;
  send_head_ = send_size_ = 0;
  for (FirstOrder& f : first_order_) f.head = f.size = 0;
  ClearTimers();
  for (Slot& s : slots_) s = Slot{};
  for (uint64_t q = 0; q < w; ++q) {
    if (!PacketExists(q)) continue;
    const uint32_t local = LocalSlot(q);
    slots_[local].packet = static_cast<uint32_t>(q);
    slots_[local].id = SlotOf(q);
    slots_[local].tsi = NextTsi(local);
    slots_[local].outstanding = true;
    Enqueue(local);
  }
  if (total_packets_ == 0) Finish(Status());
}

SliceLayout WorkerSession::Layout() const {
  SliceLayout l;
  l.allreduce = slice_.allreduce;
  l.dtype = slice_.dtype;
  l.in = slice_.in;
  l.out = slice_.out;
  l.count = slice_.count;
  l.element_offset = slice_.element_offset;
  l.base = slice_base_;
  l.blocks = blocks_;
  return l;
}

void WorkerSession::KeepInput(uint32_t local, uint64_t block) {
  const size_t e = block * numel_, n = std::min(numel_, slice_.count - e);
  uint8_t* dst = last_inputs_.data() + size_t{local} * numel_ * 4;
  std::memcpy(dst, static_cast<const uint8_t*>(slice_.in) + 4 * e, 4 * n);
  std::memset(dst + 4 * n, 0, 4 * (numel_ - n));
}

void WorkerSession::OnBlockDone(uint32_t local, uint64_t block) {
  ++slots_[local].blocks_done;
  ++blocks_done_[local];
  // In place, the result overwrites the input; an out-of-place slice's is kept when it ends.
  if (config_.keep_last_inputs && slice_.in == slice_.out) KeepInput(local, block);
}

void WorkerSession::KeepFinishedSlice() {
  // (Only slices with blocks: an empty one finishes without the other workers, so counting it
  // would let workers drift more than a slice apart.)
  ++slices_finished_;
  previous_ = Layout();
  previous_->in = nullptr;  // the caller's again once the slice is reported
  previous_->out = nullptr;
  if (!config_.keep_last_inputs || slice_.in == slice_.out) return;
  // The last block of each slot used: the last W blocks, one per slot.
  const uint64_t w = config_.window;
  for (uint64_t b = blocks_ > w ? blocks_ - w : 0; b < blocks_; ++b) {
    KeepInput(static_cast<uint32_t>((slice_base_ + b) % w), b);
  }
}

LaneProgress WorkerSession::Progress() const {
  LaneProgress p;
  p.window = config_.window;
  p.numel = static_cast<uint32_t>(numel_);
  p.slices_finished = slices_finished_;
  p.blocks_done = blocks_done_;
  if (state_ == State::kRunning) {
    p.current = Layout();
    p.current_done.resize(config_.window);
    for (uint32_t l = 0; l < config_.window; ++l) p.current_done[l] = slots_[l].blocks_done;
    p.current_non_finite = first_non_finite_block_ != UINT64_MAX;
  }
  p.previous = previous_;
  p.last_inputs = last_inputs_;
  return p;
}

size_t WorkerSession::Encode(uint32_t q, const Slot& slot, std::span<uint8_t> buf) {
  const size_t bytes = proto::DatagramBytes(config_.size);
  CHECK(buf.size() >= bytes) << "transmit buffer of " << buf.size() << " bytes";
  proto::Header h;
  h.size = config_.size;
  h.job_number = static_cast<uint8_t>(slice_.allreduce);
  h.tsi = slot.tsi;
  h.slot = slot.id;
  // The payload is written straight into buf in wire order, by SIMD kernels that convert the byte
  // order in the same pass (no host-order copy).
  const std::span<uint8_t> payload = buf.subspan(proto::kPrefixBytes, 4 * numel_);
  if (slice_.dtype == DataType::kInt32) {
    const size_t first = size_t{q} * numel_;
    const size_t n = std::min(numel_, slice_.count - first);
    PrefetchBlock<false>(slice_.in, uint64_t{q} + kPrefetchBlocks);
    proto::StorePayload({static_cast<const int32_t*>(slice_.in) + first, n}, payload.first(4 * n));
    std::fill(payload.begin() + 4 * n, payload.end(), 0);  // the last block's padding
  } else {
    const float* in = static_cast<const float*>(slice_.in);
    h.e0 = quant::kZeroBlockExponent;  // carries no exponent: does not raise the max
    // The block whose exponent this packet carries (q < B) and the block whose data it carries
    // (q >= W, unless flagged non-finite): nearly every packet has both, quantized and scanned
    // by one kernel.
    std::span<const float> next, data;
    if (q < blocks_) {
      const size_t first = size_t{q} * numel_;
      next = {in + first, std::min(numel_, slice_.count - first)};
      PrefetchBlock<false>(in, uint64_t{q} + kPrefetchBlocks);
    }
    const bool has_data = q >= config_.window && !slot.data_non_finite;
    if (has_data) {
      const size_t first = size_t{q - config_.window} * numel_;
      data = {in + first, std::min(numel_, slice_.count - first)};
    }
    quant::BlockInfo info;
    // (The quantizers zero the padding after the last block's elements themselves.)
    if (has_data && q < blocks_) {
      info = quant::QuantizeToWireAndAnalyze(data, slot.data_exponent, config_.num_workers, payload,
                                             next);
    } else if (has_data) {
      quant::QuantizeToWire(data, slot.data_exponent, config_.num_workers, payload);
    } else {
      std::fill(payload.begin(), payload.end(), 0);  // exponents only, or a flagged block
      if (q < blocks_) info = quant::AnalyzeBlock(next);
    }
    if (q < blocks_) {
      h.e0 = info.exponent;
      h.e1 = info.non_finite ? 1 : 0;
    }
  }
  proto::EncodeHeader(h, buf);
  return bytes;
}

std::optional<uint32_t> WorkerSession::NextTransmitSlot() {
  // Entries of slots answered while queued are dropped here as PollTransmit would.
  while (state_ == State::kRunning && send_size_ > 0) {
    const uint32_t local = send_queue_[send_head_];
    if (slots_[local].outstanding) return local;
    slots_[local].queued = false;
    if (++send_head_ == send_queue_.size()) send_head_ = 0;
    --send_size_;
  }
  return std::nullopt;
}

size_t WorkerSession::PollTransmit(Nanos now, std::span<uint8_t> buf) {
  while (state_ == State::kRunning && send_size_ > 0) {
    const uint32_t local = send_queue_[send_head_];
    if (++send_head_ == send_queue_.size()) send_head_ = 0;
    --send_size_;
    Slot& s = slots_[local];
    s.queued = false;
    if (!s.outstanding) continue;  // answered while queued
    const uint32_t q = s.packet;   // the slot's current packet (a queued re-send may be outdated)
    if (s.transmissions++ == 0) {
      ++counters_.sent;
      s.first_sent = now;
      s.first_seq = next_send_seq_++;
      if (config_.retransmit.early_retransmit_after > 0) {
        FirstOrder& f = first_order_[stripe_of_slot_[local]];
        if (f.size == f.ring.size()) {  // grow the ring (rarely: it holds ~W)
          std::vector<uint32_t> bigger(std::max<size_t>(64, 2 * f.ring.size()));
          for (size_t i = 0; i < f.size; ++i) bigger[i] = f.ring[(f.head + i) % f.ring.size()];
          f.ring = std::move(bigger);
          f.head = 0;
        }
        f.ring[(f.head + f.size) % f.ring.size()] = q;
        ++f.size;
      }
    } else {
      ++counters_.retransmitted;
    }
    // One timer per packet: an early re-send leaves the one already armed (a second would
    // time the packet out twice per RTO, re-sending it twice and counting two timeouts).
    if (!s.timer_armed) {
      ArmTimer(Timer{now + current_timeout_, q, local});
      s.timer_armed = true;
    }
    return Encode(q, s, buf);
  }
  return 0;
}

void WorkerSession::HandleDatagram(std::span<const uint8_t> datagram, Nanos now) {
  proto::Header h;
  if (proto::DecodeHeader(datagram, &h) != proto::DecodeError::kOk || h.size != config_.size) {
    ++counters_.malformed;
    return;
  }
  if (state_ != State::kRunning || h.job_number != static_cast<uint8_t>(slice_.allreduce)) {
    ++counters_.stale;
    return;
  }
  if (h.slot.index < config_.slot_start || h.slot.index >= config_.slot_start + config_.window) {
    ++counters_.foreign_slot;
    return;
  }
  const uint32_t local = h.slot.index - config_.slot_start;
  Slot& s = slots_[local];
  // A result for a packet this worker has not sent yet (still queued) cannot be the switch's:
  // the switch needs this worker's contribution to complete the round. Taking it would leave
  // the packet unsent and the round at the switch incomplete for every other worker.
  if (!s.outstanding || s.transmissions == 0 || s.tsi != h.tsi || !(s.id == h.slot)) {
    ++counters_.duplicates;
    return;
  }
  last_progress_ = now;
  OnResult(s, now);
  if (config_.retransmit.early_retransmit_after > 0)
    CountLaterResult(s.first_seq, stripe_of_slot_[local]);
  Complete(local, h, datagram.subspan(proto::kPrefixBytes));
}

void WorkerSession::Complete(uint32_t local, const proto::Header& h,
                             std::span<const uint8_t> payload) {
  Slot& s = slots_[local];
  const uint32_t q = s.packet;
  const uint64_t w = config_.window;
  ++counters_.results;
  // The payload is read straight from the datagram's wire bytes (no host-order copy).
  if (slice_.dtype == DataType::kInt32) {
    const size_t first = size_t{q} * numel_;
    const size_t n = std::min(numel_, slice_.count - first);
    PrefetchBlock<true>(slice_.out, uint64_t{q} + kPrefetchBlocks);
    OnBlockDone(local, q);
    proto::LoadPayload(payload.first(4 * n), {static_cast<int32_t*>(slice_.out) + first, n});
  } else {
    float* out = static_cast<float*>(slice_.out);
    if (q >= w) {
      const uint64_t block = q - w;
      const size_t first = block * numel_;
      const size_t n = std::min(numel_, slice_.count - first);
      PrefetchBlock<true>(out, block + kPrefetchBlocks);
      OnBlockDone(local, block);
      if (s.data_non_finite) {
        std::fill(out + first, out + first + n, std::numeric_limits<float>::quiet_NaN());
        first_non_finite_block_ = std::min(first_non_finite_block_, block);
      } else {
        quant::DequantizeFromWire(payload, s.data_exponent, config_.num_workers, {out + first, n});
      }
    }
    if (q < blocks_) {  // the reply carries the max exponent for block q's data, sent next
      s.data_exponent = h.e0;
      s.data_non_finite = h.e1 != 0;
    }
  }
  s.outstanding = false;
  s.transmissions = 0;
  s.later_results = 0;
  s.early = false;
  s.timer_armed = false;  // (its timer is trimmed below, or skipped when it comes due)
  ++completed_packets_;
  const uint64_t next = uint64_t{q} + w;
  if (PacketExists(next)) {
    s.packet = static_cast<uint32_t>(next);
    s.id.set ^= 1;  // SlotOf(next): the same index, the other set
    s.tsi = NextTsi(local);
    s.outstanding = true;
    Enqueue(local);
  }
  TrimAnsweredTimers();
  if (completed_packets_ == total_packets_) {
    KeepFinishedSlice();
    if (first_non_finite_block_ != UINT64_MAX) {
      const size_t first = first_non_finite_block_ * numel_;
      const size_t a = slice_.element_offset + first;
      const size_t b = a + std::min(numel_, slice_.count - first);
      Finish(InvalidArgumentError(
          "input contains inf or NaN: elements [" + std::to_string(a) + ", " + std::to_string(b) +
          ") (and possibly later ones) are not finite on at least one worker; the affected "
          "outputs are set to NaN"));
    } else {
      Finish(Status());
    }
  }
}

void WorkerSession::HandleTimeout(Nanos now) {
  if (state_ != State::kRunning) return;
  if (now - last_progress_ >= config_.retransmit.peer_timeout) {
    // Name one packet still missing, to help whoever debugs the hang.
    std::string which;
    for (uint32_t l = 0; l < slots_.size(); ++l) {
      if (slots_[l].outstanding) {
        which = " (e.g. slot " + std::to_string(config_.slot_start + l) + ", packet " +
                std::to_string(slots_[l].packet) + ", sent " +
                std::to_string(slots_[l].transmissions) + " times)";
        break;
      }
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_progress_);
    Finish(DeadlineExceededError("no result from the switch for " + std::to_string(ms.count()) +
                                 " ms with " + std::to_string(remaining()) +
                                 " packets outstanding" + which +
                                 ": a peer worker stopped, or the switch is down or unreachable"));
    return;
  }
  while (HaveTimers() && EarliestDeadline() <= now) {
    const Timer t = PopEarliestTimer();
    if (!TimerLive(t)) continue;  // answered in time
    Slot& s = slots_[t.local_slot];
    s.timer_armed = false;  // the re-send arms the next one
    Enqueue(t.local_slot);
    OnTimeout(now);
  }
}

Nanos WorkerSession::ClampRto(Nanos rto) const {
  const Nanos ceiling = std::min(config_.retransmit.max_timeout, config_.retransmit.peer_timeout);
  return std::min(std::max(rto, config_.retransmit.min_timeout), ceiling);
}

void WorkerSession::OnResult(const Slot& s, Nanos now) {
  // A result that comes after the result of a packet sent later was held up on its own slot:
  // usually a peer lost its packet and the round waited for that peer's retransmission. Such a
  // time measures the peer's RTO, not the path; taking it would raise every RTO in the job,
  // which would lengthen the next such wait: a feedback loop that ends at the ceiling.
  const bool in_order = s.first_sent >= newest_answered_;
  newest_answered_ = std::max(newest_answered_, s.first_sent);
  if (s.transmissions != 1) return;  // Karn's rule: which transmission was answered is unknown
  if (!in_order) {
    ++counters_.rtt_out_of_order;
    return;
  }
  const double r = static_cast<double>(std::max(now - s.first_sent, Nanos{0}).count());
  if (!have_rtt_) {  // RFC 6298, 2.2
    srtt_ns_ = r;
    rttvar_ns_ = r / 2;
    have_rtt_ = true;
  } else {  // 2.3: RTTVAR first, from the old SRTT
    // A window yields W correlated samples per round trip, where TCP's formula expects about
    // one: RTTVAR would fade within a fraction of a round trip. So a sample raises RTTVAR at
    // once, but RTTVAR falls only once per W samples, toward the largest deviation among them
    // (as Linux's mdev_max). With W = 1 this is RFC 6298's formula exactly.
    const double deviation = std::fabs(srtt_ns_ - r);
    if (deviation > rttvar_ns_) rttvar_ns_ = 0.75 * rttvar_ns_ + 0.25 * deviation;
    round_max_deviation_ns_ = std::max(round_max_deviation_ns_, deviation);
    if (++round_samples_ >= config_.window) {
      if (round_max_deviation_ns_ < rttvar_ns_) {
        rttvar_ns_ = 0.75 * rttvar_ns_ + 0.25 * round_max_deviation_ns_;
      }
      round_max_deviation_ns_ = 0;
      round_samples_ = 0;
    }
    srtt_ns_ = 0.875 * srtt_ns_ + 0.125 * r;
  }
  const double spread =
      std::max(static_cast<double>(config_.retransmit.clock_granularity.count()), 4 * rttvar_ns_);
  // A fresh sample ends any back-off: the RTO it gives is at least the sample itself
  // (docs/architecture.md, 4.3), so the round trip just seen is covered.
  current_timeout_ = ClampRto(Nanos{RoundNonNegative(srtt_ns_ + spread)});
  timeouts_since_sample_ = 0;
  next_threshold_ = config_.retransmit.timeout_threshold;
  ++counters_.rtt_samples;
  counters_.srtt = Nanos{RoundNonNegative(srtt_ns_)};
  counters_.rttvar = Nanos{RoundNonNegative(rttvar_ns_)};
  counters_.rto = current_timeout_;
}

void WorkerSession::OnTimeout(Nanos now) {
  ++counters_.timeouts;
  // Back off while no fresh sample comes back: after `timeout_threshold` timeouts (a whole
  // window at most) the RTO doubles, once per RTO period at most, and the threshold grows.
  const uint64_t threshold = std::min<uint64_t>(next_threshold_, config_.window);
  if (++timeouts_since_sample_ >= threshold && now - last_backoff_ >= current_timeout_) {
    current_timeout_ = ClampRto(current_timeout_ * 2);
    next_threshold_ += config_.retransmit.timeout_threshold_increment;
    last_backoff_ = now;
    ++counters_.backoffs;
    counters_.rto = current_timeout_;
  }
}

void WorkerSession::CountLaterResult(uint64_t seq, uint32_t stripe) {
  FirstOrder& f = first_order_[stripe];
  const size_t cap = f.ring.size();
  // Entries are still waiting when their slot's outstanding packet is theirs and was sent once.
  auto waiting = [&](uint32_t q, Slot** slot) {
    Slot& e = slots_[LocalSlot(q)];
    *slot = &e;
    return e.outstanding && e.packet == q && !e.early && e.transmissions == 1;
  };
  Slot* e = nullptr;
  while (f.size > 0 && !waiting(f.ring[f.head], &e)) {
    f.head = (f.head + 1) % cap;
    --f.size;
  }
  // Walk the packets first sent before `seq`. The walk is short: past the front it meets only
  // held-up packets (each counted at most early_retransmit_after times before it leaves) and
  // answered ones between them.
  for (size_t i = 0; i < f.size; ++i) {
    const uint32_t q = f.ring[(f.head + i) % cap];
    if (!waiting(q, &e)) continue;
    if (e->first_seq >= seq) break;
    if (++e->later_results >= config_.retransmit.early_retransmit_after) {
      e->early = true;
      ++counters_.early_retransmits;
      Enqueue(LocalSlot(q));
    }
  }
}

std::optional<Nanos> WorkerSession::PollTimeout() const {
  if (state_ != State::kRunning) return std::nullopt;
  Nanos t = last_progress_ + config_.retransmit.peer_timeout;
  if (HaveTimers()) t = std::min(t, EarliestDeadline());
  return t;
}

void WorkerSession::ArmTimer(const Timer& t) {
  if (timer_fifo_size_ > 0) {
    const size_t last = (timer_fifo_head_ + timer_fifo_size_ - 1) & (timer_fifo_.size() - 1);
    if (t.deadline < timer_fifo_[last].deadline) {  // out of order: the RTO fell
      timers_.push_back(t);
      std::push_heap(timers_.begin(), timers_.end(), LaterDeadline);
      return;
    }
  }
  if (timer_fifo_size_ == timer_fifo_.size()) {  // grow (rarely: it holds ~RTO x rate); size 2^k
    std::vector<Timer> bigger(2 * timer_fifo_.size());
    for (size_t i = 0; i < timer_fifo_size_; ++i) {
      bigger[i] = timer_fifo_[(timer_fifo_head_ + i) & (timer_fifo_.size() - 1)];
    }
    timer_fifo_ = std::move(bigger);
    timer_fifo_head_ = 0;
  }
  timer_fifo_[(timer_fifo_head_ + timer_fifo_size_) & (timer_fifo_.size() - 1)] = t;
  ++timer_fifo_size_;
}

bool WorkerSession::TimerLive(const Timer& t) const {
  const Slot& s = slots_[t.local_slot];
  return s.outstanding && s.packet == t.packet;
}

void WorkerSession::TrimAnsweredTimers() {
  while (timer_fifo_size_ > 0 && !TimerLive(timer_fifo_[timer_fifo_head_])) {
    timer_fifo_head_ = (timer_fifo_head_ + 1) & (timer_fifo_.size() - 1);
    --timer_fifo_size_;
  }
}

Nanos WorkerSession::EarliestDeadline() const {
  if (timer_fifo_size_ == 0) return timers_.front().deadline;
  const Nanos fifo = timer_fifo_[timer_fifo_head_].deadline;
  return timers_.empty() ? fifo : std::min(fifo, timers_.front().deadline);
}

WorkerSession::Timer WorkerSession::PopEarliestTimer() {
  if (timer_fifo_size_ > 0 &&
      (timers_.empty() || timer_fifo_[timer_fifo_head_].deadline <= timers_.front().deadline)) {
    const Timer t = timer_fifo_[timer_fifo_head_];
    timer_fifo_head_ = (timer_fifo_head_ + 1) & (timer_fifo_.size() - 1);
    --timer_fifo_size_;
    return t;
  }
  std::pop_heap(timers_.begin(), timers_.end(), LaterDeadline);
  const Timer t = timers_.back();
  timers_.pop_back();
  return t;
}

void WorkerSession::ClearTimers() {
  timers_.clear();
  timer_fifo_head_ = timer_fifo_size_ = 0;
}

void WorkerSession::Abort(Status status) {
  if (state_ == State::kRunning) Finish(std::move(status));
}

void WorkerSession::Finish(Status status) {
  state_ = State::kDone;
  status_ = std::move(status);
  slice_.in = nullptr;  // the caller may reuse the buffers now
  slice_.out = nullptr;
  base_ += span_;
  send_head_ = send_size_ = 0;
  for (FirstOrder& f : first_order_) f.head = f.size = 0;
  ClearTimers();
}

}  // namespace switchml::worker
