// Fuzzes the wire codec (proto/wire.h) and the quantizer's wire kernels (quant/quantizer.h), on
// every SIMD target Highway compiled that this CPU supports (each input runs once per target,
// hwy::SetSupportedTargetsForTest), so the scalar target and every vector width are compared.
//
// Codec: any bytes either fail DecodeHeader with one of its errors, or decode, and then
// re-encoding the header and payload gives the same bytes back (nothing is accepted that the
// codec would not write), Decode agrees with DecodeHeader, and the datagram has exactly the
// size code's length; the switch's payload kernels (AddPayload, AddPayloadAndStore in place)
// give the element-by-element wrapping sums. Quantizer: for blocks of floats taken from the
// input (any bit patterns: NaN, inf, denormals), AnalyzeBlock gives the smallest exponent e with
// 2^e > max finite |x| (clamped to [-126, 127]; kZeroBlockExponent for none) and flags inf/NaN;
// the SIMD kernels (QuantizeToWire, the data path's fused QuantizeToWireAndAnalyze,
// DequantizeFromWire) give bit for bit the scalar reference's results (Quantize, AnalyzeBlock,
// Dequantize), zeros after the data in a padded packet; and finite inputs quantize within the
// documented range |q| <= INT32_MAX / n.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "hwy/targets.h"
#include "proto/wire.h"
#include "quant/quantizer.h"

