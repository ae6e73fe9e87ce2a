#!/usr/bin/python3
"""Per-core packet and element rates of switchml's data-plane transports, side by side.

Brings up an unshaped emulated rack (scripts/rack.sh --rate none: the switch on a bridge, each
worker in a namespace of its own behind a veth pair), then for every transport (udp: kernel UDP
with GSO/GRO; udp-plain: kernel UDP without them; xdp: AF_XDP; a backend that another build
adds joins with --transports) runs the same verified all-reduces --runs times with the switch
pinned to CPU 0 and the workers to CPU 1, and reports the median over runs of:

  switch:  packets (received + sent) and aggregated elements (every worker's contribution) per
           CPU-second of the switch process (its user + system time over its life, from wait4);
  worker:  packets (sent + received) and elements per CPU-second of a worker process during its
           timed all-reduces (switchml worker's cpu= per all-reduce);
  wall:    elements/s of the all-reduce (the worker's median time).

Kernel work done in softirq is charged to whichever process the CPU was running, which on veth is
mostly the sender: the figures compare transports on the same path, they are not NIC figures.
Needs root (namespaces) and a build with the transports; run with /usr/bin/python3.
Example: bench/transport_bench.py --transports udp,udp-plain,xdp --workers 2 --size 4M --runs 3
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
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def field(line, name):
    m = re.search(rf"\b{name}=(\S+)", line)
    return m.group(1) if m else None


def run_once(a, rack, transport, tag):
    """One job: returns a dict of figures, or {'error': ...}."""
    elements = a.size // 4
    sw_ns = rack["RACK_SWITCH_NS"]
    ips = rack["RACK_WORKER_IPS"].split()
    logdir = a.logs
    sw_out = open(f"{logdir}/{tag}-switch.out", "w+")
    switch = subprocess.Popen(
        ["ip", "netns", "exec", sw_ns, "taskset", "-c", "0", a.switchml, "switch", "--bind",
         rack["RACK_SWITCH_IP"], "--data-port", "48864", "--control-port", "50099",
         "--transport", transport, "--log-level", "warning"],
        stdout=sw_out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            sw_out.seek(0)
            text = sw_out.read()
            if "control port" in text:
                break
            if switch.poll() is not None or time.monotonic() > deadline:
                return {"error": "the switch did not start: " + text.strip()[-400:]}
            time.sleep(0.02)
        workers = []
        for r in range(a.workers):
            out = open(f"{logdir}/{tag}-w{r}.out", "w+")
            argv = ["ip", "netns", "exec", f"{rack['RACK_NAME']}-w{r}", "taskset", "-c",
                    str(a.worker_cpu), a.switchml, "worker", "--switch",
                    f"{rack['RACK_SWITCH_IP']}:50099", "--bind", ips[r], "--rank", str(r),
                    "--workers", str(a.workers), "--session", "1", "--size", str(elements),
                    "--dtype", "float32", "--iterations", str(a.iterations), "--warmup",
                    str(a.warmup), "--transport", transport, "--setup-timeout-ms", "30000",
                    "--report", "--quiet"] + a.worker_args.split()
            workers.append((subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT), out))
        results = []
        for p, out in workers:
            try:
                p.wait(timeout=a.timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                return {"error": "a worker took over --timeout seconds"}
            out.seek(0)
            text = out.read()
            line = next((l for l in text.splitlines() if l.startswith("SWITCHML_RESULT")), "")
            if p.returncode != 0 or "status=ok verified=1" not in line:
                return {"error": f"worker failed (exit {p.returncode}): {text.strip()[-400:]}"}
            results.append(line)
    finally:
        usage = None
        if switch.returncode is None:  # not reaped yet: its resource usage is still there
            switch.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(switch.pid, 0)
            switch.returncode = os.waitstatus_to_exitcode(status)
    if usage is None:
        return {"error": "the switch exited early"}
    sw_out.seek(0)
    text = sw_out.read()
    m = re.search(r"daemon: received (\d+), sent (\d+)", text)
    if not m:
        return {"error": "no switch counters: " + text.strip()[-400:]}
    received, sent = int(m.group(1)), int(m.group(2))
    switch_cpu = usage.ru_utime + usage.ru_stime
    all_reduces = a.iterations + a.warmup
    per_worker_elements = elements * all_reduces
    times = [float(x) for x in field(results[0], "times").split(",")]
    w_cpu = [median([float(x) for x in field(l, "cpu").split(",")]) for l in results]
    w_sent = [int(field(l, "sent")) / all_reduces for l in results]  # per all-reduce
    return {
        "switch_cpu_s": switch_cpu,
        "switch_pps_per_core": (received + sent) / switch_cpu,
        "switch_elements_per_core_s": a.workers * per_worker_elements / switch_cpu,
        # A worker receives one result per packet it sends.
        "worker_pps_per_core": median([2 * s / c for s, c in zip(w_sent, w_cpu)]),
        "worker_elements_per_core_s": median([elements / c for c in w_cpu]),
        "elements_per_s": elements / median(times),
        "retransmitted": sum(int(field(l, "retransmitted")) for l in results),
        "switch_mode": (re.search(r"over (\S+ \([^)]*\)|\S+)", text) or [None, ""])[1],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transports", default="udp,udp-plain,xdp")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=parse_size, default=parse_size("4M"),
                   help="tensor bytes (float32)")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--runs", type=int, default=3, help="runs per transport (median reported)")
    p.add_argument("--worker-cpu", type=int, default=1, help="CPU the workers are pinned to")
    p.add_argument("--worker-args", default="", help="extra `switchml worker` flags")
    p.add_argument("--mtu", type=int, default=9000)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--switchml", default=os.path.join(REPO, "build", "tools", "switchml"))
    p.add_argument("--rack-script", default=os.path.join(REPO, "scripts", "rack.sh"))
    p.add_argument("--json", default="", help="also write the results here")
    a = p.parse_args()
    if os.geteuid() != 0:
        p.error("needs root (network namespaces)")
    if not os.access(a.switchml, os.X_OK):
        p.error(f"no executable {a.switchml} (build the switchml target)")
    a.logs = f"/tmp/transport_bench.{os.getpid()}"
    os.makedirs(a.logs, exist_ok=True)
    name = f"smltb{os.getpid()}"
    up = subprocess.run([a.rack_script, "up", "--name", name, "--workers", str(a.workers),
                         "--rate", "none", "--mtu", str(a.mtu)], capture_output=True, text=True)
    if up.returncode != 0:
        log(f"SKIPPED: the rack cannot be made here: {up.stderr.strip()}")
        return 77 if up.returncode == 77 else 1
    rack = {}
    for line in up.stdout.splitlines():
        k, _, v = line.partition("=")
        rack[k] = v.strip('"')
    rows = {}
    try:
        for transport in a.transports.split(","):
            runs = []
            for i in range(a.runs):
                r = run_once(a, rack, transport, f"{transport}-{i}")
                if "error" in r:
                    log(f"{transport}: run {i}: {r['error']}")
                    break
                log(f"{transport}: run {i}: switch {r['switch_pps_per_core'] / 1e6:.3f} Mpps/core, "
                    f"worker {r['worker_pps_per_core'] / 1e6:.3f} Mpps/core, "
                    f"{r['elements_per_s']:.3g} elements/s")
                runs.append(r)
            if not runs:
                rows[transport] = {"error": r["error"]}
                continue
            rows[transport] = {k: median([x[k] for x in runs]) if isinstance(runs[0][k], float)
                               else runs[0][k] for k in runs[0]}
            rows[transport]["runs"] = len(runs)
    finally:
        subprocess.run([a.rack_script, "down", "--name", name])
    print(f"\n{a.workers} workers, {a.size >> 20} MiB float32, {a.iterations} timed all-reduces "
          f"after {a.warmup}, median of {a.runs} runs; switch on CPU 0, workers on CPU "
          f"{a.worker_cpu}; unshaped rack (veth + bridge, MTU {a.mtu})\n")
    print("| transport | switch Mpps/core | switch Melem/s/core | worker Mpps/core | "
          "worker Melem/s/core | wall Melem/s | retransmitted |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t, r in rows.items():
        if "error" in r:
            print(f"| {t} | failed: {r['error'][:80]} | | | | | |")
            continue
        print(f"| {t} ({r['switch_mode']}) | {r['switch_pps_per_core'] / 1e6:.3f} | "
              f"{r['switch_elements_per_core_s'] / 1e6:.1f} | {r['worker_pps_per_core'] / 1e6:.3f} | "
              f"{r['worker_elements_per_core_s'] / 1e6:.1f} | {r['elements_per_s'] / 1e6:.1f} | "
              f"{r['retransmitted']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(a).items()}, "rows": rows}, f, indent=1)
    return 0 if all("error" not in r for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
