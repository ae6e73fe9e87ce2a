#!/usr/bin/python3
"""All-reduce side by side: switchml, Gloo (ring, halving-doubling) and Open MPI.

For every setting (loopback; the emulated rack of scripts/rack.sh at a rate), worker count and
tensor size, runs one system after another on the same verifiable tensors (src/testing/pattern.h:
every result is checked) and reports per system: median and p99 time (per iteration the slowest
rank's time), elements/s, algorithm and bus bandwidth as nccl-tests define them, and CPU seconds
per GiB reduced over all processes of the run. Writes JSON, a Markdown table and PNG plots.
scripts/bench.sh builds the programs and runs this; docs/benchmarks.md explains the output.
Debian's python3 and python3-matplotlib only (run with /usr/bin/python3).
"""

import argparse
import datetime
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import ddp_steps
import outputs

SYSTEMS = ["switchml", "switchml-mcast", "switchml-unicast", "switchml-xdp", "switchml-shm",
           "switchml-shm-unpinned", "switchml-scraped", "gloo-ring", "gloo-hd", "mpi-tcp",
           "mpi-shm"]
# What --systems runs by default: all but the A/B variants of switchml-shm and switchml.
DEFAULT_SYSTEMS = [s for s in SYSTEMS if s not in ("switchml-shm-unpinned", "switchml-scraped")]
SYSTEM_LABELS = {
    "switchml": "SwitchML (software switch, UDP; in the rack each result sent once to the job's "
                "LAN multicast group, replicated by the bridge: --multicast auto, the default)",
    "switchml-mcast": "SwitchML with LAN multicast required (worker --multicast on: an error "
                      "rather than one copy per worker; rack only)",
    "switchml-unicast": "SwitchML with results one copy per worker in the rack (worker "
                        "--multicast local, the default before LAN multicast was; rack only)",
    "switchml-xdp": "SwitchML over AF_XDP (--transport xdp; rack only)",
    "switchml-shm": "SwitchML over shared memory (--transport shm, --threads and --pin-threads "
                    "at the switch and the workers as `switchml run` picks; loopback only)",
    "switchml-shm-unpinned": "switchml-shm without --pin-threads, for an A/B of the pinning "
                             "(loopback only; not run by default)",
    "switchml-scraped": "switchml with its Prometheus metrics scraped every second (switch "
                        "--metrics-port; a scraper in the switch's namespace), for an A/B "
                        "against switchml (not run by default)",
    "gloo-ring": "Gloo ring (TCP)",
    "gloo-hd": "Gloo halving-doubling (TCP)",
    "mpi-tcp": "Open MPI MPI_Allreduce (btl tcp)",
    "mpi-shm": "Open MPI MPI_Allreduce (btl vader, shared memory; loopback only)",
}
# The worker flags of switchml-mcast (the switch, bound to the bridge's address, allows it) and
# of switchml-unicast.
MCAST_ARGS = ["--multicast", "on"]
UNICAST_ARGS = ["--multicast", "local"]
# switchml-shm's threads, for the workers and the switch alike: what `switchml run` picks over
# shm (tools/commands.h, kShmRunThreads) on a host with at least that many cores, pinned (thread
# t of each process on the t-th CPU) where they are as many as the CPUs, as `run`'s
# --pin-threads auto does.
SHM_THREADS = 2 if (os.cpu_count() or 1) >= 2 else 1
SHM_UNPINNED_ARGS = ["--threads", str(SHM_THREADS)]
SHM_ARGS = SHM_UNPINNED_ARGS + (
    ["--pin-threads"] if SHM_THREADS == len(os.sched_getaffinity(0)) else [])
# The flags a switchml system adds (beyond --transport): (for every worker, for the switch).
SYSTEM_FLAGS = {"switchml-mcast": (MCAST_ARGS, []), "switchml-unicast": (UNICAST_ARGS, []),
                "switchml-shm": (SHM_ARGS, SHM_ARGS),
                "switchml-shm-unpinned": (SHM_UNPINNED_ARGS, SHM_UNPINNED_ARGS)}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# switchml-scraped's scraper: GETs the switch's /metrics every second (as a Prometheus server
# would) and prints one line per scrape with its size.
SCRAPER = """
import sys, time, urllib.request
url = sys.argv[1]
while True:
    t = time.monotonic()
    try:
        body = urllib.request.urlopen(url, timeout=5).read()
        print(len(body), flush=True)
    except OSError as e:
        print("error", e, flush=True)
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
"""
GIB = float(1 << 30)
# --audit-kernel: perf's system-wide sampling rate (per CPU) and the softirq handlers whose
# presence in a sample's call chain marks network work (the bridge, veth, tbf, IP, UDP, TCP).
AUDIT_HZ = 499
NET_SOFTIRQ = ("net_rx_action", "net_tx_action")


class Interrupted(Exception):
    pass


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def parse_size(text):
    """Bytes from '1M', '256M', '4K', '1G' (binary multiples) or a plain number."""
    m = re.fullmatch(r"(\d+)([KkMmGg]?)(i?B)?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: '{text}' (e.g. 1M, 64M, 256M)")
    shift = {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]
    return int(m.group(1)) << shift


