"""Several processes, one mesh: JAX's multi-controller runtime.

``import shardwise`` never joins a runtime; :func:`initialize_distributed` does, when called.
``shardwise launch`` starts N local processes with these variables set, and each joins before
its command runs; on a real cluster set them yourself and call
:func:`initialize_distributed` (with no variables set and no arguments, JAX detects SLURM,
Open MPI and the like):

- ``SHARDWISE_COORDINATOR``: ``host:port`` of process 0's coordination service;
- ``SHARDWISE_NUM_PROCESSES`` and ``SHARDWISE_PROCESS_ID``;
- ``SHARDWISE_INIT_TIMEOUT``: seconds to wait for every process to join (default 60);
- ``SHARDWISE_HEARTBEAT_TIMEOUT``: seconds after which a silent process counts as lost and
  the others stop (default 30).

Every process runs the same program; each creates only its own shards
(``jax.make_array_from_callback``) and results are gathered where a process needs all of
them (:func:`to_host`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shardwise._errors import DistributedError
from shardwise._runtime.devices import apply_env

ENV_COORDINATOR = "SHARDWISE_COORDINATOR"
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
) -> None:
    """Join the distributed runtime (before any JAX computation).

    With no arguments: the ``SHARDWISE_*`` variables above if ``SHARDWISE_COORDINATOR`` is set
    (with ``SHARDWISE_CPU_DEVICES`` simulated devices, if set), else JAX detects the cluster
    (SLURM, Open MPI, Cloud TPU …). On CPU the processes exchange data with gloo collectives
    over the network.

    Does nothing in a process that has already joined (a program that ``shardwise launch``
    started has, before its first line).

    Raises:
        DistributedError: a wrong coordinator address, a process count that does not match,
            or a timeout, with what to check.
    """
    given = (coordinator, num_processes, process_id)
    if given == (None, None, None) and os.environ.get(ENV_COORDINATOR, "").strip():
        apply_env()
        join_from_env()
        return
    _join(coordinator, num_processes, process_id, init_timeout, heartbeat_timeout)


def _join(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    init_timeout: int,
    heartbeat_timeout: int,
) -> None:
    import jax

    if jax.distributed.is_initialized():
        return

    if coordinator is not None:
        # JAX ends the process outright when it cannot reach the coordinator; check first
        _reachable(coordinator, process_id or 0, num_processes, init_timeout)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=init_timeout,
            heartbeat_timeout_seconds=heartbeat_timeout,
            shutdown_timeout_seconds=max(heartbeat_timeout, 5),
        )
    except Exception as e:  # JAX raises RuntimeError / XlaRuntimeError with long texts
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = f"coordinator {coordinator}" if coordinator else "the detected coordinator"
        raise DistributedError(
            f"process {process_id} of {num_processes} could not join the runtime at {where} "
            f"within {init_timeout} s ({text}). Check that process 0 is running and that the "
            "address, port and process count are the same for every process."
        ) from None


def _reachable(coordinator: str, process_id: int, count: int | None, timeout: float) -> None:
    """Process 0 must be able to listen on the port; the others must reach it in time."""
    import socket
    import time

    host, _, port_text = coordinator.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise DistributedError(f"coordinator {coordinator!r} is not host:port.") from None
    if process_id == 0:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host or "0.0.0.0", port))
            except OSError as e:
                raise DistributedError(
                    f"process 0 cannot host the coordinator on {coordinator} ({e.strerror or e});"
                    " the port is in use or the address is not this machine's."
                ) from None
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise DistributedError(
                    f"process {process_id} of {count} could not join the runtime: nothing "
                    f"answered at coordinator {coordinator} within {timeout:.0f} s. Check that "
                    "process 0 is running there and that every process was given the same "
                    "address and port."
                ) from None
            time.sleep(0.2)


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
    """Join the runtime if ``SHARDWISE_COORDINATOR`` is set (``shardwise launch`` sets it);
    return whether it did. ``native_stdout_to_stderr`` (for the CLI and ``launch``ed
    processes, whose standard output is their result) sends what native libraries print
    there to standard error."""
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
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
