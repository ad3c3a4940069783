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


def test_a_caller_waiting_for_a_task_a_thread_has_taken_does_the_next_ones(monkeypatch):
    """The pricing asks for each step's costs in order while a thread makes them ahead: had
    the caller only waited, the thread would have done every task and the caller none."""
    monkeypatch.setattr(beside_module, "cores", lambda: 2)  # (one thread beside the caller)
    began, second = threading.Event(), threading.Event()
    who: dict[int, threading.Thread] = {}

    def first():
        who[0] = threading.current_thread()
        began.set()
        return second.wait(WAIT_S)  # (done only once the caller has done the second)

    def then(k):
        def run():
            who[k] = threading.current_thread()
            second.set()
            return k

        return run

    pending = Beside([first, then(1), then(2)], alone=False)
    assert began.wait(WAIT_S)  # (the thread has taken the first task)
    assert pending.result(0) is True
    assert who[0] is not threading.current_thread()
    assert who[1] is threading.current_thread()
    assert pending.result(1) == 1 and pending.result(2) == 2


def test_the_callers_interrupt_is_raised_at_once_not_after_the_other_tasks():
    """An error goes up in the tasks' order, once all are done; an interrupt of the caller's
    own task (Ctrl-C) at once: pricing a mesh of four axes is tasks of tens of seconds."""
    done = []

    def interrupted():
        raise KeyboardInterrupt

    pending = Beside([interrupted, lambda: done.append(1)], alone=True)
    with pytest.raises(KeyboardInterrupt):
        pending.results()
    assert done == []
    with pytest.raises(KeyboardInterrupt):
        Beside([lambda: done.append(0), interrupted, lambda: done.append(2)], alone=True).result(1)
    assert done == []


def _problem_digest(problem) -> tuple:
    return (
        problem.labels,
        problem.choices,
        [u.tobytes() for u in problem.unary],
        sorted((key, m.shape, m.tobytes()) for key, m in problem.edges.items()),
        problem.considered,
        problem.truncated,
    )


def test_steps_priced_in_threads_are_those_priced_one_after_another(four_cores, monkeypatch):
    """Where pricing is large (a mesh of four axes), threads make the steps' costs ahead of
    the caller, who adds them in step order: every cost, edge and choice the same, to the
    bit, as one thread pricing alone."""
    from shardwise._program import pricing
    from shardwise._program.problem import effective_mesh

    fn, args = shardwise.model(name="transformer", batch=16, hidden=32, ffn=64, train=True)
    p = shardwise.plan(fn, *args, mesh="a=2,b=2,c=2", profile="cpu-2core", train=True, top=1)
    mesh = effective_mesh(p.mesh)
    made = []
    real = beside_module.Beside.__init__

    def counted(self, tasks, alone):
        real(self, tasks, alone)
        made.append((len(tasks), len(self._threads)))

    monkeypatch.setattr(beside_module.Beside, "__init__", counted)
    found = {}
    for pairs in (0, 10**18):
        monkeypatch.setattr(pricing, "THREADED_PAIRS", pairs)
        shardwise.clear_caches()
        found[pairs] = _problem_digest(pricing.build_problem(p.graph, mesh, p.profile))
    assert len(made) == 1 and made[0][0] > 10 and made[0][1] == 3  # (threads only where large)
    assert found[0] == found[10**18]


def test_a_grid_two_threads_need_at_once_is_made_once(monkeypatch):
    """Two steps priced at once often need the same grid of layout pairs: the second waits
    for the first to make it (seconds of NumPy each on a mesh of four axes)."""
    from shardwise._model.mesh import MeshSpec
    from shardwise._model.spec import Spec
    from shardwise._program import moves

    mesh = MeshSpec.parse("x=2,y=2")
    specs = [Spec.parse(s) for s in ("x", "y", "x,y", "-")]
    entered, go, waiting = threading.Event(), threading.Event(), threading.Event()
    calls, got = [], {}
    real = moves.grid_of

    def slow(*a):
        calls.append(threading.current_thread())
        entered.set()
        assert go.wait(WAIT_S)
        return real(*a)

    class Told(threading.Event):  # (says when the second thread waits on it)
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(timeout)

    monkeypatch.setattr(moves, "grid_of", slow)

    def need(name):
        got[name] = moves._grid(specs, specs, 2, mesh)

    with moves.grids_kept():
        first = threading.Thread(target=contextvars.copy_context().run, args=(need, "first"))
        first.start()
        assert entered.wait(WAIT_S)  # (the first is making it)
        kept = moves._GRIDS.get()
        (key,) = kept.making
        kept.making[key] = told = Told()
        second = threading.Thread(target=contextvars.copy_context().run, args=(need, "second"))
        second.start()
        assert waiting.wait(WAIT_S)  # (the second waits for it)
        go.set()
        first.join()
        told.set()  # (as the first's own event now says: it is made)
        second.join()
    assert len(calls) == 1 and got["first"] is got["second"]


def test_an_error_pricing_a_step_in_a_thread_goes_up_from_the_pricing(four_cores, monkeypatch):
    """A step's costs made ahead in a thread that fail fail the pricing, as made in order."""
    from shardwise._program import pricing
    from shardwise._program.problem import effective_mesh

    fn, args = shardwise.model(name="mlp", batch=16, hidden=32, ffn=64)
    p = shardwise.plan(fn, *args, mesh="a=2,b=2,c=2", profile="cpu-2core", top=1)

    def broken(*a, **k):
        raise ValueError("a move priced wrong")

    monkeypatch.setattr(pricing, "THREADED_PAIRS", 0)
    monkeypatch.setattr(pricing, "_moves", broken)
    with pytest.raises(ValueError, match="a move priced wrong"):
        pricing.build_problem(p.graph, effective_mesh(p.mesh), p.profile)
