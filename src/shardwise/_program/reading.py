"""Read a program for planning, once whatever the budget: trace it (its SGD training step
where asked), read what its arguments and code say of its layout, pin what must stay, and
build the problem of every choice (:class:`Program`), which :mod:`.program` then solves."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from shardwise._errors import (
    ArgumentError,
    ShardwiseError,
    UserCodeError,
    as_users,
    user_code_error,
)
from shardwise._model.mesh import MeshSpec
from shardwise._model.plan import check_program_extent
from shardwise._model.profile import Profile
from shardwise._model.spec import Spec, SpecLike
from shardwise._program.annotations import (
    Annotations,
    Call,
    annotated_pins,
    logical_constraints_recorded,
    read_annotations,
    with_activations,
)
from shardwise._program.constraints import respected, traced_under
from shardwise._program.donation import donated, donated_leaves
from shardwise._program.fold import prints_kept
from shardwise._program.graph import Graph, build
from shardwise._program.pins import fixed_pins, pinned
from shardwise._program.pricing import build_problem
from shardwise._program.problem import Problem, effective_mesh
from shardwise._program.roles import Roles, roles
from shardwise._program.stages import say
from shardwise._versions import sources_in_users_code
from shardwise._xla.meshes import auto_twin, is_explicit
from shardwise._xla.names import positional_names


def train_step(loss: Callable[..., Any], learning_rate: float = 0.01) -> Callable[..., Any]:
    """One SGD step of ``loss(params, *batch)``: returns the loss and the updated parameters.
    Parameters that are not floats (a step count, an RNG state's counter) and a loss that is
    not one scalar are refused, saying how to plan such a step."""
    yours = "or plan your own training step (value_and_grad and the update inside fn) without train"

    def step(params: Any, *batch: Any) -> Any:
        bad = [
            f"{jax.tree_util.keystr(path) or 'params'} is {leaf.dtype}"
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)
            if not jnp.issubdtype(leaf.dtype, jnp.inexact)
        ]
        if bad:
            raise ArgumentError(
                "train=True differentiates the loss with respect to its first argument, whose "
                f"leaves must be floats, but {', '.join(bad[:3])}: pass the parameters alone "
                f"first (nnx.split(model, nnx.Param, ...)), the rest after, {yours}."
            )
        try:
            value, grads = jax.value_and_grad(loss)(params, *batch)
        except ShardwiseError:
            raise
        except TypeError as e:  # (JAX's, of what the loss returned)
            if "scalar" not in str(e):
                raise
            raise ArgumentError(
                "train=True needs the function to return its loss as one scalar (JAX: "
                f"{str(e).splitlines()[0].split('. Output was')[0]}): return the loss alone, "
                f"{yours}."
            ) from None
        except (ValueError, NotImplementedError) as e:  # (JAX cannot differentiate the code)
            raise user_code_error(
                e, f"your function {getattr(loss, '__name__', 'loss')!r}",
                "differentiated",
                f"train=True differentiates the loss: make it differentiable, {yours}.",
            ) from e  # fmt: skip
        return value, jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)

    step.__name__ = f"train_step({getattr(loss, '__name__', 'loss')})"
    return step


class Program(NamedTuple):
    """What planning reads of a program once, whatever the budget: its name and graph,
    what its arguments and code say of its layout, the array roles, the pinned inputs
    (``pins``) and the plans to compare beside the baselines (``extra``), and the problem
    with every choice (``full``) and with the pins kept (``searchable``); the positions of
    the donated arguments."""

    name: str
    graph: Graph
    annotations: Annotations
    role: Roles
    pins: dict[int, Spec]
    extra: dict[str, dict[int, Spec] | str]
    full: Problem
    searchable: Problem
    donate_argnums: tuple[int, ...] = ()


def read_program(
    fn: Callable[..., Any], args: tuple[Any, ...], train: bool, devices: Mesh | None,
    spec: MeshSpec, prof: Profile, fixed: Mapping[str, SpecLike] | None, rules: Any,
    respect: str, donate_argnums: int | Sequence[int] | None = (),
    time_limit: float | None = None,
) -> Program:  # fmt: skip
    """``fn(*args)`` read for planning on ``spec`` (traced, its training step with
    ``train``; the arguments at ``donate_argnums`` donated), its pins and its problem built
    (:class:`Program`)."""
    donate = donated(args, donate_argnums)
    say("tracing the program")
    name, graph, annotations = _read(fn, args, train, devices, spec, rules, respect)
    leaves = donated_leaves(args, donate)
    graph = dataclasses.replace(graph, donated=frozenset(graph.inputs[i] for i in leaves))
    role = roles(graph)  # once, for the keys here and every baseline
    pins, extra = _pins(graph, fixed, spec, role, annotations, respect)
    with prints_kept():
        problem = build_problem(graph, effective_mesh(spec), prof, time_limit=time_limit)
        full = respected(graph, problem, spec, respect, annotations)
        searchable = pinned(graph, full, pins, spec, given=True)
    return Program(name, graph, annotations, role, pins, extra, full, searchable, donate)


def _unchanged(fn: Callable[..., Any], name: str, signature: Any) -> Callable[..., Any]:
    """``fn``, refused where it changes a Flax object among its arguments in place and does
    not return what it changed (``optimizer.update(model, grads)`` on NNX objects, as
    ``nnx.jit`` steps are written): ``jax.jit`` drops such changes, and so does a plan, so the
    step would run and never train. A step over ``nnx.merge`` d state changes the state's
    variables too, and returns them (``nnx.split``): the functional form, which passes. A dict
    written into as scratch space loses nothing (JAX gives the function fresh containers)."""

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        before = [jax.tree.leaves(a) if _flax(a) else None for a in args]
        out = fn(*args)
        _check_results(out, name)
        returned = {id(x) for x in jax.tree.leaves(out)}  # (changed and returned: functional)
        changed = []
        params = positional_names(signature)
        for k, (arg, old) in enumerate(zip(args, before, strict=True)):
            if old is None:
                continue
            new = jax.tree_util.tree_flatten_with_path(arg)[0]
            head = params[k] if k < len(params) else f"args[{k}]"
            if len(new) != len(old):
                changed.append(head)
                continue
            for a, (path, b) in zip(old, new, strict=True):
                if a is not b and id(b) not in returned:
                    changed.append(head + jax.tree_util.keystr(path))
        if not changed:
            return out
        shown = ", ".join(changed[:3]) + (" …" if len(changed) > 3 else "")
        raise ArgumentError(
            f"{name} changes its arguments in place ({shown}): under jax.jit, as in a plan, "
            "changes made so are dropped, and the step would not train. Return the new state "
            "instead: for Flax NNX, graphdef, state = nnx.split((model, optimizer)), and a "
            "step(state, x, y) that does model, optimizer = nnx.merge(graphdef, state), "
            "updates them, and returns nnx.state((model, optimizer)) with the loss."
        )

    return call


def _check_results(out: Any, name: str) -> None:
    """Refuse a result of ``name`` that JAX cannot return (a string, an object), saying
    which and what a planned function returns; Python numbers JAX takes as arrays."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(out):
        if isinstance(leaf, (bool, int, float, complex)) or (
            hasattr(leaf, "shape") and hasattr(leaf, "dtype")
        ):
            continue
        shown = repr(leaf)
        shown = f"{type(leaf).__name__} {shown}" if len(shown) <= 60 else type(leaf).__name__
        what = f"a result whose {jax.tree_util.keystr(path)} is " if path else ""
        raise ArgumentError(
            f"{name} returned {what}{shown}, not an array: a planned function must return "
            "arrays (or a pytree of arrays: a tuple, list or dict of them), as a jax.jit "
            "function does. Return the arrays alone, and make the rest (a string, a label, an "
            "object) outside the function."
        )


def _flax(arg: Any) -> bool:
    """Whether ``arg`` is a Flax object (an NNX module, optimizer or state), whose changes a
    user expects to last, as ``nnx.jit`` makes them."""
    return type(arg).__module__.split(".")[0] == "flax"


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused within (where it runs): the planner makes
    millions of small tuples, lists and dicts, and the collections they set off walk every
    object alive, the traced program's and JAX's included (a third of the time planning a
    24-layer transformer's training step took). What the planner makes is freed by reference
    counts; a cycle made meanwhile is collected once the collector runs again. The user's
    function is traced so too: JAX's tracing of a 24-layer unrolled training step made
    collections that took a quarter of its time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read(
    fn: Callable[..., Any],
    args: Any,
    train: bool,
    devices: Mesh | None,
    spec: MeshSpec,
    rules: Any,
    respect: str,
) -> tuple[str, Graph, Annotations]:
    """The program's name and graph, and what its arguments and code say of its layout.
    Traced under the mesh's abstract form where no JAX mesh is given, so that the code's
    constraints are in the trace, with Explicit axes where Auto ones fail (code that asks
    for layouts by ``out_sharding=``); where they name axes this mesh lacks (planning a
    function for another mesh than its constraints'), traced with no mesh, as they were then
    not asked, unless ``respect="constraints"``."""
    annotations = read_annotations(args, rules)
    given = annotations.rules if rules is not None else None  # (in force while traced)
    calls: list[Call] = []
    try:
        with traced_under(devices, spec), logical_constraints_recorded(calls, given):
            name, graph = _traced(fn, args, train, devices)
    except UserCodeError:
        if devices is not None:
            raise
        calls.clear()
        try:  # code that asks for layouts by out_sharding= needs Explicit axes
            with traced_under(devices, spec, True), logical_constraints_recorded(calls, given):
                name, graph = _traced(fn, args, train, devices)
        except UserCodeError:
            if respect == "constraints":
                raise
            calls.clear()
            with logical_constraints_recorded(calls, given):
                name, graph = _traced(fn, args, train, devices)
    return name, graph, with_activations(annotations, graph, calls)


def _pins(
    graph: Graph,
    fixed: Mapping[str, SpecLike] | None,
    mesh: MeshSpec,
    role: Roles,
    annotations: Annotations,
    respect: str,
) -> tuple[dict[int, Spec], dict[str, dict[int, Spec] | str]]:
    """The inputs every plan of the search keeps (``fixed``, PRNG keys, and the annotations'
    layouts with ``respect="annotations"``), and the plan of the annotations to compare
    (or why there is none) with ``respect="none"``."""
    pins = fixed_pins(graph, fixed, mesh)
    for k in role.keys:  # a PRNG key is never split: every device draws the same bits
        pins.setdefault(k, Spec())
    annotated = annotated_pins(annotations, graph, mesh, pins)
    if respect != "annotations":
        return pins, ({"annotations": annotated} if annotations and respect == "none" else {})
    if isinstance(annotated, str):
        raise ArgumentError(
            f"respect='annotations', but {annotated}; plan with respect='none' (--respect "
            "none), or annotate the parameters"
        )
    return annotated, {}


def _traced(
    fn: Callable[..., Any], args: Any, train: bool, devices: Mesh | None
) -> tuple[str, Graph]:
    """The program's name and graph (of its training step with ``train``), traced under
    ``devices`` where given (so code that names mesh axes bare, as explicit sharding does,
    finds them; on Explicit axes, under their Auto twin first, and last with the arrays'
    own shardings, for code that asserts them): what ``fn`` raises is the user's, said as
    such; a program past what XLA can count is refused."""
    inner = getattr(fn, "func", None)  # (a functools.partial: its function's name)
    name = str(getattr(fn, "__name__", "") or getattr(inner, "__name__", "program"))
    traced = _unchanged(as_users(fn, name), name, fn)
    step = train_step(traced) if train else traced

    def under(mesh: Mesh | None, sharded: bool = False) -> Graph:
        with (
            jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext(),
            sources_in_users_code(),
        ):
            return build(step, args, name, signature=fn, sharded=sharded)

    if devices is None or not is_explicit(devices):
        graph = under(devices)
    else:
        # traced on the mesh's Auto twin first: traced on Explicit axes, the regions of ops (a
        # scatter-add's combiner) carry the mesh's types, which JAX lowers as constraints that
        # change how XLA partitions the op (it gathered an embedding gradient's updates where
        # the plan sums partial tables), and ``with_sharding_constraint`` asserts the layout an
        # array already has (Flax's logical constraints call it; the abstract arguments have
        # none). The plan's layouts stand in for constraints when it runs. Code that needs
        # Explicit axes is traced on them.
        try:
            graph = under(auto_twin(devices))
        except UserCodeError:
            try:
                graph = under(devices)
            except UserCodeError:  # (code that asserts its arguments' shardings)
                if not _sharded(args):
                    raise
                graph = under(devices, sharded=True)
    check_program_extent([(v.name, v.shape, v.dtype) for v in graph.values], name)
    return name, graph


def _sharded(args: Any) -> bool:
    """Whether an argument leaf is an array with a ``NamedSharding`` of its own."""
    return any(
        isinstance(getattr(x, "sharding", None), NamedSharding) for x in jax.tree.leaves(args)
    )
