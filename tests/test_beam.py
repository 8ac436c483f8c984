"""CTC prefix beam search with a word LM, and the forced alignment that times its words."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from speechrt.asr.beam import BeamOptions, beam_decode, beam_search, lm_word
from speechrt.asr.ctc import align_pieces, align_tokens, collapse, greedy_decode, tokens_to_words
from speechrt.errors import SpeechRTError
from speechrt_train.ngram import build_lm

LABELS = [" ", *"abcdefghijklmnopqrstuvwxyz", "'"]
BLANK = len(LABELS)
NO_LM = BeamOptions(alpha=0.0, beta=0.0, oov_penalty=0.0, oov_char_penalty=0.0)
LM = build_lm(["the cat sat on the mat", "a cat sat", "the dog sat on a log"])


def frames(spec: list[dict[str, float]]) -> np.ndarray:
    """Per frame {label (" " space, "_" blank): probability}; the rest of the mass is spread
    evenly over the other classes -> (T, 29) log-probs."""
    out = np.empty((len(spec), BLANK + 1))
    for t, probs in enumerate(spec):
        rest = (1.0 - sum(probs.values())) / (BLANK + 1 - len(probs))
        out[t] = rest
        for ch, p in probs.items():
            out[t, BLANK if ch == "_" else LABELS.index(ch)] = p
    return np.log(out)


def spoken(text: str, p: float = 0.98) -> list[dict[str, float]]:
    """Each character for two frames then a blank frame, with probability p."""
    return [f for ch in text for f in ({ch: p}, {ch: p}, {"_": p})]


def peaked(ids: list[int], length: int) -> torch.Tensor:
    """(1, length, 29) log-probs whose argmax is ids (blank beyond), by a wide margin."""
    logits = torch.zeros(1, length, BLANK + 1)
    logits[0, :, BLANK] = 12.0
    for t, i in enumerate(ids):
        logits[0, t, BLANK] = 0.0
        logits[0, t, i] = 12.0
    return logits.log_softmax(-1)


def assert_finds_the_most_probable_text(labels: list[str], seeds: int = 40) -> None:
    """Against brute force on random log-probs of 5 frames: the sum over every CTC path of each
    text (texts differing only in extra spaces are one text). The search without an LM (a beam
    wide enough for every prefix) returns the best, unless the two best are within rounding."""
    classes = len(labels) + 1
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        lp = (torch.randn(5, classes, generator=g) * 1.5).log_softmax(-1).numpy()
        texts: defaultdict[str, float] = defaultdict(float)
        for path in itertools.product(range(classes), repeat=5):
            read = [labels[i] for i, _ in itertools.groupby(path) if i != classes - 1]
            texts[" ".join("".join(read).split())] += math.exp(sum(lp[range(5), list(path)]))
        (p1, best), (p2, _) = sorted(((p, t) for t, p in texts.items()), reverse=True)[:2]
        if p1 - p2 <= 1e-9 * p1:  # a tie that another CPU's exp and log could break either way
            continue
        wide = NO_LM.updated(beam_size=1000, prune_logp=-1e9)
        assert beam_search(lp, labels, LM, wide) == best, seed


def test_without_lm_it_finds_the_most_probable_text_exactly() -> None:
    assert_finds_the_most_probable_text([" ", "a", "b"])


def test_alpha_beta_zero_equals_greedy_on_peaked_inputs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(5, 60))
        # mostly letters, some spaces (also doubled and leading), blanks and repeats
        ids = rng.choice([*range(BLANK), *[0] * 6, *[BLANK] * 20], size=n).tolist()
        lp = peaked(ids, n + int(rng.integers(0, 5)))
        lengths = torch.tensor([lp.shape[1]])
        want = greedy_decode(lp, lengths, LABELS, 0.02, offset=0.1)
        got = beam_decode(lp, lengths, LABELS, 0.02, LM, NO_LM.updated(beam_size=4), offset=0.1)
        assert got == want


def test_lm_turns_a_misspelling_into_the_word() -> None:
    spec = spoken("the c") + [{"e": 0.55, "a": 0.4}] * 2 + [{"_": 0.98}] + spoken("t sat")
    lp = frames(spec)
    greedy = greedy_decode(torch.from_numpy(lp)[None], torch.tensor([len(spec)]), LABELS, 0.02)
    assert greedy[0].text == "the cet sat"
    assert beam_search(lp, LABELS, LM, BeamOptions()) == "the cat sat"
    assert beam_search(lp, LABELS, LM, NO_LM) == "the cet sat"


def test_a_word_the_lm_lacks_is_still_spelled() -> None:
    lp = frames(spoken("the zqx sat"))
    assert beam_search(lp, LABELS, LM, BeamOptions()) == "the zqx sat"
    lp = frames(spoken("kezar"))  # no vocabulary word starts with "ke"
    assert beam_search(lp, LABELS, LM, BeamOptions()) == "kezar"


def test_word_times_are_ordered_and_inside_the_utterance() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 150, BLANK + 1, generator=g) * 3
    logits[..., BLANK] += 4
    logits[..., 0] += 1
    lengths = torch.tensor([150, 90])
    for dec, n in zip(
        beam_decode(logits.log_softmax(-1), lengths, LABELS, 0.02, LM, BeamOptions()),
        lengths.tolist(),
        strict=True,
    ):
        assert dec.text and dec.text == " ".join(w.word for w in dec.words)
        ends = [0.0]
        for w in dec.words:
            assert ends[-1] <= w.start < w.end <= n * 0.02 + 1e-9
            ends.append(w.end)


def test_alignment_of_repeats_across_and_within_words() -> None:
    ids = [1, BLANK, 0, 1, 1, 0, 1, BLANK, 1, BLANK, 0, 0]  # "a a aa"
    lp = peaked(ids, 14)[0].numpy()
    tokens = align_tokens(lp, "a a aa", LABELS)
    # greedy's letter tokens; a space token (its frames unused) before each word after the first
    assert [t for t in tokens if t[0]] == [t for t in collapse(ids, BLANK) if t[0]]
    assert [t[0] for t in tokens] == [1, 0, 1, 0, 1, 1]
    assert align_tokens(lp, "", LABELS) == []
    with pytest.raises(ValueError, match="cannot be aligned"):
        align_tokens(lp[:3], "abcd", LABELS)


def test_options() -> None:
    opts = BeamOptions.from_dict({"alpha": 0.3, "beam_size": 4})
    assert opts.alpha == 0.3 and opts.beam_size == 4 and opts.beta == BeamOptions().beta
    assert opts.updated(alpha=None, beta=2.0) == BeamOptions(alpha=0.3, beam_size=4, beta=2.0)
    assert BeamOptions.from_dict(opts.to_dict()) == opts
    for bad in (
        {"gamma": 1},
        {"beam_size": 0},
        {"alpha": float("nan")},
        {"beta": "1"},
        {"beta": True},
    ):
        with pytest.raises(SpeechRTError):
            BeamOptions.from_dict(bad)
    # the search's cost grows with both: each is bounded
    for bad in ({"beam_size": 100_000}, {"beam_size": 2.5}):
        with pytest.raises(SpeechRTError, match=r"beam_size must be an integer within \[1, 1024\]"):
            BeamOptions.from_dict(bad)
    with pytest.raises(SpeechRTError, match=r"max_chars must be an integer within \[1, 64\]"):
        BeamOptions(max_chars=1000)
    assert BeamOptions(beam_size=1024).beam_size == 1024
    with pytest.raises(ValueError, match="labels"):
        beam_search(np.zeros((3, 4)), LABELS, LM, opts)


# word pieces as a Parakeet CTC model reads them: a leading space starts a word
PIECES = [" the", " c", " cat", "a", "e", "t", " sat", " s", " ", ",", " The", " ⁇ "]


def piece_frames(spec: list[dict[str, float]]) -> np.ndarray:
    """As frames(), over PIECES + blank ("_")."""
    blank = len(PIECES)
    out = np.empty((len(spec), blank + 1))
    for t, probs in enumerate(spec):
        out[t] = (1.0 - sum(probs.values())) / (blank + 1 - len(probs))
        for piece, p in probs.items():
            out[t, blank if piece == "_" else PIECES.index(piece)] = p
    return np.log(out)


def said(*pieces: str, p: float = 0.98) -> list[dict[str, float]]:
    return [f for piece in pieces for f in ({piece: p}, {piece: p}, {"_": p})]


@pytest.mark.parametrize("labels", [[" a", "a", " ", "b"], [" a", "b", " ", ""]])
def test_pieces_without_lm_find_the_most_probable_text_exactly(labels: list[str]) -> None:
    """As for characters, on pieces whose segmentations overlap (" a" = " " + "a"), a lone
    space and a control piece that reads as nothing: a text sums over its segmentations."""
    assert_finds_the_most_probable_text(labels)


def test_pieces_alpha_beta_zero_equal_greedy_words_and_times() -> None:
    """On peaked log-probs the beam's text is greedy's, and aligning it over every segmentation
    into pieces finds greedy's path: the same words at the same times."""
    rng = np.random.default_rng(1)
    blank = len(PIECES)
    for _ in range(30):
        n = int(rng.integers(5, 50))
        ids = rng.choice([*range(blank), *[blank] * 12], size=n).tolist()
        logits = torch.zeros(1, n + 2, blank + 1)
        logits[0, :, blank] = 12.0
        for t, i in enumerate(ids):
            logits[0, t, blank] = 0.0
            logits[0, t, i] = 12.0
        lp = logits.log_softmax(-1)
        lengths = torch.tensor([n + 2])
        want = greedy_decode(lp, lengths, PIECES, 0.08, offset=0.5)
        got = beam_decode(lp, lengths, PIECES, 0.08, LM, NO_LM.updated(beam_size=4), offset=0.5)
        assert got == want, ids


