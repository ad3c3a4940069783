"""Several processes, one mesh: JAX's multi-controller runtime.

``import shardwise`` never joins a runtime; :func:`initialize_distributed` does, when called.
``shardwise launch`` starts N local processes with these variables set, and each joins before
its command runs; on a real cluster set them yourself and call
:func:`initialize_distributed` (with no variables set and no arguments, JAX detects SLURM,
Open MPI and the like):

- ``SHARDWISE_COORDINATOR``: ``host:port`` of process 0's coordination service;
- ``SHARDWISE_COORDINATOR_BIND``: in process 0, the ``host:port`` the coordinator listens on
  (``shardwise launch`` sets the coordinator's address, ``127.0.0.1`` unless told another;
  unset, JAX listens on every interface);
- ``SHARDWISE_NUM_PROCESSES`` and ``SHARDWISE_PROCESS_ID``;
- ``SHARDWISE_INIT_TIMEOUT``: seconds to wait for every process to join (default 60);
- ``SHARDWISE_HEARTBEAT_TIMEOUT``: seconds after which a silent process counts as lost and
  the others stop (default 30).

JAX's distributed runtime has no authentication: anyone who can reach the coordinator's port
can join the job, so expose it to trusted networks only.

Every process runs the same program; each creates only its own shards
(``jax.make_array_from_callback``) and results are gathered where a process needs all of
them (:func:`to_host`).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import numpy as np

from shardwise._errors import DistributedError
from shardwise._runtime.address import (
    await_coordinator,
    bind_error,
    join_address,
    split_address,
)
from shardwise._runtime.devices import apply_env

ENV_COORDINATOR = "SHARDWISE_COORDINATOR"
ENV_COORDINATOR_BIND = "SHARDWISE_COORDINATOR_BIND"
ENV_NUM_PROCESSES = "SHARDWISE_NUM_PROCESSES"
ENV_PROCESS_ID = "SHARDWISE_PROCESS_ID"
ENV_INIT_TIMEOUT = "SHARDWISE_INIT_TIMEOUT"
ENV_HEARTBEAT_TIMEOUT = "SHARDWISE_HEARTBEAT_TIMEOUT"


def _int_env(name: str, default: int | None = None) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"{name}={raw!r} is not a whole number.") from None


def initialize_distributed(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    init_timeout: int = 60,
    heartbeat_timeout: int = 30,
    coordinator_bind: str | None = None,
) -> None:
    """Join the distributed runtime (before any JAX computation).

    With no arguments: the ``SHARDWISE_*`` variables above if ``SHARDWISE_COORDINATOR`` is set
    (with ``SHARDWISE_CPU_DEVICES`` simulated devices, if set), else JAX detects the cluster
    (SLURM, Open MPI, Cloud TPU …). On CPU the processes exchange data with gloo collectives
    over the network.

    Process 0 hosts the coordinator. It listens on ``coordinator_bind`` (``HOST:PORT``; else
    ``SHARDWISE_COORDINATOR_BIND``), or on every interface where neither is set. The runtime
    has no authentication: anyone who can reach that port can join the job, so bind it to an
    interface that only the job's hosts reach.

    Does nothing in a process that has already joined (a program that ``shardwise launch``
    started has, before its first line).

    Raises:
        DistributedError: a wrong coordinator address, a process count that does not match,
            or a timeout JAX reports, with what to check. A process still waiting for the
            others after ``init_timeout`` seconds (which JAX's runtime would abort from native
            code) says so on standard error and exits with status 2.
    """
    given = (coordinator, num_processes, process_id)
    if given == (None, None, None) and os.environ.get(ENV_COORDINATOR, "").strip():
        apply_env()
        join_from_env()
        return
    bind = coordinator_bind or os.environ.get(ENV_COORDINATOR_BIND, "").strip() or None
    _join(coordinator, num_processes, process_id, init_timeout, heartbeat_timeout, bind)


def _join(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    init_timeout: int,
    heartbeat_timeout: int,
    bind: str | None = None,
) -> None:
    import jax

    if jax.distributed.is_initialized():
        return

    if coordinator is not None:
        # JAX ends the process outright when it cannot reach the coordinator; check first
        if (process_id or 0) == 0:
            _can_host(coordinator, bind)
        else:
            await_coordinator(coordinator, process_id or 0, num_processes, init_timeout)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    watch = _watchdog(process_id, num_processes, init_timeout)
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=init_timeout + _GRACE_S,
            heartbeat_timeout_seconds=heartbeat_timeout,
            shutdown_timeout_seconds=max(heartbeat_timeout, 5),
            coordinator_bind_address=bind if process_id == 0 else None,
        )
    except Exception as e:  # JAX raises RuntimeError / XlaRuntimeError with long texts
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = f"coordinator {coordinator}" if coordinator else "the detected coordinator"
        raise DistributedError(
            f"process {process_id} of {num_processes} could not join the runtime at {where} "
            f"within {init_timeout} s ({text}). Check that process 0 is running and that the "
            "address, port and process count are the same for every process."
        ) from None
    finally:
        watch.cancel()


_GRACE_S = 5
"""Seconds JAX waits past the timeout given, so that :func:`_watchdog` speaks first."""


def _watchdog(process_id: int | None, count: int | None, timeout: int) -> threading.Timer:
    """A timer that, where the runtime has not started ``timeout`` seconds on (a process never
    joined), says so and ends the process with status 2, before JAX's runtime aborts it from
    native code (status 134, a C++ stack: what process 0 had printed when a peer never came)."""

    who = f"process {process_id} of {count}" if count is not None else "this process"
    every = f"all {count} processes" if count is not None else "every process"

    def give_up() -> None:
        sys.stderr.write(
            f"error: {who}: not every process joined the runtime within {timeout} s. Check "
            f"that {every} were started, with the same coordinator address, port and process "
            f"count (a longer timeout: {ENV_INIT_TIMEOUT}, or initialize_distributed's "
            "init_timeout).\n"
        )
        sys.stderr.flush()
        os._exit(2)

    timer = threading.Timer(timeout, give_up)
    timer.daemon = True
    timer.start()
    return timer


def _can_host(coordinator: str, bind: str | None) -> None:
    """Process 0 must be able to listen where it will host the coordinator: on ``bind``, else
    on every interface (JAX's default), at an address of this machine."""
    host, port = split_address(bind or coordinator)
    for where in [host] if bind else [host, "0.0.0.0"]:
        e = bind_error(where, port)
        if e is not None:
            raise DistributedError(
                f"process 0 cannot host the coordinator on {join_address(where, port)} "
                f"({e.strerror or e}); the port is in use or the address is not this machine's."
            )


def _native_stdout_to_stderr() -> None:
    """Send what native libraries print to standard output (gloo announces every connection,
    from several threads, in pieces) to standard error, so a program's own output (``--json``)
    stays clean; Python's ``sys.stdout`` keeps the real standard output."""
    import sys

    try:
        sys.stdout.flush()
        real = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = os.fdopen(real, "w", buffering=1, encoding=sys.stdout.encoding or "utf-8")
    except (OSError, ValueError, AttributeError):
        pass


def join_from_env(native_stdout_to_stderr: bool = False) -> bool:
    """Join the runtime if ``SHARDWISE_COORDINATOR`` is set (``shardwise launch`` sets it,
    and ``SHARDWISE_COORDINATOR_BIND`` for process 0); return whether it did.
    ``native_stdout_to_stderr`` (for the CLI and ``launch``ed processes, whose standard output
    is their result) sends what native libraries print there to standard error."""
    coordinator = os.environ.get(ENV_COORDINATOR, "").strip()
    if not coordinator:
        return False
    count = _int_env(ENV_NUM_PROCESSES)
    pid = _int_env(ENV_PROCESS_ID)
    if count is None or pid is None:
        raise DistributedError(
            f"{ENV_COORDINATOR} is set, so {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be too."
        )
    if not 0 <= pid < count:
        raise DistributedError(
            f"{ENV_PROCESS_ID}={pid} is outside 0..{count - 1} ({ENV_NUM_PROCESSES}={count})."
        )
    import jax

    if jax.distributed.is_initialized():
        return True
    if native_stdout_to_stderr:
        _native_stdout_to_stderr()
    _join(
        coordinator,
        count,
        pid,
        init_timeout=_int_env(ENV_INIT_TIMEOUT, 60) or 60,
        heartbeat_timeout=_int_env(ENV_HEARTBEAT_TIMEOUT, 30) or 30,
        bind=os.environ.get(ENV_COORDINATOR_BIND, "").strip() or None,
    )
    return True


def process_index() -> int:
    """This process's index (0 on a single process)."""
    import jax

    return int(jax.process_index())


def multi_process() -> bool:
    """Whether the mesh spans more than one process."""
    import jax

    return int(jax.process_count()) > 1


def to_host(x: Any) -> np.ndarray:
    """The whole of a (possibly multi-process) array as a NumPy array on this process."""
    import jax

    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def put(x: Any, sharding: Any) -> Any:
    """Place a host array with ``sharding``; across processes each creates only its shards."""
    import jax

    if isinstance(x, jax.Array):
        return jax.device_put(x, sharding)
    if sharding.is_fully_addressable:
        from shardwise._runtime.hostmem import put_cpu

        return put_cpu(np.asarray(x), sharding)
    _spans_every_process(sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _spans_every_process(sharding: Any) -> None:
    """Every process runs the same program, so an array that spans processes must span them
    all: a process that holds none of it cannot take part."""
    import jax

    count = int(jax.process_count())
    held = sorted({int(d.process_index) for d in sharding.device_set})
    if len(held) == count:
        return
    missing = sorted(set(range(count)) - set(held))
    size = len(sharding.device_set)
    raise DistributedError(
        f"the mesh's {size} devices belong to processes {held} of the {count} in the runtime, "
        f"so process{'es' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
        f"{'hold' if len(missing) > 1 else 'holds'} none of them; every process runs the same "
        f"program and must hold part of each array. Use a mesh of all "
        f"{jax.device_count()} devices (mesh='auto'), or start as many devices as the mesh "
        f"has: shardwise launch -n N --devices-per-process K with N × K = {size}."
    )
