"""Greedy CTC: collapse, blanks, word splitting and word times, on hand-made frame sequences."""

from __future__ import annotations

import numpy as np
import torch

from speechrt.asr.ctc import Word, collapse, greedy_decode, greedy_tokens, tokens_to_words

LABELS = [" ", *"abcdefghijklmnopqrstuvwxyz", "'"]
B = 28  # blank, the last class
H, EYE, A, BE, SP, APOS = 8, 9, 1, 2, 0, 27


def one_hot(ids: list[int], length: int | None = None) -> torch.Tensor:
    """(T,) ids -> log-probs (1, length, 29) whose argmax is ids (blank beyond)."""
    length = length or len(ids)
    lp = torch.full((1, length, 29), -10.0)
    lp[0, :, B] = -0.1
    for t, i in enumerate(ids):
        lp[0, t, i] = 0.0
    return lp


def test_collapse_merges_repeats_and_drops_blanks() -> None:
    ids = [B, H, H, B, EYE, SP, SP, A, BE, B, BE, B]
    assert collapse(ids, B) == [
        (H, 1, 2),
        (EYE, 4, 4),
        (SP, 5, 6),
        (A, 7, 7),
        (BE, 8, 8),
        (BE, 10, 10),
    ]
    assert collapse([B, B], B) == [] and collapse([], B) == []


def test_greedy_tokens_is_collapse_of_every_row() -> None:
    """The batched decoding finds each row's runs as collapse() does on the row's own frames,
    for any lengths (0 and the full width included) and runs that cross a row's end."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        b, t, v = rng.integers(1, 9), rng.integers(1, 30), rng.integers(2, 5)
        lp = rng.standard_normal((b, t, v))
        lengths = rng.integers(0, t + 1, b)
        lengths[0] = t
        best = lp.argmax(-1)
        want = [collapse(best[i, : lengths[i]], v - 1) for i in range(b)]
        assert greedy_tokens(lp, lengths, v - 1) == want
        assert greedy_tokens(torch.from_numpy(lp), torch.from_numpy(lengths), v - 1) == want


def test_words_and_times() -> None:
    ids = [B, H, H, B, EYE, SP, SP, A, BE, B, BE, B]
    (dec,) = greedy_decode(one_hot(ids), torch.tensor([len(ids)]), LABELS, 0.02)
    assert dec.text == "hi abb"
    assert dec.words == (Word("hi", 0.02, 0.1), Word("abb", 0.14, 0.22))


def test_offset_clip_and_spaces() -> None:
    toks = [(SP, 0, 0), (EYE, 2, 3), (APOS, 4, 4), (SP, 5, 5), (SP, 7, 7), (A, 9, 20)]
    dec = tokens_to_words(toks, LABELS, 0.02, offset=-0.05, clip=(0.0, 0.3))
    assert dec.text == "i' a"
    assert dec.words == (Word("i'", 0.0, 0.05), Word("a", 0.13, 0.3))


def test_lengths_limit_decoding() -> None:
    ids = [H, B, EYE, B, A]
    lp = torch.cat([one_hot(ids), one_hot([A, A, B, EYE, EYE])])
    out = greedy_decode(lp, torch.tensor([3, 5]), LABELS, 0.02)
    assert [d.text for d in out] == ["hi", "ai"]
