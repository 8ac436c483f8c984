"""`python -m speechrt_train lm` on a tiny fortunes tree: train split only, as spoken."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from speechrt.lm import load_lm
from speechrt_train.__main__ import main
from speechrt_train.asr_data import transcript
from speechrt_train.language_model import DECODING
from speechrt_train.texts import FORTUNES_DIR, is_heldout


def name(i: int) -> str:
    """A made-up word per number (letters only), so each sentence has words of its own."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i, 26)
        out += string.ascii_lowercase[r]
    return "zq" + out


def fortunes() -> tuple[list[str], list[str], tuple[str, str]]:
    """(train sentences, held-out sentences, a (train, held-out) pair equal but for punctuation)."""
    train, held = [], []
    i = 0
    while len(held) < 6 or len(train) < 30:
        s = f"The {name(i)} walked home with {name(i + 10_000)}."
        (held if is_heldout(s) else train).append(s)
        i += 1
    for j in range(20_000, 30_000):
        variants = [f"{name(j).title()} sat down{p}" for p in (".", "!", "?")]
        variants += [f"{name(j).title()}, sat down{p}" for p in (".", "!", "?")]
        h = [v for v in variants if is_heldout(v)]
        t = [v for v in variants if not is_heldout(v)]
        if h and t:
            return train, held, (t[0], h[0])
    raise AssertionError("no punctuation pair found")


def test_lm_command_sees_the_train_split_only(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train, held, (twin_train, twin_held) = fortunes()
    train.append("There are 22 cats in the house.")
    assert not is_heldout(train[-1])
    folder = tmp_path / "root" / FORTUNES_DIR
    folder.mkdir(parents=True)
    lines = [*train, twin_train, *held, twin_held]
    (folder / "tiny").write_text("\n%\n".join(lines) + "\n")
    words = tmp_path / "words"
    words.write_text("Zebra\nnaïve\nx-ray\no'clock\nit's\n'\nzebra\n")
    out = tmp_path / "lm"
    args = ["lm", "--out", str(out), "--fortunes-root", str(tmp_path / "root")]
    assert main([*args, "--words", str(words), "--alpha", "0.3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train_sentences"] == len(train) + 1 and summary["dropped_as_heldout"] == 1
    assert summary["sentences"] == len(train)
    lm = load_lm(out)
    vocab = set(lm.vocab)
    assert {"zebra", "o'clock", "it's"} <= vocab and not {"naïve", "x-ray", "'"} & vocab
    assert {"twenty", "two", "cats"} <= vocab and "22" not in vocab  # what the voices say
    for s in train:
        assert set(transcript(s).split()) <= vocab
    for s in [*held, twin_held]:
        own = {w for w in transcript(s).split() if w.startswith("zq")}
        assert own and not own & vocab, s  # nothing held out reaches the LM ...
    assert transcript(twin_train).split()[0] not in vocab  # ... not even as a train twin
    assert lm.decoding == {**DECODING, "alpha": 0.3}
    assert lm.source["words_listed"] == 3 and lm.source["sentences"] == len(train)
