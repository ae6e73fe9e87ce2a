// Fuzzes the worker session (worker::WorkerSession) with arbitrary replies.
//
// A session of a chosen configuration runs slices (int32 or float32, chosen lengths, output
// buffers of exactly the slice's size so that any write past them is caught) while the fuzzer
// feeds it datagrams: raw bytes, and results with chosen header fields aimed at the slots, sets,
// tsi and job number it waits for; it also moves the clock, calls HandleTimeout, polls
// transmissions and aborts. Alternatively (first byte) an honest switch answers the session's
// own packets (each result the sum of num_workers copies of the packet) while the fuzzer drops,
// duplicates, delays and reorders them: then an int32 slice must end OK with exactly that sum.
// Checks: no crash or sanitizer report; every transmitted datagram decodes with the session's
// size and addresses one of its slots; remaining() never grows; a slice that is done stays done
// until the next Start; counters only grow.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <vector>

#include "fuzz_check.h"
#include "proto/wire.h"
#include "worker/session.h"

namespace switchml::worker {
namespace {

void CheckMonotonic(const SessionCounters& before, const SessionCounters& after) {
  FUZZ_CHECK(after.sent >= before.sent);
  FUZZ_CHECK(after.retransmitted >= before.retransmitted);
  FUZZ_CHECK(after.results >= before.results);
  FUZZ_CHECK(after.duplicates >= before.duplicates);
  FUZZ_CHECK(after.stale >= before.stale);
  FUZZ_CHECK(after.malformed >= before.malformed);
  FUZZ_CHECK(after.foreign_slot >= before.foreign_slot);
}

struct Harness {
  SessionConfig config;
  WorkerSession* session = nullptr;
  Nanos now{1'000'000'000};
  uint64_t allreduce = 0;
  DataType dtype = DataType::kInt32;
  size_t count = 0;
  std::vector<int32_t> in_i, out_i;
  std::vector<float> in_f, out_f;
  std::vector<uint8_t> tx = std::vector<uint8_t>(proto::kMaxDatagramBytes);
  // The session's transmissions, as an honest switch would see them.
  std::deque<std::vector<uint8_t>> sent;

  void Start(FuzzedDataProvider& in, bool honest) {
    ++allreduce;
    dtype = (!honest && in.ConsumeBool()) ? DataType::kFloat32 : DataType::kInt32;
    const size_t numel = proto::NumelOf(config.size);
    count = in.ConsumeIntegralInRange<size_t>(0, numel * (config.window * 3 + 1) + 3);
    const uint32_t seed = in.ConsumeIntegral<uint32_t>();
    in_i.assign(count, 0);
    out_i.assign(count, 0);
    in_f.assign(count, 0);
    out_f.assign(count, 0);
    for (size_t i = 0; i < count; ++i) {
      in_i[i] = static_cast<int32_t>(FuzzMix(seed + i));
      const uint32_t m = FuzzMix(seed * 31 + i);
      // Mostly ordinary floats, some zeros, huge values, denormals, inf and NaN.
      switch (m % 16) {
        case 0:
          in_f[i] = 0;
          break;
        case 1:
          in_f[i] = 3e38f;
          break;
        case 2:
          in_f[i] = 1e-40f;
          break;
        case 3:
          in_f[i] = (m & 0x100) ? INFINITY : NAN;
          break;
        default:
          in_f[i] = static_cast<float>(static_cast<int32_t>(m)) / 65536.0f;
      }
    }
    Slice slice;
    slice.allreduce = allreduce;
    slice.dtype = dtype;
    slice.in = dtype == DataType::kInt32 ? static_cast<const void*>(in_i.data()) : in_f.data();
    slice.out = dtype == DataType::kInt32 ? static_cast<void*>(out_i.data()) : out_f.data();
    slice.count = count;
    sent.clear();
    session->Start(slice, now);
  }

  void Transmit(size_t max) {
    for (size_t i = 0; i < max; ++i) {
      const size_t len = session->PollTransmit(now, tx);
      if (len == 0) break;
      proto::Header h;
      FUZZ_CHECK(len == proto::DatagramBytes(config.size));
      FUZZ_CHECK(proto::DecodeHeader(std::span<const uint8_t>(tx.data(), len), &h) ==
                 proto::DecodeError::kOk);
      FUZZ_CHECK(h.size == config.size);
      FUZZ_CHECK(h.slot.index >= config.slot_start &&
                 h.slot.index < config.slot_start + config.window);
      FUZZ_CHECK(h.job_number == static_cast<uint8_t>(allreduce));
      sent.emplace_back(tx.begin(), tx.begin() + static_cast<long>(len));
    }
  }

  // The honest switch's result for one of the session's packets: every worker sent the same.
  std::vector<uint8_t> Answer(const std::vector<uint8_t>& packet) const {
    std::vector<uint8_t> reply = packet;
    const size_t numel = proto::NumelOf(config.size);
    std::vector<int32_t> v(numel);
    proto::LoadPayload(std::span<const uint8_t>(packet).subspan(proto::kPrefixBytes), v);
    for (int32_t& x : v) {
      x = static_cast<int32_t>(static_cast<uint32_t>(x) * config.num_workers);
    }
    proto::StorePayload(v, std::span<uint8_t>(reply).subspan(proto::kPrefixBytes));
    return reply;
  }
};

}  // namespace
}  // namespace switchml::worker

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchml;
  using namespace switchml::worker;
  FuzzedDataProvider in(data, size);
  const bool honest = in.ConsumeBool();
  Harness h;
  h.config.num_workers = in.ConsumeIntegralInRange<uint32_t>(1, 64);
  h.config.window = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  h.config.slot_start = in.ConsumeIntegralInRange<uint32_t>(0, 16);
  h.config.size = in.ConsumeBool() ? proto::SizeCode::k256B : proto::SizeCode::k1024B;
  h.config.retransmit.timeout_threshold = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  if (!h.config.Validate().ok()) return 0;
  WorkerSession session(h.config);
  h.session = &session;
  h.Start(in, honest);
  std::vector<uint8_t> d(proto::kMaxDatagramBytes + 4);
  std::vector<int32_t> values(proto::kMaxNumel);
  size_t remaining = session.remaining();
  SessionCounters last = session.counters();
  int slices = 1;
  while (in.remaining_bytes() > 0) {
    const bool running = session.state() == WorkerSession::State::kRunning;
    const uint8_t op = in.ConsumeIntegral<uint8_t>();
    switch (op % 8) {
      case 0:
        h.Transmit(in.ConsumeIntegralInRange<size_t>(1, 16));
        break;
      case 1:  // time passes; timeouts fire
        h.now += std::chrono::microseconds(in.ConsumeIntegralInRange<uint32_t>(0, 2'000'000));
        if (auto t = session.PollTimeout(); t && *t <= h.now) session.HandleTimeout(h.now);
        break;
      case 2:
      case 3:
        if (honest) {  // the switch answers one of the packets (maybe again later: a duplicate)
          if (h.sent.empty()) break;
          const size_t i = in.ConsumeIntegralInRange<size_t>(0, h.sent.size() - 1);
          const std::vector<uint8_t> reply = h.Answer(h.sent[i]);
          if (in.ConsumeBool()) h.sent.erase(h.sent.begin() + static_cast<long>(i));
          session.HandleDatagram(reply, h.now);
        } else {  // a result with chosen fields, near what the session waits for
          proto::Header hd;
          hd.size =
              in.ConsumeIntegralInRange<int>(0, 7) == 0 ? proto::SizeCode::k256B : h.config.size;
          hd.job_number = static_cast<uint8_t>(h.allreduce + in.ConsumeIntegralInRange<int>(-1, 1));
          hd.tsi = in.ConsumeIntegralInRange<uint32_t>(0, 64);
          hd.slot.index = static_cast<uint16_t>(in.ConsumeIntegralInRange<uint32_t>(0, 32));
          hd.slot.set = in.ConsumeBool();
          hd.e0 = in.ConsumeIntegral<int8_t>();
          hd.e1 = in.ConsumeIntegralInRange<int8_t>(-1, 2);
          const uint32_t seed = in.ConsumeIntegral<uint32_t>();
          const size_t numel = proto::NumelOf(hd.size);
          for (size_t i = 0; i < numel; ++i) values[i] = static_cast<int32_t>(FuzzMix(seed ^ i));
          const size_t n = proto::Encode(hd, std::span<const int32_t>(values.data(), numel), d);
          session.HandleDatagram(std::span<const uint8_t>(d.data(), n), h.now);
        }
        break;
      case 4:
        if (honest) {  // the network loses one of the session's packets
          if (h.sent.empty()) break;
          h.sent.erase(h.sent.begin() +
                       static_cast<long>(in.ConsumeIntegralInRange<size_t>(0, h.sent.size() - 1)));
        } else {  // raw bytes
          const std::vector<uint8_t> raw =
              in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, d.size()));
          session.HandleDatagram(raw, h.now);
        }
        break;
      case 5:
        if (!honest && in.ConsumeIntegralInRange<int>(0, 15) == 0 && running) {
          session.Abort(CancelledError("fuzz"));
        }
        break;
      default:
        break;
    }
    const SessionCounters c = session.counters();
    CheckMonotonic(last, c);
    last = c;
    if (running && session.state() == WorkerSession::State::kRunning) {
      FUZZ_CHECK(session.remaining() <= remaining);
    }
    remaining = session.remaining();
    if (session.state() == WorkerSession::State::kDone) {
      FUZZ_CHECK(!session.PollTimeout().has_value());
      if (honest) {
        // An honest switch's results: the slice ends OK with the exact sum (int32), or with a
        // timeout when the fuzzer let no result through for the progress timeout.
        if (session.status().ok()) {
          FUZZ_CHECK(session.remaining() == 0);
          for (size_t i = 0; i < h.count; ++i) {
            FUZZ_CHECK(h.out_i[i] == static_cast<int32_t>(static_cast<uint32_t>(h.in_i[i]) *
                                                          h.config.num_workers));
          }
        } else {
          FUZZ_CHECK(session.status().code() == StatusCode::kDeadlineExceeded);
        }
      }
      if (slices < 8) {
        ++slices;
        h.Start(in, honest);
        remaining = session.remaining();
      }
    }
  }
  return 0;
}
