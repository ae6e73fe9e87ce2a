"""The "switchml" torch.distributed backend (PyTorch 1.13).

    import switchml.torch  # registers the backend
    torch.distributed.init_process_group("switchml", ...)

all_reduce with SUM on CPU float32, int32, float16 and bfloat16 tensors goes through the SwitchML
switch (float16/bfloat16 as float32 on the way); every other collective, op, dtype or device is
served by a Gloo process group made on the same store. The switch and the worker options come
from init_process_group(pg_options=switchml.torch.Options(...)) or, for what those leave unset,
from the environment (switchml worker's flag in brackets):

    SWITCHML_SWITCH=host[:port]    the switch's control plane (default 127.0.0.1:50099); a
                                   comma-separated list stripes the job over several switch
                                   hosts (the same list on every process; docs/deployment.md)
    SWITCHML_THREADS=N             worker threads (UDP ports) per process (default 0: as many as
                                   the switch's data-plane threads) [--threads]
    SWITCHML_WINDOW=N              packets in flight per process (default: from the link rate and
                                   base round trip) [--window]
    SWITCHML_LINK_GBPS=G           link rate the automatic window is sized for (10) [--link-gbps]
    SWITCHML_BASE_RTT=SECONDS      round trip the automatic window is sized for (0.0001)
    SWITCHML_PACKET_NUMEL=auto|64|256|512|1024|2048  elements per packet; auto (the default):
                                   the largest the switch takes, the transport carries and the
                                   MTU toward the switch holds (2048 from a `switchml switch` on
                                   this host or across an MTU of 9000, 256 from a reference
                                   switch or across an MTU of 1500; docs/python.md); 512 and up:
                                   jumbo packets, where the switch enables them [--packet-numel]
    SWITCHML_BIND_ADDRESS=IPv4     local address for the data plane (default 0.0.0.0) [--bind]
    SWITCHML_UDP_PORT=N            first local data-plane port (default 0: any) [--udp-port]
    SWITCHML_TRANSPORT=auto|udp|udp-plain|xdp|dpdk|shm  the data-plane transport; auto (the
                                   default): the one the switch serves, shm for a shm switch on
                                   this host, else udp (docs/python.md)
    SWITCHML_BUSY_POLL=0|1         poll for results without sleeping (default 0) [--busy-poll]
    SWITCHML_WAKE_BATCH=F          wake-up batching, F in [0, 1] (default 0: off) [--wake-batch]
    SWITCHML_MULTICAST=auto|local|on|off  results once per job to a multicast group: auto = with
                                   a switch on this host, and on the LAN where the switch and
                                   the network allow it (default); local = on this host only;
                                   on = as auto, but an error without the LAN group
    SWITCHML_CHECK_TENSORS=0|1     the switch checks every all-reduce's count and type (default 1)
    SWITCHML_PEER_TIMEOUT=SECONDS  an all-reduce fails when no result comes for this long (10)
    SWITCHML_RETRANSMIT_TIMEOUT=SECONDS      a packet's timeout until round trips are measured
    SWITCHML_MIN_RETRANSMIT_TIMEOUT=SECONDS  and its floor and ceiling (0.01, 0.01, 1)
    SWITCHML_MAX_RETRANSMIT_TIMEOUT=SECONDS
    SWITCHML_EARLY_RETRANSMIT=N    re-send a packet once N later ones got results (0: off)
    SWITCHML_AUTH_DATA=0|1         the authenticated data plane (docs/security.md 4.4; every
                                   process of the job the same)
    SWITCHML_SPARSE=auto|on|off    block-sparse all-reduces (docs/protocol.md 2.5): only blocks
                                   non-zero on some process cross the network; auto: a bucket
                                   whose blocks are almost all non-zero somewhere (over 7/8)
                                   runs dense, and a switch without the feature runs the job
                                   dense (default auto; every process of the job the same)
                                   [--sparse, --sparse-auto]
    SWITCHML_SETUP_TIMEOUT=SECONDS joining the switch fails after this long (the group's
                                   timeout, at most 60)

A bad value raises ValueError from init_process_group, naming the option or variable; an
Options field of the wrong Python type (window="64", threads=2.5, multicast=True) TypeError,
naming the field and the type it takes. See docs/python.md.
"""

import dataclasses
import datetime
import numbers
import os
from typing import Optional, Union

import torch.distributed as dist

import switchml
from switchml import _torch

