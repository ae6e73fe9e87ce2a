// RefusalLog: the registry's refusals, logged as warnings at a bounded rate (docs/security.md 2:
// a flood of bad requests must not flood the log): at most kLinesPerSecond lines a second; the
// others are counted and summed up in the first line of a later second. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "switchml/status.h"

namespace switchml::control {

class RefusalLog {
 public:
  static constexpr uint32_t kLinesPerSecond = 20;
  // "`what` from `peer` refused: `why`", at `now` (the registry's clock).
  void Log(std::chrono::steady_clock::time_point now, const std::string& what,
           const std::string& peer, const Status& why);

 private:
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_{};  // the current second's start
  uint32_t logged_in_window_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace switchml::control
