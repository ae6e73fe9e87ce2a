// The SwitchML data-plane wire codec: the only code that touches header bytes.
//
// A datagram (UDP payload) is, bit for bit as the reference P4 program and client use it:
//
//   byte 0     msg_type (high 4 bits) | unused (1 bit) | size code (low 3 bits)
//   byte 1     job_number: low 8 bits of the all-reduce number, echoed by the switch
//   bytes 2-5  tsi, echoed by the switch. Our workers write the slot's running round number,
//              big-endian, which our switch compares to recognise late copies of earlier rounds;
//              the reference client writes its packet id within the slice, in host order, and
//              its switch never reads it (docs/protocol.md 2.2 and 3.4)
//   bytes 6-7  pool_index, big-endian: bit 15 = set, bit 14 unused (must be 0), bits 13..0 = slot
//   byte 8     e0 (int8), byte 9 e1 (int8): exponents, the switch returns the max over workers
//   bytes 10.. numel int32 values, big-endian
//
// Decoding validates every field and the exact length; the caller counts and drops what fails.
// All functions are pure and thread-compatible. See docs/protocol.md for the field-by-field spec.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace switchml::proto {

inline constexpr uint16_t kDefaultDataPort = 0xBEE0;  // 48864
inline constexpr uint16_t kDefaultControlPort = 50099;
inline constexpr size_t kHeaderBytes = 8;
inline constexpr size_t kExponentBytes = 2;
inline constexpr size_t kPrefixBytes = kHeaderBytes + kExponentBytes;  // 10
inline constexpr uint8_t kMsgTypeData = 1;
// The largest packet of any size code we support (our jumbo sizes, docs/protocol.md 2.6), and
// the largest of the reference's sizes. Buffers for one job's packets are sized by
// DatagramBytes(job's code), not by these: a 256-element job keeps 1034-byte buffers.
inline constexpr size_t kMaxNumel = 2048;
inline constexpr size_t kMaxDatagramBytes = kPrefixBytes + kMaxNumel * 4;  // 8202
inline constexpr size_t kReferenceMaxNumel = 256;
inline constexpr size_t kReferenceMaxDatagramBytes = kPrefixBytes + kReferenceMaxNumel * 4;  // 1034
inline constexpr uint32_t kMaxSlots = 1u << 14;  // slot index has 14 bits

// The 3-bit size code: payload 128 << code bytes. We support 1 (64 int32) and 3 (256 int32),
// the two the reference client and switch use, and, as our extension (docs/protocol.md 2.6),
// 4, 5 and 6 (512, 1024 and 2048 int32: "jumbo" packets, only between our workers and a switch
// of ours that accepted the job's size at registration). 0, 2 and 7 are not supported.
enum class SizeCode : uint8_t {
  k128B = 0,
  k256B = 1,
  k512B = 2,
  k1024B = 3,
  k2048B = 4,
  k4096B = 5,
  k8192B = 6,
};

constexpr size_t NumelOf(SizeCode code) { return (size_t{128} << static_cast<uint8_t>(code)) / 4; }
constexpr bool IsReferenceSize(SizeCode code) {
  return code == SizeCode::k256B || code == SizeCode::k1024B;
}
constexpr bool IsJumboSize(SizeCode code) {
  return code == SizeCode::k2048B || code == SizeCode::k4096B || code == SizeCode::k8192B;
}
constexpr bool IsSupportedSize(SizeCode code) { return IsReferenceSize(code) || IsJumboSize(code); }
// The size code for a packet of numel elements; false when numel is not 64, 256, 512, 1024 or
// 2048.
bool SizeCodeForNumel(size_t numel, SizeCode* out);
constexpr size_t DatagramBytes(SizeCode code) { return kPrefixBytes + NumelOf(code) * 4; }
// The datagram of numel elements per packet (any numel; for sizing and messages).
constexpr size_t DatagramBytesForNumel(size_t numel) { return kPrefixBytes + numel * 4; }
// A count of 256-element packets (a window, a slot pool) as the count of numel-element packets
// that carry the same bytes: unchanged up to 256 elements, fewer for jumbo ones, at least 1.
constexpr uint64_t SameBytesInPackets(uint64_t reference_packets, size_t numel) {
  if (numel <= kReferenceMaxNumel) return reference_packets;
  const uint64_t packets = reference_packets * kReferenceMaxNumel / numel;
  return packets > 0 ? packets : 1;
}

