"""What XLA's CPU backend does with a convolution beyond its FLOPs and bytes: the copies it
makes of its operands and result into the layouts its kernels take, the time it takes per
(output position, kernel tap) whatever the features, and per group of a grouped one.
"""

from __future__ import annotations

from collections.abc import Mapping

from shardwise._model.op import Op
from shardwise._program.windows import Shape

GROUP_TAP = 0.4
"""What each further group of a grouped convolution adds to its time per (position, tap), as
a share of it: XLA's CPU backend runs a depthwise convolution about group by group (measured
on one device of a 2-core x86 machine, 28×28 images: 2.3 ns per position, tap and group at
32 and 64 groups, where one group takes 5.7 ns per position and tap; a 32-group convolution
had run at 6× the time predicted without it)."""


def cpu_copies(op: Op) -> tuple[bool, ...]:
    """Which of a convolution's operands, and its result (last), XLA's CPU backend copies into
    the layout its kernels take (batch first and features last for images, kernel features
    last; ``ConvCanonicalization``): a kernel's gradient copies both operands and its result.

    >>> cpu_copies(Op(("nhwc", "ijco"), "nhwo")), cpu_copies(Op(("chwn", "cijo"), "hwno"))
    ((False, False, False), (True, True, True))
    """
    lhs, rhs = op.inputs
    k = len(lhs) - 2
    return (
        lhs != "n" + "hwd"[:k] + "c",
        rhs not in ("ijk"[:k] + "co", "ijk"[:k] + "go"),
        op.output != "n" + "hwd"[:k] + "o",
    )


def conv_taps(
    op: Op, kernel: Shape, flops: float, split: Mapping[str, int], groups: int = 1
) -> float:
    """How many (output position, kernel tap) pairs one device's part of a convolution read
    as ``op`` (kernel shape ``kernel``) computes, from its ``flops`` on that device: two FLOPs
    per tap, input feature (of a group) and output feature, each feature letter's size
    divided by the devices ``split`` splits it over. Splitting the features leaves every
    device all the pairs; splitting the batch divides them (a kernel's gradient sums over the
    batch: its "batch" is the image's features). Each group past the first of a grouped
    convolution (``groups`` on the device) adds :data:`GROUP_TAP` of them.

    >>> op = Op(("nhwc", "ijco"), "nhwo")  # 16 images, 8 to 16 features, 9 taps at 100 points
    >>> conv_taps(op, (3, 3, 8, 16), 2 * 16 * 100 * 9 * 8 * 16 / 4, {"n": 2, "o": 2})
    7200.0
    """
    features = 1
    for letter, size in zip(op.inputs[1], kernel, strict=True):
        if letter in op.inputs[0] or letter in op.output or letter == "g":  # (not a tap)
            features *= -(-size // split.get(letter, 1))
    return flops / (2 * features) * (1 + GROUP_TAP * (groups - 1))


def groups(op: Op, lhs: Shape, kernel: Shape) -> int:
    """How many groups a convolution read as ``op`` has (its images' features over its
    kernel's features per group, ``g``; 1 where it is not grouped).

    >>> groups(Op(("nhwc", "ijgo"), "nhwo"), (8, 14, 14, 32), (3, 3, 1, 32))
    32
    """
    if "g" not in op.inputs[1]:
        return 1
    [c] = [i for i in op.inputs[0] if i not in op.inputs[1] and i not in op.output]
    return lhs[op.inputs[0].index(c)] // kernel[op.inputs[1].index("g")]
