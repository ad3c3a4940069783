"""The records a program graph is made of: its arrays (:class:`Value`), the ops between them
that decide or change a layout (:class:`Step`), the layouts its code asks for (:class:`Asked`),
the classes of arrays that share a layout (:class:`Classes`), and the last reads of arrays
that elementwise ops read again where XLA fuses them (:func:`fused_reads`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np

from shardwise._model.op import Op
from shardwise._model.spec import Spec

Kind: TypeAlias = Literal["dot", "map", "opaque"]
Role: TypeAlias = Literal["op", "broadcast", "scan slice", "scan stack"]
"""Where a step comes from: an equation of the program (``op``), an elementwise op's operand
broadcast along its dimensions of size 1 (``broadcast``: XLA does it inside the op, so it is
costed, not applied), or a scan's slicing of a stacked array or stacking of its results."""


KERNEL = "fused_kernel"
"""The ``jax.named_scope`` of code that stands in for a fused kernel (the built-in Llama's
flash attention block, which MaxText runs as one Pallas kernel): its elementwise ops and maps
move no bytes through HBM (their blocks stay in the core's own memory) and its dots cost their
FLOPs alone. Its memory is counted as any code's."""


def in_kernel(module: str) -> bool:
    """Whether an op of name stack ``module`` (``MLP/fused_kernel``) is in a fused kernel.

    >>> in_kernel("rematted_computation/fused_kernel"), in_kernel("MLP/Dense_0")
    (True, False)
    """
    return KERNEL in module.split("/")


@dataclass(frozen=True, slots=True)
class Value:
    """One array of the program: shape, dtype, a name from the user's code, where it is made."""

    shape: tuple[int, ...]
    dtype: str
    name: str
    source: str = ""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True, slots=True)
class Loop:
    """A scan: the program points its body spans (``start`` < point ≤ ``end``), how many
    times the body runs, the arrays it carries round, as the body reads them (their initial
    values'), and its steps, ``steps[0] ≤ k < steps[1]``: its slicing and its body's (nested
    scans' included), not its stacking; ``unroll``: the scan's ``unroll``, how many copies of
    the body each turn of the compiled loop runs (the whole length: no loop)."""

    start: int
    end: int
    length: int
    carried: frozenset[int]
    steps: tuple[int, int] = (0, 0)
    unroll: int = 1

    @property
    def copies(self) -> int:
        """How many copies of the body the compiled program holds: ``unroll`` in its loop and
        the rest of the length after it (JAX runs ``length % unroll`` turns unrolled after),
        the whole length where it is unrolled whole, one where not at all.

        >>> [Loop(0, 1, 10, frozenset(), unroll=u).copies for u in (1, 4, 5, 10, 12)]
        [1, 6, 5, 10, 10]
        """
        if self.unroll <= 1:
            return 1
        if self.unroll >= self.length:
            return self.length
        return self.unroll + self.length % self.unroll


