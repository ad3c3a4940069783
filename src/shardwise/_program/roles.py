"""What each input of a program is to the baselines: the batch (data), a random key, or a
parameter (weights, optimizer state, anything else).

- **keys**: PRNG keys, never data. A typed key (``jax.random.key``) is told by its dtype; a
  legacy one (``jax.random.PRNGKey``, ``uint32[2]``, or ``[4]`` for other generators) by what
  the program does with it: it is wrapped into a key, split, folded or fed to the random bit
  generator (``random_wrap``, ``random_bits``, ``threefry2x32``, …), inside calls and scans
  too. Shape alone is not enough: a ``uint32[2]`` may be anything.
- **data**: the arguments that are one array each (not containers), not keys, not scalars,
  whose first dimension is the batch: the first dimension most of them share (the first
  such argument's, on a tie). Integer labels of that batch are data. So are the leaves of a
  container argument (``train_step(state, batch)``'s ``batch['image']``, ``batch['label']``)
  but the first argument, which holds the parameters, where every leaf has the batch as its
  first dimension: the one the single arrays give, or, where none does, the one that all
  leaves of such a container share (the first container's, where two would).
- **params**: every other input: the leaves of the other container arguments, and single
  arrays that are not the batch (``fn(x, w)``'s ``w``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from shardwise._program.graph import Graph
from shardwise._program.walk import Path, Walker

KEY_OPERANDS = {
    "random_wrap": (0,),
    "random_seed": (0,),
    "random_bits": (0,),
    "random_split": (0,),
    "random_fold_in": (0,),
    "random_unwrap": (0,),
    "random_clone": (0,),
    "threefry2x32": (0, 1),
}
"""The primitives that read a random key, and which of their operands is one (``fold_in``'s
second operand is the number folded in; ``threefry2x32``'s last two are the counts)."""


@dataclass(frozen=True, slots=True)
class Roles:
    """The inputs of a program by role, as positions in ``graph.inputs``.

    Attributes:
        data: inputs split along their first dimension, the batch.
        keys: PRNG keys: never data, always replicated.
        params: the rest: weights, optimizer state, other arrays.
        batch: the batch's size (``None`` where no input is data).
    """

    data: tuple[int, ...]
    keys: tuple[int, ...]
    params: tuple[int, ...]
    batch: int | None


def roles(graph: Graph) -> Roles:
    """Each input's role in ``graph`` (see the module's docstring)."""
    starts, k = [], 0
    for leaves in graph.tree.children():
        starts.append(k)
        k += leaves.num_leaves
    keys = random_keys(graph.closed)
    single = [starts[a] for a in graph.data]
    candidates = [k for k in single if k not in keys and graph.values[graph.inputs[k]].shape]
    firsts = [graph.values[graph.inputs[k]].shape[0] for k in candidates]
    counts = Counter(firsts)
    batch = max(firsts, key=lambda n: counts[n]) if firsts else None  # first of the most common
    data = [k for k, n in zip(candidates, firsts, strict=True) if n == batch]
    sizes = [leaves.num_leaves for leaves in graph.tree.children()]
    for a in range(1, len(starts)):
        if a in graph.data or not sizes[a]:
            continue
        leaves = range(starts[a], starts[a] + sizes[a])
        shapes = [graph.values[graph.inputs[k]].shape for k in leaves]
        if any(k in keys for k in leaves) or not all(shapes):
            continue
        shared = {shape[0] for shape in shapes}
        if len(shared) == 1 and (batch is None or batch in shared):
            batch = shared.pop()
            data += leaves
    params = tuple(k for k in range(len(graph.inputs)) if k not in keys and k not in data)
    return Roles(tuple(sorted(data)), tuple(sorted(keys)), params, batch)


def random_keys(closed: Any) -> set[int]:
    """The inputs of a traced jaxpr that are PRNG keys: of a key dtype, or (unsigned integers,
    as raw keys are) read as a key.

    >>> f = lambda x, key, n: x * jax.random.normal(key, x.shape) + n
    >>> ins = (jnp.ones(3), jax.random.PRNGKey(0), jnp.ones(2, "uint32").sum())
    >>> sorted(random_keys(jax.make_jaxpr(f)(*ins)))
    [1]
    """
    jaxpr = closed.jaxpr
    dtypes = [var.aval.dtype for var in jaxpr.invars]
    typed = {k for k, d in enumerate(dtypes) if jnp.issubdtype(d, jax.dtypes.prng_key)}
    raw = [frozenset({k}) if jnp.issubdtype(d, jnp.unsignedinteger) else None
           for k, d in enumerate(dtypes)]  # fmt: skip
    if not any(raw):
        return typed
    walker = _KeyReader()
    walker.run(jaxpr, [None] * len(jaxpr.constvars), (), raw)
    return typed | walker.keys


Taint = frozenset[int]


class _KeyReader(Walker[Taint]):
    """Follows each raw key candidate through the program (which of them each value is
    computed from), into calls, scans, conds and loops, and notes those that reach a key
    operand of a random primitive."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[int] = set()

    def equation(self, eqn: Any, path: Path, here: Path, ins: list[Taint | None]) -> Sequence[Any]:
        name, p = eqn.primitive.name, eqn.params
        if name == "cond":
            for branch in p["branches"]:
                self._inner(branch, here, ins[1:])
        elif name == "while":
            nc, nb = p["cond_nconsts"], p["body_nconsts"]
            self._inner(p["cond_jaxpr"], here, ins[:nc] + ins[nc + nb :])
            self._inner(p["body_jaxpr"], here, ins[nc:])
        slots = KEY_OPERANDS.get(name)
        if slots is not None:
            read = frozenset().union(*(ins[s] or frozenset() for s in slots if s < len(ins)))
            self.keys |= read
            return [read or None] * len(eqn.outvars)  # a key's results come from the key alone
        return [_union(ins)] * len(eqn.outvars)

    def scan(self, eqn: Any, path: Path, here: Path, ins: list[Taint | None]) -> Sequence[Any]:
        self._inner(eqn.params["jaxpr"], here, ins)
        return [_union(ins)] * len(eqn.outvars)

    def _inner(self, closed: Any, here: Path, ins: Sequence[Taint | None]) -> None:
        self.run(closed.jaxpr, [None] * len(closed.jaxpr.constvars), here, ins)


def _union(ins: Sequence[Taint | None]) -> Taint | None:
    return frozenset().union(*(t for t in ins if t)) or None
