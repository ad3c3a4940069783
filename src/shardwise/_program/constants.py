"""Arrays a program makes from nothing (a causal mask ``jnp.tril(jnp.ones((n, n)))``,
``jnp.eye``) and arrays it closes over (a weight defined at a module's top level): not arrays
of the graph (no layout to plan: every device makes what it needs of them, or holds them), but
memory all the same. XLA makes one whole on every device where a dot or a convolution reads it
together with the program's own arrays (a dot with a mask), and holds it until the last such
read; read only by other ops (elementwise ones, a scatter-add into zeros), it is made inside
their loops or is their result's buffer. A closed-over array is held for the whole program
wherever it is read. (Seen: a 256 KiB mask, and a 256 KiB closed-over weight, each compiled to
256 KiB more per device than the prediction left them out of, for every plan.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from shardwise._caches import per_object
from shardwise._program.walk import Path, Walker, is_var, rank
from shardwise._versions import scan_counts

if TYPE_CHECKING:
    from shardwise._program.graph import Graph


CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated"})
"""The ops XLA gives an operand made from nothing as a whole buffer (seen: a dot reading a
mask). Others make it inside their own loops (elementwise ops, a concatenation) or write the
program's array into it in place (a scatter-add into zeros, the gradient of a lookup: that
buffer is the scatter's result, held already)."""


@dataclass(eq=False)
class _Made:
    """An array made from nothing (``held``: one closed over): its bytes, and the program
    points of the ops that read it with the program's own arrays and make it whole."""

    nbytes: int
    held: bool = False
    reads: list[int] = field(default_factory=list)
    used: bool = False


def _nbytes(aval: Any) -> int | None:
    try:
        return int(np.prod(aval.shape, dtype=np.int64)) * int(np.dtype(aval.dtype).itemsize)
    except TypeError:  # (a PRNG key's dtype has no NumPy twin: not memory worth counting)
        return None


class _Finder(Walker[Any]):
    """Walks the graph's jaxpr as the graph builder did (the same keys): a value is the
    graph's array (its index) or a :class:`_Made`."""

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        self.graph = graph
        self.made: list[_Made] = []

    def constant(self, value: Any) -> _Made | None:
        shape = np.shape(value)
        if not shape:
            return None
        found = _Made(int(np.prod(shape)) * np.asarray(value).dtype.itemsize, held=True)
        self.made.append(found)
        return found

    def _array(self, path: Path, var: Any) -> int | None:
        return self.graph.keys.get((path, var)) if is_var(var) else None

    def equation(self, eqn: Any, path: Path, here: Path, ins: list[Any]) -> Sequence[Any]:
        outs: list[Any] = [self._array(path, o) for o in eqn.outvars]
        made = [x for x in ins if isinstance(x, _Made)]
        arrays = [x for x in ins if isinstance(x, int)]
        for m in made:
            m.used = True
        if not arrays and not any(isinstance(o, int) for o in outs):
            for k, o in enumerate(eqn.outvars):
                size = _nbytes(o.aval) if is_var(o) and rank(o) else None
                if size:
                    outs[k] = _Made(size)
                    self.made.append(outs[k])
            return outs
        point = next((self.graph.born[o] for o in outs if isinstance(o, int)), None)
        if point is not None and eqn.primitive.name in CONTRACTIONS:
            for m in made:
                m.reads.append(point)
        return outs

    def scan(self, eqn: Any, path: Path, here: Path, ins: list[Any]) -> Sequence[Any]:
        inner = eqn.params["jaxpr"]
        n_consts = scan_counts(eqn.params)[0]
        bound = [
            self._array(here, v) if self._array(here, v) is not None
            else ins[k] if k < n_consts else None
            for k, v in enumerate(inner.jaxpr.invars)
        ]  # fmt: skip
        self.run(inner.jaxpr, inner.consts, here, bound)
        return [self._array(path, o) for o in eqn.outvars]

    def cond(self, eqn: Any, path: Path, here: Path, ins: list[Any]) -> Sequence[Any]:
        for k, branch in enumerate(eqn.params["branches"]):  # (as the graph reads them)
            self.run(branch.jaxpr, branch.consts, (*here, k), ins[1:])
        return [self._array(path, o) for o in eqn.outvars]


@per_object(maxsize=8)
def made_whole(graph: Graph) -> tuple[tuple[int, int, int], ...]:
    """Each array ``graph``'s program makes from nothing or closes over that XLA holds whole
    on every device: (first program point, last, bytes); computed once per graph.

    >>> import jax, jax.numpy as jnp
    >>> from shardwise._program.graph import build
    >>> g = build(lambda x: x @ jnp.tril(jnp.ones((8, 8))), [jax.ShapeDtypeStruct((4, 8), "f4")])
    >>> [size for _, _, size in made_whole(g)]  # the mask the dot reads: 8 x 8 float32
    [256]
    >>> made_whole(build(lambda x: x * jnp.tril(jnp.ones((4, 8))), [jnp.ones((4, 8))]))
    ()
    """
    finder = _Finder(graph)
    closed = graph.closed
    finder.run(closed.jaxpr, closed.consts, (), [*graph.inputs])
    return tuple(
        (0, graph.clock, m.nbytes) if m.held else (min(m.reads), max(m.reads), m.nbytes)
        for m in finder.made
        if m.reads or (m.held and m.used)
    )
