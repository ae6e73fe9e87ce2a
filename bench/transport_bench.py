#!/usr/bin/python3
"""switchml's data-plane transports side by side: packets and elements per core, the software
switch against a do-nothing DPDK forwarder, and all-reduces over each transport (issue 9).

Sections (--sections, default rates,run):

  rates  One load generator thread (switchml_transport_bench gen: a 1-worker job with --window
         packets of 256 int32 in flight, each reply answered at once by the slot's next packet)
         against one server, the server pinned to CPU 0 and the generator to CPU 1:
           - fwd:          a do-nothing DPDK forwarder (memif server echoing every frame with
                           addresses swapped, polling without pause);
           - dpdk:         the switch over DPDK memif, polling without pause (--busy-poll);
           - dpdk-adaptive the switch over DPDK memif waiting its default way (doorbells);
           - xdp, udp, udp-plain: the switch over AF_XDP, kernel UDP with GSO/GRO and plain
                           kernel UDP, polling (--busy-poll), across a veth pair between two
                           network namespaces (server 10.98.0.1, generator 10.98.0.2; needs root).
         memif runs in the host's namespace (shared memory, no kernel on the path).
  run    `switchml run --transport dpdk|udp --workers 2|4`: the switch and the worker processes
         of one host (memif / loopback), aggregated elements/s (median all-reduce) and the CPU
         time of the whole process tree (switch and workers, from wait4); --run-transports
         (default dpdk,dpdk-naps,udp: dpdk-naps is memif with SWITCHML_DPDK_DOORBELL=off; also
         udp-plain and shm, the shared-memory transport); --run-rounds N interleaves N rounds of them and reports the run of median
         elements/s.
  rack   Verified all-reduces on an emulated rack (scripts/rack.sh: the switch on a bridge, each
         worker in a namespace behind a veth pair; --rack-rate none = unshaped, or e.g. 1gbit
         with ingress shaping), over kernel UDP and AF_XDP (--rack-transports), the switch pinned
         to CPU 0 and the workers to CPU 1.

Per core, precisely: a process's packets (datagrams received + sent by it) and elements (256
per aggregated datagram: every request the switch answers; every result the worker takes) over
the same interval, divided by that process's CPU time (user + system, all threads) in that
interval: for a server, from /proc/<pid>/stat at the start and the end of the generator's
measured interval (rates) or from wait4 over its life (rack); for the generator, from its own
getrusage (rates); for a rack worker, its CPU time per timed all-reduce (getrusage). Kernel work
done in softirq context is charged to whichever process the CPU was running (on veth mostly the
sender), so the columns "pair" (round trips per CPU-second of server + generator together) is
the figure least sensitive to where the kernel charged its work. A process that polls without
pause uses its whole core, so its per-core figure is its rate. All rates are medians over
--runs runs.

Output: Markdown on stdout (and --md FILE), everything in --json FILE. Needs a build with
switchml and switchml_transport_bench (DPDK and AF_XDP rows are reported as failed, with the
reason, where the build or the machine lacks them). Run with /usr/bin/python3, as root for the
namespaces and AF_XDP. Example (about 2.5 minutes):
  flock /work/notes/bench.lock bench/transport_bench.py --json /tmp/tb.json --md /tmp/tb.md
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
ELEMENTS_PER_PACKET = 256
SERVER_CPU, GEN_CPU = "0", "1"
NS_IP = {"a": "10.98.0.1", "b": "10.98.0.2"}
EAL = "--no-huge --no-pci --no-shconf -m 512 --no-telemetry --log-level=*:error"


def log(msg):
    print(f"[transport_bench] {msg}", file=sys.stderr, flush=True)


def parse_size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: '{text}' (e.g. 1M, 4M)")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def median(values):
    v = sorted(values)
    n = len(v)
    if n == 0:
        return 0.0
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def field(line, name):
    m = re.search(rf"\b{name}=(\S+)", line)
    return m.group(1) if m else None


def cpu_seconds(pid):
    """User + system CPU time of every thread of a running process."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / TICK  # fields 14 and 15 of proc(5)


