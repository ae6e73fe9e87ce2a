// RetransmitOptions (include/switchml/retransmit.h): checked here once, for Config::Validate and
// worker::SessionConfig::Validate alike.
#include "switchml/retransmit.h"

namespace switchml {

Status RetransmitOptions::Validate() const {
  if (timeout.count() <= 0) return InvalidArgumentError("timeout must be positive");
  if (min_timeout.count() <= 0) return InvalidArgumentError("min_timeout must be positive");
  if (max_timeout < min_timeout) {
    return InvalidArgumentError("max_timeout must be at least min_timeout");
  }
  if (clock_granularity.count() < 0) {
    return InvalidArgumentError("clock_granularity must not be negative");
  }
  if (timeout_threshold == 0) return InvalidArgumentError("timeout_threshold must be at least 1");
  if (peer_timeout < timeout) {
    return InvalidArgumentError("peer_timeout must be at least the retransmission timeout");
  }
  return Status();
}

}  // namespace switchml
