"""A compiled program's HLO text with the source lines of the trace that lowered it.

JAX's persistent compilation cache (``jax_compilation_cache_dir``) keys a program without
its source locations (it strips debug information before hashing), so a program found there
carries the lines of wherever it was first compiled: the same function moved down its file
by an edit, or the same computation written on another line, reads with the old lines. The
miscompile guard matches each compiled contraction with the dots of its line
(:func:`~shardwise._xla.check.dot_problems`) and checks nothing it cannot match, so such a
program would go unchecked. :func:`hlo_with_lines` compiles it again for the check where its
contractions' lines are not the trace's, under a key of the cache that these lines alone
share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import jax

from shardwise._xla import flow
from shardwise._xla.check import DotTerms

OPTION = "xla_debug_buffer_assignment_show_max"
"""The XLA option the program is compiled again with, set from a hash of the lowered module's
source locations: only XLA's debug output reads it, and the cache's key holds it."""


def hlo_with_lines(lowered: Any, compiled: Any, dots: Sequence[DotTerms]) -> str:
    """``compiled.as_text()``, or where the persistent compilation cache is on and one of its
    contractions carries a line that none of ``dots`` (the trace's, as
    :func:`~shardwise._xla.check.jaxpr_dots` reads them) has, the text of ``lowered`` compiled
    again with its own lines (the code is the same; only its metadata differs)."""
    text = compiled.as_text() or ""
    cached = getattr(jax.config, "jax_compilation_cache_dir", None)
    if not (cached and getattr(jax.config, "jax_enable_compilation_cache", True)):
        return text
    lines = {d.source for d in dots}
    found = {c.source for c in flow.contractions(flow.parse(text))}
    if found <= lines:
        return text
    located = lowered.as_text(debug_info=True).encode()
    tag = int.from_bytes(hashlib.sha256(located).digest()[:4], "big") >> 1
    try:
        again = lowered.compile(compiler_options={OPTION: tag})
    except jax.errors.JaxRuntimeError:  # (an XLA without the option: the lines it came with)
        return text
    return again.as_text() or ""
