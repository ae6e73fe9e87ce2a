// CPU affinity of the data-plane threads (Config::pin_threads, SwitchDaemonOptions::pin_threads).
//
// Why: on a host that runs the workers and the switch together (shm, `switchml run`), worker
// thread t exchanges every datagram with switch thread t mod S and no other. Where the scheduler
// puts such a pair on different cores, each datagram's cache lines move between the cores' caches
// (the writer's, then the reader's, then back for the result), which slows an all-reduce
// markedly (the figures: docs/benchmarks.md, "Threads that share a core's caches"). Pinning
// thread t of every process to the t-th allowed CPU keeps each pair on one core.
#pragma once

#include <cstdint>
#include <vector>

#include "base/logging.h"
#include "switchml/status.h"

namespace switchml {

// The CPUs the calling thread may run on (sched_getaffinity), ascending; never empty on success.
Result<std::vector<int>> AllowedCpus();

// The CPU of data thread t of a process whose allowed CPUs are `cpus` (not empty): the t-th, round
// robin. The same t gets the same CPU in every process started with the same CPU set.
inline int CpuOfThread(const std::vector<int>& cpus, uint32_t t) { return cpus[t % cpus.size()]; }

// Pins the calling thread to `cpu` (sched_setaffinity); the error names the CPU and why.
Status PinCurrentThread(int cpu);

// A data thread's start: pins it to `cpu` where cpu >= 0 (-1: not pinned); a pin that fails is
// logged as a warning of `subsystem` and the thread runs unpinned.
void PinDataThread(int cpu, LogSubsystem subsystem);

}  // namespace switchml
