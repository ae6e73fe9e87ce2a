"""Tests of the switchml Python module: several workers as threads of one process (which needs
the GIL released while they wait), against an in-process switch on loopback."""
import array
import datetime
import os
import shutil
import tempfile
import threading
import time
import unittest

import numpy as np

import switchml


def run_workers(switch, n, body, session_id, **options):
    """Creates n contexts concurrently and runs body(ctx, rank) in each; returns the results
    by rank and re-raises the first exception."""
    results, errors = [None] * n, []

    def worker(rank):
        try:
            ctx = switchml.Context(rank=rank, num_workers=n, control_port=switch.control_port,
                                   session_id=session_id, setup_timeout=10.0, **options)
            results[rank] = body(ctx, rank)
        except BaseException as e:  # noqa: B902 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def inputs(rank, count, dtype, seed=0):
    rng = np.random.default_rng(seed + rank)
    if dtype == np.int32:
        return rng.integers(-1000, 1000, count, dtype=np.int32)
    return rng.standard_normal(count).astype(dtype)


class ConfigTest(unittest.TestCase):
    def test_unknown_option_is_a_type_error(self):
        with self.assertRaisesRegex(TypeError, "unknown option 'num_wrokers'"):
            switchml.Context(num_wrokers=2)

    def test_invalid_config_raises_the_library_message(self):
        with self.assertRaises(switchml.SwitchMLError) as cm:
            switchml.Context(rank=3, num_workers=2)
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        self.assertIn("use ranks 0 to 1", str(cm.exception))

    def test_config_fields_and_durations(self):
        c = switchml.Config()
        c.peer_timeout = datetime.timedelta(seconds=3)
        c.setup_timeout = 1.5
        self.assertEqual(c.peer_timeout, datetime.timedelta(seconds=3))
        self.assertEqual(c.setup_timeout, datetime.timedelta(seconds=1.5))
        c.base_rtt = datetime.timedelta(microseconds=250)
        self.assertEqual(c.base_rtt, datetime.timedelta(microseconds=250))
        for field in ("link_gbps", "min_timeout", "max_timeout", "max_outstanding_packets",
                      "early_retransmit_after"):
            self.assertTrue(hasattr(c, field), field)
        # The retransmission attributes read and write the C++ Config::retransmit struct, which
        # validate() checks: a timeout above the peer timeout is refused.
        c.timeout = datetime.timedelta(milliseconds=20)
        c.early_retransmit_after = 3
        self.assertEqual((c.timeout, c.early_retransmit_after),
                         (datetime.timedelta(milliseconds=20), 3))
        c.peer_timeout = datetime.timedelta(milliseconds=10)
        with self.assertRaisesRegex(switchml.SwitchMLError, "peer_timeout must be at least"):
            c.validate()
        c.peer_timeout = datetime.timedelta(seconds=3)
        c.packet_numel = 100
        with self.assertRaisesRegex(switchml.SwitchMLError, "use 64 or 256"):
            c.validate()
        c.packet_numel = 0  # automatic: chosen at setup
        c.validate()
        c.packet_numel = 256
        c.validate()
        # The bind address is checked by validate() too, not only when a Context binds.
        for bad in ("10.0.0", "localhost", "10.0.0.256", ""):
            c.bind_address = bad
            with self.assertRaisesRegex(switchml.SwitchMLError,
                                        f"bind_address '{bad}' is not an IPv4 address"):
                c.validate()

    def test_data_path_options_round_trip(self):
        c = switchml.Config()
        self.assertEqual((c.transport, c.wake_batch, c.multicast, c.check_tensors),
                         ("udp", 0.0, "auto", True))
        self.assertEqual((c.loopback_multicast, c.lan_multicast, c.lan_multicast_required),
                         (True, True, False))
        self.assertIn("shm", switchml.TRANSPORTS)
        for kind in switchml.TRANSPORTS:
            c.transport = kind
            c.validate()
            self.assertEqual(c.transport, kind)
        c.wake_batch = 0.25
        c.check_tensors = False
        c.job_secret = "s3cret"
        c.tls_ca_file, c.tls_cert_file, c.tls_key_file, c.tls_server_name = "a", "b", "c", "d"
        self.assertEqual((c.wake_batch, c.check_tensors, c.job_secret), (0.25, False, "s3cret"))
        self.assertEqual((c.tls_ca_file, c.tls_cert_file, c.tls_key_file, c.tls_server_name),
                         ("a", "b", "c", "d"))
        # multicast is switchml worker's --multicast over the two fields.
        for mode, fields in (("on", (True, True, True)), ("off", (False, False, False)),
                             ("local", (True, False, False)), ("auto", (True, True, False))):
            c.multicast = mode
            self.assertEqual((c.loopback_multicast, c.lan_multicast, c.lan_multicast_required),
                             fields)
            self.assertEqual(c.multicast, mode)
        def no_mode(read_error, validate_error):
            with self.assertRaisesRegex(switchml.SwitchMLError, read_error):
                c.multicast
            with self.assertRaisesRegex(switchml.SwitchMLError, validate_error):
                c.validate()

        # Required LAN multicast without LAN multicast is no mode either.
        c.lan_multicast, c.lan_multicast_required = False, True
        no_mode("lan_multicast_required=True with lan_multicast=False",
                "lan_multicast_required needs lan_multicast: set both")
        c.lan_multicast_required = False
        c.loopback_multicast = False
        self.assertEqual(c.multicast, "off")
        # LAN multicast alone is no mode: reading it raises (it once read "on", which sets
        # both), and validate() refuses it, saying what to set.
        c.lan_multicast = True
        no_mode("lan_multicast=True with loopback_multicast=False is not a multicast mode: set "
                "loopback_multicast=True", "lan_multicast needs loopback_multicast: set both")
        c.loopback_multicast = True
        c.validate()
        self.assertEqual(c.multicast, "auto")

    def test_bad_data_path_options_are_refused_at_setup(self):
        cases = ((dict(wake_batch=1.5), "wake_batch must be in [0, 1]"),
                 (dict(wake_batch=-0.1), "wake_batch must be in [0, 1]"),
                 (dict(transport="tcp"), "unknown transport 'tcp': use one of udp, udp-plain, "
                                         "xdp, dpdk, shm"),
                 (dict(multicast="maybe"), "multicast must be 'auto', 'local', 'on' or 'off', not 'maybe'"),
                 (dict(multicast="on", authenticate_data=True),
                  "(multicast 'on') cannot go with authenticate_data: datagrams to a group"),
                 (dict(job_secret="x" * 65), "job_secret must be at most 64 bytes"))
        for options, message in cases:
            start = time.monotonic()
            with self.assertRaises(switchml.SwitchMLError, msg=options) as cm:
                # No switch listens there: refused before any connection is tried.
                switchml.Context(rank=0, num_workers=2, control_port=1, setup_timeout=30.0,
                                 **options)
            self.assertEqual(cm.exception.code, "INVALID_ARGUMENT", options)
            self.assertIn(message, str(cm.exception))
            self.assertLess(time.monotonic() - start, 5, options)
        with self.assertRaisesRegex(switchml.SwitchMLError, "unknown transport 'tcp'"):
            switchml.Switch(transport="tcp")

    def test_unreachable_switch_raises_within_the_setup_timeout(self):
        sw = switchml.Switch()
        port = sw.control_port
        sw.stop()  # nothing listens there any more
        start = time.monotonic()
        with self.assertRaises(switchml.SwitchMLError) as cm:
            switchml.Context(rank=0, num_workers=2, control_port=port, setup_timeout=1.0)
        self.assertLess(time.monotonic() - start, 10)
        self.assertIn(cm.exception.code, ("DEADLINE_EXCEEDED", "UNAVAILABLE"))


class AllReduceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.switch = switchml.Switch()
        cls.session = 100

    @classmethod
    def tearDownClass(cls):
        cls.switch.stop()

    def run_job(self, n, body, **options):
        type(self).session += 1
        return run_workers(self.switch, n, body, self.session, **options)

    def test_int32_is_exact_and_float32_within_the_bound(self):
        n, count = 3, 10000
        for dtype in (np.int32, np.float32):
            out = self.run_job(n, lambda ctx, r: ctx.allreduce(inputs(r, count, dtype)))
            expect = sum(inputs(r, count, dtype).astype(np.float64) for r in range(n))
            for r in range(n):
                self.assertEqual(out[r].dtype, dtype)
                if dtype == np.int32:
                    np.testing.assert_array_equal(out[r], expect.astype(np.int32))
                else:
                    # docs/architecture.md 5.2: n^2 2^E / (2 (2^31 - 1)) + float32 rounding.
                    bound = n * n * 2.0 ** np.ceil(np.log2(np.abs(expect).max() + 1)) / 2**32
                    np.testing.assert_allclose(out[r], expect, rtol=2**-23, atol=bound)

    def test_in_place_is_zero_copy_and_returns_the_same_object(self):
        def body(ctx, r):
            x = np.full((4, 100), r + 1, dtype=np.int32)
            address = x.__array_interface__["data"][0]
            y = ctx.allreduce(x, out=x)
            return y is x, x.__array_interface__["data"][0] == address, x

        for same, same_address, x in self.run_job(2, body):
            self.assertTrue(same)
            self.assertTrue(same_address)
            np.testing.assert_array_equal(x, np.full((4, 100), 3, dtype=np.int32))

    def test_strided_views_and_other_buffer_objects(self):
        def body(ctx, r):
            base = np.arange(600, dtype=np.float32).reshape(20, 30) * (r + 1)
            strided = base[::2, 1::3]  # not contiguous
            out_view = np.zeros((20, 30), np.float32)[::2, 1::3]
            ctx.allreduce(strided, out=out_view)
            arr = array.array("i", [r, 2 * r, 3 * r])
            ctx.allreduce(arr, out=arr)
            mv = memoryview(bytearray(np.full(5, r + 1, np.int32).tobytes())).cast("i")
            ctx.allreduce(mv, out=mv)
            return strided, out_view, list(arr), list(mv)

        expect = (np.arange(600, dtype=np.float32).reshape(20, 30) * 3)[::2, 1::3]
        for _, out_view, arr, mv in self.run_job(2, body):
            np.testing.assert_allclose(out_view, expect, rtol=1e-6)
            self.assertEqual(arr, [1, 2, 3])
            self.assertEqual(mv, [3] * 5)

    def test_float16_within_its_rounding(self):
        n, count = 2, 3000
        out = self.run_job(n, lambda ctx, r: ctx.allreduce(inputs(r, count, np.float16)))
        expect = sum(inputs(r, count, np.float16).astype(np.float64) for r in range(n))
        for r in range(n):
            self.assertEqual(out[r].dtype, np.float16)
            # One float16 rounding of the result (2^-11 relative) dominates the quantization.
            np.testing.assert_allclose(out[r].astype(np.float64), expect, rtol=2**-10, atol=1e-3)

    def test_async_handles(self):
        def body(ctx, r):
            xs = [np.full(1000 * (i + 1), r + i, np.int32) for i in range(4)]
            handles = [ctx.allreduce_async(x, out=x) for x in xs]
            outs = [h.wait() for h in handles]
            done = all(h.is_completed() for h in handles)
            ctx.wait_for_all()
            ctx.barrier()
            return done, outs, ctx.session_id

        res = self.run_job(2, body)
        for done, outs, session in res:
            self.assertTrue(done)
            self.assertEqual(session, res[0][2])
            for i, o in enumerate(outs):
                np.testing.assert_array_equal(o, np.full(1000 * (i + 1), 1 + 2 * i, np.int32))

    def test_early_retransmission_option(self):
        def body(ctx, r):
            x = np.arange(100000, dtype=np.int32) * (r + 1)
            ctx.allreduce(x, out=x)
            return x, ctx.config.early_retransmit_after, ctx.config.num_workers

        for x, after, n in self.run_job(3, body, early_retransmit_after=2):
            np.testing.assert_array_equal(x, np.arange(100000, dtype=np.int32) * 6)
            self.assertEqual((after, n), (2, 3))

    def test_multicast_and_wake_batch_options_reach_the_library(self):
        def body(ctx, r):
            x = np.arange(50000, dtype=np.int32) * (r + 1)
            ctx.allreduce(x, out=x)
            c = ctx.config
            return x, ctx.stats(), (c.multicast, c.wake_batch, c.check_tensors)

        # With a switch on this host results come through the job's group unless it is off.
        for options, group in ((dict(multicast="auto", wake_batch=0.5), True),
                               (dict(multicast="off", check_tensors=False), False)):
            for x, stats, fields in self.run_job(2, body, **options):
                np.testing.assert_array_equal(x, np.arange(50000, dtype=np.int32) * 3)
                self.assertEqual(fields, (options["multicast"], options.get("wake_batch", 0.0),
                                          options.get("check_tensors", True)))
                # 196 packets of 256 elements, each answered once.
                self.assertGreaterEqual(stats["datagrams_received"], 196)
                if group:
                    self.assertGreaterEqual(stats["group_datagrams_received"], 196, stats)
                else:
                    self.assertEqual(stats["group_datagrams_received"], 0, stats)

    def test_wrong_dtype_and_size(self):
        def body(ctx, r):
            with self.assertRaisesRegex(TypeError, "float32, int32 or float16"):
                ctx.allreduce(np.zeros(4, np.float64))
            with self.assertRaisesRegex(ValueError, "out has 3 elements"):
                ctx.allreduce(np.zeros(4, np.float32), out=np.zeros(3, np.float32))
            with self.assertRaisesRegex(TypeError, "out has format"):
                ctx.allreduce(np.zeros(4, np.float32), out=np.zeros(4, np.int32))
            # Another byte order (NumPy's '>f4'): refused, not summed as if it were this one's.
            with self.assertRaisesRegex(TypeError, "byte order.*'>f'"):
                ctx.allreduce(np.arange(4, dtype=">f4"))
            with self.assertRaisesRegex(TypeError, "byte order.*'>i'"):
                ctx.allreduce(np.zeros(4, np.int32), out=np.zeros(4, ">i4"))
            np.testing.assert_array_equal(ctx.allreduce(np.arange(4, dtype="=f4")), np.arange(4))
            with self.assertRaises(BufferError):  # read-only
                ctx.allreduce(np.zeros(4, np.float32), out=b"0123456789abcdef")
            return True

        self.assertEqual(self.run_job(1, body), [True])

    def test_a_dead_peer_raises_instead_of_hanging(self):
        def body(ctx, r):
            if r == 1:
                return None  # leaves without all-reducing; its context is destroyed
            time.sleep(0.5)
            start = time.monotonic()
            with self.assertRaises(switchml.SwitchMLError) as cm:
                ctx.allreduce(np.ones(1000, np.float32))
            return cm.exception.code, time.monotonic() - start

        code, seconds = self.run_job(2, body, peer_timeout=1.0)[0]
        self.assertEqual(code, "DEADLINE_EXCEEDED")
        self.assertLess(seconds, 10)


