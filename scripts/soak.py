#!/usr/bin/python3
"""Soak: many concurrent jobs on one software switch with packet loss, for a while.

Starts `switchml switch --loss L` (the switch drops a seeded fraction L of the datagrams it
receives and of those it sends) and J jobs of W `switchml worker` processes each (int32 and
float32 jobs alternating, distinct sessions), every worker verifying every all-reduce against the
exact sum. While they run, samples the switch's resident memory once a second.

Passes when:
  - wrong results: 0 (no worker reports a wrong sum) and every worker exits 0;
  - switch memory flat: the largest RSS of the last half of the run exceeds the largest of the
    first half (after warm-up) by at most --rss-slack-mib MiB;
  - fairness: each job's throughput (elements / median all-reduce time) is at least --fair
    times its fair share (the mean over the jobs).

  scripts/soak.py --switchml build/tools/switchml                   # the full run: 10 minutes
  scripts/soak.py --switchml build/tools/switchml --seconds 20      # the short run (CI)
  scripts/soak.py --switchml build/tools/switchml \
      --abuser build/tests/switchml_abuser                          # the same under abuse

With --abuser, a stranger (tests/abuser.cc) cycles through the abuses of issue 28 on the
switch's control port for the whole main run (idle connections from many addresses, thousands of
waiting barriers from 70 addresses, a top-of-rack switch flooded with barriers, a table of its
own jobs and 20,000 silent streams, a port-0 registration of the workers' address), and a probe
job (2 workers, a small all-reduce) starts every --probe-seconds: the soak's jobs must still
all pass; the probes' outcomes, the switch's open file descriptors and memory are reported.

The run length is reached by choosing the iteration count from two calibration rounds (all jobs,
2 and 12 all-reduces, same load: their difference is the time of 10 without the start-up). Prints a summary table; exit status 0 when every check passes.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def free_port(kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def parse_result(line):
    kv = {}
    for field in line.split()[1:]:
        if "=" in field:
            k, v = field.split("=", 1)
            kv[k] = v
    return kv


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def run_probe(args, ctrl, session, logdir):
    """One small 2-worker job; returns None when it verified, else why not."""
    procs = []
    for r in range(2):
        cmd = [args.switchml, "worker", "--switch", f"127.0.0.1:{ctrl}", "--rank", str(r),
               "--workers", "2", "--session", str(session), "--size", "4096", "--iterations",
               "2", "--warmup", "0", "--report", "--quiet", "--setup-timeout-ms", "30000",
               "--job-secret", f"probe-{session}"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    why = None
    for r, p in enumerate(procs):
        out, err = p.communicate()
        if p.returncode != 0 or "status=ok verified=1" not in out:
            why = why or f"rank {r}: exit {p.returncode}: {err.strip()[-200:]}"
    return why


def run_jobs(args, ctrl, iterations, warmup, session_base, logdir):
    """Runs all jobs to the end; returns (per-job results, failures, wrong, wall seconds)."""
    procs = []
    for j in range(args.jobs):
        dtype = "int32" if j % 2 == 0 else "float32"
        for r in range(args.workers):
            cmd = [args.switchml, "worker", "--switch", f"127.0.0.1:{ctrl}", "--rank", str(r),
                   "--workers", str(args.workers), "--session", str(session_base + j),
                   "--size", str(args.size), "--dtype", dtype, "--iterations", str(iterations),
                   "--warmup", str(warmup), "--seed", str(j + 1), "--window", str(args.window),
                   "--report", "--quiet", "--peer-timeout-ms", "20000",
                   "--setup-timeout-ms", "60000"]
            err = open(os.path.join(logdir, f"job{session_base + j}-rank{r}.err"), "w")
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
            procs.append((j, r, p, err))
    start = time.monotonic()
    results = {}
    failures, wrong = [], 0
    for j, r, p, err in procs:
        out, _ = p.communicate()
        err.close()
        line = next((l for l in out.splitlines() if l.startswith("SWITCHML_RESULT")), "")
        kv = parse_result(line)
        with open(err.name) as f:
            text = f.read()
        wrong += text.count("gave a wrong result")
        if p.returncode != 0 or kv.get("status") != "ok":
            failures.append(f"job {j} rank {r}: exit {p.returncode}: {text.strip()[-300:]}")
            continue
        times = [float(t) for t in kv.get("times", "").split(",") if t]
        results.setdefault(j, []).append((times, int(kv.get("retransmitted", 0))))
    return results, failures, wrong, time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switchml", required=True, help="path of the switchml binary")
    ap.add_argument("--seconds", type=float, default=600, help="length of the main run, seconds")
    ap.add_argument("--jobs", type=int, default=8, help="concurrent jobs (sessions)")
    ap.add_argument("--workers", type=int, default=4, help="worker processes per job")
    ap.add_argument("--loss", type=float, default=0.01,
                    help="fraction of datagrams the switch drops in each direction")
    ap.add_argument("--size", type=int, default=262144, help="elements per all-reduce")
    ap.add_argument("--window", type=int, default=64, help="packets in flight per worker")
    ap.add_argument("--fair", type=float, default=0.5,
                    help="each job's throughput must be at least this fraction of the mean")
    ap.add_argument("--rss-slack-mib", type=float, default=8.0,
                    help="how much the switch's RSS may grow from the first half of the main "
                    "run to the second, MiB")
    ap.add_argument("--abuser", help="path of switchml_abuser: abuse the control port meanwhile")
    ap.add_argument("--probe-seconds", type=float, default=20,
                    help="with --abuser: start a probe job this often, seconds")
    args = ap.parse_args()
    # Refused here, before anything starts: a run with these measures nothing (or, with a loss
    # the switch refuses, waits for a switch that never came up).
    if not (os.path.isfile(args.switchml) and os.access(args.switchml, os.X_OK)):
        ap.error(f"--switchml {args.switchml} is not an executable file (build/tools/switchml)")
    if not args.seconds > 0:
        ap.error(f"--seconds must be positive, not {args.seconds:g}")
    if not 1 <= args.jobs <= 1000:
        ap.error(f"--jobs must be in 1..1000, not {args.jobs}")
    if not 1 <= args.workers <= 64:
        ap.error(f"--workers must be in 1..64, not {args.workers}")
    if not 0 <= args.loss < 1:
        ap.error(f"--loss must be in [0, 1), e.g. 0.01 for 1%, not {args.loss:g}")
    if args.size < 1:
        ap.error(f"--size (elements) must be at least 1, not {args.size}")
    if args.window < 1:
        ap.error(f"--window must be at least 1, not {args.window}")
    if not 0 <= args.fair <= 1:
        ap.error(f"--fair must be in [0, 1], not {args.fair:g}")
    if args.rss_slack_mib < 0:
        ap.error(f"--rss-slack-mib must be at least 0, not {args.rss_slack_mib:g}")
    if args.abuser and not (os.path.isfile(args.abuser) and os.access(args.abuser, os.X_OK)):
        ap.error(f"--abuser {args.abuser} is not an executable file (build/tests/switchml_abuser)")
    if not args.probe_seconds > 0:
        ap.error(f"--probe-seconds must be positive, not {args.probe_seconds:g}")

    ctrl, data = free_port(), free_port(socket.SOCK_DGRAM)
    logdir = tempfile.mkdtemp(prefix="switchml-soak.")
    sw_log = open(os.path.join(logdir, "switch.log"), "w")
    sw = subprocess.Popen([args.switchml, "switch", "--bind", "127.0.0.1", "--control-port",
                           str(ctrl), "--data-port", str(data), "--loss", str(args.loss),
                           "--log-level", "warning"], stdout=sw_log, stderr=subprocess.STDOUT)
    samples = []  # (seconds since start, RSS MiB)
    fds = []  # (seconds since start, open file descriptors)
    stop = threading.Event()
    t0 = time.monotonic()

    def sample():
        while not stop.is_set():
            m = rss_mib(sw.pid)
            if m is not None:
                samples.append((time.monotonic() - t0, m))
            n = fd_count(sw.pid)
            if n is not None:
                fds.append((time.monotonic() - t0, n))
            stop.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.5)
    ok = True
    prober, probes = None, []
    try:
        # Calibration: every job, 2 and then 12 all-reduces, to learn the time of one under this
        # load; the difference leaves out the processes' start and the job's setup (a large
        # share of a short run: counted in, a "600 s" soak lasted 176 s).
        walls = []
        for cal_iters, base in ((2, 1000), (12, 1100)):
            res, fail, wrong, wall = run_jobs(args, ctrl, cal_iters, 1, base, logdir)
            if fail or wrong:
                print("soak: calibration failed:", *fail, sep="\n  ")
                return 1
            walls.append(wall)
        per_iter = max(walls[1] - walls[0], 0.1 * walls[1]) / 10
        iterations = max(3, int(args.seconds / per_iter))
        print(f"soak: {args.jobs} jobs x {args.workers} workers, {args.size} elements, "
              f"window {args.window}, switch loss {args.loss} each way; calibration "
              f"{per_iter:.3f} s per all-reduce -> {iterations} iterations per job "
              f"(logs {logdir})", flush=True)
        main_start = time.monotonic() - t0
        abuser = None
        if args.abuser:
            abuse_log = open(os.path.join(logdir, "abuser.log"), "w")
            abuser = subprocess.Popen([args.abuser, "--switch", f"127.0.0.1:{ctrl}", "--switchml",
                                       args.switchml, "--seconds", str(int(args.seconds))],
                                      stdout=abuse_log, stderr=subprocess.STDOUT)

            def probe_loop():
                k = 0
                while not stop.wait(args.probe_seconds):
                    if abuser.poll() is not None:
                        break
                    k += 1
                    at = time.monotonic() - t0 - main_start
                    probes.append((at, run_probe(args, ctrl, 5000 + k, logdir)))

            prober = threading.Thread(target=probe_loop, daemon=True)
            prober.start()
        res, fail, wrong, wall = run_jobs(args, ctrl, iterations, 1, 2000, logdir)
        main_end = time.monotonic() - t0
        if abuser is not None:
            abuser.terminate()
            try:
                abuser.wait(30)
            except subprocess.TimeoutExpired:
                abuser.kill()
            abuse_log.close()
    finally:
        stop.set()
        sampler.join()
        if prober is not None:
            prober.join(120)
        sw.terminate()
        try:
            sw.wait(10)
        except subprocess.TimeoutExpired:
            sw.kill()
        sw_log.close()

    # Memory: first half of the main run (after its first 10%) against the second half.
    run = [(t, m) for t, m in samples if main_start <= t <= main_end]
    span = main_end - main_start
    first = [m for t, m in run if main_start + 0.1 * span <= t < main_start + 0.5 * span]
    second = [m for t, m in run if t >= main_start + 0.5 * span]
    rss_ok = bool(first) and bool(second) and max(second) <= max(first) + args.rss_slack_mib
    # Fairness.
    tput = {}
    retrans = {}
    for j, ranks in res.items():
        med = statistics.median(statistics.median(t) for t, _ in ranks if t)
        tput[j] = args.size / med if med > 0 else 0
        retrans[j] = sum(r for _, r in ranks)
    fair = statistics.mean(tput.values()) if tput else 0
    low = min(tput.values()) / fair if fair else 0
    fair_ok = len(tput) == args.jobs and low >= args.fair

    print(f"soak: main run {wall:.1f} s, {iterations} all-reduces per job (+1 warm-up)")
    print(f"{'job':>4} {'dtype':>8} {'elements/s':>12} {'share':>6} {'retransmitted':>14}")
    for j in sorted(tput):
        print(f"{j:>4} {'int32' if j % 2 == 0 else 'float32':>8} {tput[j]:12.4g} "
              f"{tput[j] / fair:6.2f} {retrans[j]:14d}")
    print(f"soak: wrong results {wrong}; failed workers {len(fail)}")
    for f in fail[:8]:
        print("  " + f)
    if run:
        marks = [run[0], run[len(run) // 4], run[len(run) // 2], run[3 * len(run) // 4], run[-1]]
        print("soak: switch RSS MiB at " +
              ", ".join(f"{t - main_start:.0f}s {m:.1f}" for t, m in marks) +
              f"; max first half {max(first) if first else 0:.1f}, "
              f"max second half {max(second) if second else 0:.1f} "
              f"(allowed +{args.rss_slack_mib:g})")
    print(f"soak: fairness: slowest job {low:.2f} of the fair share (required >= {args.fair:g})")
    run_fds = [n for t, n in fds if main_start <= t <= main_end]
    if run_fds:
        print(f"soak: switch open file descriptors: at start {run_fds[0]}, max {max(run_fds)}, "
              f"at the end {run_fds[-1]}")
    if args.abuser:
        with open(os.path.join(logdir, "abuser.log")) as f:
            lines = [l.rstrip() for l in f if l.startswith("abuse ")]
        print(f"soak: abuser: {len(lines)} phases")
        for l in lines:
            print("  " + l)
        ok_probes = sum(1 for _, why in probes if why is None)
        print(f"soak: probe jobs: {ok_probes} of {len(probes)} verified")
        for at, why in probes:
            if why is not None:
                print(f"  probe at {at:.0f} s: {why}")
        peak = max((m for t, m in samples if main_start <= t <= main_end), default=0)
        print(f"soak: switch RSS peak during the main run {peak:.1f} MiB")
    ok = not fail and wrong == 0 and rss_ok and fair_ok
    print("soak: " + ("PASS" if ok else "FAIL") +
          ("" if rss_ok else " (switch memory grew)") +
          ("" if fair_ok else " (a job got less than its fair share)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
