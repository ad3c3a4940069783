"""Where the coordinator of JAX's distributed runtime listens, and what answers there:
addresses read and written, free ports, whether a port can be bound, and whether what listens
at an address is JAX's coordinator (JAX ends a process outright where it is not)."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

from shardwise._errors import DistributedError

_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""What an HTTP/2 client sends first: the connection preface and an empty SETTINGS frame. JAX's
coordinator (a gRPC server) answers with a SETTINGS frame of its own."""


def split_address(address: str) -> tuple[str, int]:
    """The host and port of ``HOST:PORT`` (``[IPV6]:PORT`` too).

    >>> split_address("127.0.0.1:1234")
    ('127.0.0.1', 1234)
    >>> split_address("[::1]:80")
    ('::1', 80)
    """
    host, _, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(
            f"coordinator address {address!r} is not HOST:PORT; give it as e.g. "
            "10.0.0.1:1234 or [::1]:1234, with a port from 1 to 65535."
        )
    return host, int(port)


def join_address(host: str, port: int) -> str:
    """``HOST:PORT``, with an IPv6 host in brackets.

    >>> join_address("::1", 80)
    '[::1]:80'
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def free_port() -> int:
    """A TCP port nothing listens on now at 127.0.0.1, below the range the kernel hands out
    to outgoing connections and ``bind(0)``: process 0 listens there only a second or more
    later, and a port from that range may by then be another connection's end (gloo opens
    many). Falls back to a port the kernel picks.

    >>> 1024 <= free_port() < 65536
    True
    """
    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(min(10000, low // 2), low)
        if bind_error("127.0.0.1", port) is None:
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux says; else IANA's 49152)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def bind_error(host: str, port: int) -> OSError | None:
    """Why a server could not listen at ``host:port`` now, or ``None`` if it could."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def await_coordinator(coordinator: str, process_id: int, count: int | None, timeout: float) -> None:
    """Wait until something listens at ``coordinator``, and check that it is a gRPC server
    (JAX ends the process outright when what answers there is not its coordinator)."""
    host, port = split_address(coordinator)
    deadline = time.monotonic() + timeout
    for _ in range(3):  # a connection closed at once may be a server still starting
        while True:
            try:
                with socket.create_connection((host, port), timeout=1.0) as s:
                    answer, why = _hello(s, min(5.0, max(deadline - time.monotonic(), 1.0)))
                break
            except OSError:  # nothing listens there (yet)
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"process {process_id} of {count} could not join the runtime: nothing "
                        f"answered at coordinator {coordinator} within {timeout:.0f} s. Check "
                        "that process 0 is running there and that every process was given the "
                        "same address and port."
                    ) from None
                time.sleep(0.2)
        if len(answer) >= 9 and answer[3] == 4 and answer[5:9] == bytes(4):
            return  # an HTTP/2 SETTINGS frame: a gRPC server
        if answer or "silent" in why:
            break
        time.sleep(0.5)
    raise DistributedError(
        f"process {process_id} of {count} could not join the runtime: what listens at "
        f"coordinator {coordinator} is not JAX's coordinator (a gRPC server); it {why}. "
        "Check the address and port: they must be those of process 0, the same for every "
        "process."
    )


def _hello(s: socket.socket, wait: float) -> tuple[bytes, str]:
    """Greet an HTTP/2 server on socket ``s``: the first 9 bytes it answered (an HTTP/2 frame's
    header) within ``wait`` seconds, and in words what it did."""
    answer = b""
    try:
        s.sendall(_HTTP2_HELLO)
        s.settimeout(wait)
        while len(answer) < 9:
            chunk = s.recv(9 - len(answer))
            if not chunk:
                break
            answer += chunk
        else:
            return answer, f"answered {answer!r} where a gRPC server sends an HTTP/2 SETTINGS frame"
        what = "closed the connection"
    except TimeoutError:
        what = f"kept silent for {wait:.0f} s"
    except OSError as e:
        what = f"reset the connection ({e.strerror or e})"
    return answer, f"answered {answer!r}, then {what}" if answer else what