def size_label(nbytes):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def rate_bps(rate):
    """Bits per second of a tc rate: 1gbit, 500mbit, 10gbit, 1000000bit."""
    m = re.fullmatch(r"(\d+)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"not a tc rate: '{rate}' (e.g. 1gbit, 500mbit)")
    return int(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def link_limit_s(setting, system, n, nbytes, switch_hosts=0):
    """The least time the rack's cables allow: SwitchML moves each worker's tensor once each
    way (plus its 10-byte header per 1 KiB packet), a bandwidth-optimal all-reduce between
    hosts 2(n-1)/n times. On the server rack, each of the k switch hosts' cables carries n/k
    tensors' worth in: SwitchML's time is the larger of the two. None on loopback."""
    if not is_rack(setting):
        return None
    wire = nbytes * (1 + 10 / 1024) if system.startswith("switchml") else nbytes * 2 * (n - 1) / n
    if system.startswith("switchml") and switch_hosts:
        wire *= max(1.0, n / switch_hosts)
    return wire * 8 / rate_bps(setting.split(":", 1)[1])


def is_rack(setting):
    return setting.startswith("rack:") or setting.startswith("server-rack:")


def switch_hosts_for(spec, n):
    """The k of a --switch-hosts entry for n workers: a number, or n."""
    return n if spec == "n" else int(spec)


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100); with few values the p99 is the largest."""
    v = sorted(values)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)]


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def stat_cpu_ticks(path):
    """utime + stime, in clock ticks, of a /proc/.../stat file; None if it cannot be read (the
    process or thread is gone)."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


class Proc:
    """A started process; its output goes to files, its rusage comes from wait4."""

    def __init__(self, argv, out_path, err_path, env=None):
        self.argv = argv
        self.out_path, self.err_path = out_path, err_path
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True)
        self.pid = self.popen.pid
        self.returncode = None
        self.cpu_s = 0.0  # user + system of the process and every child it reaped
        # CPU spent before the part of its life that is measured (Proc.mark_start_cpu), e.g. a
        # switch's start-up (loading, gRPC, Highway's calibration) before any worker is started.
        self.cpu_before_s = 0.0

    def mark_start_cpu(self):
        """Records the CPU used so far (/proc/PID/stat, all threads) as not measured."""
        ticks = stat_cpu_ticks(f"/proc/{self.pid}/stat")
        self.cpu_before_s = 0.0 if ticks is None else ticks / os.sysconf("SC_CLK_TCK")

    def measured_cpu_s(self):
        """CPU of its life after mark_start_cpu (all of it without a mark)."""
        return max(0.0, self.cpu_s - self.cpu_before_s)

    def cpu_clock_s(self):
        """Its CPU so far (user + system, every thread, exited ones too) from the process's CPU
        clock (clock_getcpuclockid's id: ~pid << 3 | CPUCLOCK_SCHED), to the nanosecond; None
        once it is gone."""
        try:
            return time.clock_gettime((~self.pid << 3) | 2)
        except OSError:
            return None

    def poll(self):
        if self.returncode is None:
            pid, status, ru = os.wait4(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self.popen.returncode = self.returncode
                self.cpu_s = ru.ru_utime + ru.ru_stime
        return self.returncode

    def signal(self, sig):
        if self.returncode is None:
            try:
                os.killpg(self.pid, sig)  # its own session: the process and its children
            except ProcessLookupError:
                pass

    def output(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def errors(self, lines=8):
        with open(self.err_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])


class TimedCpuWatch(threading.Thread):
    """The CPU a process (the switch) uses while the workers' timed all-reduces run: read from
    its CPU clock when rank 0's progress line of its last warm-up all-reduce appears and again
    when that of its last timed one does. Both lines come after the all-reduce's result was
    verified, and before the next all-reduce the worker fills its tensor, so the switch is idle
    at both marks and the 5 ms polling moves neither into an all-reduce. Between them lie the
    timed all-reduces and the barriers and tensor checks between them; the job's setup, the
    warm-up (which first touches the switch's memory) and the shutdown do not."""

    def __init__(self, procs, rank0_err, warmup, iterations):
        super().__init__(daemon=True)
        self.procs, self.path = procs, rank0_err
        self.marks = [f"warm-up {warmup}/{warmup}:", f"iteration {iterations}/{iterations}:"]
        self.cpu = []
        self.done = threading.Event()

    def run(self):
        seen = 0
        while not self.done.wait(0.005) and len(self.cpu) < 2:
            try:
                size = os.path.getsize(self.path)
            except OSError:
                continue
            if size == seen:
                continue
            seen = size
            with open(self.path, errors="replace") as f:
                text = f.read()
            while len(self.cpu) < 2 and self.marks[len(self.cpu)] in text:
                cpus = [p.cpu_clock_s() for p in self.procs]
                if None in cpus:
                    return
                self.cpu.append(sum(cpus))

    def timed_cpu_s(self):
        """The CPU between the marks, or None where either was not seen."""
        self.done.set()
        self.join()
        return self.cpu[1] - self.cpu[0] if len(self.cpu) == 2 else None


class Runner:
    """Starts processes, waits for them with a deadline, and ends whatever is left."""

    def __init__(self):
        self.running = []

    def start(self, argv, out_path, err_path, env=None):
        p = Proc(argv, out_path, err_path, env)
        self.running.append(p)
        return p

    def wait(self, procs, timeout_s):
        """Waits for all of procs; on the first failure or the deadline ends the others.
        Returns an error message or None."""
        deadline = time.monotonic() + timeout_s
        error = None
        while True:
            left = [p for p in procs if p.poll() is None]
            if error is None:
                bad = [p for p in procs if p.returncode not in (None, 0)]
                if bad:
                    error = (f"{os.path.basename(bad[0].argv[0])} (pid {bad[0].pid}) exited with "
                             f"code {bad[0].returncode}; its last errors:\n{bad[0].errors()}")
                elif left and time.monotonic() > deadline:
                    error = f"killed after --run-timeout {timeout_s} s"
                if error is not None:
                    for p in left:
                        p.signal(signal.SIGKILL)
            if not left:
                return error
            time.sleep(0.02)

    def stop(self, p, timeout_s=10):
        """SIGTERM, then SIGKILL after timeout_s; waits for it."""
        p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while p.poll() is None:
            if time.monotonic() > deadline:
                p.signal(signal.SIGKILL)
            time.sleep(0.02)

    def kill_all(self):
        for p in self.running:
            p.signal(signal.SIGKILL)
        for p in self.running:
            while p.poll() is None:
                time.sleep(0.01)


def result_lines(procs, prefix):
    """Parses `PREFIX rank=R status=ok ... times=a,b cpu=c,d` lines into dicts, one per rank."""
    results = []
    for p in procs:
        for line in p.output().splitlines():
            if not line.startswith(prefix + " "):
                continue
            fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            results.append(fields)
    return results


def uncharged_net_samples(script_text, run_comms):
    """Parses `perf script -F comm,pid,ip,sym` of a system-wide call-graph recording and returns
    (samples of the run's processes, samples of network softirq work that ran in any other task,
    the idle task included). A process is the run's when any of its samples carries one of
    run_comms (its threads may have other names). The kernel charges softirq work to whichever
    task it interrupts (no CONFIG_IRQ_TIME_ACCOUNTING here), so the second count is the run's
    network work that no process of the run was charged for (with other traffic on the host,
    theirs too)."""
    samples = []
    for block in script_text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        head = lines[0].split()  # the comm (right-aligned, may hold spaces) and the pid
        if len(head) < 2 or not head[-1].isdigit():
            continue
        # Then one frame per line, indented: its address and symbol.
        samples.append((" ".join(head[:-1]), head[-1],
                        [f.split()[1] for f in lines[1:] if len(f.split()) >= 2]))
    run_pids = {pid for comm, pid, _ in samples if comm in run_comms}
    ours = sum(1 for _, pid, _ in samples if pid in run_pids)
    uncharged = sum(1 for _, pid, chain in samples
                    if pid not in run_pids and any(f in NET_SOFTIRQ for f in chain))
    return ours, uncharged


def floats(text):
    return [float(x) for x in text.split(",") if x]


class Bench:
    def __init__(self, args):
        self.args = args
        self.runner = Runner()
        self.rack = None  # dict of RACK_* variables while a rack is up
        self.rack_name = None  # set from before `rack.sh up` until `down`
        self.logs = os.path.join(args.out, "logs")
        self.measured = 0  # measurements so far: numbers each one's log files
        os.makedirs(self.logs, exist_ok=True)

    # --- Commands of each system -------------------------------------------------------------

    def ns_prefix(self, where):
        """argv prefix that runs a command in a rack namespace: where is 'sw', a rank, or
        ('host', j) for switch host j of the server rack."""
        if self.rack is None:
            return []
        if where == "sw":
            ns = self.rack["RACK_SWITCH_NS"]
        elif isinstance(where, tuple):
            ns = self.rack["RACK_SWITCH_HOST_NS"].split()[where[1]]
        else:
            ns = f"{self.rack['RACK_NAME']}-w{where}"
        return ["ip", "netns", "exec", ns]

    def host_ip(self, rank):
        return "127.0.0.1" if self.rack is None else self.rack["RACK_WORKER_IPS"].split()[rank]

    def job_args(self, n, elements, quiet):
        a = ["--size", str(elements), "--dtype", self.args.dtype, "--iterations",
             str(self.args.iterations), "--warmup", str(self.args.warmup), "--report"]
        return a + (["--quiet"] if quiet else [])

    def run_switchml(self, tag, n, elements, transport="udp", extra=(), switch_extra=(),
                     switch_hosts=0, scrape=False):
        """switch_hosts k > 0 (the server rack): one switch on each of k switch hosts, the job
        striped over them; else one switch, on the bridge (rack) or on loopback. scrape: the
        (first) switch serves its metrics, GET every second by a scraper in its namespace."""
        a = self.args
        if scrape:
            switch_extra = list(switch_extra) + ["--metrics-port", "0"]
        scraper = None
        places = []  # (namespace where, bind address, data port, control port) per switch
        if self.rack is None:
            places.append(("sw", "127.0.0.1", "0", "0"))
        elif switch_hosts:
            ips = self.rack["RACK_SWITCH_HOST_IPS"].split()
            places += [(("host", j), ips[j], "48864", "50099") for j in range(switch_hosts)]
        else:
            places.append(("sw", self.rack["RACK_SWITCH_IP"], "48864", "50099"))
        switches = []
        for j, (where, bind, data_port, control_port) in enumerate(places):
            name = f"{tag}-switch" + (f"{j}" if len(places) > 1 else "")
            switches.append(self.runner.start(
                self.ns_prefix(where) + [a.switchml, "switch", "--bind", bind, "--data-port",
                                         data_port, "--control-port", control_port, "--log-level",
                                         "warning", "--transport", transport]
                + list(switch_extra) + a.switch_args.split(),
                f"{self.logs}/{name}.out", f"{self.logs}/{name}.err"))
        try:
            # Each switch says which ports it got once it listens.
            deadline = time.monotonic() + 15
            controls = []
            for switch, (_, bind, _, _) in zip(switches, places):
                port = None
                while port is None:
                    m = re.search(r"control port (\d+)", switch.output())
                    if m and scrape and "metrics on" not in switch.output():
                        m = None  # (printed just after the ports)
                    if m:
                        port = m.group(1)
                        # Its start-up (about 0.04 s: loading, gRPC, Highway's calibration) is
                        # no part of any all-reduce, as the baselines' start-up is not: counted
                        # from here.
                        switch.mark_start_cpu()
                    elif switch.poll() is not None or time.monotonic() > deadline:
                        return {"error": "the switch did not start: " + switch.errors()}
                    else:
                        time.sleep(0.02)
                controls.append(f"{bind}:{port}")
            switch_list = ",".join(controls)
            if scrape:
                url = re.search(r"metrics on (http://\S+)", switches[0].output()).group(1)
                scraper = self.runner.start(
                    self.ns_prefix(places[0][0]) + [sys.executable, "-c", SCRAPER, url],
                    f"{self.logs}/{tag}-scraper.out", f"{self.logs}/{tag}-scraper.err")
            workers = []
            for r in range(n):
                argv = self.ns_prefix(r) + [
                    a.switchml, "worker", "--switch", switch_list, "--rank", str(r),
                    "--workers", str(n), "--session", "1", "--setup-timeout-ms", "60000",
                    "--transport", transport]
                if self.rack is not None:
                    argv += ["--bind", self.host_ip(r)]
                argv += self.job_args(n, elements, r != 0) + list(extra) + self.switchml_extra_args()
                workers.append(self.runner.start(argv, f"{self.logs}/{tag}-r{r}.out",
                                                 f"{self.logs}/{tag}-r{r}.err"))
            # Not sampled while they run (the baselines run unobserved too): each rank reports
            # its own CPU in the timed all-reduces (docs/benchmarks.md, CPU s/GiB); the switch's
            # is read twice, at the marks of rank 0's output (TimedCpuWatch).
            watch = None
            if a.warmup > 0:
                watch = TimedCpuWatch(switches, workers[0].err_path, a.warmup, a.iterations)
                watch.start()
            error = self.runner.wait(workers, a.run_timeout)
            switch_timed = watch.timed_cpu_s() if watch else None
        finally:
            if scraper is not None:
                self.runner.stop(scraper)
            for switch in switches:
                self.runner.stop(switch)
        if error:
            return {"error": error}
        out = self.collect(workers, "SWITCHML_RESULT", n, switches, switch_timed)
        if "cpu_timed_s" not in out:
            # A worker that does not report its CPU (an older build): the timed iterations'
            # share of every process's life, set-up, filling and verifying included.
            share = a.iterations / (a.iterations + a.warmup)
            hosts = sum(w.cpu_s for w in workers)
            out["cpu_timed_s"] = share * (hosts + sum(sw.measured_cpu_s() for sw in switches))
            out["cpu_hosts_timed_s"] = share * hosts
            out["cpu_method"] = "share of the processes' lives"
        if scraper is not None:
            lines = scraper.output().split()
            out["scrapes"] = sum(1 for x in lines if x.isdigit())
            if out["scrapes"] == 0 or "error" in lines:
                return {"error": "the metrics scraper failed: " + scraper.output()[-300:]}
        out["retransmitted"] = sum(int(r.get("retransmitted", 0))
                                   for r in result_lines(workers, "SWITCHML_RESULT"))
        # The switch's own CPU (from when it listens: the job's setup and warm-up included) per
        # all-reduce.
        out["switch_cpu_s_per_allreduce"] = (sum(sw.measured_cpu_s() for sw in switches)
                                             / (a.iterations + a.warmup))
        return out

    def switchml_extra_args(self):
        return self.args.switchml_args.split()

    def run_gloo(self, tag, n, elements, algorithm):
        a = self.args
        rendezvous = tempfile.mkdtemp(prefix="gloo-rendezvous-", dir=a.out)
        try:
            procs = []
            for r in range(n):
                argv = self.ns_prefix(r) + [
                    a.gloo, "--rank", str(r), "--workers", str(n), "--algorithm", algorithm,
                    "--rendezvous", rendezvous, "--host", self.host_ip(r),
                    "--timeout-s", str(a.run_timeout)] + self.job_args(n, elements, r != 0)
                procs.append(self.runner.start(argv, f"{self.logs}/{tag}-r{r}.out",
                                               f"{self.logs}/{tag}-r{r}.err"))
            error = self.runner.wait(procs, a.run_timeout)
        finally:
            shutil.rmtree(rendezvous, ignore_errors=True)
        return {"error": error} if error else self.collect(procs, "BENCH_RESULT", n)

    def run_mpi(self, tag, n, elements, btl):
        a = self.args
        argv = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "-np", str(n), "--mca", "btl", btl]
        env = dict(os.environ)
        if self.rack is None:
            if btl.startswith("tcp"):
                argv += ["--mca", "btl_tcp_if_include", "lo"]
            prefix, program = [], [a.mpi]
        else:
            # mpirun runs in the switch namespace; its ranks' PMIx clients reach it over the
            # bridge (PMIx's TCP listener would otherwise be on the switch namespace's loopback,
            # out of the workers' reach), and each rank enters its own worker namespace, so the
            # btl's TCP connections cross the rate-limited cables.
            subnet = self.rack["RACK_SUBNET"]
            env["PMIX_MCA_ptl_tcp_remote_connections"] = "1"
            env["PMIX_MCA_ptl_tcp_if_include"] = subnet
            argv += ["-x", "PMIX_MCA_ptl_tcp_if_include", "--mca", "oob_tcp_if_include", subnet,
                     "--mca", "btl_tcp_if_include", subnet]
            prefix = self.ns_prefix("sw")
            program = ["bash", "-c", 'exec ip netns exec "$0-w$OMPI_COMM_WORLD_RANK" "$@"',
                       self.rack["RACK_NAME"], a.mpi]
        argv = prefix + argv + program + ["--timeout-s", str(a.run_timeout)]
        argv += self.job_args(n, elements, False)
        p = self.runner.start(argv, f"{self.logs}/{tag}.out", f"{self.logs}/{tag}.err", env)
        error = self.runner.wait([p], a.run_timeout)
        return {"error": error} if error else self.collect([p], "BENCH_RESULT", n)

    def collect(self, procs, prefix, n, others=(), others_timed_cpu_s=None):
        """Per iteration the slowest rank's time; CPU of the timed all-reduces where every rank
        reports it, and of every process's whole life (wait4) in any case. others_timed_cpu_s:
        the other processes' (the switch's) CPU in the timed all-reduces where it was read
        (TimedCpuWatch); without it, their life's share."""
        results = result_lines(procs, prefix)
        ok = [r for r in results if r.get("status") == "ok" and r.get("verified") == "1"]
        if len(ok) != n:
            return {"error": f"{len(ok)} of {n} ranks reported a verified result ({prefix} lines "
                             f"in {self.logs})"}
        times = [floats(r["times"]) for r in ok]
        if any(len(t) != self.args.iterations for t in times):
            return {"error": f"a rank reported a wrong number of times ({prefix} lines)"}
        slowest = [max(t[i] for t in times) for i in range(self.args.iterations)]
        out = {"times_s": slowest,
               "cpu_lifetime_s": sum(p.cpu_s for p in list(procs) + list(others))}
        if all("cpu" in r for r in ok):
            out["cpu_timed_s"] = sum(sum(floats(r["cpu"])) for r in ok)
            # The ranks' hosts alone, without a switch process (which in the real design is the
            # rack's switch hardware): a second figure, never a replacement for the first.
            out["cpu_hosts_timed_s"] = out["cpu_timed_s"]
            # A process without its own report (the switch) counts with its CPU between the
            # marks of rank 0's output (TimedCpuWatch), or else with its life's share of the
            # timed iterations, from when it was ready (Proc.mark_start_cpu).
            share = self.args.iterations / (self.args.iterations + self.args.warmup)
            life_share = share * sum(p.measured_cpu_s() for p in others)
            if others:
                out["switch_cpu_life_share_s"] = round(life_share, 4)
            if others_timed_cpu_s is not None:
                out["cpu_timed_s"] += others_timed_cpu_s
                out["switch_cpu_timed_s"] = round(others_timed_cpu_s, 4)
                out["cpu_method"] = ("reported by each rank; the switch's between rank 0's last "
                                     "warm-up and its last timed all-reduce")
            else:
                out["cpu_timed_s"] += life_share
                out["cpu_method"] = "reported by each rank"
        return out

    # --- One measurement -------------------------------------------------------------------------

    def measure(self, setting, system, n, nbytes, switch_hosts=0):
        a = self.args
        elements = nbytes // 4
        # Unique per measurement (rounds repeat a row; sizes need not be whole MiB), so that
        # logs/ keeps every process's output.
        self.measured += 1
        k = f"-k{switch_hosts}" if switch_hosts else ""
        tag = (f"{self.measured:03d}-{setting}-{system}{k}-{n}w-"
               f"{size_label(nbytes).replace(' ', '')}").replace(":", "-")
        log(f"{setting}: {system}{f' on {switch_hosts} switch hosts' if switch_hosts else ''}, "
            f"{n} workers, {size_label(nbytes)} {a.dtype} "
            f"({a.iterations} iterations after {a.warmup} warm-up)")
        load = os.getloadavg()[0]  # other work on the host skews every figure: recorded
        audit = self.start_audit(tag) if a.audit_kernel else None
        t0 = time.monotonic()
        if system == "switchml":
            r = self.run_switchml(tag, n, elements, switch_hosts=switch_hosts)
        elif system == "switchml-scraped":
            r = self.run_switchml(tag, n, elements, scrape=True)
        elif system in ("switchml-mcast", "switchml-unicast"):
            r = self.run_switchml(tag, n, elements, "udp", *SYSTEM_FLAGS[system])
        elif system == "switchml-xdp":
            r = self.run_switchml(tag, n, elements, transport="xdp")
        elif system in ("switchml-shm", "switchml-shm-unpinned"):
            r = self.run_switchml(tag, n, elements, "shm", *SYSTEM_FLAGS[system])
        elif system == "gloo-ring":
            r = self.run_gloo(tag, n, elements, "ring")
        elif system == "gloo-hd":
            r = self.run_gloo(tag, n, elements, "halving-doubling")
        elif system == "mpi-tcp":
            r = self.run_mpi(tag, n, elements, "tcp,self")
        else:
            r = self.run_mpi(tag, n, elements, "vader,self")
        wall = time.monotonic() - t0
        uncharged_ms = self.stop_audit(audit, system) if audit else None
        row = {"setting": setting, "system": system, "workers": n, "bytes": nbytes,
               "elements": elements, "dtype": a.dtype, "iterations": a.iterations,
               "warmup": a.warmup, "wall_s": round(wall, 3),
               "loadavg_1m": round(load, 2), "logs": tag}
        if switch_hosts:
            row["switch_hosts"] = switch_hosts
        if "error" in r:
            row["error"] = r["error"]
            log(f"FAILED: {system}: {r['error']}")
            return row
        t = r["times_s"]
        med = median(t)
        algbw = nbytes / med  # bytes/s, as nccl-tests' algbw (which prints GB/s)
        row.update({
            "times_s": t, "median_s": med, "p99_s": percentile(t, 99), "min_s": min(t),
            "elements_per_s": elements / med, "algbw_GBps": algbw / 1e9,
            "busbw_GBps": algbw * 2 * (n - 1) / n / 1e9, "verified": True,
            # Lifetime: every process from start to exit (setup, input fill and verification
            # included) over every all-reduce it ran, warm-up included.
            "cpu_lifetime_s_per_gib": r["cpu_lifetime_s"] / (nbytes * (a.iterations + a.warmup)
                                                             / GIB),
        })
        limit = link_limit_s(setting, system, n, nbytes, switch_hosts)
        if limit:
            row["link_limit_s"] = limit
            row["x_link_limit"] = med / limit
        if "cpu_timed_s" in r:
            row["cpu_s_per_gib"] = r["cpu_timed_s"] / (nbytes * a.iterations / GIB)
            row["cpu_method"] = r["cpu_method"]
            row["cpu_hosts_s_per_gib"] = r["cpu_hosts_timed_s"] / (nbytes * a.iterations / GIB)
            if "switch_cpu_timed_s" in r:
                # The same with the switch counted as before TimedCpuWatch: its life's share.
                row["cpu_s_per_gib_switch_life_share"] = (
                    (r["cpu_hosts_timed_s"] + r["switch_cpu_life_share_s"])
                    / (nbytes * a.iterations / GIB))
        if uncharged_ms is not None:
            row["uncharged_net_ms_per_allreduce"] = uncharged_ms
        if "retransmitted" in r:
            row["retransmitted"] = r["retransmitted"]
            row["switch_cpu_s_per_allreduce"] = r["switch_cpu_s_per_allreduce"]
            if "scrapes" in r:
                row["metrics_scrapes"] = r["scrapes"]  # switchml-scraped
            extra, switch_extra = SYSTEM_FLAGS.get(system, ([], []))
            row["switchml_args"] = " ".join(extra + self.switchml_extra_args())
            row["switch_args"] = " ".join(switch_extra + a.switch_args.split())
        log(f"{system}: median {med:.4f} s, p99 {row['p99_s']:.4f} s, "
            f"{row['elements_per_s']:.3g} elements/s, busbw {row['busbw_GBps']:.3f} GB/s, "
            f"CPU {row.get('cpu_s_per_gib', row['cpu_lifetime_s_per_gib']):.2f} s/GiB"
            + (f" (hosts {row['cpu_hosts_s_per_gib']:.2f})" if "retransmitted" in r else "")
            + (f"; network softirq charged to no process of the run {uncharged_ms:.0f} ms per "
               f"all-reduce" if uncharged_ms is not None else ""))
        return row

    def start_audit(self, tag):
        path = os.path.join(self.logs, f"{tag}-perf.data")
        p = subprocess.Popen(["perf", "record", "-a", "-g", "-F", str(AUDIT_HZ), "-o", path],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        time.sleep(1)  # perf opens its per-CPU buffers before the run starts
        return p, path

    def stop_audit(self, audit, system):
        """Network softirq work charged to no process of the run, in CPU ms per all-reduce
        (warm-up included, like the switch's share), or None if perf failed."""
        p, path = audit
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
            text = subprocess.run(["perf", "script", "-i", path, "-F", "comm,pid,ip,sym"],
                                  capture_output=True, text=True, timeout=600).stdout
        except (subprocess.TimeoutExpired, OSError) as e:
            log(f"--audit-kernel: perf failed: {e}")
            if p.poll() is None:  # never left recording behind the next runs
                p.kill()
                p.wait()
            return None
        binary = {"gloo-ring": self.args.gloo, "gloo-hd": self.args.gloo}.get(
            system, self.args.mpi if system.startswith("mpi") else self.args.switchml)
        ours, uncharged = uncharged_net_samples(text, {os.path.basename(binary)[:15]})
        if ours == 0:
            log("--audit-kernel: no samples of the run's processes (perf record -a failed?)")
            return None
        os.remove(path)
        return uncharged * 1000.0 / AUDIT_HZ / (self.args.iterations + self.args.warmup)

    # --- Settings --------------------------------------------------------------------------------

    def rack_up(self, rate, workers, switch_hosts=0):
        a = self.args
        name = self.rack_name = f"smlbench{os.getpid()}"
        argv = [a.rack_script, "up", "--name", name, "--workers", str(workers), "--rate", rate,
                "--mtu", str(a.mtu), "--switch-hosts", str(switch_hosts)]
        argv += ["--bridge-netfilter", a.bridge_netfilter]
        if "switchml-xdp" in a.systems:
            # AF_XDP bypasses the sender's qdisc: every system of this run then has its uplink
            # shaped at the switch end, so that all cross the same cables.
            argv.append("--ingress-shaping")
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed (exit {p.returncode}): "
                               f"{p.stderr.strip()}", p.returncode)
        self.rack = {}
        for line in p.stdout.splitlines():
            k, _, v = line.partition("=")
            self.rack[k] = v.strip('"')
        log(f"rack {name}: {workers} workers, {switch_hosts} switch hosts, {rate} per cable "
            f"each way, MTU {a.mtu}, bridge netfilter {a.bridge_netfilter}")

    def rack_down(self):
        """Removes the rack, also one whose `up` was interrupted."""
        if self.rack_name is not None:
            subprocess.run([self.args.rack_script, "down", "--name", self.rack_name])
            self.rack = self.rack_name = None

    def run(self):
        a = self.args
        rows = []
        report = {
            "benchmark": "switchml vs Gloo vs Open MPI all-reduce (bench/bench.py)",
            "started": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z",
            "host": socket.gethostname(), "host_cpus": os.cpu_count(),
            "kernel": os.uname().release, "commit": git_commit(),
            "config": {k: v for k, v in vars(a).items() if k != "func"},
            "rows": rows,
        }
        failed = 0
        for setting in a.settings:
            try:
                server = setting.startswith("server-rack:")
                if is_rack(setting):
                    hosts = max(switch_hosts_for(k, n) for k in a.switch_hosts
                                for n in a.workers) if server else 0
                    try:
                        self.rack_up(setting.split(":", 1)[1], max(a.workers), hosts)
                    except RuntimeError as e:
                        log(f"SKIPPED setting {setting}: {e.args[0]}")
                        rows.append({"setting": setting, "error": f"skipped: {e.args[0]}"})
                        failed += 1
                        continue
                for n in a.workers:
                    for nbytes in a.sizes:
                        for system in [s for _ in range(a.rounds) for s in a.systems]:
                            if system in ("mpi-shm", "switchml-shm", "switchml-shm-unpinned") \
                                    and self.rack is not None:
                                continue  # shared memory would not cross the rack's cables
                            if system == "switchml-xdp" and self.rack is None:
                                continue  # AF_XDP needs an interface per process: rack only
                            if system in ("switchml-mcast", "switchml-unicast") and \
                                    self.rack is None:
                                continue  # on loopback switchml multicasts (auto or local)
                            if system.startswith("mpi") and not a.mpi:
                                rows.append({"setting": setting, "system": system, "workers": n,
                                             "bytes": nbytes, "error": "mpi_allreduce not built"})
                                continue
                            if server and system.startswith("switchml") and system != "switchml":
                                continue  # the server rack measures plain switchml, per k
                            ks = sorted({switch_hosts_for(k, n) for k in a.switch_hosts}) \
                                if server and system == "switchml" else [0]
                            for k in ks:
                                row = self.measure(setting, system, n, nbytes, k)
                                failed += "error" in row
                                rows.append(row)
                                write_outputs(report, a.out, a.docs_dir, plots=False)
            finally:
                self.rack_down()
        write_outputs(report, a.out, a.docs_dir, plots=True)
        return 1 if failed else 0


