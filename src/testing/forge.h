// Test support for attacks on the data plane (docs/security.md): datagrams sent with any source
// address and port, the packets of a job's first round as a forger would build them, and a
// thread that sprays datagrams until told to stop.
//
// Thread-safety: a RawUdpSender is used by one thread; a Sprayer's send function runs on its own
// thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "base/endpoint.h"

namespace switchml::testing {

// Sends UDP datagrams with whatever source address and port the caller names, through a raw
// IPv4 socket. Needs root (CAP_NET_RAW): ok() is false without it.
class RawUdpSender {
 public:
  RawUdpSender();
  ~RawUdpSender();
  RawUdpSender(const RawUdpSender&) = delete;
  RawUdpSender& operator=(const RawUdpSender&) = delete;

  bool ok() const { return fd_ >= 0; }
  // False when the datagram was not sent whole.
  bool Send(Endpoint source, Endpoint destination, std::span<const uint8_t> payload);

 private:
  int fd_;
};

// A UDP port that was free on every address when the call returned (the kernel's pick), so
// that a test can register a worker there and aim forged packets at it; 0 on failure.
uint16_t FreeUdpPort();

// Packet q of a job's first all-reduce in the reference format, as a forger builds it: slot q,
// set 0, tsi q, job number 1, 256 int32 elements (k1024B) all equal to `value`. With the
// worker's window at least q + 1, it lands in the first round.
std::vector<uint8_t> FirstRoundPacket(uint32_t q, int32_t value);

// Calls `done` every 5 ms until it returns true (then true), or until `limit` has passed (then
// false): for a test that must wait for a state (a switch holding a worker's packets) rather
// than sleep for a time that a loaded machine or a sanitizer may not keep.
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit);

// Calls `send_once` every `period` on a thread of its own until Stop() (or destruction).
class Sprayer {
 public:
  Sprayer(std::function<void()> send_once, std::chrono::milliseconds period);
  ~Sprayer() { Stop(); }
  Sprayer(const Sprayer&) = delete;
  Sprayer& operator=(const Sprayer&) = delete;
  void Stop();

 private:
  std::atomic<bool> spraying_{true};
  std::thread thread_;
};

}  // namespace switchml::testing
