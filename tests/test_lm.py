"""The word n-gram LM: Kneser-Ney values by hand, normalisation, pruning, storage, bad files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from speechrt.asr.lm import BOS, EOS, UNK, NGramLM, load_lm
from speechrt.errors import SpeechRTError
from speechrt_train.ngram import build_lm

TEXT = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a cat and a dog",
    "the cat ate the rat",
    "on the mat the cat sat",
    "the the cat",
    "a dog sat",
]


def total(lm: NGramLM, context: tuple[int, ...]) -> float:
    """Sum of P(w | context) over every word that can follow (all but <s>)."""
    return sum(math.exp(lm.logprob(w, context)) for w in range(len(lm)) if w != lm.bos)


def histories(lm: NGramLM) -> list[tuple[int, ...]]:
    i = lm.ids
    return [
        (),
        (lm.bos,),
        (i["the"],),
        (i["zebra"],),  # in the vocabulary only through the word list
        (lm.bos, i["the"]),
        (i["the"], i["cat"]),
        (i["sat"], i["on"]),
        (i["zebra"], i["the"]),
        (lm.unk, lm.unk),
        (i["cat"], i["the"], i["dog"]),  # longer than the order: the oldest word is dropped
    ]


def test_kneser_ney_by_hand() -> None:
    """A bigram model small enough to work out: continuation counts, fallback discounts
    (0.5, 1, 1.5: too few counts of counts to estimate them), uniform floor."""
    lm = build_lm(["a b", "a c", "a b"], order=2)
    i = lm.ids
    p = {w: math.exp(lm.logprob(i[w])) for w in ("a", "b", "c", EOS, UNK)}
    # continuation counts: a 1 (after <s>), b 1, c 1, </s> 2 (after b and c); 5 in all;
    # leftover (0.5 * 3 + 1 * 1) / 5 = 0.5, spread over the 5 predictable words
    assert p == pytest.approx({"a": 0.2, "b": 0.2, "c": 0.2, EOS: 0.3, UNK: 0.1}, abs=1e-6)
    after_a = {w: math.exp(lm.logprob(i[w], [i["a"]])) for w in ("a", "b", "c", EOS, UNK)}
    # context "a": b twice, c once; leftover (1 + 0.5) / 3 = 0.5 times the unigram
    want = {"b": 1 / 3 + 0.1, "c": 0.5 / 3 + 0.1, "a": 0.1, EOS: 0.15, UNK: 0.05}
    assert after_a == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("order,prune", [(3, 1), (3, 2), (2, 1), (1, 1)])
def test_distributions_sum_to_one(order: int, prune: int) -> None:
    lm = build_lm(TEXT, ["zebra", "cat", "don't"], order=order, prune=prune)
    for h in histories(lm):
        assert total(lm, h) == pytest.approx(1.0, abs=1e-5), h


def test_pruning_drops_singleton_trigrams_only() -> None:
    full, pruned = build_lm(TEXT), build_lm(TEXT, prune=2)
    n_full, n_pruned = (len(m.arrays[0][2]) for m in (full, pruned))
    assert 0 < n_pruned < n_full
    assert len(full.arrays[0][1]) == len(pruned.arrays[0][1])  # bigrams all kept
    i = full.ids
    seen_twice = (i["on"], i["the"]), i["mat"]  # "on the mat" twice: kept, same value
    assert pruned.logprob(seen_twice[1], seen_twice[0]) == pytest.approx(
        full.logprob(seen_twice[1], seen_twice[0]), abs=1e-6
    )


def test_word_list_words_are_in_vocabulary_below_seen_words() -> None:
    lm = build_lm(TEXT, ["zebra", "aardvark's"])
    assert lm.word_id("zebra") is not None and lm.word_id("aardvark's") is not None
    assert lm.word_id("unicorn") is None and lm.word_id(BOS) is None
    once = lm.logprob(lm.ids["rat"])  # seen once
    assert lm.logprob(lm.ids["zebra"]) < once
    assert lm.logprob(lm.ids["zebra"]) == pytest.approx(lm.logprob(lm.unk))
    assert lm.sentence_logprob(["the", "cat", "sat"]) > lm.sentence_logprob(["sat", "cat", "the"])


def test_prefixes() -> None:
    lm = build_lm(TEXT, ["zebra"])
    assert all(lm.is_prefix(p) for p in ("", "c", "ca", "cat", "zeb", "zebra"))
    assert not any(lm.is_prefix(p) for p in ("cats", "x", "zebras", "<"))


def test_save_load_round_trip(tmp_path: Path) -> None:
    lm = build_lm(TEXT, ["zebra"], prune=2, decoding={"alpha": 0.5}, source={"sentences": 7})
    lm.save(tmp_path)
    # readable by another user as lm.json is: not safetensors' 0600
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes["lm.safetensors"] == modes["lm.json"], modes
    back = load_lm(tmp_path)
    assert back.vocab == lm.vocab and back.order == 3
    assert back.decoding == {"alpha": 0.5} and back.source == {"sentences": 7}
    ids, back_ids = lm.arrays[2], back.arrays[2]
    for x, y in zip(ids, back_ids, strict=True):
        np.testing.assert_array_equal(x, y)
    # log-probabilities and backoffs are stored in fp16: within half its step at their size
    for a, b in zip(lm.arrays[:2], back.arrays[:2], strict=True):
        for x, y in zip(a, b, strict=True):
            assert y.dtype == np.float32
            np.testing.assert_allclose(y, x, rtol=2**-11, atol=0)
    for h in histories(lm):
        got = [back.logprob(w, h) for w in range(len(lm))]
        want = [lm.logprob(w, h) for w in range(len(lm))]
        np.testing.assert_allclose(got, want, rtol=0, atol=0.01)


def test_float32_files_still_load(tmp_path: Path) -> None:
    """LMs written before fp16 storage (float32 arrays) load unchanged."""
    from safetensors.numpy import load_file, save_file

    lm = build_lm(TEXT, ["zebra"], prune=2)
    lm.save(tmp_path)
    path = tmp_path / "lm.safetensors"
    logp, backoff, _ = lm.arrays
    t = load_file(str(path))
    for n in range(1, lm.order + 1):
        t[f"logp.{n}"] = logp[n - 1].astype(np.float32)
        if n < lm.order:
            t[f"backoff.{n}"] = backoff[n - 1].astype(np.float32)
    save_file(t, str(path))
    back = load_lm(tmp_path)
    for h in histories(lm):
        assert [back.logprob(w, h) for w in range(len(lm))] == [
            lm.logprob(w, h) for w in range(len(lm))
        ]


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    build_lm(TEXT).save(tmp_path / "lm")
    return tmp_path / "lm"


def _one_line(path: Path, match: str) -> None:
    with pytest.raises(SpeechRTError, match=match) as e:
        load_lm(path)
    assert "\n" not in str(e.value)


def test_bad_files_are_one_line_errors(saved: Path, tmp_path: Path) -> None:
    _one_line(tmp_path / "nowhere", "no lm.json")
    info = saved / "lm.json"
    good = json.loads(info.read_text())
    info.write_text('{"format_version": 1, "order": ')
    _one_line(saved, "corrupt language model description")
    for change, match in [
        ({"format_version": 9}, "format_version"),
        ({"order": 0}, "order"),
        ({"vocab": good["vocab"][3:]}, "vocab lacks"),
        ({"vocab": good["vocab"][:-1]}, "does not match"),  # one word short: ids out of range
        ({"order": 2}, "unexpected arrays"),
        ({"counts": {"1": 1}}, "counts"),
        ({"kind": "arpa"}, "n-gram model"),
    ]:
        info.write_text(json.dumps({**good, **change}))
        _one_line(saved, match)
    info.write_text(json.dumps(good))
    assert len(load_lm(saved)) == len(good["vocab"])
    weights = saved / "lm.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    _one_line(saved, "corrupt language model file")
    weights.unlink()
    _one_line(saved, "no lm.safetensors")


def test_build_rejects_bad_arguments() -> None:
    with pytest.raises(SpeechRTError, match="order"):
        build_lm(TEXT, order=0)
    with pytest.raises(SpeechRTError, match="prune"):
        build_lm(TEXT, prune=0)
    empty = build_lm([], ["word"])  # no sentences: uniform over the vocabulary
    assert total(empty, ()) == pytest.approx(1.0, abs=1e-6)