ProcessGroupSwitchML = _torch.ProcessGroupSwitchML
DEFAULT_CONTROL_PORT = 50099
MULTICAST_MODES = ("auto", "local", "on", "off")
SPARSE_MODES = ("auto", "on", "off")
# "auto": the transport the switch serves, chosen at setup (switchml::Config::transport).
TRANSPORT_CHOICES = ("auto",) + tuple(switchml.TRANSPORTS)
DEFAULT_TRANSPORT = "auto"
# "auto": the largest packet size the switch, the transport and the path allow, chosen at setup
# (switchml::Config::packet_numel 0).
PACKET_NUMELS = (64, 256, 512, 1024, 2048)
DEFAULT_PACKET_NUMEL = "auto"


@dataclasses.dataclass
class Options:
    """Backend options; a field left None is read from the environment, then defaulted."""

    # The fields before session_id in the order they always had: Options is also built
    # positionally. Fields added later go after it, never between.
    switch: Optional[str] = None  # "host[:port]", or "host[:port],host[:port],..." (striped)
    threads: Optional[int] = None
    window: Optional[int] = None
    packet_numel: Optional[Union[int, str]] = None  # an int, or "auto" (or 0): the default
    bind_address: Optional[str] = None
    transport: Optional[str] = None  # "auto" or one of switchml.TRANSPORTS
    busy_poll: Optional[bool] = None
    peer_timeout: Optional[float] = None  # seconds
    setup_timeout: Optional[float] = None  # seconds
    early_retransmit: Optional[int] = None  # Config::retransmit.early_retransmit_after (0: off)
    authenticate_data: Optional[bool] = None  # Config::authenticate_data
    session_id: int = 0  # 0: rank 0 picks a random one and shares it through the store
    link_gbps: Optional[float] = None  # Config::link_gbps (the automatic window)
    base_rtt: Optional[float] = None  # seconds; Config::base_rtt (the automatic window)
    udp_port: Optional[int] = None  # Config::udp_port (0: any)
    wake_batch: Optional[float] = None  # Config::wait.wake_batch, in [0, 1] (0: off)
    multicast: Optional[str] = None  # "auto", "on" or "off" (switchml worker --multicast)
    check_tensors: Optional[bool] = None  # Config::check_tensors
    retransmit_timeout: Optional[float] = None  # seconds; Config::retransmit.timeout
    min_retransmit_timeout: Optional[float] = None  # seconds; Config::retransmit.min_timeout
    max_retransmit_timeout: Optional[float] = None  # seconds; Config::retransmit.max_timeout
    pin_threads: Optional[bool] = None  # Config::pin_threads
    sparse: Optional[str] = None  # "auto", "on" or "off": Config::sparse and sparse_auto


_KIND_NAMES = {int: "an int", float: "a number (int or float)", str: "a str", bool: "a bool"}


def _of_kind(value, kind):
    """value as `kind` when it is of that kind (an int or float for float; bool is not an int
    here, nor an int a bool), else None."""
    if kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if kind is int:
        return int(value) if isinstance(value, numbers.Integral) else None
    if kind is float:
        return float(value) if isinstance(value, numbers.Real) else None
    return value if isinstance(value, kind) else None


def _parse(raw, kind):
    """An environment variable's text as `kind` (bool: exactly 0 or 1), or None."""
    if kind is bool:
        return {"0": False, "1": True}.get(raw)
    if kind is str:
        return raw
    try:
        return kind(raw)
    except ValueError:
        return None


