// WaitOptions (include/switchml/wait.h): checked here once, for Config::Validate and the worker
// threads alike.
#include "switchml/wait.h"

namespace switchml {

Status WaitOptions::Validate() const {
  if (!(wake_batch >= 0 && wake_batch <= 1)) {
    return InvalidArgumentError(
        "wake_batch must be in [0, 1] (a fraction of the packets in flight; 0 = wake for every "
        "arrival)");
  }
  return Status();
}

}  // namespace switchml
