#!/usr/bin/env python3
"""Checks bench.py's CPU accounting and table without running anything: result lines of fake
processes go through Bench.collect, rows through markdown()."""
import os
import subprocess
import sys
import tempfile
import unittest
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402
import ddp_steps  # noqa: E402


class FakeProc:
    def __init__(self, text, cpu_s=0.0, cpu_before_s=0.0):
        self.text = text
        self.cpu_s = cpu_s
        self.cpu_before_s = cpu_before_s

    measured_cpu_s = bench.Proc.measured_cpu_s

    def output(self):
        return self.text


def fake_bench(iterations, warmup):
    b = bench.Bench.__new__(bench.Bench)  # no runner, rack or log directory needed
    b.args = SimpleNamespace(iterations=iterations, warmup=warmup)
    b.measured = 0
    return b


class CollectTest(unittest.TestCase):
    def test_switch_counts_in_cpu_but_not_in_hosts_cpu(self):
        b = fake_bench(iterations=2, warmup=2)
        workers = [FakeProc(f"SWITCHML_RESULT rank={r} status=ok verified=1 times=0.5,0.7 "
                            f"cpu=0.25,0.5\n", cpu_s=9.0) for r in range(2)]
        switch = FakeProc("", cpu_s=4.0)
        out = b.collect(workers, "SWITCHML_RESULT", 2, [switch])
        self.assertEqual(out["times_s"], [0.5, 0.7])
        # Hosts: the ranks' own reports, 2 x (0.25 + 0.5).
        self.assertAlmostEqual(out["cpu_hosts_timed_s"], 1.5)
        # All processes: plus the switch's whole life x iterations / (iterations + warm-up).
        self.assertAlmostEqual(out["cpu_timed_s"], 1.5 + 4.0 * 2 / 4)
        self.assertAlmostEqual(out["cpu_lifetime_s"], 22.0)

    def test_the_switch_start_up_is_not_counted(self):
        b = fake_bench(iterations=3, warmup=1)
        workers = [FakeProc(f"SWITCHML_RESULT rank={r} status=ok verified=1 times=1,1,1 "
                            f"cpu=0.5,0.5,0.5\n") for r in range(2)]
        switch = FakeProc("", cpu_s=2.5, cpu_before_s=0.5)
        out = b.collect(workers, "SWITCHML_RESULT", 2, [switch])
        # (2.5 - 0.5) x 3 / 4 of the switch on top of the ranks' 3.0.
        self.assertAlmostEqual(out["cpu_timed_s"], 3.0 + 1.5)
        self.assertAlmostEqual(out["cpu_lifetime_s"], 2.5)

    def test_the_switch_cpu_read_in_the_timed_window_replaces_its_life_share(self):
        b = fake_bench(iterations=2, warmup=2)
        workers = [FakeProc(f"SWITCHML_RESULT rank={r} status=ok verified=1 times=0.5,0.7 "
                            f"cpu=0.25,0.5\n") for r in range(2)]
        switch = FakeProc("", cpu_s=4.0)
        out = b.collect(workers, "SWITCHML_RESULT", 2, [switch], others_timed_cpu_s=0.75)
        self.assertAlmostEqual(out["cpu_timed_s"], 1.5 + 0.75)
        self.assertAlmostEqual(out["cpu_hosts_timed_s"], 1.5)
        self.assertAlmostEqual(out["switch_cpu_timed_s"], 0.75)
        self.assertAlmostEqual(out["switch_cpu_life_share_s"], 2.0)  # still reported
        self.assertIn("between rank 0's last warm-up and its last timed", out["cpu_method"])

    def test_timed_cpu_watch_reads_the_cpu_at_the_two_marks(self):
        class Clock:
            def __init__(self):
                self.now = 0.0

            def cpu_clock_s(self):
                return self.now

        with tempfile.TemporaryDirectory() as d:
            err = os.path.join(d, "r0.err")
            clock = Clock()
            with open(err, "w") as f:
                f.write("joined\n")
            watch = bench.TimedCpuWatch([clock], err, 1, 3)
            watch.start()
            steps = [(1.0, "warm-up 1/1: 0.2 s\n"), (1.5, "iteration 1/3: 0.1 s\n"),
                     (1.7, "iteration 2/3: 0.1 s\n"), (2.25, "iteration 3/3: 0.1 s\n"),
                     (9.0, "median 0.1 s\n")]
            for cpu, line in steps:
                clock.now = cpu
                with open(err, "a") as f:
                    f.write(line)
                deadline = bench.time.monotonic() + 5
                # Each line is taken before the clock moves on (as the switch idles at a mark).
                while bench.time.monotonic() < deadline and (
                        ("warm-up" in line and len(watch.cpu) < 1) or
                        ("3/3" in line and len(watch.cpu) < 2)):
                    bench.time.sleep(0.002)
            self.assertAlmostEqual(watch.timed_cpu_s(), 2.25 - 1.0)
            # A run that never printed its last iteration: no figure, the caller falls back.
            with open(err, "w") as f:
                f.write("warm-up 1/1: 0.2 s\n")
            unfinished = bench.TimedCpuWatch([clock], err, 1, 3)
            unfinished.start()
            bench.time.sleep(0.05)
            self.assertIsNone(unfinished.timed_cpu_s())

    def test_cpu_clock_is_the_process_cpu_to_the_nanosecond(self):
        p = bench.Proc.__new__(bench.Proc)
        p.pid = os.getpid()
        before, mine = p.cpu_clock_s(), bench.time.process_time()
        while bench.time.process_time() - mine < 0.02:  # burn a little CPU
            pass
        spent = p.cpu_clock_s() - before
        self.assertGreaterEqual(spent, 0.019)
        self.assertLess(spent, 0.5)
        p.pid = 2 ** 22 + 1  # above pid_max: no such process
        self.assertIsNone(p.cpu_clock_s())

    def test_start_cpu_is_read_from_proc(self):
        p = bench.Proc.__new__(bench.Proc)
        p.pid, p.cpu_s, p.cpu_before_s = os.getpid(), 0.0, 0.0
        spent = os.times()
        while os.times().user - spent.user < 0.05:  # burn a little CPU first
            pass
        p.mark_start_cpu()
        self.assertGreaterEqual(p.cpu_before_s, 0.03)
        p.cpu_s = p.cpu_before_s - 1.0  # a mark can never make the measured CPU negative
        self.assertEqual(p.measured_cpu_s(), 0.0)

    def test_without_a_switch_hosts_cpu_is_all_cpu(self):
        b = fake_bench(iterations=1, warmup=0)
        ranks = [FakeProc(f"BENCH_RESULT rank={r} status=ok verified=1 times=1.0 cpu=0.75\n")
                 for r in range(3)]
        out = b.collect(ranks, "BENCH_RESULT", 3)
        self.assertAlmostEqual(out["cpu_timed_s"], 2.25)
        self.assertAlmostEqual(out["cpu_hosts_timed_s"], 2.25)