def _resolve(options, group_timeout):
    """The switchml.Config fields that the options and the environment set (None: the library's
    default), checked: a value of the wrong Python type in Options raises TypeError, a bad value
    (or a bad environment variable) ValueError; both name the Options field or the variable and
    say what to use."""
    o = options if options is not None else Options()
    env = os.environ

    def pick(field, name, default, kind, valid=None, hint=""):
        """The value of Options field `field`, else of environment variable `name`, else
        `default`; kind (int, float, str or bool) is the type the field takes, and how the
        variable is read (bool: 0 or 1)."""
        value = getattr(o, field)
        if value is not None:
            shown = f"{field}={value!r}"
            hint = ": use True or False" if kind is bool else f": {hint}" if hint else ""
            if _of_kind(value, kind) is None:
                raise TypeError(f"switchml: {shown} is of type {type(value).__name__}, not "
                                f"{_KIND_NAMES[kind]}{hint}")
            value = _of_kind(value, kind)
        else:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            shown = f"{name}={raw!r}"
            hint = ": use 0 or 1" if kind is bool else f": {hint}" if hint else ""
            value = _parse(raw, kind)
        if value is None or (valid is not None and not valid(value)):
            raise ValueError(f"switchml: {shown} is not valid{hint}")
        return value

    def seconds(field, name, low, high):
        # low: the resolution of the Config field (1 ms or 1 us); finer is not representable.
        hint = f"seconds in [{low:g}, {high:g}]"
        v = pick(field, name, None, float, lambda x: low <= x <= high, hint)
        return None if v is None else datetime.timedelta(seconds=v)

    def packet_numel():
        """Options.packet_numel (an int, or "auto"), else SWITCHML_PACKET_NUMEL, else auto: as
        switchml.Config.packet_numel (0 for auto)."""
        hint = ("use 64 or 256, or 512, 1024 or 2048 where the switch enables jumbo packets, or "
                "auto (the largest the switch and the path take)")
        value = o.packet_numel
        if value is None:
            raw = env.get("SWITCHML_PACKET_NUMEL")
            value = DEFAULT_PACKET_NUMEL if raw is None or raw == "" else raw
            shown = f"SWITCHML_PACKET_NUMEL={raw!r}"
            if value != "auto":
                value = _parse(value, int)
        else:
            shown = f"packet_numel={value!r}"
            if value != "auto" and _of_kind(value, int) is None:
                raise TypeError(f"switchml: {shown} is of type {type(value).__name__}, not an int "
                                f"or 'auto': {hint}")
            if value != "auto":
                value = _of_kind(value, int)
        if value == "auto" or value == 0:
            return 0
        if value not in PACKET_NUMELS:
            raise ValueError(f"switchml: {shown} is not valid: {hint}")
        return value

    switch = pick("switch", "SWITCHML_SWITCH", "127.0.0.1", str)
    targets = []
    for item in switch.split(","):
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host or (":" in item and not (port.isascii() and port.isdigit()
                                             and 1 <= int(port) <= 65535)):
            of = f" (of {switch!r})" if "," in switch else ""
            raise ValueError(f"switchml: switch address {item!r}{of} is not host[:port] (port "
                             "1..65535); several: host[:port],host[:port],...")
        targets.append((host, int(port) if port else DEFAULT_CONTROL_PORT))
    if len(set(targets)) != len(targets):
        raise ValueError(f"switchml: switch list {switch!r} names a host twice: list each once")
    host, port = targets[0]
    session_id = o.session_id
    if _of_kind(session_id, int) is None:
        raise TypeError(f"switchml: session_id={session_id!r} is of type "
                        f"{type(session_id).__name__}, not an int")
    if not 0 <= session_id < 2**64:
        raise ValueError(f"switchml: session_id={session_id!r} is not valid: use 0..2^64-1 "
                         "(0: rank 0 picks one)")
    kinds = ", ".join(TRANSPORT_CHOICES)
    group_seconds = group_timeout.total_seconds()
    kwargs = dict(
        switch_host=host,
        control_port=port,
        switch_hosts=[f"{h}:{p}" for h, p in targets] if len(targets) > 1 else [],
        setup_timeout=datetime.timedelta(seconds=pick(
            "setup_timeout", "SWITCHML_SETUP_TIMEOUT", min(group_seconds, 60.0), float,
            lambda x: 0.001 <= x <= 86400, "seconds in [0.001, 86400]")),
        session_id=int(session_id),
        # None: switchml::Config's default.
        # 0 by default, unlike switchml::Config (1): as many as the switch's data-plane
        # threads, asked at setup (docs/python.md, "DDP steps on one host").
        num_worker_threads=pick("threads", "SWITCHML_THREADS", 0, int,
                                lambda x: 0 <= x <= 64,
                                "use 1..64, or 0 for as many as the switch's data-plane threads"),
        max_outstanding_packets=pick("window", "SWITCHML_WINDOW", None, int,
                                     lambda x: 0 <= x <= 16384,
                                     "use 1..16384 packets (0: automatic)"),
        link_gbps=pick("link_gbps", "SWITCHML_LINK_GBPS", None, float,
                       lambda x: 0 < x <= 1e6, "Gbit/s in (0, 1e6]"),
        base_rtt=seconds("base_rtt", "SWITCHML_BASE_RTT", 1e-6, 10),
        # auto by default, unlike switchml::Config (256): the largest size the switch and the
        # path take (docs/python.md, "DDP steps on one host, and which transport").
        packet_numel=packet_numel(),
        bind_address=pick("bind_address", "SWITCHML_BIND_ADDRESS", None, str, None,
                          "an IPv4 address"),
        udp_port=pick("udp_port", "SWITCHML_UDP_PORT", None, int, lambda x: 0 <= x <= 65535,
                      "use 0..65535 (0: any free ports)"),
        # auto by default, unlike switchml::Config (udp): the one the switch serves, so a switch
        # on this host serving shm is reached over shared memory (docs/python.md, "DDP steps on
        # one host, and which transport").
        transport=pick("transport", "SWITCHML_TRANSPORT", DEFAULT_TRANSPORT, str,
                       lambda x: x in TRANSPORT_CHOICES, f"use one of {kinds}"),
        busy_poll=pick("busy_poll", "SWITCHML_BUSY_POLL", None, bool),
        pin_threads=pick("pin_threads", "SWITCHML_PIN_THREADS", None, bool),
        wake_batch=pick("wake_batch", "SWITCHML_WAKE_BATCH", None, float,
                        lambda x: 0 <= x <= 1,
                        "use a fraction in [0, 1] of the packets in flight (0: off)"),
        multicast=pick("multicast", "SWITCHML_MULTICAST", None, str,
                       lambda x: x in MULTICAST_MODES,
                       "use auto (on this host, and on the LAN where it can be had), local "
                       "(on this host only), on (auto, or an error without the LAN group) or off"),
        check_tensors=pick("check_tensors", "SWITCHML_CHECK_TENSORS", None, bool),
        peer_timeout=seconds("peer_timeout", "SWITCHML_PEER_TIMEOUT", 0.001, 86400),
        timeout=seconds("retransmit_timeout", "SWITCHML_RETRANSMIT_TIMEOUT", 0.001, 3600),
        min_timeout=seconds("min_retransmit_timeout", "SWITCHML_MIN_RETRANSMIT_TIMEOUT", 1e-6,
                            3600),
        max_timeout=seconds("max_retransmit_timeout", "SWITCHML_MAX_RETRANSMIT_TIMEOUT", 0.001,
                            3600),
        early_retransmit_after=pick("early_retransmit", "SWITCHML_EARLY_RETRANSMIT", None, int,
                                    lambda x: 0 <= x <= 1_000_000, "use 0..1000000 (0: off)"),
        authenticate_data=pick("authenticate_data", "SWITCHML_AUTH_DATA", None, bool),
    )
    # auto by default, unlike switchml::Config (off): a DDP bucket may hold an embedding table's
    # mostly-zero gradient, and a dense bucket costs only the announcement (docs/python.md).
    sparse = pick("sparse", "SWITCHML_SPARSE", "auto", str, lambda x: x in SPARSE_MODES,
                  "use auto (block-sparse, a bucket with almost no zero block dense), on (every "
                  "all-reduce block-sparse) or off")
    kwargs["sparse"] = sparse != "off"
    kwargs["sparse_auto"] = sparse == "auto"
    _config(kwargs, 0, 1)  # what only the combination can get wrong
    return kwargs


