"""The FastConformer's alignment guide (ctc_guide): the batched CTC Viterbi against a per-item
reference, and pieces mapped onto characters and frames. A guided training step:
test_fastconformer_train."""

from __future__ import annotations

import numpy as np
import torch

from speechrt_train.ctc_guide import piece_anchors, place, viterbi_first_frames


def reference_first_frames(lp: np.ndarray, target: list[int], blank: int) -> list[int]:
    """One item's best CTC path (plain loops over states) -> each target's first frame."""
    ext = [blank]
    for c in target:
        ext += [c, blank]
    T, S = lp.shape[0], len(ext)
    score = np.full((T, S), -np.inf)
    came = np.zeros((T, S), dtype=int)
    score[0, :2] = lp[0, ext[:2]]
    for t in range(1, T):
        for s in range(S):
            options = [(score[t - 1, s], s)]
            if s >= 1:
                options.append((score[t - 1, s - 1], s - 1))
            if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                options.append((score[t - 1, s - 2], s - 2))
            best, came[t, s] = max(options)
            score[t, s] = best + lp[t, ext[s]]
    s = max((S - 1, S - 2), key=lambda k: score[T - 1, k])
    states = [0] * T
    for t in range(T - 1, -1, -1):
        states[t] = s
        s = came[t, s]
    return [states.index(2 * j + 1) for j in range(len(target))]


def test_batched_viterbi_matches_the_reference_per_item():
    g = torch.Generator().manual_seed(0)
    B, T, C, blank = 5, 30, 6, 5
    lp = torch.randn(B, T, C, generator=g).log_softmax(-1)
    lengths = torch.tensor([30, 24, 17, 30, 9])
    targets = torch.tensor(
        [[0, 1, 1, 2, 3], [4, 4, 4, 0, 0], [1, 2, 0, 0, 0], [3, 0, 0, 0, 0], [2, 2, 1, 0, 0]]
    )
    n = torch.tensor([5, 3, 2, 1, 3])
    got = viterbi_first_frames(lp, lengths, targets, n, blank)
    for b in range(B):
        want = reference_first_frames(
            lp[b, : lengths[b]].numpy(), targets[b, : n[b]].tolist(), blank
        )
        assert got[b, : n[b]].tolist() == want
        assert (got[b, n[b] :] == -1).all()


def test_viterbi_follows_peaky_emissions_and_flags_impossible_items():
    T, C, blank = 12, 4, 3
    lp = torch.full((2, T, C), -9.0)
    lp[:, :, blank] = 0.0
    for t, c in [(2, 0), (3, 0), (6, 1), (9, 1)]:  # "a" twice, then "b" twice
        lp[0, t, c], lp[0, t, blank] = 0.0, -9.0
    targets = torch.tensor([[0, 1, 1], [0, 0, 0]])
    first = viterbi_first_frames(lp, torch.tensor([T, 4]), targets, torch.tensor([3, 3]), blank)
    assert first[0].tolist() == [2, 6, 9]
    assert first[1].tolist() == [-1, -1, -1]  # "aaa" needs 5 frames: there are 4


def test_pieces_anchor_on_their_first_character():
    text = "hello world"
    assert piece_anchors(["▁hel", "lo", "▁", "w", "orld"], text) == [0, 3, 6, 6, 7]
    assert piece_anchors(["▁hello", "▁word"], text) is None  # they spell something else
    assert place([0, 0, 1, 5], [7, 8, 8, 9], 8, blank=10) == [7, 8, 10, 8, 10, 9, 10, 10]
    assert place([0, 3], [7, 8], 3, blank=10) is None  # runs past the frames
