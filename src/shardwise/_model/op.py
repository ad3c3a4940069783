"""Einsum equations, parsed once into an :class:`Op`.

Each index is one of three kinds (the vocabulary used throughout shardwise):

- **batch**: in every input and in the output (``n`` in ``nd,nd->n``);
- **contracted**: in the inputs but not the output (``d``); sharding it leaves
  each device a partial sum that a collective must add up;
- **free**: in the output and some but not all inputs (``m``, ``k`` in ``md,kd->mk``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardwise._caches import cached
from shardwise._errors import ArgumentTypeError, EquationError, ShapeError

MAX_DIMENSION = 2**63 - 1
"""The largest size of one dimension: XLA writes every dimension as a 64-bit integer."""


def as_shapes(shapes: Any) -> tuple[tuple[int, ...], ...]:
    """``shapes``, one per operand, as tuples of whole numbers from 0 to :data:`MAX_DIMENSION`.

    >>> as_shapes([(8, 4), [2], ()])
    ((8, 4), (2,), ())
    >>> as_shapes([8, 4])
    Traceback (most recent call last):
    shardwise._errors.ArgumentTypeError: the shape of operand 0 is 8, not a sequence of sizes; ...

    Raises:
        ArgumentTypeError: for shapes that are not sequences of whole numbers.
        ShapeError: for a size below 0 or above :data:`MAX_DIMENSION`.
    """
    if isinstance(shapes, str | bytes) or not isinstance(shapes, Sequence):
        raise ArgumentTypeError(
            f"shapes {shapes!r} is not a sequence of shapes; give one tuple of sizes per "
            "operand, e.g. [(4000, 10000), (4000, 10000)]."
        )
    return tuple(_shape(s, k) for k, s in enumerate(shapes))


def _shape(shape: Any, k: int) -> tuple[int, ...]:
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        raise ArgumentTypeError(
            f"the shape of operand {k} is {shape!r}, not a sequence of sizes; give one tuple "
            "of sizes per operand, e.g. [(4000, 10000), (4000, 10000)]."
        )
    dims = []
    for n in shape:
        try:
            if isinstance(n, bool):
                raise TypeError
            dims.append(operator.index(n))
        except TypeError:
            raise ArgumentTypeError(
                f"the shape of operand {k}, {tuple(shape)!r}, has the size {n!r}, which is "
                "not a whole number; sizes are ints, e.g. (4000, 10000)."
            ) from None
    for n in dims:
        if not 0 <= n <= MAX_DIMENSION:
            raise ShapeError(
                f"the shape of operand {k}, {tuple(dims)}, has the size {n}; sizes run from 0 "
                f"to {MAX_DIMENSION:,} (2**63 - 1, the largest dimension XLA can represent)."
            )
    return tuple(dims)


@dataclass(frozen=True, slots=True)
class Op:
    """An einsum equation: the indices of each input and of the output.

    >>> op = Op.parse("nd,nd->n")
    >>> op.batch, op.contracted, op.free
    ('n', 'd', '')
    >>> Op.parse("ij,jk").equation
    'ij,jk->ik'
    """

    inputs: tuple[str, ...]
    output: str

    @staticmethod
    def parse(equation: str) -> Op:
        """Parse ``equation``; without ``->`` the output is NumPy's (indices seen once, sorted).

        >>> Op.parse(b"ij,jk->ik")
        Traceback (most recent call last):
        shardwise._errors.ArgumentTypeError: an einsum equation is a str like 'ij,jk->ik', ...
        """
        if not isinstance(equation, str):
            decode = " (decode it: equation.decode())" if isinstance(equation, bytes) else ""
            raise ArgumentTypeError(
                f"an einsum equation is a str like 'ij,jk->ik', but {type(equation).__name__} "
                f"{repr(equation)[:80]} was given{decode}."
            )
        return Op._parsed(equation)

    @staticmethod
    @cached(maxsize=256)
    def _parsed(equation: str) -> Op:
        text = equation.replace(" ", "")
        if "..." in text:
            raise EquationError(
                f"equation {equation!r} uses '...'; shardwise needs every dimension named, so "
                "write a letter for each, e.g. 'bnd,bnd->bn' instead of '...nd,...nd->...n'."
            )
        lhs, arrow, rhs = text.partition("->")
        if "->" in rhs:
            raise EquationError(f"equation {equation!r} has more than one '->'.")
        inputs = tuple(lhs.split(","))
        for k, term in enumerate(inputs):
            bad = [c for c in term if not c.isalpha()]
            if bad:
                raise EquationError(
                    f"equation {equation!r}: operand {k} ({term!r}) contains {bad[0]!r}; indices "
                    "are single letters, operands are separated by commas, e.g. 'nd,nd->n'."
                )
            if len(set(term)) != len(term):
                twice = next(c for c in term if term.count(c) > 1)
                raise EquationError(
                    f"equation {equation!r}: index {twice!r} appears twice in operand {k} "
                    f"({term!r}); traces and diagonals are not supported, take them with "
                    "jnp.diagonal first."
                )
        # ('' is one scalar operand and a scalar result, as NumPy's einsum reads it)
        seen = "".join(inputs)
        if arrow:
            output = rhs
            bad = [c for c in output if not c.isalpha()]
            if bad:
                raise EquationError(
                    f"equation {equation!r}: the output contains {bad[0]!r}; use letters only."
                )
            if len(set(output)) != len(output):
                raise EquationError(
                    f"equation {equation!r}: an index appears twice in the output {output!r}."
                )
            missing = [c for c in output if c not in seen]
            if missing:
                raise EquationError(
                    f"equation {equation!r}: output index {missing[0]!r} appears in no input; "
                    "every output index must come from an input."
                )
        else:
            output = "".join(sorted(c for c in set(seen) if seen.count(c) == 1))
        return Op(inputs, output)

    @property
    def equation(self) -> str:
        """Canonical text, always with ``->``."""
        return f"{','.join(self.inputs)}->{self.output}"

    @property
    def indices(self) -> str:
        """Every index, in order of first appearance."""
        return "".join(dict.fromkeys("".join(self.inputs) + self.output))

    @property
    def batch(self) -> str:
        """Indices in every input and the output."""
        return "".join(i for i in self.output if all(i in t for t in self.inputs))

    @property
    def contracted(self) -> str:
        """Indices in the inputs but not the output (summed over)."""
        return "".join(i for i in self.indices if i not in self.output)

    @property
    def free(self) -> str:
        """Indices in the output and some, but not all, inputs."""
        return "".join(i for i in self.output if i not in self.batch)

    def sizes(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """Index → size for operands of ``shapes``.

        Raises:
            ShapeError: wrong operand count, a rank that does not match, or one index with
                two sizes.
        """
        if len(shapes) != len(self.inputs):
            raise ShapeError(
                f"equation {self.equation!r} takes {len(self.inputs)} operand"
                f"{'s' if len(self.inputs) != 1 else ''}, but {len(shapes)} "
                f"{'were' if len(shapes) != 1 else 'was'} given."
            )
        sizes: dict[str, int] = {}
        where: dict[str, int] = {}
        for k, (term, shape) in enumerate(zip(self.inputs, shapes, strict=True)):
            if len(shape) != len(term):
                raise ShapeError(
                    f"equation {self.equation!r}: operand {k} has indices {term!r}, so it needs "
                    f"{len(term)} dimension{'s' if len(term) != 1 else ''}, but its shape is "
                    f"{tuple(shape)}."
                )
            for index, n in zip(term, shape, strict=True):
                if index in sizes and sizes[index] != n:
                    raise ShapeError(
                        f"equation {self.equation!r}: index {index!r} has size {sizes[index]} in "
                        f"operand {where[index]} but {n} in operand {k}; shapes are "
                        f"{', '.join(str(tuple(s)) for s in shapes)}."
                    )
                sizes[index] = int(n)
                where[index] = k
        return sizes

    def output_shape(self, shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
        """The shape of the result."""
        sizes = self.sizes(shapes)
        return tuple(sizes[i] for i in self.output)
