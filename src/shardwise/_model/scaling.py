"""The scaling book's closed forms for training a dense Transformer, as pure functions.

After jax-ml/scaling-book, ``training.md`` ("How to Parallelize a Transformer for Training"),
``applied-training.md`` (LLaMA 3 on TPU v5p), ``gpus.md`` ("Rooflines for LLM Scaling on
GPUs") and ``transformers.md`` (gradient checkpointing), in the book's notation:

- ``B`` tokens per batch (all of it, not per device), ``D`` model width, ``F`` feed-forward
  width, ``L`` layers; ``X`` ways of data parallelism or FSDP (ZeRO-3), ``Y`` ways of tensor
  parallelism, ``N = X·Y`` devices;
- ``C`` a device's peak FLOP/s, ``W`` the bytes per second it moves in a collective (``W_ici``
  on a TPU axis with wrap-around, both directions; a GPU's egress within its node, or the
  node's past it, the book's ``W_collective``); ``axes`` (``M_X``, ``M_Y``) the mesh axes a
  sharding spans, each adding a ``W``.

Like the book, a layer is its MLP alone (``In[B, D] · W_in[D, F] · W_out[F, D]``, no gating
matrix, no attention, no vocabulary), weights and activations travel in bfloat16 (2 bytes),
matmuls run at peak, communication within a pass overlaps its matmuls perfectly (a pass takes
the longer of the two) and has no latency, and comms along ``X`` and ``Y`` do not overlap each
other. What these drop is what the planner counts; see the plan guide's "The scaling book's
closed forms".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

BF16 = 2
"""Bytes per bfloat16 element: what the book's weights, activations and gradients travel as."""


@dataclass(frozen=True, slots=True)
class Pass:
    """One layer's forward or backward pass: matmul seconds and collective seconds."""

    math_s: float
    comms_s: float


@dataclass(frozen=True, slots=True)
class Roofline:
    """A training step's times under one strategy, as the book counts them.

    Attributes:
        forward: one layer's forward pass.
        backward: one layer's backward pass.
        layers: ``L``.
    """

    forward: Pass
    backward: Pass
    layers: int

    @property
    def math_s(self) -> float:
        """Seconds of matmuls in the step (``L`` layers, forward and backward)."""
        return self.layers * (self.forward.math_s + self.backward.math_s)

    @property
    def comms_s(self) -> float:
        """Seconds of collectives in the step."""
        return self.layers * (self.forward.comms_s + self.backward.comms_s)

    @property
    def step_s(self) -> float:
        """The step's time: each pass takes the longer of its matmuls and its collectives."""
        passes = (self.forward, self.backward)
        return self.layers * sum(max(p.math_s, p.comms_s) for p in passes)

    @property
    def ratio(self) -> float:
        """The smaller of the passes' ``T_math / T_comms`` (infinite with no collectives)."""
        ratios = [p.math_s / p.comms_s for p in (self.forward, self.backward) if p.comms_s]
        return min(ratios, default=math.inf)

    @property
    def compute_bound(self) -> bool:
        """``T_math > T_comms`` in each pass: the collectives hide behind the matmuls."""
        return self.ratio > 1


def _math(B: float, D: float, F: float, N: float, C: float) -> tuple[float, float]:
    """Forward and backward matmul seconds of one layer on each of ``N`` devices: two matmuls
    of ``2·B·D·F / N`` FLOPs forward, four backward."""
    forward = 2 * 2 * B * D * F / (N * C)
    return forward, 2 * forward


def data_parallel(
    *, B: float, X: int, D: float, F: float, L: int, C: float, W: float, axes: int = 1
) -> Roofline:
    """Pure data parallelism, ``In[B_X, D] · W_in[D, F] · W_out[F, D]``: no forward comms;
    backward, each weight's gradient (``2·D·F`` bytes) all-reduced at ``2 · bytes / W``, so
    ``T_comms = 8·D·F / W`` against ``T_math = 8·B·D·F / (X·C)`` (training.md, "Data
    Parallelism"); compute-bound when ``B / X > C / W``.
    """
    fwd, bwd = _math(B, D, F, X, C)
    return Roofline(Pass(fwd, 0.0), Pass(bwd, 2 * 2 * 2 * D * F / (W * axes)), L)


def fsdp(
    *, B: float, X: int, D: float, F: float, L: int, C: float, W: float, axes: int = 1
) -> Roofline:
    """FSDP (ZeRO-3), ``In[B_X, D] · W_in[D_X, F] · W_out[F, D_X]``: forward, both weights
    all-gathered (``4·D·F / W``); backward, gathered again and their gradients
    reduce-scattered (``8·D·F / W``), the same ratio as data parallelism (training.md, "Fully-
    Sharded Data Parallelism"; the takeaways' table: "4DF + 8DF").
    """
    fwd, bwd = _math(B, D, F, X, C)
    comms = 2 * 2 * D * F / (W * axes)
    return Roofline(Pass(fwd, comms), Pass(bwd, 2 * comms), L)


