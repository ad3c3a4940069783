"""Run one streamed einsum in a child process (for kill, memory and fault tests).

usage: python stream_child.py EQUATION OUT BUDGET [--slow] [--rss] [--truncate PATH] INPUT...

``--slow`` sleeps a little after each chunk and before each write, so that kills land
everywhere; ``--truncate PATH`` cuts the file PATH to half its size once the first chunk is
done (an input truncated under a running stream).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import shardwise

shardwise.use_cpu_devices(8)


def main() -> None:
    args = sys.argv[1:]
    truncate = None
    if "--truncate" in args:
        at = args.index("--truncate")
        truncate = args[at + 1]
        del args[at : at + 2]
    slow = "--slow" in args
    rss = "--rss" in args
    args = [a for a in args if a not in ("--slow", "--rss")]
    equation, out, budget, *inputs = args

    def on_chunk(done: int, total: int, nbytes: int) -> None:
        nonlocal truncate
        if truncate is not None:
            os.truncate(truncate, os.path.getsize(truncate) // 2)
            truncate = None
        if slow:
            time.sleep(random.uniform(0.0, 0.03))

    if slow:  # a slow disk too: kills then land mid-write and between writes and flushes
        from shardwise._data.sink import Sink

        write = Sink.write

        def slow_write(self: Sink, *args: Any, **kwargs: Any) -> None:
            time.sleep(random.uniform(0.0, 0.03))
            write(self, *args, **kwargs)

        Sink.write = slow_write  # type: ignore[method-assign]

    result = shardwise.stream(
        equation, *inputs, mesh="devices=8", out=out, budget=budget, on_chunk=on_chunk
    )
    if rss:
        from shardwise._data.stream import peak_rss

        print(json.dumps({"peak_rss": peak_rss(), **result.to_json()}))


if __name__ == "__main__":
    main()
