"""The program planner's rules per primitive: every primitive that ``jax.lax``, ``jax.nn`` and
the ``jax.numpy`` of models emit in this JAX version has one (:mod:`primitive_corpus`), and the
planner walks every function of the corpus, forward and differentiated, with none left not
modelled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from primitive_corpus import CORPUS, grad_jaxprs, primitives
from shardwise._program.graph import read_jaxpr
from shardwise._program.rules import NOT_MODELLED, RULES, UNTIMED, rule_of


@pytest.mark.slow
def test_every_primitive_of_the_corpus_has_a_rule_and_the_planner_walks_every_function():
    """Every corpus function's jaxpr, and its gradient's where it has one, traced once: each
    primitive in them has a rule, and the graph builder walks each with nothing not
    modelled."""
    first: dict[str, str] = {}
    unmodelled: dict[str, tuple[str, ...]] = {}
    walked = 0
    for label, fn, args in CORPUS:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        traced = [(label, closed)]
        traced += [(f"{label} [grad]", g) for g in grad_jaxprs(fn, args, out_shape)]
        for name, jaxpr in traced:
            for prim in primitives(jaxpr):
                first.setdefault(prim, name)
            graph = read_jaxpr(jaxpr)
            if graph.not_modelled:
                unmodelled[name] = graph.not_modelled
            walked += len(graph.steps) + graph.elementwise_ops
    assert len(first) > 150 and walked > 1000  # the corpus reaches all of jax.lax and jax.nn
    missing = {name: label for name, label in first.items() if name not in RULES}
    assert not missing, f"primitives with no rule (and the corpus entry that emits each): {missing}"
    untimed = set(UNTIMED.split())  # (linear algebra, loops: their bytes are not their time)
    assert all(set(prims) <= untimed for prims in unmodelled.values()), unmodelled


def test_a_primitive_with_no_rule_is_opaque_and_not_modelled():
    assert rule_of("a_primitive_from_a_library_of_kernels") is NOT_MODELLED
    assert NOT_MODELLED.kind == "opaque" and not NOT_MODELLED.modelled
    assert all(rule.modelled for name, rule in RULES.items() if name not in UNTIMED.split())
    assert not any(RULES[name].modelled for name in UNTIMED.split())


def test_each_kind_of_rule_reads_as_its_step():
    def f(x, w, key):
        h = jax.checkpoint(lambda a: jnp.tanh(a @ w))(x)  # a call (remat2), elementwise, a dot
        h = jax.lax.with_sharding_constraint(
            h, jax.sharding.make_single_device_sharding(jax.devices()[0])
        )
        g = jnp.take(h, jnp.array([0, 2]), axis=0)  # a gather of rows: read as an einsum
        g = g.at[jnp.array([1, 0])].set(0.0)  # a scatter that overwrites: opaque
        return jnp.cumsum(h, axis=1), g, jax.random.normal(key, h.shape) + h

    args = (jnp.ones((4, 8)), jnp.ones((8, 8)), jax.random.key(0))
    graph = read_jaxpr(jax.make_jaxpr(f)(*args))
    kinds = {(s.kind, s.prim) for s in graph.steps}
    assert ("dot", "dot_general") in kinds and ("map", "cumsum") in kinds
    assert ("dot", "gather") in kinds and ("opaque", "scatter") in kinds
    assert all(s.modelled for s in graph.steps)
    # the constraint joins its operand's class: the plan's layout stands in its place
    assert not any(s.prim == "sharding_constraint" for s in graph.steps)
