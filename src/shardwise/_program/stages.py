"""Where a program's planning is, said to whoever listens (the command's status line) as each
stage starts, and the pricing step by step: on a mesh of four axes it takes most of a minute,
and the whole plan minutes.

>>> seen = []
>>> with told(seen.append):
...     say("searching")
>>> say("unheard"); seen
['searching']
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_LISTENER: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "shardwise_planning_stage", default=None
)


@contextlib.contextmanager
def told(listener: Callable[[str], None]) -> Iterator[None]:
    """Within it, each stage of planning is said to ``listener``, in words."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def say(stage: str) -> None:
    """``stage`` said to the listener, if one listens."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(stage)


def listener() -> Callable[[str], None] | None:
    """Who listens (``None``: no one), for a loop that would say each of its steps."""
    return _LISTENER.get()
