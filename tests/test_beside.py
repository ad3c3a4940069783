"""The baselines solved in threads beside the search (:mod:`shardwise._program.beside`): the
same plans as solved one after another, every task done once and in its order, errors raised
in the tasks' order, and native output kept off stdout while threads solve at once."""

from __future__ import annotations

import contextvars
import os
import threading

import pytest

import shardwise
from shardwise._program import beside as beside_module
from shardwise._program import program as program_module
from shardwise._program.beside import Beside
from shardwise._program.integer import stdout_to_stderr

WAIT_S = 60.0
"""How long a task waits for another to run beside it before the test fails (only a broken
:class:`Beside` waits that long: the other is then never run at the same time)."""


@pytest.fixture
def four_cores(monkeypatch):
    """As on a machine of four cores, whatever this one has: three threads beside the caller."""
    monkeypatch.setattr(beside_module, "cores", lambda: 4)


def test_tasks_run_at_once_each_once_and_come_back_in_order(four_cores):
    began = [threading.Event() for _ in range(3)]
    runs = [0, 0, 0]

    def task(k):
        def run():
            runs[k] += 1
            began[k].set()
            # each waits for the others to have begun: only tasks run at once get past this
            return k, all(e.wait(WAIT_S) for e in began)

        return run

    assert Beside([task(k) for k in range(3)], alone=False).results() == [
        (0, True), (1, True), (2, True)
    ]  # fmt: skip
    assert runs == [1, 1, 1]


def test_alone_the_caller_does_every_task_in_order_after_its_own_work(four_cores):
    order = []

    def task(k):
        return lambda: order.append((k, threading.current_thread()))

    pending = Beside([task(k) for k in range(4)], alone=True)
    order.append("own work")
    pending.results()
    caller = threading.current_thread()
    assert order == ["own work", *((k, caller) for k in range(4))]


def test_the_first_tasks_error_by_order_is_raised_once_every_task_is_done(four_cores):
    done = []

    def fails(k):
        def run():
            done.append(k)
            raise ValueError(f"task {k}")

        return run

    tasks = [fails(0), lambda: done.append(1), fails(2)]
    with pytest.raises(ValueError, match="task 0"):
        Beside(tasks, alone=False).results()
    assert sorted(done) == [0, 1, 2]


def test_cancelled_the_tasks_no_one_has_taken_are_left_undone(monkeypatch):
    monkeypatch.setattr(beside_module, "cores", lambda: 2)  # (one thread beside the caller)
    began, go, ran = threading.Event(), threading.Event(), []

    def first():
        began.set()
        assert go.wait(WAIT_S)
        ran.append(0)
        return 0

    pending = Beside([first, *(lambda k=k: ran.append(k) for k in range(1, 4))], alone=False)
    assert began.wait(WAIT_S)  # (the thread has taken the first task)
    pending.cancel()
    go.set()
    assert pending.results() == [0]
    assert ran == [0]
    alone = Beside([lambda: ran.append("alone")], alone=True)
    alone.cancel()
    assert alone.results() == [] and ran == [0]


def test_tasks_in_threads_see_the_callers_context(four_cores):
    var = contextvars.ContextVar("shardwise_test_beside", default="unset")
    var.set("the caller's")
    seen = Beside([var.get for _ in range(5)], alone=False).results()
    assert seen == ["the caller's"] * 5


def test_baselines_solved_beside_the_search_are_those_solved_after_it(four_cores, monkeypatch):
    fn, args = shardwise.model(name="transformer", batch=16, hidden=32, ffn=64, train=True)

    def planned(pairs: int):
        monkeypatch.setattr(program_module, "BESIDE_PAIRS", pairs)
        shardwise.clear_caches()
        threads = []
        real = beside_module.Beside.__init__

        def counted(self, tasks, alone):
            real(self, tasks, alone)
            threads.append(len(self._threads))

        monkeypatch.setattr(beside_module.Beside, "__init__", counted)
        p = shardwise.plan(fn, *args, mesh="data=2,model=4", profile="cpu-2core", train=True)
        monkeypatch.setattr(beside_module.Beside, "__init__", real)
        shown = [
            (q.name, q.predicted.seconds, q.predicted.memory_bytes, str(q.in_specs))
            for q in p.plans
        ]
        return shown, list(p.skipped), threads

    beside, skipped_beside, threads = planned(0)
    alone, skipped_alone, none = planned(10**18)
    assert threads == [3] and none == [0]
    assert len(beside) > 3
    assert beside == alone
    assert skipped_beside == skipped_alone


def test_native_output_stays_off_stdout_until_the_last_thread_solving_is_done(capfd):
    inside, leave, left = threading.Event(), threading.Event(), threading.Event()

    def solving():
        with stdout_to_stderr():
            inside.set()
            assert leave.wait(WAIT_S)
            os.write(1, b"first\n")
        left.set()

    other = threading.Thread(target=solving)
    other.start()
    assert inside.wait(WAIT_S)
    with stdout_to_stderr():  # (entered second, left last)
        leave.set()
        assert left.wait(WAIT_S)
        os.write(1, b"second\n")
    other.join()
    os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert out == "after\n", out
    assert err.split() == ["first", "second"], err
