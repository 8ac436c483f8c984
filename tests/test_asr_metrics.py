"""WER / CER on hand-computed cases, with jiwer and with the built-in edit distance."""

from __future__ import annotations

import random

import pytest

from speechrt.asr import wer as wer_module
from speechrt.asr.wer import cer, char_errors, normalize_transcript, wer, word_errors


@pytest.fixture(params=["jiwer", "builtin"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "builtin":
        monkeypatch.setattr(wer_module, "_jiwer", lambda: None)
    else:
        pytest.importorskip("jiwer")
    return request.param


def test_word_errors(backend: str) -> None:
    e = word_errors("the cat sat on the mat", "the cat sit on mat")
    assert (e.substitutions, e.deletions, e.insertions, e.ref_len) == (1, 1, 0, 6)
    assert e.rate == pytest.approx(2 / 6)
    e = word_errors("a b", "a x b")
    assert (e.insertions, e.errors, e.rate) == (1, 1, 0.5)
    assert word_errors("", "").rate == 0.0 and word_errors("", "a b").errors == 2
    assert word_errors("a b", "").deletions == 2


def test_char_errors(backend: str) -> None:
    assert char_errors("abc", "abd").rate == pytest.approx(1 / 3)
    e = char_errors("ab c", "abc")  # the space is a character
    assert (e.deletions, e.ref_len) == (1, 4)
    assert cer(["hello world"], ["hallo word"]) == pytest.approx(2 / 11)


def test_corpus_rates_are_pooled(backend: str) -> None:
    assert wer(["a b c", "d"], ["a c", "e f"]) == pytest.approx(3 / 4)
    assert wer(["A b, C!"], ["a b c"]) == 0.0
    with pytest.raises(ValueError):
        wer(["a"], [])


def test_normalization() -> None:
    assert (
        normalize_transcript("Hello, World!  It\u2019s 2 o'clock.") == "hello world it's 2 o'clock"
    )
    assert normalize_transcript("well-known\tfact; (yes)") == "well known fact yes"
    assert normalize_transcript("  ") == ""
    assert normalize_transcript("our motto is 'it hurts ' the boys' rock 'n' roll") == (
        "our motto is it hurts the boys rock n roll"
    )


def test_builtin_matches_jiwer_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jiwer")
    rng = random.Random(0)
    vocab = ["a", "b", "c", "dd", "e'e"]
    pairs = [
        (
            " ".join(rng.choices(vocab, k=rng.randint(1, 9))),
            " ".join(rng.choices(vocab, k=rng.randint(1, 9))),
        )
        for _ in range(50)
    ]
    with_jiwer = [(word_errors(r, h).errors, char_errors(r, h).errors) for r, h in pairs]
    monkeypatch.setattr(wer_module, "_jiwer", lambda: None)
    assert [(word_errors(r, h).errors, char_errors(r, h).errors) for r, h in pairs] == with_jiwer