class SharedMemoryTest(unittest.TestCase):
    """transport='shm' end to end: a switch on shared-memory rings and two workers, in a shm
    directory of the test's own (SWITCHML_SHM_DIR)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None,
                                    prefix="switchml-pytest-")
        self.saved = os.environ.get("SWITCHML_SHM_DIR")
        os.environ["SWITCHML_SHM_DIR"] = self.dir

    def tearDown(self):
        if self.saved is None:
            del os.environ["SWITCHML_SHM_DIR"]
        else:
            os.environ["SWITCHML_SHM_DIR"] = self.saved
        shutil.rmtree(self.dir)

    def test_two_workers_over_shm(self):
        sw = switchml.Switch(transport="shm")
        try:
            self.assertIn(f"inbox-{sw.data_port}", os.listdir(self.dir))

            def body(ctx, r):
                x = np.arange(100000, dtype=np.int32) * (r + 1)
                ctx.allreduce(x, out=x)
                y = ctx.allreduce(inputs(r, 5000, np.float32))
                return x, y, ctx.config.transport, ctx.stats()

            res = run_workers(sw, 2, body, 601, transport="shm", num_worker_threads=2)
            counters = sw.counters()
        finally:
            sw.stop()
        expect = sum(inputs(r, 5000, np.float32).astype(np.float64) for r in range(2))
        for x, y, transport, stats in res:
            np.testing.assert_array_equal(x, np.arange(100000, dtype=np.int32) * 3)
            bound = 4 * 2.0 ** np.ceil(np.log2(np.abs(expect).max() + 1)) / 2**32
            np.testing.assert_allclose(y, expect, rtol=2**-23, atol=bound)
            self.assertEqual(transport, "shm")
            # Results through the job's shm groups (the default, --multicast auto).
            self.assertGreater(stats["group_datagrams_received"], 0)
        # Every packet of both workers (391 + 20 each) went through the switch's rings.
        self.assertGreaterEqual(counters["received"], 2 * (391 + 20))
        self.assertEqual(os.listdir(self.dir), [])  # every inbox and group file removed


class AuthenticatedDataTest(unittest.TestCase):
    """Config.authenticate_data (docs/security.md 4.4) from Python, against a switch that
    refuses jobs without it (so a job it serves has reached it with the option set)."""

    @classmethod
    def setUpClass(cls):
        cls.switch = switchml.Switch(require_authenticated_data=True)

    @classmethod
    def tearDownClass(cls):
        cls.switch.stop()

    def test_an_authenticated_job_is_exact_and_every_tag_verifies(self):
        def body(ctx, r):
            x = np.arange(100000, dtype=np.int32) * (r + 1)
            ctx.allreduce(x, out=x)
            y = ctx.allreduce(inputs(r, 5000, np.float32))
            return x, y, ctx.config.authenticate_data, ctx.stats()["auth_dropped"]

        before = self.switch.counters()
        res = run_workers(self.switch, 2, body, 501, authenticate_data=True)
        expect = sum(inputs(r, 5000, np.float32).astype(np.float64) for r in range(2))
        for x, y, auth, dropped in res:
            np.testing.assert_array_equal(x, np.arange(100000, dtype=np.int32) * 3)
            bound = 4 * 2.0 ** np.ceil(np.log2(np.abs(expect).max() + 1)) / 2**32  # as above
            np.testing.assert_allclose(y, expect, rtol=2**-23, atol=bound)
            self.assertTrue(auth)
            self.assertEqual(dropped, 0)
        after = self.switch.counters()
        # 2 workers x (391 + 20 packets) went through the switch's tag check, none failed it.
        self.assertGreaterEqual(after["received"] - before["received"], 2 * (391 + 20))
        self.assertEqual(after["auth_dropped"], before["auth_dropped"])

    def test_a_job_without_it_is_refused_by_a_switch_that_requires_it(self):
        with self.assertRaises(switchml.SwitchMLError) as cm:
            run_workers(self.switch, 1, lambda ctx, r: None, 502)
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        self.assertIn("authenticate_data", str(cm.exception))

    def test_workers_that_disagree_are_refused_at_setup(self):
        sw = switchml.Switch()
        try:
            errors = []

            def worker(rank):
                try:
                    switchml.Context(rank=rank, num_workers=2, control_port=sw.control_port,
                                     session_id=503, setup_timeout=10.0,
                                     authenticate_data=(rank == 0))
                except switchml.SwitchMLError as e:
                    errors.append(str(e))

            threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            self.assertEqual(len(errors), 2, errors)
            self.assertTrue(any("authenticate_data" in e for e in errors), errors)
        finally:
            sw.stop()


class SparseTest(unittest.TestCase):
    """Config.sparse (block-sparse all-reduces, docs/protocol.md 2.5) from Python."""

    def test_only_the_union_crosses_and_the_result_is_exact(self):
        sw = switchml.Switch()
        try:
            def body(ctx, r):
                x = np.zeros(100000, dtype=np.int32)  # 391 blocks of 256
                x[3 * 256:4 * 256] = np.arange(256, dtype=np.int32) * (r + 1)  # both: block 3
                if r == 1:
                    x[7 * 256 + 5] = -9  # rank 1 only: block 7
                y = ctx.allreduce(x)
                return y, ctx.config.sparse, ctx.stats()

            res = run_workers(sw, 2, body, 601, sparse=True)
        finally:
            sw.stop()
        expect = np.zeros(100000, dtype=np.int32)
        expect[3 * 256:4 * 256] = np.arange(256, dtype=np.int32) * 3
        expect[7 * 256 + 5] = -9
        for r, (y, sparse, stats) in enumerate(res):
            np.testing.assert_array_equal(y, expect)
            self.assertTrue(sparse)
            self.assertEqual(stats["sparse_blocks"], 391)
            self.assertEqual(stats["sparse_union_blocks"], 2)
            self.assertEqual(stats["sparse_own_blocks"], 1 + r)
            # The announcement (one packet: 391 two-bit fields) and the union's two blocks.
            self.assertLess(stats["packets_sent"], 10)


class StripedTest(unittest.TestCase):
    """A job striped over two in-process switches (Config.switch_hosts)."""

    def test_striped_job_is_exact_and_reports_its_hosts(self):
        switches = [switchml.Switch(), switchml.Switch()]
        try:
            hosts = [f"127.0.0.1:{sw.control_port}" for sw in switches]
            n, count = 2, 20000

            def body(ctx, r):
                return ctx.allreduce(inputs(r, count, np.int32)), ctx.stats(), ctx.config

            out = run_workers(switches[0], n, body, 601, switch_hosts=hosts)
            expect = sum(inputs(r, count, np.int32) for r in range(n))
            for result, stats, config in out:
                np.testing.assert_array_equal(result, expect)
                self.assertEqual(stats["switch_hosts_alive"], 2)
                self.assertEqual(stats["failovers"], 0)
                self.assertEqual(config.switch_hosts, hosts)
        finally:
            for sw in switches:
                sw.stop()

    def test_a_host_listed_twice_is_refused(self):
        c = switchml.Config()
        c.switch_hosts = ["127.0.0.1:50099", "127.0.0.1:50099"]
        with self.assertRaisesRegex(switchml.SwitchMLError, "listed twice"):
            c.validate()


if __name__ == "__main__":
    unittest.main()