@dataclass(frozen=True, slots=True)
class Step:
    """One op between arrays that needs a decision (a dot) or maps layouts (everything else).

    Attributes:
        kind: ``dot``, ``map`` or ``opaque``.
        prim: the JAX primitive, as the report names it (``sub (broadcast)``, ``scan slice``).
        inputs: the arrays it reads (scalars left out).
        output: the array it makes.
        op: a dot's einsum (or the einsum an op is read as: a convolution's, a gather's).
        dim_map: a map's source dimension of each result dimension (``None``: new).
        local: a map's operand dimensions that must be whole on each device.
        reduced: a map's operand dimensions summed away (split ones leave partial sums).
        role: where it comes from (:data:`Role`).
        modelled: ``False`` for an op of a primitive with no rule (planned whole, costed by
            its bytes).
        whole: the letters of ``op`` that stay whole on each device (a convolution's spatial
            dimensions): ``""`` for a ``dot_general``.
        flops: a dot read as an einsum's FLOPs per run, whole, as its rule counts them (a
            convolution's; ``0``: it is bound by the bytes it moves).
        source: ``file:line`` of the user's code.
        repeat: how many times it runs (a scan's length).
        key: where it is in the jaxpr, for applying a plan.
        backward: part of a training step's backward pass (the transpose of a forward op at
            the same source line).
        module: the library module that made it (``MLP/Dense_0``), where the library names
            its modules in the trace (Flax Linen, Haiku); else ``""``.
        length: a scan slice's or stack's scan length (``1`` for every other step).
        branch: the path of the ``cond`` branch it runs in, the innermost (``()``: none).
    """

    kind: Kind
    prim: str
    inputs: tuple[int, ...]
    output: int
    source: str
    repeat: int
    key: tuple[int, ...]
    op: Op | None = None
    dim_map: tuple[int | None, ...] = ()
    local: tuple[int, ...] = ()
    reduced: tuple[int, ...] = ()
    role: Role = "op"
    backward: bool = False
    modelled: bool = True
    whole: str = ""
    flops: float = 0.0
    module: str = ""
    length: int = 1
    branch: tuple[int, ...] = ()

    def runs(self, result: bool) -> int:
        """How many times a move of its result (``result``) or of an operand runs: a scan
        slice's result and a scan stack's operand are moved inside the loop, once per
        iteration, as XLA moves them; the stack itself outside it."""
        inside = self.role == ("scan slice" if result else "scan stack")
        return self.repeat * self.length if inside else self.repeat

    @property
    def read_as_einsum(self) -> bool:
        """Whether it is an op read as an einsum (a convolution, a gather…), not a
        ``dot_general``, which computes one."""
        return self.kind == "dot" and self.prim != "dot_general"

    @property
    def kernel(self) -> bool:
        """Whether it runs inside a fused kernel (:data:`KERNEL`)."""
        return in_kernel(self.module)

    @property
    def implicit(self) -> bool:
        """Whether XLA carries it out inside the op that reads it: costed, not applied."""
        return self.role == "broadcast"


@dataclass(frozen=True, slots=True)
class Asked:
    """A layout the program's code asks an array to have (``with_sharding_constraint``, Flax's
    ``nn.with_logical_constraint``, ``reshard``, ``device_put``).

    Attributes:
        value: the array.
        spec: the layout asked for (a dimension in ``free`` unsharded here).
        free: the dimensions whose layout the code leaves open (``P.UNCONSTRAINED``).
        mesh: the axes (name, size) of the mesh the layout is given on.
        source: ``file:line`` of the user's code.
    """

    value: int
    spec: Spec
    free: frozenset[int]
    mesh: tuple[tuple[str, int], ...]
    source: str


class Classes:
    """Arrays joined into classes that share one layout, each class named by its first array
    (a union-find over array indices)."""

    def __init__(self) -> None:
        self.parent: list[int] = []

    def add(self) -> None:
        """The next array, in a class of its own."""
        self.parent.append(len(self.parent))

    def find(self, v: int) -> int:
        """The class of array ``v``."""
        while self.parent[v] != v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def join(self, a: int, b: int) -> None:
        """Make the classes of ``a`` and ``b`` one."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def fused_reads(sources: Mapping[int, Sequence[int]], kept: Set[int], last: list[int]) -> None:
    """Move each array's last read (``last``, by array) to the last read of the elementwise
    results made from it alone that are not ``kept`` as buffers (no step reads them, no step
    makes them): XLA computes such a result inside each elementwise op that reads it, from its
    operand then (a training step keeps a relu's input for the backward pass, where the
    relu's mask ``x > 0`` is read, not the mask). ``sources``: each elementwise result's
    operands of its shape, by result, in program order."""
    for v, operands in sorted(sources.items(), reverse=True):  # (a chain's last first)
        if v not in kept and len(operands) == 1:
            last[operands[0]] = max(last[operands[0]], last[v])


def recomputed(
    steps: Sequence[Step], sources: Mapping[int, Sequence[int]], kept: Set[int]
) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Each result of an elementwise op that reads an operand broadcast (``x - mean``, the
    mean of each row; a bias added) that no step reads (``kept``: what steps read, and the
    results) and that is made from at most one array of its own shape, and the arrays it is
    made from. XLA fuses it into each op that reads it, computing it there from those arrays,
    which are so held until its last reader (a BatchNorm's ``x - mean``, read again in the
    backward pass, is made there again from ``x``), and keeps no buffer of it."""
    found: dict[int, list[int]] = {}
    for step in steps:
        if step.implicit and step.output not in kept:
            found.setdefault(step.output, []).append(step.inputs[0])
    return tuple(
        (v, (*sources.get(v, ()), *broadcast))
        for v, broadcast in sorted(found.items())
        if len(sources.get(v, ())) <= 1
    )