def load_average():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def wait_for(path, pattern, proc, seconds):
    """Waits until the log file has `pattern`; returns its match or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(path) as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(path, n=300):
    with open(path) as f:
        return f.read().strip()[-n:]


# ------------------------------------------------------------------------------------------------
# rates

class Namespaces:
    """Two namespaces joined by a veth pair: a (server) and b (generator)."""

    def __init__(self, tag):
        self.names = {k: f"{tag}-{k}" for k in "ab"}
        self.ok = False
        self.error = ""

    def __enter__(self):
        cmds = [["ip", "netns", "add", self.names["a"]], ["ip", "netns", "add", self.names["b"]],
                ["ip", "link", "add", "tbva", "netns", self.names["a"], "type", "veth", "peer",
                 "name", "tbvb", "netns", self.names["b"]]]
        for k in "ab":
            ns, dev = self.names[k], f"tbv{k}"
            cmds += [["ip", "-n", ns, "addr", "add", f"{NS_IP[k]}/24", "dev", dev],
                     ["ip", "-n", ns, "link", "set", dev, "up"],
                     ["ip", "-n", ns, "link", "set", "lo", "up"]]
        for c in cmds:
            r = subprocess.run(c, capture_output=True, text=True)
            if r.returncode != 0:
                self.error = f"{' '.join(c)}: {r.stderr.strip()}"
                return self
        self.ok = True
        return self

    def __exit__(self, *exc):
        for ns in self.names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def prefix(self, k):
        return ["ip", "netns", "exec", self.names[k]] if k else []


def rates_once(a, row, ns, port, tag):
    """One generator run against one server: a dict of figures or {'error': ...}."""
    kind, server_kind = row["gen"], row["server"]
    local = server_kind == "fwd" or kind == "dpdk"
    sp, gp = ([], []) if local else (ns.prefix("a"), ns.prefix("b"))
    server_ip, gen_ip = ("127.0.0.1", "127.0.0.1") if local else (NS_IP["a"], NS_IP["b"])
    slog = f"{a.logs}/{tag}-server.log"
    if server_kind == "fwd":
        argv = [a.bench, "fwd", "--port", str(port), "--seconds", str(a.seconds + 30)]
        ready = r"fwd: ready"
    else:
        argv = [a.switchml, "switch", "--transport", kind, "--bind", server_ip, "--data-port",
                str(port), "--control-port", "0", "--log-level", "info"] + row["flags"]
        ready = r"control port (\d+)"
    with open(slog, "w") as out:
        server = subprocess.Popen(sp + ["taskset", "-c", SERVER_CPU] + argv, stdout=out,
                                  stderr=subprocess.STDOUT)
    gen = None
    try:
        m = wait_for(slog, ready, server, 30)
        if not m:
            return {"error": "the server did not start: " + tail(slog)}
        gargv = [a.bench, "gen", "--kind", kind, "--data", f"{server_ip}:{port}", "--bind", gen_ip,
                 "--seconds", str(a.seconds), "--window", str(a.window)]
        if server_kind != "fwd":
            gargv += ["--control", f"{server_ip}:{m.group(1)}"]
        gen = subprocess.Popen(gp + ["taskset", "-c", GEN_CPU] + gargv, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        c0 = t0 = c1 = t1 = None
        result = ""
        # The server's CPU over the generator's measured interval: from its "measuring" line to
        # its rates line (printed as the interval ends), not to its exit, which comes after it
        # has closed its transport and job.
        for line in gen.stdout:
            if line.startswith("measuring"):
                c0, t0 = cpu_seconds(server.pid), time.monotonic()
            elif line.startswith("pps="):
                c1, t1 = cpu_seconds(server.pid), time.monotonic()
                result = line
        gen.wait()
        if gen.returncode != 0 or not result or c0 is None:
            return {"error": f"generator failed (exit {gen.returncode}): "
                             f"{gen.stderr.read().strip()[-300:]}"}
    finally:
        if gen is not None:  # still running if this run was interrupted
            stop(gen)
        stop(server)
    pps = float(field(result, "pps"))  # round trips (replies) per second
    server_cores = (c1 - c0) / (t1 - t0)
    gen_cores = float(field(result, "gen_cpu"))
    per = lambda cores: 2 * pps / cores if cores > 0 else 0.0  # datagrams in + out
    return {
        "round_trips_per_s": pps,
        "elements_per_s": pps * ELEMENTS_PER_PACKET,
        "server_cores": server_cores,
        "gen_cores": gen_cores,
        "server_pps_per_core": per(server_cores),
        "server_elements_per_core_s": pps * ELEMENTS_PER_PACKET / server_cores
        if server_cores > 0 else 0.0,
        "gen_pps_per_core": per(gen_cores),
        "gen_elements_per_core_s": pps * ELEMENTS_PER_PACKET / gen_cores if gen_cores > 0 else 0.0,
        "pair_round_trips_per_core_s": pps / (server_cores + gen_cores)
        if server_cores + gen_cores > 0 else 0.0,
        "transport": result.split("transport=", 1)[1].strip() if "transport=" in result else "",
    }


RATE_ROWS = {
    "fwd": {"label": "do-nothing DPDK forwarder (memif, polling)", "gen": "dpdk", "server": "fwd",
            "flags": []},
    "dpdk": {"label": "switch, DPDK memif (polling)", "gen": "dpdk", "server": "switch",
             "flags": ["--busy-poll"]},
    "dpdk-adaptive": {"label": "switch, DPDK memif (doorbells: sleeps until rung)", "gen": "dpdk",
                      "server": "switch", "flags": []},
    "xdp": {"label": "switch, AF_XDP on veth (polling)", "gen": "xdp", "server": "switch",
            "flags": ["--busy-poll"]},
    "udp": {"label": "switch, kernel UDP GSO/GRO on veth (polling)", "gen": "udp",
            "server": "switch", "flags": ["--busy-poll"]},
    "udp-plain": {"label": "switch, plain kernel UDP on veth (polling)", "gen": "udp-plain",
                  "server": "switch", "flags": ["--busy-poll"]},
}


def section_rates(a, out):
    # Runs are interleaved (run 0 of every row, then run 1, ...), so that a change of the machine's
    # load during the benchmark falls on every row alike.
    names = a.rows.split(",")
    runs = {n: [] for n in names}
    errors = {}
    with Namespaces(f"smltb{os.getpid()}") as ns:
        if not ns.ok:
            log(f"namespaces: {ns.error}: the kernel rows will fail")
        port = 47100
        for i in range(a.runs):
            for name in names:
                row = RATE_ROWS[name]
                if name in errors:
                    continue
                port += 1  # a fresh port per run: no stale memif socket or lock in the way
                if row["server"] != "fwd" and row["gen"] != "dpdk" and not ns.ok:
                    errors[name] = "no namespaces: " + ns.error
                    continue
                r = rates_once(a, row, ns, port, f"rates-{name}-{i}")
                if "error" in r:
                    errors[name] = r["error"]
                    log(f"rates {name} run {i}: {r['error']}")
                    continue
                log(f"rates {name} run {i}: {r['round_trips_per_s']:.0f} round trips/s, server "
                    f"{r['server_cores']:.2f} cores, generator {r['gen_cores']:.2f} cores")
                runs[name].append(r)
    rows = {}
    for name in names:
        label = RATE_ROWS[name]["label"]
        if not runs[name]:
            rows[name] = {"label": label, "error": errors.get(name, "no run")}
            continue
        rs = runs[name]
        rows[name] = {k: median([x[k] for x in rs]) for k in rs[0] if isinstance(rs[0][k], float)}
        rows[name].update(label=label, runs=len(rs), all=rs)
    out["rates"] = rows
    fwd, sw = rows.get("fwd", {}), rows.get("dpdk", {})
    plain = rows.get("udp-plain", {})
    ratios = {}
    if "round_trips_per_s" in fwd and "round_trips_per_s" in sw:
        ratios["switch_over_forwarder"] = sw["round_trips_per_s"] / fwd["round_trips_per_s"]
        # Also the median of the ratios of runs made one after the other.
        pairs = zip(fwd["all"], sw["all"])
        ratios["switch_over_forwarder_paired"] = median(
            [s_["round_trips_per_s"] / f["round_trips_per_s"] for f, s_ in pairs
             if f["round_trips_per_s"] > 0])
    if "server_pps_per_core" in sw and plain.get("server_pps_per_core"):
        ratios["dpdk_over_udp_plain_switch_core"] = (sw["server_pps_per_core"] /
                                                     plain["server_pps_per_core"])
    if "gen_pps_per_core" in sw and plain.get("gen_pps_per_core"):
        ratios["dpdk_over_udp_plain_worker_core"] = (sw["gen_pps_per_core"] /
                                                     plain["gen_pps_per_core"])
    out["ratios"] = ratios


def markdown_rates(a, out):
    lines = [f"### Packet rates: one generator thread, window {a.window}, {a.seconds} s x "
             f"{a.runs} runs (median); server on CPU {SERVER_CPU}, generator on CPU {GEN_CPU}", "",
             "| server | round trips/s | server cores | switch Mpps/core | switch Melem/s/core | "
             "worker Mpps/core | worker Melem/s/core | pair round trips/CPU-s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in out["rates"].items():
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error'][:120]} | | | | | | |")
            continue
        lines.append(
            f"| {r['label']} | {r['round_trips_per_s']:,.0f} | {r['server_cores']:.2f} | "
            f"{r['server_pps_per_core'] / 1e6:.3f} | {r['server_elements_per_core_s'] / 1e6:.1f} | "
            f"{r['gen_pps_per_core'] / 1e6:.3f} | {r['gen_elements_per_core_s'] / 1e6:.1f} | "
            f"{r['pair_round_trips_per_core_s']:,.0f} |")
    rt = out.get("ratios", {})
    lines.append("")
    if "switch_over_forwarder" in rt:
        lines.append(f"- switch over memif / do-nothing forwarder (round trips/s, both polling): "
                     f"**{rt['switch_over_forwarder']:.2f}** (target >= 0.80; median of the "
                     f"ratios of runs made back to back: "
                     f"{rt.get('switch_over_forwarder_paired', 0):.2f})")
    if "dpdk_over_udp_plain_switch_core" in rt:
        lines.append(f"- DPDK / plain kernel UDP, packets per switch core: "
                     f"**{rt['dpdk_over_udp_plain_switch_core']:.2f}** (target >= 4)")
    if "dpdk_over_udp_plain_worker_core" in rt:
        lines.append(f"- DPDK / plain kernel UDP, packets per worker core: "
                     f"**{rt['dpdk_over_udp_plain_worker_core']:.2f}** (target >= 4)")
    return lines


# ------------------------------------------------------------------------------------------------
# run

# `run` transports: the name in the tables -> (--transport, extra environment).
RUN_KINDS = {
    "dpdk": ("dpdk", {}),
    "dpdk-naps": ("dpdk", {"SWITCHML_DPDK_DOORBELL": "off"}),  # memif without doorbells
    "udp": ("udp", {}),
    "udp-plain": ("udp-plain", {}),
    "shm": ("shm", {}),  # shared-memory rings (transport/shm.h)
}


def run_with_cpu(argv, timeout, env=None):
    """Runs argv, returning (exit code, output, CPU seconds of its process tree)."""
    before = os.times()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, **(env or {})))
    text = ""
    try:
        text, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: `switchml run` then stops its switch and workers (SIGKILL would leave
        # them running, holding the output pipe open).
        stop(p)
        try:
            text, _ = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass  # something it started still holds the pipe: give up its output
    finally:
        stop(p)  # interrupted: not left running
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system -
                                                           before.children_system)
    return p.returncode, text, cpu


def section_run_cpu(a, out):
    # Rounds interleave the transports (round 0 of each, then round 1, ...), so that a change of
    # the machine's load falls on each alike; the row is the run of median elements/s.
    runs = {}
    for _ in range(a.run_rounds):
        for workers in a.run_workers:
            for kind in a.run_transports.split(","):
                runs.setdefault((workers, kind), []).append(run_once(a, workers, kind))
    rows = []
    for (workers, kind), rs in runs.items():
        ok = sorted((r for r in rs if "error" not in r), key=lambda r: r["elements_per_s"])
        row = ok[len(ok) // 2] if ok else rs[0]
        row["rounds"] = len(ok)
        row["all_elements_per_s"] = [r["elements_per_s"] for r in ok]
        rows.append(row)
    out["run"] = rows


def run_once(a, workers, kind):
    """One `switchml run`: a row of figures, or one with 'error'."""
    if kind not in RUN_KINDS:
        return {"workers": workers, "transport": kind,
                "error": f"unknown --run-transports entry {kind} (one of {', '.join(RUN_KINDS)})"}
    transport, env = RUN_KINDS[kind]
    argv = [a.switchml, "run", "--transport", transport, "--workers", str(workers), "--size",
            str(a.size // 4), "--iterations", str(a.iterations), "--warmup", "1"]
    code, text, cpu = run_with_cpu(argv, a.timeout, env)
    row = {"workers": workers, "transport": kind, "cpu_s": cpu}
    m = re.search(r"aggregated elements/s:\s+(\S+)", text)
    t = re.search(r"aggregation time \(median of \d+\): (\S+) s", text)
    w = re.search(r"wall time:\s+(\S+) s", text)
    rt = re.search(r"retransmissions:\s+(\d+)", text)
    if code != 0 or not m:
        row["error"] = f"exit {code}: {text.strip()[-300:]}"
        log(f"run {kind} {workers} workers: {row['error']}")
        return row
    row["elements_per_s"] = float(m.group(1))
    row["median_s"] = float(t.group(1)) if t else 0.0
    row["wall_s"] = float(w.group(1)) if w else 0.0
    row["retransmitted"] = int(rt.group(1)) if rt else 0
    log(f"run {kind} {workers} workers: {row['elements_per_s']:.3g} elements/s, {cpu:.2f} CPU-s, "
        f"load {os.getloadavg()[0]:.1f}")
    return row


def markdown_run(a, out):
    lines = [f"### `switchml run` on this host: {a.size >> 20} MiB float32, {a.iterations} timed "
             f"all-reduces after 1 (median); the median of {a.run_rounds} interleaved rounds", "",
             "| workers | transport | aggregated elements/s | median all-reduce s | "
             "CPU-s of the run (switch + workers) | retransmitted |", "|---:|---|---:|---:|---:|---:|"]
    by = {}
    for r in out["run"]:
        if "error" in r:
            lines.append(f"| {r['workers']} | {r['transport']} | failed: {r['error'][:100]} | | | |")
            continue
        by[(r["workers"], r["transport"])] = r
        lines.append(f"| {r['workers']} | {r['transport']} | {r['elements_per_s']:.3g} | "
                     f"{r['median_s']:.4f} | {r['cpu_s']:.2f} | {r['retransmitted']} |")
    lines.append("")
    for w in a.run_workers:
        for kind, what in (("dpdk", "memif"), ("dpdk-naps", "memif without doorbells")):
            if (w, kind) in by and (w, "udp") in by:
                lines.append(f"- {w} workers: {what} / kernel UDP elements/s = "
                             f"**{by[(w, kind)]['elements_per_s'] / by[(w, 'udp')]['elements_per_s']:.2f}**")
    return lines


# ------------------------------------------------------------------------------------------------
# rack

def rack_once(a, rack, transport, tag):
    elements = a.size // 4
    ips = rack["RACK_WORKER_IPS"].split()
    slog = f"{a.logs}/{tag}-switch.log"
    with open(slog, "w") as out:
        switch = subprocess.Popen(
            ["ip", "netns", "exec", rack["RACK_SWITCH_NS"], "taskset", "-c", SERVER_CPU,
             a.switchml, "switch", "--bind", rack["RACK_SWITCH_IP"], "--data-port", "48864",
             "--control-port", "50099", "--transport", transport, "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT)
    usage = None
    workers = []
    try:
        if not wait_for(slog, r"control port", switch, 15):
            return {"error": "the switch did not start: " + tail(slog)}
        for r in range(a.rack_workers):
            wlog = f"{a.logs}/{tag}-w{r}.log"
            with open(wlog, "w") as wout:
                argv = ["ip", "netns", "exec", f"{rack['RACK_NAME']}-w{r}", "taskset", "-c",
                        GEN_CPU, a.switchml, "worker", "--switch",
                        f"{rack['RACK_SWITCH_IP']}:50099", "--bind", ips[r], "--rank", str(r),
                        "--workers", str(a.rack_workers), "--session", "1", "--size",
                        str(elements), "--dtype", "float32", "--iterations", str(a.iterations),
                        "--warmup", "1", "--transport", transport, "--setup-timeout-ms", "30000",
                        "--report", "--quiet"]
                workers.append((subprocess.Popen(argv, stdout=wout, stderr=subprocess.STDOUT),
                                wlog))
        results = []
        for p, wlog in workers:
            try:
                p.wait(timeout=a.timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                return {"error": "a worker took over --timeout seconds"}
            text = open(wlog).read()
            line = next((l for l in text.splitlines() if l.startswith("SWITCHML_RESULT")), "")
            if p.returncode != 0 or "status=ok verified=1" not in line:
                return {"error": f"worker failed (exit {p.returncode}): {text.strip()[-300:]}"}
            results.append(line)
    finally:
        # After a failed or timed-out worker (or an interrupt) the others are not left running
        # into the next run.
        for p, _ in workers:
            stop(p)
        if switch.returncode is None:  # not reaped yet: its resource usage is still there
            switch.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(switch.pid, 0)
            switch.returncode = os.waitstatus_to_exitcode(status)
    if usage is None:
        return {"error": "the switch exited early: " + tail(slog)}
    text = open(slog).read()
    m = re.search(r"daemon: received (\d+), sent (\d+)", text)
    if not m:
        return {"error": "no switch counters: " + tail(slog)}
    received, sent = int(m.group(1)), int(m.group(2))
    switch_cpu = usage.ru_utime + usage.ru_stime
    all_reduces = a.iterations + 1
    times = [float(x) for x in field(results[0], "times").split(",")]
    w_cpu = [median([float(x) for x in field(l, "cpu").split(",")]) for l in results]
    w_sent = [int(field(l, "sent")) / all_reduces for l in results]  # per all-reduce
    return {
        "switch_cpu_s": switch_cpu,
        "switch_pps_per_core": (received + sent) / switch_cpu,
        "switch_elements_per_core_s": a.rack_workers * elements * all_reduces / switch_cpu,
        # A worker receives one result per packet it sends.
        "worker_pps_per_core": median([2 * s / c for s, c in zip(w_sent, w_cpu)]),
        "worker_elements_per_core_s": median([elements / c for c in w_cpu]),
        "elements_per_s": elements / median(times),
        "retransmitted": float(sum(int(field(l, "retransmitted")) for l in results)),
    }


def section_rack(a, out):
    name = f"smltr{os.getpid()}"
    argv = [a.rack_script, "up", "--name", name, "--workers", str(a.rack_workers), "--rate",
            a.rack_rate, "--mtu", "9000"]
    if a.rack_rate != "none":
        argv.append("--ingress-shaping")  # AF_XDP bypasses the sender's qdisc
    rows = {}
    # From before `up`: an interrupted `up` (killed, so its own cleanup never ran) is removed too.
    try:
        up = subprocess.run(argv, capture_output=True, text=True)
        if up.returncode != 0:
            out["rack"] = {"error": f"the rack cannot be made here: {up.stderr.strip()[-300:]}"}
            log(out["rack"]["error"])
            return
        rack = {}
        for line in up.stdout.splitlines():
            k, _, v = line.partition("=")
            rack[k] = v.strip('"')
        for transport in a.rack_transports.split(","):
            runs, error = [], ""
            for i in range(a.rack_runs):
                r = rack_once(a, rack, transport, f"rack-{transport}-{i}")
                if "error" in r:
                    error = r["error"]
                    log(f"rack {transport} run {i}: {error}")
                    break
                log(f"rack {transport} run {i}: switch {r['switch_pps_per_core'] / 1e6:.3f} "
                    f"Mpps/core, worker {r['worker_pps_per_core'] / 1e6:.3f} Mpps/core, "
                    f"{r['elements_per_s']:.3g} elements/s")
                runs.append(r)
            if not runs:
                rows[transport] = {"error": error}
                continue
            rows[transport] = {k: median([x[k] for x in runs]) for k in runs[0]}
            rows[transport]["runs"] = len(runs)
    finally:
        subprocess.run([a.rack_script, "down", "--name", name], capture_output=True)
    out["rack"] = rows


def markdown_rack(a, out):
    rack = out["rack"]
    lines = [f"### Emulated rack ({'unshaped' if a.rack_rate == 'none' else a.rack_rate + ' cables'}"
             f"): {a.rack_workers} workers, {a.size >> 20} MiB float32, {a.iterations} timed "
             f"all-reduces after 1, median of {a.rack_runs} runs; switch on CPU {SERVER_CPU}, "
             f"workers on CPU {GEN_CPU}", ""]
    if "error" in rack:
        return lines + [f"failed: {rack['error']}"]
    lines += ["| transport | switch Mpps/core | switch Melem/s/core | worker Mpps/core | "
              "worker Melem/s/core | elements/s | retransmitted |", "|---|---:|---:|---:|---:|---:|---:|"]
    for t, r in rack.items():
        if "error" in r:
            lines.append(f"| {t} | failed: {r['error'][:120]} | | | | | |")
            continue
        lines.append(f"| {t} | {r['switch_pps_per_core'] / 1e6:.3f} | "
                     f"{r['switch_elements_per_core_s'] / 1e6:.1f} | "
                     f"{r['worker_pps_per_core'] / 1e6:.3f} | "
                     f"{r['worker_elements_per_core_s'] / 1e6:.1f} | {r['elements_per_s']:.3g} | "
                     f"{r['retransmitted']:.0f} |")
    if "xdp" in rack and "udp" in rack and "error" not in rack["xdp"] and "error" not in rack["udp"]:
        lines += ["", f"- AF_XDP / kernel UDP elements/s: "
                      f"**{rack['xdp']['elements_per_s'] / rack['udp']['elements_per_s']:.2f}**"]
    return lines


# ------------------------------------------------------------------------------------------------

# The kinds `switchml --transport` takes (src/transport/factory.cc), for --rack-transports.
TRANSPORT_KINDS = ("udp", "udp-plain", "xdp", "dpdk", "shm")


def check_arguments(p, a):
    """Refuses a bad value before anything runs (p.error: exit 2, naming the flag); turns
    --run-workers into a list."""
    try:
        a.run_workers = [int(x) for x in a.run_workers.split(",")]
    except ValueError:
        p.error(f"--run-workers must be comma-separated worker counts, not '{a.run_workers}'")
    if any(not 1 <= w <= 64 for w in a.run_workers):
        p.error("--run-workers must be in 1..64")
    for kind in a.run_transports.split(","):
        if kind not in RUN_KINDS:
            p.error(f"--run-transports: unknown '{kind}' (one of {', '.join(RUN_KINDS)})")
    for kind in a.rack_transports.split(","):
        if kind not in TRANSPORT_KINDS:
            p.error(f"--rack-transports: unknown '{kind}' (one of {', '.join(TRANSPORT_KINDS)})")
    for flag in ("runs", "window", "iterations", "run_rounds", "rack_workers", "rack_runs",
                 "timeout"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if not a.seconds > 0:
        p.error("--seconds must be positive")
    if a.size < 4 or a.size % 4:
        p.error("--size must be a positive multiple of 4 bytes")
    if a.rack_rate != "none" and not re.fullmatch(r"\d+[kmg]?bit", a.rack_rate):
        p.error(f"--rack-rate must be none or a tc rate such as 1gbit or 500mbit, not "
                f"'{a.rack_rate}'")


class Interrupted(BaseException):
    """SIGTERM or SIGINT: unwinds through every `finally` and `with`, which stop the programs
    started and remove the namespaces and the rack."""


def on_signal(signum, frame):
    # Once: the cleanup that follows must not be interrupted by a second signal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signal.Signals(signum).name)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--sections", default="rates,run",
                   help="comma-separated sections to run: rates, run, rack (default: rates,run)")
    p.add_argument("--rows", default=",".join(RATE_ROWS), help="rates rows: " + ",".join(RATE_ROWS))
    p.add_argument("--seconds", type=float, default=2, help="rates: measured seconds per run")
    p.add_argument("--window", type=int, default=256, help="rates: packets in flight")
    p.add_argument("--runs", type=int, default=3, help="rates: runs per row (median)")
    p.add_argument("--size", type=parse_size, default=parse_size("64M"),
                   help="run, rack: tensor size in BYTES, float32 (switchml run gets --size bytes/4 "
                   "elements; default 64M)")
    p.add_argument("--iterations", type=int, default=3, help="run, rack: timed all-reduces")
    p.add_argument("--run-workers", default="2,4", help="run: comma-separated worker counts")
    p.add_argument("--run-transports", default="dpdk,dpdk-naps,udp",
                   help="run: " + ",".join(RUN_KINDS) + " (dpdk-naps: memif without doorbells; shm: "
                   "shared-memory rings)")
    p.add_argument("--run-rounds", type=int, default=1,
                   help="run: rounds of every transport, interleaved (the run of median elements/s)")
    p.add_argument("--rack-transports", default="udp,udp-plain,xdp",
                   help="rack: comma-separated, of " + ", ".join(TRANSPORT_KINDS))
    p.add_argument("--rack-workers", type=int, default=2, help="rack: workers (namespaces)")
    p.add_argument("--rack-rate", default="none", help="none (unshaped) or e.g. 1gbit")
    p.add_argument("--rack-runs", type=int, default=1, help="rack: runs per transport (median)")
    p.add_argument("--timeout", type=int, default=120,
                   help="seconds before one program run is killed (default 120)")
    p.add_argument("--build", default=os.path.join(REPO, "build"),
                   help="build directory holding tools/switchml and "
                   "tools/switchml_transport_bench (default: build/)")
    p.add_argument("--rack-script", default=os.path.join(REPO, "scripts", "rack.sh"),
                   help="the emulated rack's script (default: scripts/rack.sh)")
    p.add_argument("--json", default="", help="write every figure here")
    p.add_argument("--md", default="", help="write the Markdown tables here too")
    a = p.parse_args()
    check_arguments(p, a)
    a.switchml = os.path.join(a.build, "tools", "switchml")
    a.bench = os.path.join(a.build, "tools", "switchml_transport_bench")
    for exe in (a.switchml, a.bench):
        if not os.access(exe, os.X_OK):
            p.error(f"no executable {exe} (build switchml and switchml_transport_bench)")
    sections = a.sections.split(",")
    for s in sections:
        if s not in ("rates", "run", "rack"):
            p.error(f"unknown section '{s}' (rates, run, rack)")
    for r in a.rows.split(","):
        if r not in RATE_ROWS:
            p.error(f"unknown row '{r}' ({', '.join(RATE_ROWS)})")
    if os.geteuid() != 0 and ("rack" in sections or "rates" in sections):
        log("not root: the namespace rows and the rack will fail")
    os.environ.setdefault("SWITCHML_DPDK_EAL", EAL)
    a.logs = f"/tmp/transport_bench.{os.getpid()}"
    os.makedirs(a.logs, exist_ok=True)
    out = {"config": {k: v for k, v in vars(a).items()}, "load_before": load_average(),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if "rates" in sections:
            section_rates(a, out)
        if "run" in sections:
            section_run_cpu(a, out)
        if "rack" in sections:
            section_rack(a, out)
    except Interrupted as e:
        log(f"interrupted ({e})")
        return 130
    out["load_after"] = load_average()
    out["seconds"] = time.monotonic() - t0
    md = [f"## switchml transport benchmark ({out['started']}, {out['seconds']:.0f} s, load "
          f"average {out['load_before'][0]:.1f} before, {out['load_after'][0]:.1f} after; logs "
          f"in {a.logs})", ""]
    if "rates" in out:
        md += markdown_rates(a, out) + [""]
    if "run" in out:
        md += markdown_run(a, out) + [""]
    if "rack" in out:
        md += markdown_rack(a, out) + [""]
    text = "\n".join(md)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