def test_lm_corrects_pieces_and_reads_words_without_case_and_punctuation() -> None:
    cet = [{"e": 0.55, "a": 0.4}] * 2 + [{"_": 0.98}]
    lp = piece_frames(said(" the", " c") + cet + said("t", " sat"))
    assert beam_search(lp, PIECES, LM, NO_LM) == "the cet sat"
    assert beam_search(lp, PIECES, LM, BeamOptions()) == "the cat sat"
    # "The c?t, sat": the LM hears "the", "c?t" and "sat"; the text keeps its case and comma
    lp = piece_frames(said(" The", " c") + cet + said("t", ",", " sat"))
    assert beam_search(lp, PIECES, LM, BeamOptions()) == "The cat, sat"
    assert [lm_word(w) for w in ("The", "cat,", "'tis", "dogs'", "«Hi!»", ",")] == [
        "the", "cat", "'tis", "dogs'", "hi", ""
    ]  # fmt: skip


def test_align_pieces_segmentations_repeats_and_the_unknown_piece() -> None:
    blank = len(PIECES)
    # " c" "a" "t" / " cat" " cat" (a gap between the equal pieces) / " " "a" -> "a" after "cat"
    ids = [1, 3, 5, blank, 2, 2, blank, 2, 8, 3, blank, 11, 0]
    lp = piece_frames([{PIECES[i] if i < blank else "_": 0.98} for i in ids])
    text = " ".join(tokens_to_words(collapse(ids, blank), PIECES, 1.0).text.split())
    assert text == "cat cat cat a ⁇ the"
    tokens = align_pieces(lp, beam_search(lp, PIECES, LM, NO_LM), PIECES)
    assert tokens == collapse(ids, blank)
    assert align_pieces(lp, "", PIECES) == []
    with pytest.raises(ValueError, match="cannot be aligned"):
        align_pieces(lp[:3], "cat cat cat", PIECES)
    with pytest.raises(ValueError, match="start words"):
        beam_search(np.zeros((2, 3)), ["a", "b"], LM, NO_LM)
