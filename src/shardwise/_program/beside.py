"""Work done in threads beside the caller's: the baselines, each its own dynamic programming
and integer programs, solved while the search solves its own; the pricing's costs of steps
further on, made while the caller prices the steps in order (:mod:`.pricing`).

HiGHS and NumPy's operations on large arrays release the GIL, so on two cores or more the
threads run at once: on a mesh of four axes each baseline is seconds of linear programs and
of dynamic programming over tables of millions of entries. The threads take the tasks one by
one; once the caller's own work is done, it takes what is left. A small problem's tasks are
done by the caller alone, after its own work, as before: threads would only take turns with
it for the GIL.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from shardwise._xla.kernels import cores

T = TypeVar("T")

BESIDE_PAIRS = 1_000_000
"""The fewest pairs of choices a problem's edges join for its baselines to be solved beside
the search (the size past which the search solves integer programs over each variable's
likeliest choices, :data:`~shardwise._program.search.MAX_PAIRS`)."""


class Beside(Generic[T]):
    """``tasks``, done from now by threads of their own (one fewer than the cores this process
    may run on, at most one per task; none where ``alone``), and by the caller in
    :meth:`result` and :meth:`results`. Each thread runs in a copy of the caller's context
    (:mod:`contextvars`: the search's caches) and is a daemon: an interrupted plan does not
    wait for it, and :meth:`cancel` leaves the tasks no one has taken undone.

    >>> Beside([lambda: 1, lambda: 2, lambda: 3], alone=False).results()
    [1, 2, 3]
    """

    def __init__(self, tasks: Sequence[Callable[[], T]], alone: bool) -> None:
        self._tasks = list(tasks)
        self._done: list[tuple[T] | None] = [None] * len(self._tasks)
        self._errors: list[BaseException | None] = [None] * len(self._tasks)
        self._taken = [False] * len(self._tasks)
        self._ready = [threading.Event() for _ in self._tasks]
        self._next = 0  # (no task before it is left to take)
        self._lock = threading.Lock()
        helpers = 0 if alone else min(len(self._tasks), cores() - 1)
        self._threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(self._work,),
                             name=f"shardwise-beside-{k}", daemon=True)
            for k in range(helpers)
        ]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def _take(self) -> int | None:
        """The first task no one has taken, now taken; ``None``: none is left."""
        with self._lock:
            while self._next < len(self._tasks) and self._taken[self._next]:
                self._next += 1
            if self._next == len(self._tasks):
                return None
            self._taken[self._next] = True
            return self._next

    def _run(self, k: int, caller: bool = False) -> None:
        """Do task ``k``; its error is raised by :meth:`result`, in the task's order, but
        the caller's interrupt (``KeyboardInterrupt``, ``SystemExit``) at once."""
        try:
            self._done[k] = (self._tasks[k](),)
        except BaseException as e:
            self._errors[k] = e
            if caller and not isinstance(e, Exception):
                raise
        finally:
            self._ready[k].set()

    def _work(self, caller: bool = False) -> None:
        """Do the tasks no one has taken yet, one at a time, until none is left."""
        while (k := self._take()) is not None:
            self._run(k, caller)

    def cancel(self) -> None:
        """Leave undone the tasks no one has taken yet (the caller's own work failed: its
        error goes up, and nothing waits for the tasks under way)."""
        with self._lock:
            self._next = len(self._tasks)

    def result(self, k: int) -> T:
        """Task ``k``'s value (its error raised instead): done by the caller now where no
        thread has taken it; else, until a thread has done it, the caller does the next
        tasks no one has taken (none left: it waits)."""
        while not self._ready[k].is_set():
            with self._lock:
                mine = not self._taken[k]
                self._taken[k] = True
            other = k if mine else self._take()
            if other is None:
                self._ready[k].wait()
            else:
                self._run(other, caller=True)
        error = self._errors[k]
        if error is not None:
            raise error
        done = self._done[k]
        assert done is not None
        return done[0]

    def results(self) -> list[T]:
        """Each task's value, in order, once all are done (the caller does those no thread
        has taken; none :meth:`cancel` left undone); the first task's error, by order, raised
        instead."""
        self._work(caller=True)
        for thread in self._threads:
            thread.join()
        return [self.result(k) for k in range(len(self._tasks)) if self._taken[k]]
