"""Where a DDP training step's time goes: per-phase timers for the training scripts
(train_rec.py, train_digits.py) and the bare all-reduce of a model's gradients in DDP's buckets.

    timer = StepTimer(warmup)
    for step in ...:
        timer.start(); ...; timer.mark("forward"); ...; timer.mark("backward"); ...; timer.stop()
    r = timer.results()                 # step_seconds, phase_seconds, iterations_per_s
    r["allreduce_seconds"] = measure_allreduce(model)
    r = gather_slowest(r)               # every step's time and phases: the slowest rank's

"backward" includes DDP's all-reduces: they start while backward runs (a bucket as soon as its
gradients are ready) and backward() returns only when all of them ended.

The scripts' main() begins with init_from_torchrun(backend) and ends with finish(r, out, line).
"""
import ctypes
import ctypes.util
import json
import statistics
import time

import torch
import torch.distributed as dist


FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_CAP_BYTES = 25 * 1024 * 1024  # DDP's bucket_cap_mb=25


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def buckets(shapes, scale=1.0):
    """Element counts of DDP's default float32 buckets: reverse parameter order, a bucket
    closed once it holds at least its cap (1 MB for the first, 25 MB for the others)."""
    out, current, cap = [], 0, FIRST_BUCKET_BYTES
    for shape in reversed(shapes):
        n = max(1, int(numel(shape) * scale))
        current += n
        if current * 4 >= cap:
            out.append(current)
            current, cap = 0, BUCKET_CAP_BYTES
    if current:
        out.append(current)
    return out