static_assert(NumelOf(SizeCode::k256B) == 64);
static_assert(NumelOf(SizeCode::k1024B) == 256);
static_assert(NumelOf(SizeCode::k8192B) == kMaxNumel);
static_assert(DatagramBytes(SizeCode::k1024B) == kReferenceMaxDatagramBytes);
static_assert(DatagramBytes(SizeCode::k8192B) == kMaxDatagramBytes);
// An 8 KiB payload's datagram with its IPv4 and UDP headers fits a 9000-byte MTU.
static_assert(kMaxDatagramBytes + 28 <= 9000);

// Which aggregation slot and which of its two copies (sets) a packet addresses.
struct SlotId {
  uint16_t index = 0;  // 0 .. kMaxSlots-1
  uint8_t set = 0;     // 0 or 1
  bool operator==(const SlotId&) const = default;
};

// The 16-bit pool_index field: set in bit 15, slot in bits 13..0.
constexpr uint16_t EncodePoolIndex(SlotId s) {
  return static_cast<uint16_t>((uint16_t{s.set} << 15) | (s.index & (kMaxSlots - 1)));
}

struct Header {
  uint8_t msg_type = kMsgTypeData;
  SizeCode size = SizeCode::k256B;
  uint8_t job_number = 0;
  uint32_t tsi = 0;
  SlotId slot;
  int8_t e0 = 0;
  int8_t e1 = 0;
  bool operator==(const Header&) const = default;
};

enum class DecodeError : uint8_t {
  kOk = 0,
  kTooShort,         // fewer than 10 bytes
  kBadMsgType,       // msg_type != 1
  kUnsupportedSize,  // size code 0, 2 or 7
  kLengthMismatch,   // datagram length != 10 + 4 * numel(size)
  kReservedBit,      // pool_index bit 14 or header byte 0 bit 3 set
};
inline constexpr int kNumDecodeErrors = 6;
const char* DecodeErrorName(DecodeError e);

// Validates the whole datagram (header fields and exact length) and decodes the header and
// exponents. The payload stays in wire order at bytes [kPrefixBytes, size).
DecodeError DecodeHeader(std::span<const uint8_t> datagram, Header* out);

// Writes header and exponents into out[0..kPrefixBytes). out must hold kPrefixBytes.
void EncodeHeader(const Header& h, std::span<uint8_t> out);

// Big-endian payload conversion. wire.size() must equal 4 * values.size(). SIMD kernels chosen at
// run time for the CPU; the results are those of the element-by-element definition.
void LoadPayload(std::span<const uint8_t> wire, std::span<int32_t> values);
void StorePayload(std::span<const int32_t> values, std::span<uint8_t> wire);
// sums[i] += the big-endian int32 wire element i, with 32-bit wrap-around (the switch's add).
// wire.size() must equal 4 * sums.size().
void AddPayload(std::span<const uint8_t> wire, std::span<int32_t> sums);
// The switch's contribution that completes a set, with the reply's payload in the same pass:
// AddPayloadAndStore is AddPayload, then out = the new sums in wire order; LoadPayloadAndCopy is
// LoadPayload, then out = wire's bytes. out.size() must equal wire.size(); out may be wire itself
// (a reply written over the datagram it answers; LoadPayloadAndCopy then writes nothing there)
// but must not otherwise overlap it (CHECKed).
void AddPayloadAndStore(std::span<const uint8_t> wire, std::span<int32_t> sums,
                        std::span<uint8_t> out);
void LoadPayloadAndCopy(std::span<const uint8_t> wire, std::span<int32_t> values,
                        std::span<uint8_t> out);

// A decoded packet with its payload in host order (the tests' and simulator's view).
struct Packet {
  Header header;
  std::array<int32_t, kMaxNumel> values{};
  size_t numel() const { return NumelOf(header.size); }
  std::span<int32_t> payload() { return {values.data(), numel()}; }
  std::span<const int32_t> payload() const { return {values.data(), numel()}; }
};

// DecodeHeader plus LoadPayload.
DecodeError Decode(std::span<const uint8_t> datagram, Packet* out);
// Encodes a whole datagram; out must hold DatagramBytes(p.header.size). Returns bytes written.
size_t Encode(const Packet& p, std::span<uint8_t> out);
// Encodes header and the given payload (values.size() must equal NumelOf(h.size)).
size_t Encode(const Header& h, std::span<const int32_t> values, std::span<uint8_t> out);

}  // namespace switchml::proto