namespace {

using namespace switchml;

// The targets compiled in and supported here (the best first, scalar last).
const std::vector<int64_t>& Targets() {
  static const std::vector<int64_t> targets = [] {
    hwy::SetSupportedTargetsForTest(0);
    return hwy::SupportedAndGeneratedTargets();
  }();
  return targets;
}

void FuzzCodec(std::span<const uint8_t> d) {
  proto::Header h;
  const proto::DecodeError e = proto::DecodeHeader(d, &h);
  FUZZ_CHECK(static_cast<int>(e) < proto::kNumDecodeErrors);
  proto::Packet p;
  FUZZ_CHECK(proto::Decode(d, &p) == e);
  if (e != proto::DecodeError::kOk) return;
  FUZZ_CHECK(p.header == h);
  FUZZ_CHECK(proto::IsSupportedSize(h.size));
  FUZZ_CHECK(d.size() == proto::DatagramBytes(h.size));
  std::vector<uint8_t> again(proto::kMaxDatagramBytes);
  const size_t n = proto::Encode(p, again);
  FUZZ_CHECK(n == d.size());
  FUZZ_CHECK(std::memcmp(again.data(), d.data(), n) == 0);
  // The switch's adds: the payload added to itself (wrapping), then in place over a copy.
  const std::span<const uint8_t> wire = d.subspan(proto::kPrefixBytes);
  std::vector<int32_t> sums(p.payload().begin(), p.payload().end());
  proto::AddPayload(wire, sums);
  for (size_t i = 0; i < sums.size(); ++i) {
    FUZZ_CHECK(sums[i] == static_cast<int32_t>(2 * static_cast<uint32_t>(p.values[i])));
  }
  std::vector<uint8_t> reply(wire.begin(), wire.end());
  proto::AddPayloadAndStore(reply, sums, reply);
  for (size_t i = 0; i < sums.size(); ++i) {
    FUZZ_CHECK(sums[i] == static_cast<int32_t>(3 * static_cast<uint32_t>(p.values[i])));
    uint32_t be;
    std::memcpy(&be, &reply[4 * i], 4);
    FUZZ_CHECK(static_cast<int32_t>(__builtin_bswap32(be)) == sums[i]);
  }
}

std::vector<float> ConsumeBlock(FuzzedDataProvider& in) {
  const size_t count = in.ConsumeIntegralInRange<size_t>(0, proto::kMaxNumel);
  std::vector<float> block(count);
  for (float& f : block) {
    const uint32_t bits = in.ConsumeIntegral<uint32_t>();
    std::memcpy(&f, &bits, sizeof f);
  }
  return block;
}

// AnalyzeBlock's definition, in double arithmetic.
quant::BlockInfo ReferenceAnalyze(const std::vector<float>& block) {
  quant::BlockInfo info;
  double max = 0;
  for (float x : block) {
    if (std::isfinite(x)) {
      max = std::max(max, std::fabs(double{x}));
    } else {
      info.non_finite = true;
    }
  }
  if (max == 0) return info;
  int e = -126;  // denormals: 2^-126 > max
  while (e < quant::kMaxExponent && !(std::ldexp(1.0, e) > max)) ++e;
  info.exponent = static_cast<int8_t>(e);
  return info;
}

void FuzzQuantizer(FuzzedDataProvider& in) {
  const uint32_t n = in.ConsumeIntegralInRange<uint32_t>(1, 64);
  const int8_t extra = in.ConsumeIntegralInRange<int8_t>(0, 3);
  const std::vector<float> block = ConsumeBlock(in);
  const size_t count = block.size();
  const quant::BlockInfo info = ReferenceAnalyze(block);
  // The max over workers is at least this block's exponent (another worker's may be higher).
  int e = info.exponent;
  if (e != quant::kZeroBlockExponent) e = std::min<int>(quant::kMaxExponent, e + extra);
  const auto max_e = static_cast<int8_t>(e);
  // The scalar reference, in a packet padded to the largest size (zeros after the data).
  std::vector<int32_t> ref(proto::kMaxNumel);
  quant::Quantize(block, max_e, n, ref);
  for (size_t i = 0; i < count; ++i) {
    if (std::isfinite(block[i])) FUZZ_CHECK(std::abs(int64_t{ref[i]}) <= INT32_MAX / n);
  }
  // Arbitrary sums (from the input) to dequantize, and the next block for the fused kernel.
  std::vector<int32_t> sums(count);
  for (int32_t& s : sums) s = in.ConsumeIntegral<int32_t>();
  std::vector<float> want(count);
  quant::Dequantize(sums, max_e, n, want);
  const std::vector<float> next = ConsumeBlock(in);
  const quant::BlockInfo next_info = ReferenceAnalyze(next);

  // Payloads where a datagram has them: 10 bytes in, not 4-byte aligned.
  std::vector<uint8_t> datagram(proto::kMaxDatagramBytes), sums_datagram(proto::kMaxDatagramBytes);
  const std::span<uint8_t> wire(datagram.data() + proto::kPrefixBytes, 4 * proto::kMaxNumel);
  const std::span<uint8_t> sums_wire(sums_datagram.data() + proto::kPrefixBytes, 4 * count);
  std::vector<int32_t> loaded(proto::kMaxNumel);
  proto::StorePayload(sums, sums_wire);
  for (int64_t target : Targets()) {
    hwy::SetSupportedTargetsForTest(target);
    const quant::BlockInfo got = quant::AnalyzeBlock(block);
    FUZZ_CHECK(got.exponent == info.exponent && got.non_finite == info.non_finite);
    std::fill(wire.begin(), wire.end(), 0xee);
    quant::QuantizeToWire(block, max_e, n, wire);
    proto::LoadPayload(wire, loaded);
    FUZZ_CHECK(loaded == ref);
    std::fill(wire.begin(), wire.end(), 0xee);
    const quant::BlockInfo fused = quant::QuantizeToWireAndAnalyze(block, max_e, n, wire, next);
    proto::LoadPayload(wire, loaded);
    FUZZ_CHECK(loaded == ref);
    FUZZ_CHECK(fused.exponent == next_info.exponent && fused.non_finite == next_info.non_finite);
    std::vector<float> b(count);
    quant::DequantizeFromWire(sums_wire, max_e, n, b);
    FUZZ_CHECK(count == 0 || std::memcmp(want.data(), b.data(), 4 * count) == 0);
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Both on every input and every target: the codec sees the bytes as a datagram, the quantizer
  // as its choices.
  for (int64_t target : Targets()) {
    hwy::SetSupportedTargetsForTest(target);
    FuzzCodec(std::span<const uint8_t>(data, size));
  }
  hwy::SetSupportedTargetsForTest(0);
  FuzzedDataProvider in(data, size);
  FuzzQuantizer(in);
  return 0;
}
