"""Bounds on what one graph call computes, checked before the expensive part runs. No torch.

A length-regulated graph (FastPitch) knows its output frames per item only once its encoder has
predicted the durations: item b decodes T_b = sum_j floor(durations[b, j] / pace[b] + 0.5)
frames. Its encoder's self-attention holds B x L^2 scores per head and its decoder's B x T^2
(the bundled voice took ~27 bytes per cell on onnxruntime: +99 MB for one item of 1,899 frames,
+201 MB for one of 2,732). So every runner (eager, onnx, cuda) refuses an item longer than its
`max_frames` before the decoder runs, and runs a batch in groups of rows that each cost at most
what one item at the limit costs: rows x (L^2 + T^2) <= max_frames^2 (decode_groups).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from speechrt.errors import SpeechRTError


def check_frames(name: str, longest: int, limit: int | None) -> None:
    """A length-regulated graph refuses an item of more than `limit` mel frames (None: any)."""
    if limit is not None and longest > limit:
        raise SpeechRTError(
            f"{name}: an item would produce {longest} mel frames (limit {limit}); "
            "send fewer symbols or raise the pace"
        )


def decode_groups(
    name: str, symbols: int, frames: np.ndarray, limit: int | None
) -> list[np.ndarray]:
    """The rows of a batch of a length-regulated graph in the calls its decoder runs: each
    row's `frames` (B,) after a (padded) encoding of `symbols`; an item over `limit` frames is
    refused (SpeechRTError), and the calls keep within limit^2 attention cells each. One
    group, the whole batch in order, when it fits or there is no limit (None)."""
    frames = np.asarray(frames, dtype=np.int64)
    if limit is None:
        return [np.arange(len(frames))]
    check_frames(name, int(frames.max(initial=0)), limit)
    return row_groups(attention_cells(symbols, frames), limit * limit)


def attention_cells(symbols: int, frames: np.ndarray) -> np.ndarray:
    """(B,) attention scores per head of each row: its encoder's over the batch's padded
    `symbols`, its decoder's over its own frames (B,) (padded, in a call, to the longest)."""
    return symbols * symbols + np.asarray(frames, dtype=np.int64) ** 2


def row_groups(costs: np.ndarray, budget: int) -> list[np.ndarray]:
    """The rows of a batch in calls of ascending cost, each call's rows x its largest cost
    <= budget; a row over the budget alone runs alone. One group: the whole batch, in order
    (the caller runs the batch as it is)."""
    if len(costs) * int(costs.max(initial=0)) <= budget:
        return [np.arange(len(costs))]
    groups: list[list[int]] = []
    for i in np.argsort(costs, kind="stable").tolist():
        if groups and (len(groups[-1]) + 1) * int(costs[i]) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [np.array(g) for g in groups]


def stack_rows(
    parts: Sequence[Mapping[str, np.ndarray]], groups: Sequence[np.ndarray]
) -> dict[str, np.ndarray]:
    """Outputs of calls on row groups (each (rows, ...)) -> the batch's outputs in its row
    order, each zero-padded to the largest call's shape (a group's frames axis is as long as
    its own longest item; what lies past an item's length is padding either way)."""
    order = np.argsort(np.concatenate(groups), kind="stable")  # batch row -> stacked row
    out = {}
    for name in parts[0]:
        arrays = [p[name] for p in parts]
        largest = np.max([a.shape for a in arrays], axis=0)  # rows of the largest call ignored
        padded = [np.pad(a, [(0, 0), *pad_to(a.shape[1:], largest[1:])]) for a in arrays]
        out[name] = np.concatenate(padded)[order]
    return out


def pad_to(shape: Sequence[int], target: Sequence[int]) -> list[tuple[int, int]]:
    """np.pad widths that grow `shape` to `target` at the end of each axis."""
    return [(0, int(n) - int(m)) for m, n in zip(shape, target, strict=True)]
