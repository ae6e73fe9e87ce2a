#!/usr/bin/env python3
"""Checks transport_bench.py's arguments and its cleanup with stand-in programs: fake `switchml`
and `switchml_transport_bench` scripts that record their pids and wait, so that nothing is
measured and each case takes a second or two. The namespace cases need root (skipped without)."""
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
import types
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "transport_bench.py")
sys.path.insert(0, HERE)
import transport_bench  # noqa: E402

# The stand-ins: the switch says it listens and waits; the generator says it measures and
# waits; a worker of rank 0 fails once the switch and rank 1 have recorded their pids (at most
# 5 s: on a loaded host rank 1's `ip netns exec` could start after rank 0 had failed and been
# seen, and rank 1 be stopped before it wrote its pid), any other worker waits. Each appends its
# pid to pids.
FAKE_SWITCHML = """#!/bin/bash
echo $$ >> {dir}/pids
case "$1" in
  switch) echo "control port 1"; exec sleep 1000 ;;
  worker) case " $* " in
      *" --rank 0 "*)
        for i in $(seq 100); do [ "$(wc -l < {dir}/pids)" -ge 3 ] && break; sleep 0.05; done
        echo "worker 0 fails"; exit 1 ;;
    esac
    exec sleep 1000 ;;
  *) exit 1 ;;
esac
"""
FAKE_BENCH = """#!/bin/bash
echo $$ >> {dir}/pids
echo measuring
exec sleep 1000
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def namespaces(prefix):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def can_make_namespaces():
    if os.geteuid() != 0:
        return False
    name = f"smltbprobe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return True


class FakeBuild:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tbtest-")
        os.makedirs(os.path.join(self.dir, "tools"))
        for name, text in (("switchml", FAKE_SWITCHML), ("switchml_transport_bench", FAKE_BENCH)):
            path = os.path.join(self.dir, "tools", name)
            with open(path, "w") as f:
                f.write(text.format(dir=self.dir))
            os.chmod(path, stat.S_IRWXU)

    def pids(self):
        try:
            with open(os.path.join(self.dir, "pids")) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def kill_all(self):
        for pid in self.pids():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if os.path.exists(os.path.join(self.dir, "pids")):
            os.remove(os.path.join(self.dir, "pids"))

    def cleanup(self):
        self.kill_all()
        subprocess.run(["rm", "-rf", self.dir])


def run_cli(build, *args, timeout=15):
    """transport_bench.py's exit code and errors; (None, ...) if it ran past `timeout` (then it
    is killed, and what it started removed)."""
    p = subprocess.Popen([sys.executable, SCRIPT, "--build", build.dir, *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=timeout)
        return p.returncode, err
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        subprocess.run(["rm", "-rf", f"/tmp/transport_bench.{p.pid}"])  # its logs
        for ns in namespaces(f"smltb{p.pid}-"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run([os.path.join(os.path.dirname(HERE), "scripts", "rack.sh"), "down",
                        "--name", f"smltr{p.pid}"], capture_output=True)
        return None, err


class ArgumentsTest(unittest.TestCase):
    def setUp(self):
        self.build = FakeBuild()

    def tearDown(self):
        self.build.cleanup()

    def test_bad_values_are_refused_before_anything_runs(self):
        cases = [
            (["--sections", "run", "--run-transports", "udp,bogus"], "bogus"),
            (["--sections", "rack", "--rack-transports", "udp,bogus"], "bogus"),
            (["--sections", "run", "--run-workers", "2,x"], "--run-workers"),
            (["--sections", "run", "--run-workers", "0"], "--run-workers"),
            (["--sections", "run", "--run-rounds", "0"], "--run-rounds"),
            (["--sections", "run", "--iterations", "0"], "--iterations"),
            (["--sections", "rates", "--runs", "0"], "--runs"),
            (["--sections", "rates", "--seconds", "0"], "--seconds"),
            (["--sections", "rates", "--window", "0"], "--window"),
            (["--sections", "rack", "--rack-runs", "0"], "--rack-runs"),
            (["--sections", "rack", "--rack-workers", "0"], "--rack-workers"),
            (["--sections", "rack", "--rack-rate", "fast"], "--rack-rate"),
            (["--sections", "run", "--timeout", "0"], "--timeout"),
        ]
        for args, named in cases:
            with self.subTest(args=args):
                code, err = run_cli(self.build, *args)
                ran = self.build.pids()
                self.build.kill_all()
                self.assertEqual(code, 2, err)
                self.assertIn(named, err)
                self.assertEqual(ran, [], "something ran before the refusal")


class RunWithCpuTest(unittest.TestCase):
    def test_timeout_lets_the_program_stop_its_children(self):
        # As `switchml run`: SIGTERM makes it stop its workers; SIGKILL would orphan them.
        with tempfile.TemporaryDirectory() as d:
            pidfile = os.path.join(d, "child")
            script = (f"sleep 1000 & echo $! > {pidfile}; trap 'kill $!; exit 143' TERM; "
                      "while true; do wait; done")
            t0 = time.monotonic()
            code, _, _ = transport_bench.run_with_cpu(["bash", "-c", script], 3)
            self.assertNotEqual(code, 0)
            self.assertLess(time.monotonic() - t0, 20)
            with open(pidfile) as f:
                child = int(f.read())
            deadline = time.monotonic() + 5
            while alive(child) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = alive(child)
            if left:
                os.kill(child, signal.SIGKILL)
            self.assertFalse(left, "the program's child outlived the timeout")


class RatesTest(unittest.TestCase):
    def test_server_cpu_is_sampled_over_the_measured_interval(self):
        # The generator measures for 1 s, prints its rates, then takes 3 s to end (closing its
        # transport and job). A stand-in server is busy exactly while the generator measures
        # (its "CPU time" is the wall clock until the generator's rates are printed), so its
        # cores over the measured interval are 1 (less the time this script takes to read the
        # line on a loaded host); sampled at the generator's exit they were 1 / 4.
        build = FakeBuild()
        self.addCleanup(build.cleanup)
        ended = os.path.join(build.dir, "ended")
        with open(os.path.join(build.dir, "tools", "switchml_transport_bench"), "w") as f:
            f.write(f"#!/bin/bash\necho $$ >> {build.dir}/pids\necho measuring\nsleep 1\n"
                    f"touch {ended}\necho pps=1000 gen_cpu=0.5\nsleep 3\n")

        def server_cpu(pid):
            return os.stat(ended).st_mtime if os.path.exists(ended) else time.time()
        with tempfile.TemporaryDirectory() as logs:
            a = types.SimpleNamespace(logs=logs, seconds=1, window=8,
                                      switchml=os.path.join(build.dir, "tools", "switchml"),
                                      bench=os.path.join(build.dir, "tools",
                                                         "switchml_transport_bench"))
            row = {"gen": "dpdk", "server": "switch", "flags": []}  # local: no namespaces
            with unittest.mock.patch.object(transport_bench, "cpu_seconds", server_cpu):
                r = transport_bench.rates_once(a, row, None, 47999, "t")
        self.assertNotIn("error", r)
        self.assertGreater(r["server_cores"], 0.6)
        self.assertLess(r["server_cores"], 1.1)


@unittest.skipUnless(can_make_namespaces(), "needs root and network namespaces")
class CleanupTest(unittest.TestCase):
    def setUp(self):
        self.build = FakeBuild()
        self.proc = None

    def tearDown(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.build.cleanup()
        if self.proc is not None:
            for ns in namespaces(f"smltb{self.proc.pid}-") + namespaces(f"smltr{self.proc.pid}-"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["rm", "-rf", f"/tmp/transport_bench.{self.proc.pid}"])  # its logs

    def start(self, *args, want_pids):
        self.proc = subprocess.Popen([sys.executable, SCRIPT, "--build", self.build.dir, *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while len(self.build.pids()) < want_pids:
            self.assertIsNone(self.proc.poll(), "transport_bench.py ended early")
            self.assertLess(time.monotonic(), deadline, "the stand-ins did not start")
            time.sleep(0.05)
        time.sleep(0.3)  # the generator's "measuring" line read

    def assert_cleaned_up(self, prefix):
        self.proc.wait(timeout=20)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in self.build.pids()):
            time.sleep(0.05)
        self.assertEqual([p for p in self.build.pids() if alive(p)], [], "processes left")
        self.assertEqual(namespaces(prefix), [], "namespaces left")

    def test_sigterm_during_rates_stops_everything(self):
        self.start("--sections", "rates", "--rows", "udp", "--runs", "1", "--seconds", "100",
                   want_pids=2)
        self.proc.send_signal(signal.SIGTERM)
        self.assert_cleaned_up(f"smltb{self.proc.pid}-")

    def test_sigint_to_the_script_alone_stops_everything(self):
        self.start("--sections", "rates", "--rows", "udp", "--runs", "1", "--seconds", "100",
                   want_pids=2)
        self.proc.send_signal(signal.SIGINT)
        self.assert_cleaned_up(f"smltb{self.proc.pid}-")

    def test_a_failed_rack_worker_does_not_leave_the_others_running(self):
        name = f"smltbt{os.getpid()}"
        rack_script = os.path.join(os.path.dirname(HERE), "scripts", "rack.sh")
        up = subprocess.run([rack_script, "up", "--name", name, "--workers", "2", "--rate",
                             "none"], capture_output=True, text=True, timeout=60)
        self.assertEqual(up.returncode, 0, up.stderr)
        try:
            rack = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
            rack = {k: v.strip('"') for k, v in rack.items()}
            with tempfile.TemporaryDirectory() as logs:
                a = types.SimpleNamespace(size=4096, logs=logs, rack_workers=2, iterations=1,
                                          timeout=30,
                                          switchml=os.path.join(self.build.dir, "tools",
                                                                "switchml"))
                r = transport_bench.rack_once(a, rack, "udp", "t")
            self.assertIn("worker 0 fails", r.get("error", ""))
            pids = self.build.pids()
            self.assertEqual(len(pids), 3)  # the switch and two workers
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and any(alive(p) for p in pids):
                time.sleep(0.05)
            self.assertEqual([p for p in pids if alive(p)], [],
                             "a worker outlived its failed run")
        finally:
            subprocess.run([rack_script, "down", "--name", name], capture_output=True)

if __name__ == "__main__":
    unittest.main()
