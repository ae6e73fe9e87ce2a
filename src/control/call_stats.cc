#include "control/call_stats.h"

#include <grpcpp/support/server_interceptor.h>

#include <cstring>

namespace switchml::control {

int CallStats::MethodIndex(const char* full_name) {
  // "/switchml_proto.Session/Close" -> "Session/Close".
  constexpr const char kPrefix[] = "/switchml_proto.";
  if (full_name != nullptr && std::strncmp(full_name, kPrefix, sizeof kPrefix - 1) == 0) {
    const char* name = full_name + sizeof kPrefix - 1;
    for (int m = 0; m < kNumMethods - 1; ++m) {
      if (std::strcmp(name, kMethods[m]) == 0) return m;
    }
  }
  return kNumMethods - 1;  // "other"
}

const char* CallStats::CodeName(int code) {
  static constexpr std::array<const char*, kNumCodes> kNames = {"OK",
                                                                "CANCELLED",
                                                                "UNKNOWN",
                                                                "INVALID_ARGUMENT",
                                                                "DEADLINE_EXCEEDED",
                                                                "NOT_FOUND",
                                                                "ALREADY_EXISTS",
                                                                "PERMISSION_DENIED",
                                                                "RESOURCE_EXHAUSTED",
                                                                "FAILED_PRECONDITION",
                                                                "ABORTED",
                                                                "OUT_OF_RANGE",
                                                                "UNIMPLEMENTED",
                                                                "INTERNAL",
                                                                "UNAVAILABLE",
                                                                "DATA_LOSS",
                                                                "UNAUTHENTICATED"};
  return code >= 0 && code < kNumCodes ? kNames[code] : "UNKNOWN";
}

void CallStats::Count(int method, int code) {
  if (method < 0 || method >= kNumMethods) method = kNumMethods - 1;
  if (code < 0 || code >= kNumCodes) code = 2;  // UNKNOWN
  counts_[method][code].fetch_add(1, std::memory_order_relaxed);
}

std::vector<CallStats::Entry> CallStats::Read() const {
  std::vector<Entry> out;
  for (int m = 0; m < kNumMethods; ++m) {
    for (int c = 0; c < kNumCodes; ++c) {
      const uint64_t n = counts_[m][c].load(std::memory_order_relaxed);
      if (n > 0) out.push_back({kMethods[m], CodeName(c), n});
    }
  }
  return out;
}

namespace {

class CountingInterceptor final : public grpc::experimental::Interceptor {
 public:
  CountingInterceptor(CallStats* stats, int method) : stats_(stats), method_(method) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      stats_->Count(method_, static_cast<int>(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  CallStats* const stats_;
  const int method_;
};

class CountingFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CountingFactory(CallStats* stats) : stats_(stats) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CountingInterceptor(stats_, CallStats::MethodIndex(info->method()));
  }

 private:
  CallStats* const stats_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeCallStatsInterceptor(
    CallStats* stats) {
  return std::make_unique<CountingFactory>(stats);
}

}  // namespace switchml::control