def sample(comm, pid, *frames):
    return f"{comm:>16} {pid} \n" + "".join(f"\tffffffff81000000 {f}\n" for f in frames) + "\n"


class AuditTest(unittest.TestCase):
    def test_network_softirq_in_other_tasks_is_uncharged(self):
        text = (sample("switchml", 10, "udp_sendmsg", "__sys_sendmmsg")
                # a thread of the run's process with another name: still the run's
                + sample("grpc_global_tim", 10, "net_rx_action", "handle_softirqs")
                + sample("switchml", 11, "net_rx_action", "do_softirq")
                + sample("cc1plus", 20, "tcp_v4_rcv", "net_rx_action", "__irq_exit_rcu")
                + sample("swapper", 0, "veth_xmit", "net_tx_action", "handle_softirqs")
                + sample("cc1plus", 20, "cpp_lex")  # others' own work: not the run's network
                + sample("swapper", 0, "default_idle"))
        self.assertEqual(bench.uncharged_net_samples(text, {"switchml"}), (3, 2))

    def test_no_run_process_counts_nothing_as_ours(self):
        text = sample("cc1plus", 20, "net_rx_action")
        self.assertEqual(bench.uncharged_net_samples(text, {"gloo_allreduce"}), (0, 1))


class MarkdownTest(unittest.TestCase):
    def test_hosts_column(self):
        common = {"setting": "rack:1gbit", "workers": 4, "bytes": 64 << 20, "p99_s": 0.7,
                  "elements_per_s": 2.8e7, "algbw_GBps": 0.11, "busbw_GBps": 0.16,
                  "cpu_lifetime_s_per_gib": 20.0}
        rows = [dict(common, system="switchml", median_s=0.6, cpu_s_per_gib=9.5,
                     cpu_hosts_s_per_gib=6.25),
                dict(common, system="gloo-hd", median_s=0.9, cpu_s_per_gib=6.5,
                     cpu_hosts_s_per_gib=6.5),
                dict(common, system="gloo-ring", error="boom")]
        report = {"rows": rows, "commit": "abc", "host_cpus": 2, "kernel": "k",
                  "started": "now", "config": {"iterations": 5, "warmup": 1}}
        table = [line for line in bench.markdown(report).splitlines() if line.startswith("|")]
        header, rule, switchml, gloo, failed = table
        cells = [c.strip() for c in header.strip("|").split("|")]
        self.assertEqual(cells[9:11], ["CPU s/GiB", "hosts CPU s/GiB"])
        for line in (rule, switchml, gloo, failed):
            self.assertEqual(line.count("|"), header.count("|"), line)
        self.assertEqual([c.strip() for c in switchml.strip("|").split("|")][9:11],
                         ["9.50", "6.25"])
        self.assertEqual([c.strip() for c in gloo.strip("|").split("|")][9:11], ["6.50", "6.50"])
        self.assertNotIn("charged to no process", bench.markdown(report))
        rows[1]["uncharged_net_ms_per_allreduce"] = 104.6
        self.assertIn("4 workers 64 MiB gloo-hd 105.", bench.markdown(report))