def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


# --- Output --------------------------------------------------------------------------------------


def markdown(report):
    rows = report["rows"]
    lines = [f"Commit {report['commit']}, {report['host_cpus']} CPUs, kernel {report['kernel']}, "
             f"{report['started']}. Median and p99 over {report['config']['iterations']} "
             f"iterations after {report['config']['warmup']} warm-up (per iteration the slowest "
             f"rank); every result verified. algbw = bytes / median; busbw = algbw 2(n-1)/n "
             f"(GB/s = 1e9 bytes/s). CPU = CPU seconds of all processes per GiB reduced, in the "
             f"timed all-reduces, or (*) over the processes' whole life. See docs/benchmarks.md.",
             ""]
    loads = [r["loadavg_1m"] for r in rows if "loadavg_1m" in r]
    if loads:
        lines[0] += (f" 1-minute load average when each run started: {min(loads):.1f} to "
                     f"{max(loads):.1f} on {report['host_cpus']} CPUs (above the CPU count, "
                     f"other work shared the cores and every figure is skewed).")
    settings = []
    for r in rows:
        if r["setting"] not in settings:
            settings.append(r["setting"])
    for setting in settings:
        lines += [f"### {setting_title(setting)}", "",
                  "| workers | size | system | median s | p99 s | elements/s | algbw GB/s | "
                  "busbw GB/s | x link limit | CPU s/GiB | hosts CPU s/GiB | switchml speedup |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        # The speed-up's reference: switchml (on the server rack, on the most switch hosts).
        ref = {}
        for r in sorted((r for r in rows if r["setting"] == setting
                         and r.get("system") == "switchml" and "median_s" in r),
                        key=lambda r: r.get("switch_hosts", 0)):
            ref[(r["workers"], r["bytes"])] = r["median_s"]
        for r in rows:
            if r["setting"] != setting or "system" not in r:
                continue
            label = r["system"] + (f" (k={r['switch_hosts']})" if r.get("switch_hosts") else "")
            head = f"| {r['workers']} | {size_label(r['bytes'])} | {label} |"
            if "error" in r:
                lines.append(head + f" failed: {r['error'].splitlines()[0][:80]}" + " |" * 9)
                continue
            cpu = (f"{r['cpu_s_per_gib']:.2f}" if "cpu_s_per_gib" in r
                   else f"{r['cpu_lifetime_s_per_gib']:.2f}*")
            hosts = f"{r['cpu_hosts_s_per_gib']:.2f}" if "cpu_hosts_s_per_gib" in r else ""
            sw = ref.get((r["workers"], r["bytes"]))
            vs = f"{r['median_s'] / sw:.2f}" if sw else ""
            limit = link_limit_s(setting, r["system"], r["workers"], r["bytes"],
                                 r.get("switch_hosts", 0))
            link = f"{r['median_s'] / limit:.2f}" if limit else ""
            lines.append(head + f" {r['median_s']:.4f} | {r['p99_s']:.4f} | "
                         f"{r['elements_per_s']:.3g} | {r['algbw_GBps']:.3f} | "
                         f"{r['busbw_GBps']:.3f} | {link} | {cpu} | {hosts} | {vs} |")
        audited = [r for r in rows if r["setting"] == setting
                   and "uncharged_net_ms_per_allreduce" in r]
        if audited:
            lines += ["", "Network softirq work charged to no process of the run (--audit-kernel: "
                      "perf record -a, samples with net_rx_action or net_tx_action in their call "
                      "chain that ran in another task or the idle task), CPU ms per all-reduce: "
                      + "; ".join(f"{r['workers']} workers {size_label(r['bytes'])} "
                                  f"{r['system']} {r['uncharged_net_ms_per_allreduce']:.0f}"
                                  for r in audited) + ". Not in CPU s/GiB, which counts the "
                      "processes' own CPU."]
        skipped = [r for r in rows if r["setting"] == setting and "system" not in r]
        lines += [f"{r['error']}" for r in skipped]
        lines.append("")
    lines.append("switchml speedup = this system's median time / switchml's (> 1: switchml is "
                 "faster; on the server rack, switchml on the most switch hosts k measured). "
                 "x link limit (rack) = median / the least time the cables allow: "
                 "tensor bytes x (1 + 10/1024) / rate for switchml (x n/k on the server rack "
                 "when k < n: each switch host's cable carries n/k tensors), tensor bytes x "
                 "2(n-1)/n / rate for the others. hosts CPU = the same CPU without the switch process "
                 "(the workers' hosts only; in the real design the switch is the rack's hardware): "
                 "a second figure, not a replacement; for Gloo and MPI every process is a host.")
    return "\n".join(lines) + "\n"


def setting_title(setting):
    if setting == "loopback":
        return "Loopback (every process on this host, 127.0.0.1)"
    if setting.startswith("server-rack:"):
        return (f"Server rack at {setting.split(':', 1)[1]} per cable each way (scripts/rack.sh "
                f"--switch-hosts: one namespace per worker, the switches on k servers, each "
                f"behind its own cable; the job striped over them)")
    return (f"Emulated rack at {setting.split(':', 1)[1]} per cable each way "
            f"(scripts/rack.sh: one namespace per worker, the switch on the bridge)")


def plot(report, path_prefix):
    """One PNG per setting: median time and elements/s against size, one line per system,
    one column per worker count. Returns the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if "median_s" in r]
    written = []
    for setting in sorted({r["setting"] for r in rows}):
        sub = [r for r in rows if r["setting"] == setting]
        workers = sorted({r["workers"] for r in sub})
        fig, axes = plt.subplots(2, len(workers), figsize=(5.5 * len(workers), 8), squeeze=False)
        for col, n in enumerate(workers):
            lines_of = sorted({(r["system"], r.get("switch_hosts", 0)) for r in sub
                               if r["workers"] == n},
                              key=lambda sk: (SYSTEMS.index(sk[0]), sk[1]))
            for system, k in lines_of:
                pts = sorted((r["bytes"], r["median_s"], r["elements_per_s"]) for r in sub
                             if r["workers"] == n and r["system"] == system
                             and r.get("switch_hosts", 0) == k)
                x = [p[0] / (1 << 20) for p in pts]
                style = {"marker": "o", "linewidth": 2.5 if system == "switchml" else 1.5}
                label = system + (f" (k={k})" if k else "")
                axes[0][col].plot(x, [p[1] for p in pts], label=label, **style)
                axes[1][col].plot(x, [p[2] for p in pts], label=label, **style)
            sizes = sorted({r["bytes"] / (1 << 20) for r in sub if r["workers"] == n})
            for row, ylabel in ((0, "median time per all-reduce (s)"), (1, "elements/s")):
                ax = axes[row][col]
                ax.set_xscale("log", base=2)
                ax.set_xticks(sizes, [f"{s:g}" for s in sizes])
                ax.minorticks_off()
                ax.set_yscale("log")
                ax.set_xlabel("tensor size (MiB, float32)" if report["config"]["dtype"] ==
                              "float32" else "tensor size (MiB, int32)")
                ax.set_ylabel(ylabel)
                ax.set_title(f"{n} workers")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=8)
        fig.suptitle(setting_title(setting) + f" - commit {report['commit']}", fontsize=10)
        fig.tight_layout()
        path = f"{path_prefix}-{setting.replace(':', '-')}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def write_outputs(report, out_dir, docs_dir, plots):
    for name, text in (("bench.json", json.dumps(report, indent=1) + "\n"),
                       ("bench.md", markdown(report))):
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out_dir, name))
    if not plots:
        return
    files = [os.path.join(out_dir, "bench.json"), os.path.join(out_dir, "bench.md")]
    try:
        files += plot(report, os.path.join(out_dir, "bench"))
    except ImportError as e:
        log(f"no plots: {e} (apt-get install python3-matplotlib)")
    outputs.publish(files, docs_dir, log)


# --- Command line --------------------------------------------------------------------------------


def main():
    build = os.environ.get("BENCH_BUILD_DIR", os.path.join(REPO, "build-bench"))
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " See docs/benchmarks.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--settings", default="loopback,rack:1gbit",
                   help="comma-separated: loopback, rack:RATE (the switch on the bridge, e.g. "
                   "rack:1gbit, rack:10gbit) and/or server-rack:RATE (the switches on servers "
                   "behind cables of their own, the job striped over --switch-hosts of them)")
    p.add_argument("--switch-hosts", default="n",
                   help="server-rack only: comma-separated switch host counts k to measure "
                   "switchml on, each a number or n (as many as the workers)")
    p.add_argument("--workers", default="2,4", help="comma-separated worker counts")
    p.add_argument("--sizes", default="1M,4M,16M,64M,256M",
                   help="comma-separated tensor sizes in bytes (K, M, G = 2^10, 2^20, 2^30)")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help="comma-separated subset of " + ", ".join(SYSTEMS))
    p.add_argument("--dtype", default="float32", choices=["float32", "int32"])
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every system this many times per worker count and size, "
                   "interleaved (one row each), for A/B comparisons on a busy host")
    p.add_argument("--iterations", type=int, default=5, help="timed all-reduces per run")
    p.add_argument("--warmup", type=int, default=1, help="untimed all-reduces before them")
    p.add_argument("--mtu", type=int, default=9000, help="MTU of the rack's interfaces")
    p.add_argument("--bridge-netfilter", choices=["on", "off"], default="off",
                   help="whether the rack's bridge runs the switch namespace's netfilter hooks on "
                        "bridged packets (scripts/rack.sh --bridge-netfilter; a switch ASIC "
                        "does not)")
    p.add_argument("--run-timeout", type=int, default=900, help="seconds before a run is killed")
    p.add_argument("--switchml-args", default="",
                   help="extra flags for every `switchml worker`, e.g. '--window 512'")
    p.add_argument("--switch-args", default="",
                   help="extra flags for the `switchml switch` of every switchml run, e.g. "
                        "'--threads 2'")
    p.add_argument("--out", default=os.path.join(build, "bench-results"),
                   help="results directory (bench.json, bench.md, bench-*.png, logs/)")
    p.add_argument("--docs-dir", default="",
                   help="also copy the JSON, table and plots here (e.g. docs/bench)")
    p.add_argument("--switchml", default=os.path.join(build, "tools", "switchml"),
                   help="the switchml binary")
    p.add_argument("--gloo", default=os.path.join(build, "bench", "gloo_allreduce"),
                   help="the Gloo baseline's binary")
    p.add_argument("--mpi", default=os.path.join(build, "bench", "mpi_allreduce"),
                   help="the MPI baseline's binary (the MPI rows are left out without it)")
    p.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun",
                   help="Open MPI's launcher")
    p.add_argument("--rack-script", default=os.path.join(REPO, "scripts", "rack.sh"),
                   help="the emulated rack's script")
    p.add_argument("--audit-kernel", action="store_true",
                   help="record every run with `perf record -a` (root) and report the network "
                   "softirq work the kernel charged to no process of the run (another task or the "
                   "idle task): a separate figure, not in CPU s/GiB; perf's sampling adds load")
    p.add_argument("--ddp", default="", metavar="MODELS",
                   help="instead of the all-reduces: DDP training steps of these DNN-shaped "
                   "models (comma-separated: " + ", ".join(ddp_steps.MODELS) + "), gloo against "
                   "switchml, in every setting and at every worker count (the examples' "
                   "host_train.sh and rack_train.sh; --sizes and --systems do not apply). Writes "
                   "ddp.json, ddp.md and ddp.png; needs the torch backend in the build")
    p.add_argument("--ddp-steps", type=int, default=10,
                   help="with --ddp: timed steps per run (after 3 of warm-up)")
    p.add_argument("--replot", metavar="JSON", help="only redraw table and plots from a JSON")
    p.add_argument("--check-args", action="store_true",
                   help="only check the other flags (not the executables) and exit: 0 when "
                   "they are good, 2 naming the bad one (scripts/bench.sh does this before it "
                   "installs or builds anything)")
    a = p.parse_args()

    a.out = os.path.abspath(a.out)
    if a.replot and not a.check_args:
        os.makedirs(a.out, exist_ok=True)
        with open(a.replot) as f:
            write_outputs(json.load(f), a.out, a.docs_dir, plots=True)
        return 0
    try:
        a.settings = [s for s in a.settings.split(",") if s]
        a.workers = [int(w) for w in a.workers.split(",") if w]
        a.sizes = [parse_size(s) for s in a.sizes.split(",") if s]
        a.systems = [s for s in a.systems.split(",") if s]
    except (ValueError, argparse.ArgumentTypeError) as e:
        p.error(str(e))
    for s in a.settings:
        if s != "loopback" and not re.fullmatch(r"(server-)?rack:\d+[kmg]?bit", s):
            p.error(f"--settings: '{s}' is neither loopback, rack:RATE nor server-rack:RATE "
                    "(e.g. rack:1gbit)")
    a.switch_hosts = [k for k in a.switch_hosts.split(",") if k]
    for k in a.switch_hosts:
        if k != "n" and not (k.isdigit() and 1 <= int(k) <= 64):
            p.error(f"--switch-hosts: '{k}' is neither a number in 1..64 nor n")
    if not a.switch_hosts:
        p.error("--switch-hosts needs at least one entry")
    if any(not 1 <= n <= 64 for n in a.workers):
        p.error("--workers must be in 1..64")
    if any(s % 4 or s < 4 for s in a.sizes):
        p.error("--sizes must be positive multiples of 4 bytes")
    for s in a.systems:
        if s not in SYSTEMS:
            p.error(f"--systems: unknown '{s}' (choose from {', '.join(SYSTEMS)})")
    if a.iterations < 1 or a.warmup < 0:
        p.error("--iterations must be at least 1 and --warmup at least 0")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if a.run_timeout < 1:
        p.error("--run-timeout must be at least 1 second")
    if not 576 <= a.mtu <= 65000:
        p.error("--mtu must be in 576..65000 (scripts/rack.sh --mtu)")
    a.ddp = [m for m in a.ddp.split(",") if m]
    for m in a.ddp:
        if m not in ddp_steps.MODELS:
            p.error(f"--ddp: unknown model '{m}' (choose from {', '.join(ddp_steps.MODELS)})")
    if a.ddp_steps < 1:
        p.error("--ddp-steps must be at least 1")
    if a.check_args:
        return 0
    if a.ddp:
        if (why := ddp_steps.check(build)) is not None:
            p.error(why)
        os.makedirs(a.out, exist_ok=True)
        return ddp_steps.run(a, build, git_commit())
    for what in ("switchml", "gloo"):
        if not os.access(getattr(a, what), os.X_OK):
            p.error(f"no executable {getattr(a, what)} (scripts/bench.sh builds it)")
    if any(s.startswith("mpi") for s in a.systems) and not (
            os.access(a.mpi, os.X_OK) and shutil.which(a.mpirun)):
        log(f"no {a.mpi} or mpirun: the MPI rows are left out (apt-get install libopenmpi-dev "
            "openmpi-bin, then rebuild)")
        a.mpi = ""
    os.makedirs(a.out, exist_ok=True)  # after the checks: a refused run leaves nothing behind

    bench = Bench(a)

    def interrupted(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    try:
        return bench.run()
    except Interrupted as e:
        log(f"interrupted ({e}); stopping every process and removing the rack")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        bench.runner.kill_all()
        bench.rack_down()


if __name__ == "__main__":
    sys.exit(main())