def tensor_parallel(
    *, B: float, Y: int, D: float, F: float, L: int, C: float, W: float, axes: int = 1
) -> Roofline:
    """Tensor (Megatron) parallelism, ``In[B, D_Y] · W_in[D, F_Y] · W_out[F_Y, D]``: the
    activations all-gathered before ``W_in`` and reduce-scattered after ``W_out``, ``4·B·D / W``
    each pass (the takeaways' table: "4BD + 4BD"; the backward reuses the forward's gathered
    input); compute-bound while ``Y < axes · F · W / C`` (training.md, "Tensor Parallelism").
    """
    fwd, bwd = _math(B, D, F, Y, C)
    comms = 2 * 2 * B * D / (W * axes)
    return Roofline(Pass(fwd, comms), Pass(bwd, comms), L)


def fsdp_tensor(
    *,
    B: float,
    X: int,
    Y: int,
    D: float,
    F: float,
    L: int,
    C: float,
    W: float,
    mx: int = 1,
    my: int = 1,
) -> Roofline:
    """FSDP over ``X`` (on ``mx`` mesh axes) × tensor parallelism over ``Y`` (on ``my``),
    ``In[B_X, D_Y] · W_in[D_X, F_Y] · W_out[F_Y, D_X]``: forward ``T_FSDP = 4·D·F / (Y·W·M_X)``
    plus ``T_MP = 4·B·D / (X·W·M_Y)``, summed ("we assume that we do not overlap comms on the
    X and Y axis", training.md, "Mixed FSDP and Tensor Parallelism"); backward twice both
    (the takeaways' table: "(4BD/X + 4DF/Y) + (8BD/X + 8DF/Y)").
    """
    fwd, bwd = _math(B, D, F, X * Y, C)
    comms = 2 * 2 * D * F / (Y * W * mx) + 2 * 2 * B * D / (X * W * my)
    return Roofline(Pass(fwd, comms), Pass(bwd, 2 * comms), L)


def fsdp_tensor_nodes(
    *,
    B: float,
    X: int,
    Y: int,
    D: float,
    F: float,
    L: int,
    C: float,
    w_gpu: float,
    w_node: float,
    node: int = 8,
) -> Roofline:
    """ZeRO-3 over ``X`` × tensor parallelism over ``Y`` on GPUs in nodes of ``node``, ``Y`` the
    inner axis: the weights' all-gather (``4·D·F`` bytes of both matrices) costs the longer of
    its in-node part, ``bytes / (w_gpu · min(Y, node))``, and, when ``X·Y`` spans nodes, its
    scale-out part, ``bytes / w_node · node / max(node, Y)`` (gpus.md, "Reductions when array is
    sharded over a separate axis"); the activations' gather and scatter, ``4·B·D / X`` bytes,
    go over NVLink while ``Y ≤ node``, else over the network.
    """
    fwd, bwd = _math(B, D, F, X * Y, C)
    weights = 2 * 2 * D * F
    at_node = weights / (w_gpu * min(Y, node))
    scale_out = weights / w_node * node / max(node, Y) if node < X * Y else 0.0
    activations = 2 * 2 * B * D / (X * (w_gpu if node >= Y else w_node))
    comms = max(at_node, scale_out) + activations
    return Roofline(Pass(fwd, comms), Pass(bwd, 2 * comms), L)


def dp_min_tokens(C: float, W: float, axes: int = 1) -> float:
    """Tokens per device (or per slice, given a slice's ``C`` and ``W``) past which data
    parallelism and FSDP are compute-bound: ``B / X > C / (W · axes)`` (training.md: "both FSDP
    and pure data parallelism become bandwidth bound on TPUv5 when the batch size per device
    is less than 2550 / n_axes")."""
    return C / (W * axes)


def tp_max_ways(F: float, C: float, W: float, axes: int = 1) -> float:
    """The most ways of tensor parallelism that stay compute-bound: ``Y < axes · F · W / C``
    (training.md: "model parallelism becomes communication bound when Y > n_axes * F /
    2550")."""
    return axes * F * W / C


def tp_ways_in_node(F: float, C: float, W: float, node: int = 8) -> int:
    """The ways of tensor parallelism to take on GPUs: the largest power of two within both
    :func:`tp_max_ways` and a node (gpus.md, on LLaMA-3 70B: "Since this doesn't span 2 nodes,
    it realistically means we'd go up to 8-way model parallelism")."""
    return 1 << max(0, math.floor(math.log2(min(tp_max_ways(F, C, W), node))))


