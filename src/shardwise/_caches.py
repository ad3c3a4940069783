"""Every cache shardwise keeps, in one registry: each one bounded, all of them clearable.

shardwise caches what is costly to redo and fixed by its key: parsed equations, plans,
jitted and compiled programs, the planner's choices. A cache's key holds everything its value
depends on (shapes, dtypes, mesh, options, JAX's 64-bit mode, the cost profile), so a hit is
never stale; :func:`clear_caches` empties them all, e.g. to free compiled programs.

>>> @cached(maxsize=4)
... def square(n: int) -> int:
...     return n * n
>>> square(3), square.cache_info().currsize
(9, 1)
>>> clear_caches()
>>> square.cache_info().currsize
0
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
K = TypeVar("K")
V = TypeVar("V")

_CLEARERS: list[Callable[[], None]] = []


def cached(maxsize: int) -> Callable[[F], F]:
    """``functools.lru_cache(maxsize)``, registered with :func:`clear_caches`."""
    if maxsize is None or maxsize <= 0:
        raise ValueError(f"a cache needs a positive bound, got maxsize={maxsize!r}")

    def wrap(fn: F) -> F:
        wrapped = functools.lru_cache(maxsize=maxsize)(fn)
        _CLEARERS.append(wrapped.cache_clear)
        return wrapped  # type: ignore[return-value]

    return wrap


def per_object(maxsize: int) -> Callable[[F], F]:
    """A function of one object, cached by that object's identity (for what is computed once
    per graph, which is not hashable by value): each entry keeps its object alive, so that
    its id is not reused while it is there; registered with :func:`clear_caches`.

    >>> @per_object(maxsize=2)
    ... def size(xs: list[int]) -> int:
    ...     print("computed")
    ...     return len(xs)
    >>> xs = [1, 2]
    >>> size(xs)
    computed
    2
    >>> size(xs)
    2
    """

    def wrap(fn: F) -> F:
        found: Bounded[int, tuple[Any, Any]] = Bounded(maxsize)

        @functools.wraps(fn)
        def once(obj: Any) -> Any:
            hit = found.get(id(obj))
            if hit is not None and hit[0] is obj:
                return hit[1]
            value = fn(obj)
            found.put(id(obj), (obj, value))
            return value

        return once  # type: ignore[return-value]

    return wrap


class Bounded(Generic[K, V]):
    """A mapping that keeps its ``maxsize`` most recently used entries (registered with
    :func:`clear_caches`), for caches keyed on something other than a function's arguments.

    >>> c: Bounded[str, int] = Bounded(2)
    >>> c.put("a", 1); c.put("b", 2); c.get("a"); c.put("c", 3)
    1
    >>> c.get("b") is None, len(c)
    (True, 2)
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize <= 0:
            raise ValueError(f"a cache needs a positive bound, got maxsize={maxsize!r}")
        self.maxsize = maxsize
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        _CLEARERS.append(self.clear)

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def clear_caches() -> None:
    """Empty every cache shardwise keeps: plans, jitted and compiled programs, the planner's
    choices and parsed equations. Later calls rebuild what they need.

    >>> import shardwise
    >>> shardwise.clear_caches()
    """
    for clear in _CLEARERS:
        clear()
