"""Work done beside the search: the baselines, each its own dynamic programming and integer
programs, solved in threads while the search solves its own.

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
    :meth:`results`. Each thread runs in a copy of the caller's context (:mod:`contextvars`:
    the search's caches) and is a daemon: an interrupted plan does not wait for it, and
    :meth:`cancel` leaves the tasks no one has taken undone.

    >>> Beside([lambda: 1, lambda: 2, lambda: 3], alone=False).results()
    [1, 2, 3]
    """

    def __init__(self, tasks: Sequence[Callable[[], T]], alone: bool) -> None:
        self._tasks = list(tasks)
        self._done: list[tuple[T] | None] = [None] * len(self._tasks)
        self._errors: list[BaseException | None] = [None] * len(self._tasks)
        self._next = 0
        self._lock = threading.Lock()
        helpers = 0 if alone else min(len(self._tasks), cores() - 1)
        self._threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(self._work,),
                             name=f"shardwise-beside-{k}", daemon=True)
            for k in range(helpers)
        ]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        """Do the tasks no one has taken yet, one at a time, until none is left."""
        while True:
            with self._lock:
                k = self._next
                if k == len(self._tasks):
                    return
                self._next += 1
            try:
                self._done[k] = (self._tasks[k](),)
            except BaseException as e:  # (raised by :meth:`results`, in the task's order)
                self._errors[k] = e

    def cancel(self) -> None:
        """Leave undone the tasks no one has taken yet (the caller's own work failed: its
        error goes up, and nothing waits for the tasks under way)."""
        with self._lock:
            self._next = len(self._tasks)

    def results(self) -> list[T]:
        """Each task's value, in order, once all are done (the caller does those no thread
        has taken); the first task's error, by order, raised instead."""
        self._work()
        for thread in self._threads:
            thread.join()
        for error in self._errors:
            if error is not None:
                raise error
        return [done[0] for done in self._done if done is not None]
