#include "base/affinity.h"

#include <errno.h>
#include <sched.h>
#include <string.h>

#include <string>

namespace switchml {

Result<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return InternalError(std::string("sched_getaffinity: ") + strerror(errno));
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) return InternalError("sched_getaffinity: no CPU allowed");
  return cpus;
}

Status PinCurrentThread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    return InvalidArgumentError("CPU " + std::to_string(cpu) + " is out of range 0.." +
                                std::to_string(CPU_SETSIZE - 1));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return FailedPreconditionError("cannot pin a data thread to CPU " + std::to_string(cpu) + ": " +
                                   strerror(errno));
  }
  return Status();
}

void PinDataThread(int cpu, LogSubsystem subsystem) {
  if (cpu < 0) return;
  const Status pinned = PinCurrentThread(cpu);
  // (LOG names its subsystem at the call site; here the caller's.)
  if (!pinned.ok() && LogLevel::kWarning >= GetLogLevel()) {
    internal::LogMessage(LogLevel::kWarning, subsystem).stream()
        << pinned.message() << "; it runs unpinned";
  }
}

}  // namespace switchml
