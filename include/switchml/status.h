// Status and Result<T>: errors as values at every boundary of the library.
//
// A Status is a code plus a message that says what went wrong and what to do about it. The data
// path never returns Status per packet: it counts and drops (see docs/architecture.md, "Errors").
// Thread-safety: plain values, safe to copy between threads.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "switchml/export.h"

namespace switchml {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller passed something wrong; the message says what
  kFailedPrecondition,  // the system is not in a state that allows the call
  kDeadlineExceeded,    // a peer or the switch did not answer in time
  kUnavailable,         // the switch or a peer cannot be reached
  kAlreadyExists,
  kNotFound,
  kResourceExhausted,
  kUnimplemented,
  kInternal,
  kCancelled,
  kPermissionDenied,  // the caller may not do this (e.g. a job's secret is missing or wrong)
};

SWITCHML_EXPORT const char* StatusCodeName(StatusCode code);

class [[nodiscard]] SWITCHML_EXPORT Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DEADLINE_EXCEEDED: no result for 2 s ..." or "OK".
  std::string ToString() const;
  // Marks an ignored status as deliberately ignored.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgumentError(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status FailedPreconditionError(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status DeadlineExceededError(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
inline Status UnavailableError(std::string m) {
  return Status(StatusCode::kUnavailable, std::move(m));
}
inline Status AlreadyExistsError(std::string m) {
  return Status(StatusCode::kAlreadyExists, std::move(m));
}
inline Status NotFoundError(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status ResourceExhaustedError(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status UnimplementedError(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}
inline Status InternalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status CancelledError(std::string m) { return Status(StatusCode::kCancelled, std::move(m)); }
inline Status PermissionDeniedError(std::string m) {
  return Status(StatusCode::kPermissionDenied, std::move(m));
}

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok())
      v_ = Status(StatusCode::kInternal, "Result built from OK status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace switchml

#define SWITCHML_CONCAT_INNER_(a, b) a##b
#define SWITCHML_CONCAT_(a, b) SWITCHML_CONCAT_INNER_(a, b)

// SWITCHML_RETURN_IF_ERROR(expr): returns the Status of expr from the enclosing function if it
// is not OK.
#define SWITCHML_RETURN_IF_ERROR(expr) \
  do {                                 \
    ::switchml::Status _st = (expr);   \
    if (!_st.ok()) return _st;         \
  } while (0)

// SWITCHML_ASSIGN_OR_RETURN(lhs, expr): evaluates a Result<T>; returns its Status on error, else
// assigns.
#define SWITCHML_ASSIGN_OR_RETURN(lhs, expr) \
  SWITCHML_ASSIGN_OR_RETURN_IMPL_(SWITCHML_CONCAT_(_res_, __LINE__), lhs, expr)
#define SWITCHML_ASSIGN_OR_RETURN_IMPL_(res, lhs, expr) \
  auto res = (expr);                                    \
  if (!res.ok()) return res.status();                   \
  lhs = std::move(res).value()
