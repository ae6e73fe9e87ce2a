// Block floating point quantization with exponent exchange (reference notes, section 5).
//
// For each block (one packet's elements) a worker computes an exponent e with 2^e > max|x|;
// the switch returns E = max over workers; every worker then sends round(x * f) with
// f = INT32_MAX / (n * 2^E), so the sum of n workers cannot overflow, and the result is sum / f.
//
// Beyond the reference (whose weak spots these are):
// - an all-zero block has exponent kZeroBlockExponent (-128) and scale 0: it sends and yields
//   zeros instead of dividing by zero;
// - denormals get e = -126, which bounds them;
// - |x| >= 2^126 clamps to e = 127, which the scale treats as 2^128 (no int8 wrap-around);
// - inf/NaN are reported by AnalyzeBlock (non_finite) and quantize to 0; the caller decides.
// Pure functions on spans. Quantize and Dequantize work in host order and are the scalar
// reference; the data path uses QuantizeToWire and DequantizeFromWire, which read and write the
// packet payload's big-endian int32 directly (the byte order conversion fused into the pass; the
// payload's layout is the codec's, proto/wire.h). AnalyzeBlock and the *Wire* functions are SIMD
// kernels chosen at run time for the CPU, with exactly the reference's results on every target.
#pragma once

#include <cstdint>
#include <span>

namespace switchml::quant {

inline constexpr int8_t kZeroBlockExponent = -128;
inline constexpr int8_t kMaxExponent = 127;

struct BlockInfo {
  int8_t exponent = kZeroBlockExponent;  // over the finite elements
  bool non_finite = false;               // some element is inf or NaN
};

BlockInfo AnalyzeBlock(std::span<const float> block);

// f for a block whose max exponent (over workers) is e, with n workers; 0 for a zero block.
double Scale(int8_t max_exponent, uint32_t num_workers);

// out[i] = round(in[i] * f) for i < in.size() (non-finite inputs give 0), zeros after.
// Requires in.size() <= out.size(). |out[i]| <= INT32_MAX / n for every finite in[i] whose
// exponent is at most max_exponent.
void Quantize(std::span<const float> in, int8_t max_exponent, uint32_t num_workers,
              std::span<int32_t> out);

// out[i] = in[i] / f for i < out.size(); zeros for a zero block. Requires out.size() <= in.size().
void Dequantize(std::span<const int32_t> in, int8_t max_exponent, uint32_t num_workers,
                std::span<float> out);

// Quantize writing big-endian int32 to wire (4 bytes per element; zeros after 4 * in.size()).
// Requires wire.size() to be a multiple of 4 and at least 4 * in.size().
void QuantizeToWire(std::span<const float> in, int8_t max_exponent, uint32_t num_workers,
                    std::span<uint8_t> wire);

// QuantizeToWire(in, max_exponent, num_workers, wire) and AnalyzeBlock(next) in one pass, with
// exactly their results: a worker's packet carries the data of one block and the exponent of a
// later one (the reference's exponents one window ahead), and one kernel for both costs less.
BlockInfo QuantizeToWireAndAnalyze(std::span<const float> in, int8_t max_exponent,
                                   uint32_t num_workers, std::span<uint8_t> wire,
                                   std::span<const float> next);

// Dequantize reading big-endian int32 from wire. Requires 4 * out.size() <= wire.size().
void DequantizeFromWire(std::span<const uint8_t> wire, int8_t max_exponent, uint32_t num_workers,
                        std::span<float> out);

}  // namespace switchml::quant