class LogsTest(unittest.TestCase):
    def test_every_measurement_has_its_own_log_files(self):
        # Rounds repeat a row, and sizes below 1 MiB (or not whole MiB) once shared a name
        # ("...-0M"): each run overwrote the previous one's logs.
        b = fake_bench(iterations=1, warmup=0)
        b.args.dtype, b.args.audit_kernel = "float32", False
        tags = []

        def run_gloo(tag, n, elements, algorithm):
            tags.append(tag)
            return {"error": "not run"}
        b.run_gloo = run_gloo
        rows = [b.measure("loopback", "gloo-ring", 2, nbytes)
                for nbytes in (4 << 10, 64 << 10, 64 << 10, 1 << 20, (1 << 20) + 1024)]
        self.assertEqual(len(set(tags)), len(tags), tags)
        self.assertEqual([r["logs"] for r in rows], tags)  # a row names its logs


class ArgumentsTest(unittest.TestCase):
    def test_bad_counts_are_refused_before_anything_runs(self):
        with tempfile.TemporaryDirectory() as out:
            for args, named in ((["--rounds", "0"], "--rounds"),
                                (["--rounds", "-1"], "--rounds"),
                                (["--run-timeout", "0"], "--run-timeout"),
                                (["--ddp", "resnet51"], "--ddp"),
                                (["--ddp", "vgg16", "--ddp-steps", "0"], "--ddp-steps"),
                                (["--settings", "rack:1gbit", "--mtu", "100"], "--mtu")):
                with self.subTest(args=args):
                    r = subprocess.run(
                        [sys.executable, os.path.join(HERE, "bench.py"), "--settings",
                         "loopback", "--switchml", "/bin/true", "--gloo", "/bin/true", "--mpi",
                         "", "--out", out] + args, capture_output=True, text=True, timeout=60)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn(named, r.stderr)
                    self.assertFalse(os.path.exists(os.path.join(out, "bench.json")),
                                     "it ran before refusing")

    def test_bench_sh_checks_its_flags_before_it_builds(self):
        # A typo fails in a moment, before scripts/bench.sh installs or builds anything (it used
        # to configure and build build-bench/ first: minutes).
        with tempfile.TemporaryDirectory() as tmp:
            build = os.path.join(tmp, "build-bench")
            for args, named in ((["--wrokers", "2"], "--wrokers"),
                                (["--workers", "0"], "--workers"),
                                (["--settings", "rack:fast"], "--settings")):
                with self.subTest(args=args):
                    r = subprocess.run(
                        ["bash", os.path.join(HERE, "..", "scripts", "bench.sh")] + args,
                        capture_output=True, text=True, timeout=30,
                        env=dict(os.environ, BENCH_BUILD_DIR=build))
                    self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                    self.assertIn(named, r.stderr)
                    self.assertFalse(os.path.exists(build), "it configured a build first")
            r = subprocess.run([sys.executable, os.path.join(HERE, "bench.py"), "--check-args",
                                "--settings", "loopback", "--workers", "2", "--sizes", "1M",
                                "--out", os.path.join(tmp, "out")],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "out")), "--check-args wrote")

    def test_ddp_needs_the_torch_backend_in_the_build(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "tools"))
            os.symlink("/bin/true", os.path.join(tmp, "tools", "switchml"))
            r = subprocess.run([sys.executable, os.path.join(HERE, "bench.py"), "--ddp",
                                "resnet50", "--out", os.path.join(tmp, "out")],
                               capture_output=True, text=True, timeout=30,
                               env=dict(os.environ, BENCH_BUILD_DIR=tmp))
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("switchml_torch", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "out")), "it ran before refusing")


class DdpReportTest(unittest.TestCase):
    def row(self):
        return {"setting": "rack:1gbit", "model": "resnet50", "workers": 4,
                "backends": {"gloo": {"step_s": 1.5, "losses": [2.0, 1.0], "allreduce_s": 1.2},
                             "switchml": {"step_s": 1.0, "losses": [2.0, 1.25],
                                          "allreduce_s": 0.8}}}

    def test_speed_up_ratio_to_the_bare_all_reduce_and_loss_gap(self):
        row = self.row()
        ddp_steps._derive(row)
        s = row["backends"]["switchml"]
        self.assertAlmostEqual(s["speedup"], 1.5)
        self.assertAlmostEqual(s["step_over_allreduce"], 1.25)
        self.assertAlmostEqual(s["max_loss_gap"], 0.25)
        self.assertNotIn("speedup", row["backends"]["gloo"])  # not against itself
        self.assertAlmostEqual(row["backends"]["gloo"]["step_over_allreduce"], 1.25)

    def test_table_has_a_line_per_backend_and_names_failed_runs(self):
        row = self.row()
        ddp_steps._derive(row)
        text = ddp_steps.markdown({"commit": "abc", "config": {"ddp_steps": 10}, "rows": [row],
                                   "failed": ["loopback vgg16"]})
        self.assertIn("| rack:1gbit | resnet50 | 4 | switchml | 1.000 s | 1.50x | 1.25 | "
                      "2.5e-01 |", text)
        self.assertIn("| rack:1gbit | resnet50 | 4 | gloo | 1.500 s | - | 1.25 | - |", text)
        self.assertIn("Failed runs (no row): loopback vgg16", text)


if __name__ == "__main__":
    unittest.main()
