"""The "switchml" torch.distributed backend (PyTorch 1.13).

    import switchml.torch  # registers the backend
    torch.distributed.init_process_group("switchml", ...)

all_reduce with SUM on CPU float32, int32, float16 and bfloat16 tensors goes through the SwitchML
switch (float16/bfloat16 as float32 on the way); every other collective, op, dtype or device is
served by a Gloo process group made on the same store. The switch and the worker options come
from init_process_group(pg_options=switchml.torch.Options(...)) or, for what those leave unset,
from the environment:

    SWITCHML_SWITCH=host[:port]    the switch's control plane (default 127.0.0.1:50099)
    SWITCHML_THREADS=N             worker threads (UDP ports) per process (default 1)
    SWITCHML_WINDOW=N              packets in flight per process (default: the library's)
    SWITCHML_PACKET_NUMEL=64|256   elements per packet (default 256)
    SWITCHML_BIND_ADDRESS=IPv4     local address for the data plane (default 0.0.0.0)
    SWITCHML_TRANSPORT=udp|udp-plain
    SWITCHML_BUSY_POLL=0|1
    SWITCHML_PEER_TIMEOUT=SECONDS  an all-reduce fails when no result comes for this long (10)
    SWITCHML_EARLY_RETRANSMIT=N    re-send a packet once N later ones got results (0: off)
    SWITCHML_AUTH_DATA=0|1         the authenticated data plane (docs/security.md 4.4; every
                                   process of the job the same)
    SWITCHML_SETUP_TIMEOUT=SECONDS joining the switch fails after this long (the group's
                                   timeout, at most 60)

See docs/python.md.
"""

import dataclasses
import datetime
import os
from typing import Optional

import torch.distributed as dist

from switchml import _torch

ProcessGroupSwitchML = _torch.ProcessGroupSwitchML
DEFAULT_CONTROL_PORT = 50099


@dataclasses.dataclass
class Options:
    """Backend options; a field left None is read from the environment, then defaulted."""

    switch: Optional[str] = None  # "host[:port]"
    threads: Optional[int] = None
    window: Optional[int] = None
    packet_numel: Optional[int] = None
    bind_address: Optional[str] = None
    transport: Optional[str] = None
    busy_poll: Optional[bool] = None
    peer_timeout: Optional[float] = None  # seconds
    setup_timeout: Optional[float] = None  # seconds
    early_retransmit: Optional[int] = None  # Config::early_retransmit_after (0: off)
    authenticate_data: Optional[bool] = None  # Config::authenticate_data
    session_id: int = 0  # 0: rank 0 picks a random one and shares it through the store


def _resolve(options, group_timeout):
    o = options if options is not None else Options()
    env = os.environ

    def pick(value, name, default, convert):
        if value is not None:
            return value
        raw = env.get(name)
        if raw is None or raw == "":
            return default
        try:
            return convert(raw)
        except ValueError:
            raise ValueError(f"switchml: {name}={raw!r} is not valid") from None

    def flag(raw):
        if raw not in ("0", "1"):
            raise ValueError(raw)
        return raw == "1"

    switch = pick(o.switch, "SWITCHML_SWITCH", "127.0.0.1", str)
    host, _, port = switch.rpartition(":") if ":" in switch else (switch, "", "")
    if not port.isdigit() and port != "":
        raise ValueError(f"switchml: switch address {switch!r} is not host[:port]")
    peer_timeout = pick(o.peer_timeout, "SWITCHML_PEER_TIMEOUT", None, float)
    early = pick(o.early_retransmit, "SWITCHML_EARLY_RETRANSMIT", None, int)
    if early is not None and not 0 <= early <= 1_000_000:
        raise ValueError(f"switchml: early_retransmit={early} is not in [0, 1000000] (0: off)")
    return dict(
        switch_host=host,
        control_port=int(port) if port else DEFAULT_CONTROL_PORT,
        setup_timeout=datetime.timedelta(seconds=pick(
            o.setup_timeout, "SWITCHML_SETUP_TIMEOUT",
            min(group_timeout.total_seconds(), 60.0), float)),
        session_id=o.session_id,
        # None: switchml::Config's default.
        num_worker_threads=pick(o.threads, "SWITCHML_THREADS", None, int),
        max_outstanding_packets=pick(o.window, "SWITCHML_WINDOW", None, int),
        packet_numel=pick(o.packet_numel, "SWITCHML_PACKET_NUMEL", None, int),
        bind_address=pick(o.bind_address, "SWITCHML_BIND_ADDRESS", None, str),
        transport=pick(o.transport, "SWITCHML_TRANSPORT", None, str),
        busy_poll=pick(o.busy_poll, "SWITCHML_BUSY_POLL", None, lambda s: s not in ("0", "")),
        peer_timeout=None if peer_timeout is None else datetime.timedelta(seconds=peer_timeout),
        early_retransmit_after=early,
        authenticate_data=pick(o.authenticate_data, "SWITCHML_AUTH_DATA", None, flag),
    )


def create_process_group(backend_options, pg_options=None):
    """The backend's creator (torch.distributed's extended API): a Gloo group for everything
    the switch does not serve, then the switch session, both on the group's own store."""
    store = backend_options.store
    rank, size = backend_options.group_rank, backend_options.group_size
    timeout = backend_options.timeout
    kwargs = _resolve(pg_options, timeout)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    return ProcessGroupSwitchML(dist.PrefixStore("switchml/", store), rank, size, gloo, **kwargs)


if "SWITCHML" not in dist.Backend._plugins:
    dist.Backend.register_backend("switchml", create_process_group, extended_api=True)


def _local_worker(rank, world, init_method, backend, env, fn, args, queue):
    import traceback
    try:
        os.environ.update(env)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        queue.put((rank, "ok", fn(rank, world, *args)))
        dist.destroy_process_group()
    except BaseException:  # noqa: B902 - reported to the parent
        queue.put((rank, "error", traceback.format_exc()))


def run_local(world, fn, *args, backend="switchml", env=None, timeout=120.0, required=None):
    """Runs fn(rank, world, *args) in `world` new processes (spawned) that form one job over
    loopback with `backend`; returns the values by rank. For tests and single-machine runs:
    start a switch first (switchml.Switch or `switchml switch`) and name it in
    env["SWITCHML_SWITCH"]. fn must be importable (a module-level function).

    Raises RuntimeError with the failing rank's traceback, or when the job exceeds `timeout`
    seconds. Ranks outside `required` (default: all) may end without a value (None)."""
    import multiprocessing
    import queue as queue_module
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = multiprocessing.get_context("spawn")
    results_queue = ctx.Queue()
    procs = [ctx.Process(target=_local_worker,
                         args=(r, world, init_method, backend, env or {}, fn, args,
                               results_queue))
             for r in range(world)]
    for p in procs:
        p.start()
    required = set(range(world) if required is None else required)
    results, deadline = {}, time.monotonic() + timeout
    try:
        while not required <= results.keys():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"the job did not finish in {timeout} s (results from ranks "
                                   f"{sorted(results)})")
            try:
                rank, status, value = results_queue.get(timeout=min(remaining, 1.0))
            except queue_module.Empty:
                if all(not p.is_alive() for p in procs) and results_queue.empty():
                    raise RuntimeError("the workers exited without results (ranks "
                                       f"{sorted(required - results.keys())})") from None
                continue
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return [results.get(r) for r in range(world)]