def keep_freed_memory():
    """Makes glibc's malloc serve large blocks from the heap and keep freed memory (mallopt
    M_MMAP_THRESHOLD and M_TRIM_THRESHOLD of 2 GiB), so that a tensor allocated every step (a
    fresh gradient of tens of MB) reuses pages instead of mapping new ones and faulting on
    every 4 KiB page (16k page faults and the kernel's zeroing for 64 MB, per step). What
    jemalloc or tcmalloc do for PyTorch on CPUs; the same for every backend. False when glibc
    refuses it (then nothing changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    m_trim_threshold, m_mmap_threshold, limit = -1, -3, (1 << 31) - 1
    return bool(libc.mallopt(m_trim_threshold, limit) and libc.mallopt(m_mmap_threshold, limit))


class StepTimer:
    def __init__(self, warmup):
        self.warmup, self.step = warmup, 0
        self.steps, self.phases = [], {}
        self.first = self.last = None
        self.measured_start = None

    def start(self):
        if self.step == self.warmup:
            self.measured_start = time.perf_counter()
        self.first = self.last = time.perf_counter()

    def mark(self, phase):
        now = time.perf_counter()
        if self.step >= self.warmup:
            self.phases.setdefault(phase, []).append(now - self.last)
        self.last = now

    def stop(self):
        now = time.perf_counter()
        if self.step >= self.warmup:
            self.steps.append(now - self.first)
        self.step += 1
        self.end = now

    def results(self):
        measured = len(self.steps)
        seconds = self.end - self.measured_start if measured else 0.0
        return {"step_seconds": self.steps, "phase_seconds": self.phases,
                "iterations_per_s": measured / seconds if seconds > 0 else 0.0,
                "seconds": seconds}


def time_allreduces(tensors, iterations):
    """This rank's time of each of `iterations` rounds (after one warm-up) that start the
    all-reduce of every tensor at once and wait for them all, with a barrier before each."""
    times = []
    for i in range(iterations + 1):
        dist.barrier()
        start = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        if i > 0:
            times.append(time.perf_counter() - start)
    return times


def measure_allreduce(module, iterations=5):
    """Median time of the all-reduce of `module`'s gradients alone: every bucket as DDP 1.13
    makes them by default (reverse parameter order, 1 MB then 25 MB caps) started at once, then
    all waited for; one warm-up, then `iterations` timed with a barrier before each."""
    sizes = buckets([tuple(p.shape) for p in module.parameters() if p.requires_grad])
    return measure_allreduce_sizes(sizes, iterations)


def measure_allreduce_sizes(sizes, iterations=5):
    """Median (over `iterations`, after one warm-up) of the slowest rank's time to all-reduce
    float32 tensors of these element counts, all started at once, then all waited for. The
    tensors hold random values (dense, as gradients are: a backend may treat zeros apart)."""
    g = torch.Generator().manual_seed(dist.get_rank())
    times = time_allreduces([torch.randn(n, generator=g) for n in sizes], iterations)
    worst = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return statistics.median(worst.tolist())


def ddp_bucket_numels(ddp_model):
    """The element counts of the float32 buckets DDP all-reduces in a step (after its first
    steps, which may rebuild them in the order the gradients became ready), from DDP's own
    logging data; step_timing.buckets' estimate where that has none."""
    try:
        data = ddp_model._get_ddp_logging_data()
        text = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", "")
        sizes = [int(b) // 4 for b in str(text).split(",") if b.strip()]
    except (AttributeError, RuntimeError, ValueError):
        sizes = []
    return sizes or buckets([tuple(p.shape) for p in ddp_model.module.parameters()
                             if p.requires_grad])


def gather_slowest(r):
    """Replaces every step's time and phase times by the largest over the ranks (the job moves
    at its slowest rank's pace); iterations_per_s becomes the slowest rank's."""
    keys = sorted(r["phase_seconds"])
    rows = [r["step_seconds"]] + [r["phase_seconds"][k] for k in keys]
    t = torch.tensor(rows + [[-r["iterations_per_s"]] * len(rows[0])], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    rows = t.tolist()
    out = dict(r)
    out["step_seconds"] = rows[0]
    out["phase_seconds"] = {k: rows[1 + j] for j, k in enumerate(keys)}
    out["iterations_per_s"] = -rows[-1][0] if rows[-1] else r["iterations_per_s"]
    return out


def init_from_torchrun(backend):
    """init_process_group(backend) from torchrun's environment (the switchml backend registered
    first when it is the one); returns (rank, world size)."""
    if backend == "switchml":
        import switchml.torch  # noqa: F401 - registers the backend
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def finish(r, out, line):
    """The end of a training script's run: every rank's timings replaced by the slowest rank's
    (gather_slowest) and, with the switchml backend, rank 0's transport, packet size, multicast
    mode and datagram counters added (r["switchml"]); then on rank 0 line(r) printed and r written to
    `out` as JSON (when given); then the process group destroyed."""
    r = gather_slowest(r)
    group = dist.group.WORLD
    if hasattr(group, "stats"):  # the switchml backend: how this rank's results came
        stats, config = group.stats(), group.config
        r["switchml"] = {"transport": config.transport, "packet_numel": config.packet_numel,
                         "multicast": config.multicast,
                         "wake_batch": config.wake_batch,
                         **{k: stats[k] for k in ("datagrams_received",
                                                  "group_datagrams_received",
                                                  "packets_sent", "packets_retransmitted")}}
    if dist.get_rank() == 0:
        print(line(r))
        if out:
            with open(out, "w") as f:
                json.dump(r, f)
    dist.destroy_process_group()


def summary(r):
    """One line: the median step and its phases (each phase's median; the slowest rank's)."""
    med = statistics.median
    phases = ", ".join(f"{k} {med(v):.4f}" for k, v in r["phase_seconds"].items())
    text = (f"median step {med(r['step_seconds']):.4f} s ({phases}), "
            f"{r['iterations_per_s']:.2f} steps/s")
    if "allreduce_seconds" in r:
        text += f"; the gradients' all-reduce alone {r['allreduce_seconds']:.4f} s"
    return text


class Profiler:
    """torch.profiler over `steps` steps from step `first` on; finish() prints its table of
    operators by self CPU time on rank 0 (steps = 0: nothing)."""

    def __init__(self, steps, first):
        self.steps, self.first, self.prof = steps, first, None

    def step(self, step):
        if self.steps <= 0:
            return
        if step == self.first:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.prof.__enter__()
        elif step == self.first + self.steps and self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.done = True

    def finish(self, rank):
        if self.prof is None:
            return
        if not getattr(self, "done", False):
            self.prof.__exit__(None, None, None)
        if rank == 0:
            print(self.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