def fsdp_tp_min_tokens(F: float, C: float, W: float, mx_my: float = 2) -> float:
    """Tokens per device past which FSDP × tensor parallelism at the best split is
    compute-bound: ``B / N > 4·α² / (M_X·M_Y·F)``, ``α = C / W`` (training.md; with
    ``M_X·M_Y = 2`` on a 3-D mesh, the takeaway's "2 · 2550² / F")."""
    alpha = C / W
    return 4 * alpha**2 / (mx_my * F)


def optimal_fsdp(B: float, F: float, N: int, mx: int = 2, my: int = 1) -> float:
    """The ways of FSDP that minimise the mixed strategy's comms: ``X_opt = sqrt(B / F ·
    M_X / M_Y · N)`` (training.md, "Mixed FSDP and Tensor Parallelism"; X and Y real)."""
    return math.sqrt(B / F * mx / my * N)


def _power_of_two(x: float) -> int:
    return 1 << max(0, round(math.log2(x)))


def fsdp_tp_split(B: float, F: float, N: int, mx: int = 2, my: int = 1) -> tuple[int, int]:
    """``(X, Y)``: :func:`optimal_fsdp` and ``N / X_opt`` each rounded to the nearest power of
    two (in log scale), as the book rounds them ("rounding to a reasonable multiple of 2");
    ``X·Y`` may fall short of ``N`` when ``N`` is no power of two (8960 = 2⁸·35)."""
    x = optimal_fsdp(B, F, N, mx, my)
    return _power_of_two(x), _power_of_two(N / x)


def dense_params(
    *, L: int, D: int, F: int, N: int, K: int, H: int, V: int, ffn_matrices: int = 3
) -> int:
    """Parameters of a dense decoder (applied-training.md, "Counting parameters"): per layer
    ``ffn_matrices·D·F`` (gate, up, down), ``2·D·N·H`` (queries and output) and ``2·D·K·H``
    (keys and values, ``K`` heads); an input and an output embedding of ``V·D``; the norms'
    few ``D`` dropped, as the book drops them."""
    per_layer = ffn_matrices * D * F + 2 * D * N * H + 2 * D * K * H
    return L * per_layer + 2 * V * D


@dataclass(frozen=True, slots=True)
class StateBytes:
    """The bytes of a training state, all replicas together (divide by the shards)."""

    params: float
    grads: float
    optimizer: float
    master: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.master


def state_bytes(
    params: float,
    *,
    param_bytes: int = BF16,
    grad_bytes: int = BF16,
    moments: int = 2,
    moment_bytes: int = 4,
    master_bytes: int = 0,
) -> StateBytes:
    """What ``params`` parameters hold in training: the weights, their gradients, AdamW's
    ``moments`` (first and second, float32) and, with ``master_bytes=4``, float32 master
    weights. The book counts "2 + 8 = 10 bytes per parameter" (training.md): weights and
    moments; it drops the gradients (``grad_bytes=0`` reproduces it) and has no master copy.
    """
    return StateBytes(
        params=params * param_bytes,
        grads=params * grad_bytes,
        optimizer=params * moments * moment_bytes,
        master=params * master_bytes,
    )


Remat = Literal["none", "dots", "ffw", "full"]
"""What a layer keeps for the backward pass: ``"none"`` (no rematerialisation: every
intermediate, "roughly 20" arrays of ``[B, D]``), ``"dots"`` ("big matmuls only", "closer to
7"), ``"ffw"`` (the three big MLP matmuls' outputs, ``[B, D]`` + 2 × ``[B, F]``), ``"full"``
("block remat": the layer's input alone) (transformers.md, "Gradient checkpointing";
training.md, question 2)."""


def saved_per_token(policy: Remat | int, D: int, F: int) -> int:
    """Elements a layer saves per token under ``policy``, or under ``policy`` arrays of
    ``[B, D]`` when an int (applied-training.md checkpoints 4 per layer)."""
    if isinstance(policy, int):
        return policy * D
    widths = {"none": 20 * D, "dots": 7 * D, "ffw": D + 2 * F, "full": D}
    return widths[policy]


def activation_bytes(
    B: float, L: int, D: int, F: int, policy: Remat | int, bytes_per: int = BF16
) -> float:
    """Bytes the ``L`` layers keep for the backward pass over ``B`` tokens, all devices
    together (training.md, question 2: ``2 · L · B · (D + 2F)`` for ``"ffw"``). Attention's
    score matrices and the vocabulary's logits are not counted, as the book counts them."""
    return bytes_per * L * B * saved_per_token(policy, D, F)


def training_seconds(params: float, tokens: float, devices: int, C: float, mfu: float) -> float:
    """Seconds to train on ``tokens`` at ``6 · params`` FLOPs per token, ``devices`` of ``C``
    FLOP/s each at ``mfu`` of peak (applied-training.md)."""
    return 6 * params * tokens / (devices * C * mfu)
