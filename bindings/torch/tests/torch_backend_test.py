"""Tests of the "switchml" torch.distributed backend: 2 and 3 worker processes on loopback
against an in-process switch, each result compared with Gloo's (a Gloo group in the same job).

Exits 77 (ctest: skipped) saying so loudly when python3-torch or the backend is missing."""
import datetime
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    print(f"SKIPPED: the torch backend tests need python3-torch ({e}); install it with "
          "scripts/setup.sh", file=sys.stderr)
    sys.exit(77)
try:
    import switchml
    import switchml.torch as swtorch
except ImportError as e:
    print(f"SKIPPED: switchml.torch is not built ({e}): configure with libtorch-dev installed",
          file=sys.stderr)
    sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _seeded(rank, world, fn, *args):
    torch.manual_seed(0)
    return fn(rank, world, *args)


def run_job(test, world, fn, *args, env=None, timeout=90, switch_port=None, required=None):
    """Runs fn(rank, world, *args) in `world` processes of one switchml job against the test's
    switch (or `switch_port`, or a SWITCHML_SWITCH of `env`); returns results by rank; a
    failure fails the test."""
    port = switch_port if switch_port is not None else test.switch.control_port
    env = dict({"SWITCHML_SWITCH": f"127.0.0.1:{port}"}, **(env or {}))
    try:
        return swtorch.run_local(world, _seeded, fn, *args, env=env, timeout=timeout,
                                 required=required)
    except RuntimeError as e:
        test.fail(str(e))


def resolve(options=None, **env):
    """swtorch._resolve(options) with a 30 s default timeout, the SWITCHML_* variables of `env`
    set for the call only (the environment is restored after it, as it was)."""
    with mock.patch.dict(os.environ, env):
        return swtorch._resolve(options, datetime.timedelta(seconds=30))


