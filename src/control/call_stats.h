// CallStats: the switch's control-plane calls counted by method and answer (gRPC status code),
// for `switchml status` and the Prometheus metric switchml_control_calls_total. Filled by a gRPC
// server interceptor (MakeInterceptorFactory) that sees every call's final status, refusals
// included, without touching the handlers.
//
// Thread-safety: Count and Read may run concurrently from any thread (relaxed atomics: a reader
// sees each counter's value at some moment, not one instant across all of them).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace grpc::experimental {
class ServerInterceptorFactoryInterface;
}

namespace switchml::control {

class CallStats {
 public:
  // The methods counted by name (the gRPC full names of switchml.proto's calls); any other
  // counts as "other".
  static constexpr std::array<const char*, 9> kMethods = {
      "Session/RdmaSession", "Session/UdpSession", "Session/Close",
      "Session/Attach",      "Session/Diagnose",   "Sync/Barrier",
      "Sync/Broadcast",      "Monitor/Status",     "other"};
  static constexpr int kNumMethods = static_cast<int>(kMethods.size());
  static constexpr int kNumCodes = 17;  // gRPC's codes, OK (0) to UNAUTHENTICATED (16)

  // The method's index in kMethods for a gRPC full name ("/switchml_proto.Session/Close").
  static int MethodIndex(const char* full_name);
  // "OK", "PERMISSION_DENIED", ... for code 0..16.
  static const char* CodeName(int code);

  void Count(int method, int code);

  struct Entry {
    std::string method;
    std::string code;
    uint64_t count = 0;
  };
  // Every (method, code) that counted at least one call.
  std::vector<Entry> Read() const;

 private:
  std::array<std::array<std::atomic<uint64_t>, kNumCodes>, kNumMethods> counts_{};
};

// The interceptor that counts every call's final status into `stats` (which must outlive the
// server it is installed in: ServerBuilder::experimental().SetInterceptorCreators).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeCallStatsInterceptor(
    CallStats* stats);

}  // namespace switchml::control