def _config(kwargs, rank, size):
    """A switchml.Config from _resolve's fields for this rank, validated (ValueError)."""
    c = switchml.Config()
    c.rank, c.num_workers = rank, size
    for field, value in kwargs.items():
        if value is not None:
            setattr(c, field, value)
    try:
        c.validate()
    except switchml.SwitchMLError as e:
        raise ValueError(f"switchml: {e.message}") from None
    return c


def create_process_group(backend_options, pg_options=None):
    """The backend's creator (torch.distributed's extended API): a Gloo group for everything
    the switch does not serve, then the switch session, both on the group's own store."""
    store = backend_options.store
    rank, size = backend_options.group_rank, backend_options.group_size
    timeout = backend_options.timeout
    config = _config(_resolve(pg_options, timeout), rank, size)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    return ProcessGroupSwitchML(dist.PrefixStore("switchml/", store), rank, size, gloo, config)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for a switchml group: the same arguments and errors.
    torch 1.13 refuses it for every backend but gloo before it asks the group
    ("monitored_barrier is only implemented for GLOO backend"); this asks the switchml group,
    whose Gloo fallback runs it, so a rank that does not arrive within `timeout` is named
    ("Rank 1 failed to pass monitoredBarrier in 2000 ms"; with wait_all_ranks every such rank)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if timeout is None:
        timeout = dist.default_pg_timeout
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


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
