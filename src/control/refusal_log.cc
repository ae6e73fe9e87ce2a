#include "control/refusal_log.h"

#include <utility>

#include "base/logging.h"

namespace switchml::control {

void RefusalLog::Log(std::chrono::steady_clock::time_point now, const std::string& what,
                     const std::string& peer, const Status& why) {
  uint64_t suppressed = 0;
  {
    std::lock_guard lock(mu_);
    if (now - window_ >= std::chrono::seconds(1)) {
      window_ = now;
      logged_in_window_ = 0;
      suppressed = std::exchange(suppressed_, 0);
    }
    if (logged_in_window_ >= kLinesPerSecond) {
      ++suppressed_;
      return;
    }
    ++logged_in_window_;
  }
  if (suppressed > 0) {
    LOG(kWarning, kControl) << suppressed << " more refusals were not logged (rate limit)";
  }
  LOG(kWarning, kControl) << what << " from " << peer << " refused: " << why.ToString();
}

}  // namespace switchml::control