def float_bound(world, exact, dtype):
    """|switchml - exact| allowed: block floating point (docs/architecture.md 5.2) plus one
    rounding to the tensor's dtype."""
    top = exact.abs().max().item()
    quant = world * world * 2.0 ** math.ceil(math.log2(top + 1e-30)) / 2**31
    ulp = {torch.float32: 2**-23, torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    return quant + exact.abs() * ulp


# ---- bodies run in the workers -------------------------------------------------------------


def allreduce_body(rank, world):
    gloo = dist.new_group(backend="gloo")
    out = {}
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randint(-10**6, 10**6, (10007,), dtype=torch.int32, generator=g)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    out["int32_equal"] = torch.equal(a, b)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(5003, generator=g).to(dtype)
        exact = x.double()
        dist.all_reduce(exact, group=gloo)
        y = x.clone()
        dist.all_reduce(y)
        out[f"{dtype}_dtype_kept"] = y.dtype == dtype
        out[f"{dtype}_within"] = bool(((y.double() - exact).abs()
                                       <= float_bound(world, exact, dtype)).all())
    # A non-contiguous view is reduced in place through its base.
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10) * (rank + 1)
    view = base[:, ::3]
    dist.all_reduce(view)
    expect = torch.arange(60, dtype=torch.float32).reshape(6, 10)[:, ::3] * (world * (world + 1) / 2)
    out["view"] = torch.allclose(base[:, ::3], expect)
    out["view_rest_untouched"] = torch.equal(base[:, 1], torch.arange(1, 60, 10).float() * (rank + 1))
    # Async: several in flight, waited out of order.
    ts = [torch.full((1000 * (i + 1),), rank + i, dtype=torch.int32) for i in range(5)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    out["async"] = all(torch.equal(t, torch.full_like(t, sum(r + i for r in range(world))))
                       for i, t in enumerate(ts))
    out["async_completed"] = all(w.is_completed() for w in works)
    fut = dist.all_reduce(torch.ones(10), async_op=True).get_future()
    out["future"] = torch.equal(fut.wait()[0], torch.full((10,), float(world)))
    # Several tensors in one call (coalesced): one switch all-reduce, each summed separately.
    parts = [torch.full((3, 5), float(rank)), torch.arange(7, dtype=torch.float32) * rank,
             torch.ones(10)[::2]]
    ref = [p.clone() for p in parts]
    dist.all_reduce_coalesced(parts)
    dist.all_reduce_coalesced(ref, group=gloo)
    out["coalesced"] = all(torch.allclose(a, b) for a, b in zip(parts, ref))
    empty = torch.zeros(0)
    dist.all_reduce(empty)
    pg = dist.group.WORLD
    out["switch_calls"] = pg.switch_calls
    out["fallback_calls"] = pg.fallback_calls
    return out


def delegated_body(rank, world):
    gloo = dist.new_group(backend="gloo")
    out = {}

    def both(fn):
        """fn(group) -> value, on the switchml default group and on Gloo."""
        return fn(None), fn(gloo)

    def reduce_op(op, dtype):
        def f(group):
            t = (torch.arange(7) * (rank + 2)).to(dtype)
            dist.all_reduce(t, op=op, group=group)
            return t
        return f

    for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        s, g = both(reduce_op(op, torch.float32))
        out[f"op_{op}"] = torch.equal(s, g)
    for dtype in (torch.float64, torch.int64, torch.uint8):
        s, g = both(reduce_op(dist.ReduceOp.SUM, dtype))
        out[f"sum_{dtype}"] = torch.equal(s, g)

    def broadcast(group):
        t = torch.full((5,), float(rank))
        dist.broadcast(t, src=1, group=group)
        return t
    s, g = both(broadcast)
    out["broadcast"] = torch.equal(s, g) and s[0].item() == 1.0

    def all_gather(group):
        ts = [torch.zeros(3) for _ in range(world)]
        dist.all_gather(ts, torch.full((3,), float(rank)), group=group)
        return torch.stack(ts)
    s, g = both(all_gather)
    out["all_gather"] = torch.equal(s, g)

    def gather_scatter(group):
        got = torch.zeros(2)
        chunks = [torch.full((2,), float(i)) for i in range(world)] if rank == 0 else None
        dist.scatter(got, chunks, src=0, group=group)
        return got
    s, g = both(gather_scatter)
    out["scatter"] = torch.equal(s, g) and s[0].item() == rank

    def all_to_all(group):
        inp = torch.arange(world, dtype=torch.float32) + 10 * rank
        outp = torch.zeros(world)
        dist.all_to_all_single(outp, inp, group=group)
        return outp
    s, g = both(all_to_all)
    out["all_to_all"] = torch.equal(s, g)

    def objects(group):
        lst = [None] * world
        dist.all_gather_object(lst, {"rank": rank}, group=group)
        return lst
    s, g = both(objects)
    out["all_gather_object"] = s == g

    def send_recv(group):
        t = torch.full((4,), float(rank))
        if rank == 0:
            dist.send(t, dst=1, group=group)
        elif rank == 1:
            dist.recv(t, src=0, group=group)
        return t
    s, g = both(send_recv)
    out["send_recv"] = torch.equal(s, g)
    dist.barrier()
    out["fallback_calls"] = dist.group.WORLD.fallback_calls
    return out


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        # 1.1 MB of parameters: more than DDP's first bucket (1 MB) holds.
        self.body = nn.Sequential(nn.Linear(20, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                  nn.Linear(512, 5))

    def forward(self, x):
        return self.body(x)


def ddp_body(rank, world):
    gloo = dist.new_group(backend="gloo")
    models = {}
    for name, group in (("switchml", None), ("gloo", gloo)):
        torch.manual_seed(0)
        net = TinyNet()
        # Small buckets: several per step, as for a large model.
        model = DDP(net, process_group=group, bucket_cap_mb=0.25)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(rank)
        for _ in range(5):
            x = torch.randn(16, 20, generator=g)
            y = torch.randint(0, 5, (16,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        models[name] = [p.detach().clone() for p in net.parameters()]
    diffs = [(a - b).abs().max().item() for a, b in zip(models["switchml"], models["gloo"])]
    scale = max(p.abs().max().item() for p in models["gloo"])
    return {"max_diff": max(diffs), "scale": scale,
            "switch_calls": dist.group.WORLD.switch_calls}


def striped_ddp_body(rank, world):
    out = ddp_body(rank, world)
    out["switch_hosts_alive"] = dist.group.WORLD.stats()["switch_hosts_alive"]
    return out


def concurrent_groups_body(rank, world):
    # The second group's options come from pg_options (two worker threads, a 64-packet window).
    second = dist.new_group(backend="switchml", pg_options=swtorch.Options(threads=2, window=64))
    sessions = (dist.group.WORLD.session_id, second.session_id)
    ok = True
    for i in range(5):
        a = torch.full((3000,), rank + i, dtype=torch.int32)
        b = torch.full((2000,), 10 * rank + i, dtype=torch.int32)
        wa = dist.all_reduce(a, async_op=True)
        wb = dist.all_reduce(b, group=second, async_op=True)
        wb.wait()
        wa.wait()
        ok = ok and bool((a == sum(r + i for r in range(world))).all())
        ok = ok and bool((b == sum(10 * r + i for r in range(world))).all())
    return {"ok": ok, "sessions": sessions}


def exact_in_world_and(second, rank, world):
    """An int32 all-reduce in WORLD and in `second`: True when both sums are exact."""
    ok = True
    for group in (None, second):
        t = torch.arange(50000, dtype=torch.int32) * (rank + 1)
        dist.all_reduce(t, group=group)
        ok = ok and bool((t == torch.arange(50000, dtype=torch.int32) *
                          sum(r + 1 for r in range(world))).all())
    return ok


def options_body(rank, world):
    # WORLD's early retransmission from the environment, a second group's from pg_options.
    second = dist.new_group(backend="switchml",
                            pg_options=swtorch.Options(early_retransmit=1, window=64))
    return {"ok": exact_in_world_and(second, rank, world),
            "world": (dist.group.WORLD.early_retransmit_after, dist.group.WORLD.window),
            "second": (second.early_retransmit_after, second.window),
            "transports": (dist.group.WORLD.config.transport, second.config.transport),
            "packet_numels": (dist.group.WORLD.config.packet_numel, second.config.packet_numel),
            "threads": (dist.group.WORLD.config.num_worker_threads,
                        second.config.num_worker_threads),
            "world_stats": dist.group.WORLD.stats()}


def auth_body(rank, world):
    # WORLD's authenticated data plane from the environment, a second group's from pg_options.
    second = dist.new_group(backend="switchml",
                            pg_options=swtorch.Options(authenticate_data=True))
    return {"ok": exact_in_world_and(second, rank, world),
            "world": dist.group.WORLD.authenticate_data, "second": second.authenticate_data}


def sparse_body(rank, world):
    # WORLD runs block-sparse all-reduces (SWITCHML_SPARSE=on): mostly-zero tensors, exact.
    x = torch.zeros(100000, dtype=torch.int32)  # 391 blocks of 256
    x[3 * 256:4 * 256] = torch.arange(256, dtype=torch.int32) * (rank + 1)
    dist.all_reduce(x)
    expect = torch.zeros(100000, dtype=torch.int32)
    expect[3 * 256:4 * 256] = torch.arange(256, dtype=torch.int32) * (world * (world + 1) // 2)
    f = torch.zeros(50000)  # 196 blocks
    f[10 * 256 + rank] = 1.5  # each rank its own element of block 10
    dist.all_reduce(f)
    stats = dist.group.WORLD.stats()
    return {"int32": bool(torch.equal(x, expect)),
            "float32": bool(torch.equal(f.nonzero().flatten(),
                                        torch.arange(world) + 10 * 256)
                            and torch.all(f[10 * 256:10 * 256 + world] == 1.5)),
            "sparse": dist.group.WORLD.config.sparse,
            "blocks": stats["sparse_blocks"], "union": stats["sparse_union_blocks"],
            "sent": stats["packets_sent"]}


def sparse_auto_body(rank, world):
    # WORLD runs SWITCHML_SPARSE=auto: a mostly-zero bucket goes compact, a dense one and one 90 %
    # non-zero go dense (in place: one worker thread); every result exact.
    out = {}
    for name, nonzero_blocks in (("sparse", [3]), ("dense", range(400)), ("ninety", range(360))):
        x = torch.zeros(400 * 256, dtype=torch.int32)
        for b in nonzero_blocks:
            x[b * 256:(b + 1) * 256] = rank + 1 + b
        expect = torch.zeros_like(x)
        for b in nonzero_blocks:
            expect[b * 256:(b + 1) * 256] = world * (b + 1) + world * (world - 1) // 2
        before = dist.group.WORLD.stats()
        dist.all_reduce(x)
        after = dist.group.WORLD.stats()
        out[name] = {"exact": bool(torch.equal(x, expect)),
                     "dense_shares": after["sparse_dense_shares"] - before["sparse_dense_shares"],
                     "aggregated": (after["sparse_aggregated_blocks"]
                                    - before["sparse_aggregated_blocks"])}
    out["auto"] = dist.group.WORLD.config.sparse_auto
    return out


def data_path_body(rank, world):
    # WORLD's data-path options from the environment, a second group's from pg_options; both
    # over the transport of SWITCHML_TRANSPORT.
    second = dist.new_group(backend="switchml", pg_options=swtorch.Options(
        wake_batch=0.5, multicast="off", check_tensors=True, threads=2, link_gbps=1,
        base_rtt=0.005, retransmit_timeout=0.02, min_retransmit_timeout=0.005,
        max_retransmit_timeout=2.0, packet_numel=256))

    def fields(group):
        c = group.config
        return (c.transport, c.wake_batch, c.multicast, c.check_tensors, c.num_worker_threads,
                c.link_gbps, c.base_rtt, c.timeout, c.min_timeout, c.max_timeout,
                c.packet_numel)

    return {"ok": exact_in_world_and(second, rank, world),
            "world": fields(dist.group.WORLD), "second": fields(second),
            "second_window": second.window, "second_stats": second.stats()}


def destroy_with_fallback_work_pending_body(rank, world):
    # Rank 0 destroys the group while a collective of the Gloo fallback, whose tensor Python no
    # longer holds, still waits for rank 1: ~ProcessGroupGloo waits for it to end, then Gloo's
    # worker thread releases it, and the tensor with it, which takes the GIL. This hung (rank 0)
    # while the group's Python object released its reference with the GIL held.
    group = dist.new_group(backend="switchml")
    t = torch.full((4,), float(rank))
    if rank == 0:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
        del t
    else:
        time.sleep(1.0)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    dist.destroy_process_group(group)
    return True


def monitored_barrier_body(rank, world):
    """Every rank passes switchml.torch.monitored_barrier (torch's own refuses the backend);
    then rank 1 stays away (it sleeps past rank 0's timeout) and rank 0's raises naming it."""
    out = {}
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))
        out["torch's own refuses the backend"] = False
    except RuntimeError as e:
        out["torch's own refuses the backend"] = "only implemented for GLOO" in str(e)
    swtorch.monitored_barrier(timeout=datetime.timedelta(seconds=20), wait_all_ranks=True)
    out["every rank passed"] = True
    if rank == 1:
        time.sleep(6)
        return out
    start = time.monotonic()
    try:
        swtorch.monitored_barrier(timeout=datetime.timedelta(seconds=2))
        out["a missing rank raises"] = False
    except RuntimeError as e:
        out["a missing rank raises"] = True
        out[f"it names rank 1: {e}"] = "Rank 1" in str(e)
        out["within the timeout and a margin"] = time.monotonic() - start < 5
    return out


def noop_body(rank, world):
    return None


def peer_dies_body(rank, world):
    dist.all_reduce(torch.ones(10))
    if rank == 1:
        os._exit(0)  # dies without a word
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(100000))
        return {"raised": False}
    except RuntimeError as e:
        return {"raised": True, "message": str(e), "seconds": time.monotonic() - start}


# ---- the tests ------------------------------------------------------------------------------


class TorchBackendTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The reference's packet sizes only (not the default, 2048 over udp): the bodies count
        # packets of 256 elements, which the backend's automatic size chooses from such a switch.
        cls.switch = switchml.Switch(max_packet_numel=256)

    @classmethod
    def tearDownClass(cls):
        cls.switch.stop()

    def assertEveryCheckPassed(self, rank, out):
        """Each value of a body's dict of named checks is true."""
        self.assertTrue(out, f"rank {rank}: no check")
        for key, value in out.items():
            self.assertTrue(value, f"rank {rank}: {key}")

    def test_allreduce_three_processes_matches_gloo(self):
        for rank, out in enumerate(run_job(self, 3, allreduce_body)):
            calls = (out.pop("switch_calls"), out.pop("fallback_calls"))
            self.assertEveryCheckPassed(rank, out)
            self.assertGreaterEqual(calls[0], 12, "all-reduces through the switch")

    def test_delegated_collectives_and_ops_match_gloo(self):
        for rank, out in enumerate(run_job(self, 2, delegated_body)):
            self.assertGreaterEqual(out.pop("fallback_calls"), 6)
            self.assertEveryCheckPassed(rank, out)

    def test_ddp_step_matches_gloo(self):
        for out in run_job(self, 2, ddp_body):
            # Five steps, the later ones with two buckets each (after DDP rebuilds them).
            self.assertGreater(out["switch_calls"], 5, "several buckets a step, by the switch")
            # Five SGD steps: quantization error of the gradient sums, a few times 2^-30 relative.
            self.assertLessEqual(out["max_diff"], 1e-5 * out["scale"], out)

    def test_ddp_step_striped_over_two_switches(self):
        # SWITCHML_SWITCH=h1,h2: the job striped over two switches (docs/deployment.md).
        second = switchml.Switch()
        try:
            hosts = f"127.0.0.1:{self.switch.control_port},127.0.0.1:{second.control_port}"
            res = run_job(self, 2, striped_ddp_body, env={"SWITCHML_SWITCH": hosts})
            counters = second.counters()
        finally:
            second.stop()
        for out in res:
            self.assertEqual(out["switch_hosts_alive"], 2)
            self.assertLessEqual(out["max_diff"], 1e-5 * out["scale"], out)
        self.assertGreater(counters["received"], 0, "the second switch aggregated a share")

    def test_concurrent_process_groups(self):
        res = run_job(self, 2, concurrent_groups_body)
        for out in res:
            self.assertTrue(out["ok"])
        self.assertEqual(res[0]["sessions"], res[1]["sessions"])
        self.assertNotEqual(res[0]["sessions"][0], res[0]["sessions"][1])

    def test_options_reach_the_library(self):
        res = run_job(self, 2, options_body, env={"SWITCHML_EARLY_RETRANSMIT": "3",
                                                  "SWITCHML_WINDOW": "128"})
        for out in res:
            self.assertTrue(out["ok"])
            self.assertEqual(out["world"], (3, 128))
            self.assertEqual(out["second"], (1, 64))
            # The default transport, auto, against the test's kernel UDP switch: udp, named so
            # in the groups' configs.
            self.assertEqual(out["transports"], ("udp", "udp"))
            # The default packet size, auto, against a switch that takes 256 at most: 256.
            self.assertEqual(out["packet_numels"], (256, 256))
            # The default threads, as many as the switch's data-plane threads: its one.
            self.assertEqual(out["threads"], (1, 1))
            # 196 results of the int32 all-reduce at least, through the job's loopback
            # multicast group (on by default with a switch on this host).
            stats = out["world_stats"]
            self.assertGreaterEqual(stats["group_datagrams_received"], 196, stats)

    def test_authenticated_data_plane_option(self):
        # A switch that refuses jobs without it: each group it serves asked for it.
        strict = switchml.Switch(require_authenticated_data=True, max_packet_numel=256)
        try:
            res = run_job(self, 2, auth_body, env={"SWITCHML_AUTH_DATA": "1"},
                          switch_port=strict.control_port)
            counters = strict.counters()
        finally:
            strict.stop()
        for out in res:
            self.assertEqual(out, {"ok": True, "world": True, "second": True})
        # Both groups' all-reduces (196 packets each per rank) passed the switch's tag check.
        self.assertGreaterEqual(counters["received"], 2 * 2 * 196)
        self.assertEqual(counters["auth_dropped"], 0)

    def test_sparse_option(self):
        res = run_job(self, 2, sparse_body, env={"SWITCHML_SPARSE": "on"})
        for out in res:
            self.assertTrue(out["int32"], out)
            self.assertTrue(out["float32"], out)
            self.assertTrue(out["sparse"], out)
            # Both all-reduces' blocks announced; one block of each in the union.
            self.assertEqual(out["blocks"], 391 + 196, out)
            self.assertEqual(out["union"], 2, out)
            # Two announcements, two union blocks and float32's exponent packet: not 587.
            self.assertLess(out["sent"], 20, out)
        self.assertIs(resolve(SWITCHML_SPARSE="off")["sparse"], False)
        self.assertIs(resolve(swtorch.Options(sparse="on"))["sparse"], True)
        self.assertEqual((resolve()["sparse"], resolve()["sparse_auto"]), (True, True))  # auto
        with self.assertRaisesRegex(ValueError, "SWITCHML_SPARSE='yes' is not valid: use auto"):
            resolve(SWITCHML_SPARSE="yes")

    def test_sparse_auto_chooses_per_bucket(self):
        res = run_job(self, 2, sparse_auto_body, env={"SWITCHML_SPARSE": "auto"})
        for out in res:
            self.assertTrue(out["auto"], out)
            for name in ("sparse", "dense", "ninety"):
                self.assertTrue(out[name]["exact"], (name, out))
            # One block of 400 crossed the network; the others every block, dense.
            self.assertEqual(out["sparse"], {"exact": True, "dense_shares": 0, "aggregated": 1})
            self.assertEqual(out["dense"], {"exact": True, "dense_shares": 1, "aggregated": 400})
            self.assertEqual(out["ninety"], {"exact": True, "dense_shares": 1, "aggregated": 400})
        auto = resolve(SWITCHML_SPARSE="auto")
        self.assertEqual((auto["sparse"], auto["sparse_auto"]), (True, True))
        on = resolve(swtorch.Options(sparse="on"))
        self.assertEqual((on["sparse"], on["sparse_auto"]), (True, False))

    def test_shm_transport_and_data_path_options(self):
        # A switch on shared-memory rings, in a shm directory of the test's own (the workers
        # inherit SWITCHML_SHM_DIR), two processes with two groups; the transport left to its
        # default, auto, which asks the switch and opens shm (the groups' configs say so). The
        # switch's default packet sizes (up to 2048 over shm) and WORLD's default size, auto:
        # 2048 (the second group asks for 256).
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None,
                                         prefix="switchml-torchtest-") as shm_dir, \
                mock.patch.dict(os.environ, {"SWITCHML_SHM_DIR": shm_dir}):
            sw = switchml.Switch(transport="shm")
            try:
                res = run_job(self, 2, data_path_body, switch_port=sw.control_port, env={
                    "SWITCHML_WAKE_BATCH": "0.25",
                    "SWITCHML_MULTICAST": "on", "SWITCHML_CHECK_TENSORS": "0"})
                counters = sw.counters()
            finally:
                sw.stop()
        ms = datetime.timedelta(milliseconds=1)
        for out in res:
            self.assertTrue(out["ok"])
            # The library's defaults where nothing was set.
            self.assertEqual(out["world"], ("shm", 0.25, "on", False, 1, 10.0, 0.1 * ms, 10 * ms,
                                            10 * ms, 1000 * ms, 2048))
            self.assertEqual(out["second"], ("shm", 0.5, "off", True, 2, 1.0, 5 * ms, 20 * ms,
                                             5 * ms, 2000 * ms, 256))
            # Twice 1 Gbit/s x 5 ms (625 KB) in packets of 1046 + 28 + 38 bytes on the wire:
            # 1124.1, rounded up to a multiple of 32 (above shm's floor, 1024).
            self.assertEqual(out["second_window"], 1152)
            stats = out["second_stats"]  # shm: every result its own datagram, no group
            self.assertGreaterEqual(stats["datagrams_received"], 196, stats)
            self.assertEqual(stats["group_datagrams_received"], 0, stats)
        # Both groups' int32 all-reduces (WORLD's 25 packets of 2048 and the second's 196 of 256
        # per rank) came through the rings.
        self.assertGreaterEqual(counters["received"], 2 * (25 + 196))

    def test_bad_options_raise_value_error(self):
        with self.assertRaisesRegex(ValueError, "early_retransmit=-1"):
            resolve(swtorch.Options(early_retransmit=-1))
        with self.assertRaisesRegex(ValueError, "SWITCHML_EARLY_RETRANSMIT='x'"):
            resolve(SWITCHML_EARLY_RETRANSMIT="x")
        with self.assertRaisesRegex(ValueError, "SWITCHML_AUTH_DATA='yes'"):
            resolve(SWITCHML_AUTH_DATA="yes")
        with self.assertRaisesRegex(ValueError, "names a host twice"):
            resolve(SWITCHML_SWITCH="10.0.0.1:50099,10.0.0.2,10.0.0.1")
        with self.assertRaisesRegex(ValueError, r"switch address '10.0.0.2:x' \(of"):
            resolve(SWITCHML_SWITCH="10.0.0.1,10.0.0.2:x")
        self.assertEqual(resolve(SWITCHML_SWITCH="10.0.0.1,10.0.0.2:7")["switch_hosts"],
                         ["10.0.0.1:50099", "10.0.0.2:7"])
        bad_options = (
            (dict(transport="tcp"), "transport='tcp' is not valid: use one of auto, udp, "
                                    "udp-plain, xdp, dpdk, shm"),
            (dict(wake_batch=1.5), r"wake_batch=1.5 is not valid: use a fraction in \[0, 1\]"),
            (dict(multicast="yes"), "multicast='yes' is not valid: use auto"),
            (dict(multicast="on", authenticate_data=True),
             "lan_multicast_required .multicast 'on'. cannot go with authenticate_data"),
            (dict(threads=65), "threads=65 is not valid: use 1..64, or 0 for as many as the "
             "switch.s data-plane threads"),
            (dict(packet_numel=128), "packet_numel=128 is not valid: use 64 or 256"),
            (dict(retransmit_timeout=0), "retransmit_timeout=0 is not valid"),
            (dict(min_retransmit_timeout=2.0), "max_timeout must be at least min_timeout"),
            (dict(udp_port=70000), "udp_port=70000 is not valid"))
        for options, message in bad_options:
            with self.assertRaisesRegex(ValueError, "switchml: " + message, msg=options):
                resolve(swtorch.Options(**options))
        bad_env = (("SWITCHML_TRANSPORT", "tcp"), ("SWITCHML_WAKE_BATCH", "x"),
                   ("SWITCHML_WAKE_BATCH", "2"), ("SWITCHML_MULTICAST", "lan"),
                   ("SWITCHML_CHECK_TENSORS", "no"), ("SWITCHML_BASE_RTT", "-1"),
                   ("SWITCHML_BUSY_POLL", "no"), ("SWITCHML_BUSY_POLL", "false"),
                   ("SWITCHML_BUSY_POLL", "2"), ("SWITCHML_PIN_THREADS", "yes"))
        # Checked by Config.validate(), so a ValueError from init_process_group too, not a
        # RuntimeError from the setup.
        with self.assertRaisesRegex(ValueError, "switchml: bind_address '10.0.0' is not an "
                                                "IPv4 address"):
            resolve(SWITCHML_BIND_ADDRESS="10.0.0")
        for name, value in bad_env:
            with self.assertRaisesRegex(ValueError, f"switchml: {name}={value!r}"):
                resolve(**{name: value})
        # The 0|1 variables read exactly 0 or 1 (busy polling once took "no" for on).
        for name, field in (("SWITCHML_BUSY_POLL", "busy_poll"),
                            ("SWITCHML_PIN_THREADS", "pin_threads"),
                            ("SWITCHML_CHECK_TENSORS", "check_tensors"),
                            ("SWITCHML_AUTH_DATA", "authenticate_data")):
            for raw, value in (("0", False), ("1", True)):
                self.assertIs(resolve(**{name: raw})[field], value, (name, raw))
        for field in ("wake_batch", "multicast", "check_tensors", "timeout", "busy_poll",
                      "pin_threads"):
            self.assertIsNone(resolve()[field], field)
        # The transport's default is the backend's own: auto (docs/python.md), unlike
        # switchml.Config's udp; a kind named is kept.
        self.assertEqual(swtorch.DEFAULT_TRANSPORT, "auto")
        self.assertEqual(resolve()["transport"], "auto")
        self.assertEqual(resolve(SWITCHML_TRANSPORT="udp")["transport"], "udp")
        self.assertEqual(resolve(swtorch.Options(transport="shm"))["transport"], "shm")
        # So is the packet size's: auto (0 in switchml.Config), unlike switchml.Config's 256.
        self.assertEqual(swtorch.DEFAULT_PACKET_NUMEL, "auto")
        self.assertEqual(resolve()["packet_numel"], 0)
        self.assertEqual(resolve(SWITCHML_PACKET_NUMEL="auto")["packet_numel"], 0)
        self.assertEqual(resolve(SWITCHML_PACKET_NUMEL="2048")["packet_numel"], 2048)
        self.assertEqual(resolve(swtorch.Options(packet_numel="auto"))["packet_numel"], 0)
        self.assertEqual(resolve(swtorch.Options(packet_numel=64))["packet_numel"], 64)
        # And the threads': 0, as many as the switch's data-plane threads (the library's is 1).
        self.assertEqual(resolve()["num_worker_threads"], 0)
        self.assertEqual(resolve(SWITCHML_THREADS="2")["num_worker_threads"], 2)
        with self.assertRaisesRegex(ValueError, "SWITCHML_PACKET_NUMEL='big' is not valid"):
            resolve(SWITCHML_PACKET_NUMEL="big")
        self.assertIsNone(resolve()["authenticate_data"])
        self.assertIsNone(resolve()["early_retransmit_after"])
        self.assertEqual(resolve(swtorch.Options(early_retransmit=0))["early_retransmit_after"], 0)

    def test_options_of_the_wrong_type_raise_type_error(self):
        # Each named the field and the type it takes (before: window="64" failed comparing a str
        # with an int, threads=2.5 in pybind11's argument conversion, busy_poll="no" turned
        # busy polling on, multicast=True said only that it was not valid).
        wrong = (
            (dict(window="64"), "window='64' is of type str, not an int: use 1..16384"),
            (dict(threads=2.5), "threads=2.5 is of type float, not an int: use 1..64"),
            (dict(threads=True), "threads=True is of type bool, not an int"),
            (dict(multicast=True), "multicast=True is of type bool, not a str: use auto"),
            (dict(busy_poll="no"), "busy_poll='no' is of type str, not a bool: use True or "
                                   "False"),
            (dict(authenticate_data=1), "authenticate_data=1 is of type int, not a bool"),
            (dict(pin_threads="on"), "pin_threads='on' is of type str, not a bool"),
            (dict(peer_timeout="5"), "peer_timeout='5' is of type str, not a number"),
            (dict(peer_timeout=datetime.timedelta(seconds=5)),
             "peer_timeout=datetime.timedelta.* is of type timedelta, not a number"),
            (dict(transport=["udp"]), r"transport=\['udp'\] is of type list, not a str"),
            (dict(switch=("127.0.0.1", 50099)), "switch=.* is of type tuple, not a str"),
            (dict(session_id="7"), "session_id='7' is of type str, not an int"))
        for options, message in wrong:
            with self.assertRaisesRegex(TypeError, "^switchml: " + message, msg=options):
                resolve(swtorch.Options(**options))
        # Numbers of another numeric type than the field's own are fine where they fit.
        r = resolve(swtorch.Options(peer_timeout=5, link_gbps=25, wake_batch=0, window=64))
        self.assertEqual((r["peer_timeout"], r["link_gbps"], r["max_outstanding_packets"]),
                         (datetime.timedelta(seconds=5), 25.0, 64))
        # Values of the right type but out of range, and times the library cannot hold (finer
        # than its unit, or beyond what timedelta holds), stay ValueErrors.
        bad = ((dict(peer_timeout=float("inf")), "peer_timeout=inf is not valid: seconds in "
                                                 r"\[0.001, 86400\]"),
               (dict(setup_timeout=1e20), "setup_timeout=1e\\+20 is not valid"),
               (dict(retransmit_timeout=0.0001), "retransmit_timeout=0.0001 is not valid"),
               (dict(base_rtt=float("nan")), "base_rtt=nan is not valid"),
               (dict(session_id=-1), "session_id=-1 is not valid: use 0..2\\^64-1"),
               (dict(switch="10.0.0.1:99999"), "switch address '10.0.0.1:99999' is not "
                                               r"host\[:port\] \(port 1..65535\)"),
               (dict(switch="10.0.0.1:"), "switch address '10.0.0.1:' is not"),
               (dict(switch=":50099"), "switch address ':50099' is not"))
        for options, message in bad:
            with self.assertRaisesRegex(ValueError, "^switchml: " + message, msg=options):
                resolve(swtorch.Options(**options))
        with self.assertRaisesRegex(ValueError, "SWITCHML_PEER_TIMEOUT='inf' is not valid"):
            resolve(SWITCHML_PEER_TIMEOUT="inf")

    def test_process_group_keeps_its_keyword_constructor(self):
        # ProcessGroupSwitchML built directly with the keyword arguments it took before the
        # Config form (a world of one, in this process).
        store = dist.HashStore()
        timeout = datetime.timedelta(seconds=30)
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), 0, 1, timeout)
        pg = swtorch.ProcessGroupSwitchML(
            dist.PrefixStore("switchml/", store), 0, 1, gloo, switch_host="127.0.0.1",
            control_port=self.switch.control_port, setup_timeout=timeout,
            max_outstanding_packets=32, early_retransmit_after=2)
        self.assertEqual((pg.window, pg.early_retransmit_after), (32, 2))
        t = torch.arange(1000, dtype=torch.int32)
        pg.allreduce([t]).wait()
        self.assertTrue(torch.equal(t, torch.arange(1000, dtype=torch.int32)))
        self.assertEqual(pg.switch_calls, 1)
        del pg

    def test_options_keep_their_positional_order(self):
        # Options built positionally (as before the data-path fields were added) keep their
        # meaning: the fields they had stay first, in their order, session_id last of them.
        o = swtorch.Options("10.0.0.1:5000", 2, 64, 64, "10.0.0.2", "udp-plain", True, 3.0, 4.0,
                            5, True, 99)
        self.assertEqual((o.switch, o.threads, o.window, o.packet_numel, o.bind_address,
                          o.transport, o.busy_poll, o.peer_timeout, o.setup_timeout,
                          o.early_retransmit, o.authenticate_data, o.session_id),
                         ("10.0.0.1:5000", 2, 64, 64, "10.0.0.2", "udp-plain", True, 3.0, 4.0,
                          5, True, 99))
        self.assertIsNone(o.link_gbps)
        self.assertIsNone(o.udp_port)
        r = resolve(o)
        self.assertEqual((r["packet_numel"], r["transport"], r["session_id"]),
                         (64, "udp-plain", 99))

    def test_destroying_a_group_with_fallback_work_pending_does_not_hang(self):
        self.assertEqual(run_job(self, 2, destroy_with_fallback_work_pending_body, timeout=30),
                         [True, True])

    def test_unreachable_switch_raises(self):
        start = time.monotonic()
        with self.assertRaises(AssertionError) as cm:
            run_job(self, 1, noop_body, switch_port=free_port(), timeout=60,
                    env={"SWITCHML_SETUP_TIMEOUT": "3"})
        self.assertIn("RuntimeError", str(cm.exception))
        self.assertIn("cannot join the switch", str(cm.exception))
        # A hang would end in run_job's 60 s timeout without the message above; this bound
        # leaves room for process start and `import torch`, which took up to 41 s at load 17.
        self.assertLess(time.monotonic() - start, 55)

    def test_monitored_barrier_names_a_missing_rank(self):
        for rank, out in enumerate(run_job(self, 2, monitored_barrier_body, timeout=90)):
            self.assertEveryCheckPassed(rank, out)

    def test_dead_peer_raises(self):
        res = run_job(self, 2, peer_dies_body, env={"SWITCHML_PEER_TIMEOUT": "2"}, timeout=60,
                      required=[0])
        self.assertTrue(res[0]["raised"], res[0])
        # The switch notices the dead rank's control stream and names it.
        self.assertIn("rank 1 lost its control connection", res[0]["message"])
        self.assertLess(res[0]["seconds"], 20)

    def test_digits_training_matches_gloo(self):
        """A short run of the training proof (examples/torch/compare_digits.py)."""
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                              "examples", "torch", "compare_digits.py")
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, SWITCHML_SWITCH=f"127.0.0.1:{self.switch.control_port}")
            r = subprocess.run([sys.executable, script, "--out-dir", out, "--workers", "2",
                                "--epochs", "2", "--no-plot"], env=env, capture_output=True,
                               text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("accuracy gap", r.stdout)  # and within 0.5 points: the exit code


if __name__ == "__main__":
    unittest.main()
