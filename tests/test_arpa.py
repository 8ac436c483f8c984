"""ARPA word LMs (KenLM's, SRILM's) read into speechrt's n-gram model: the same probabilities
as the model that wrote them, the back-off arithmetic, <unk> added, malformed files refused,
and `speechrt convert LM.arpa DIR` for the beam search."""

from __future__ import annotations

import gzip
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from speechrt.asr.lm import NGramLM, load_lm, read_arpa
from speechrt.cli import main
from speechrt.errors import SpeechRTError
from speechrt_train.ngram import build_lm

SENTENCES = ["the cat sat on the mat", "a cat sat", "the dog sat on a log", "a dog ran"]


def to_arpa(lm: NGramLM) -> str:
    """An NGramLM as ARPA text (log10), as KenLM writes one: a test helper, not a product."""
    logp, backoff, ids = lm.arrays
    out = ["\\data\\", *(f"ngram {n}={len(logp[n - 1])}" for n in range(1, lm.order + 1)), ""]
    for n in range(1, lm.order + 1):
        out.append(f"\\{n}-grams:")
        rows = [[i] for i in range(len(lm))] if n == 1 else ids[n - 1].tolist()
        for k, row in enumerate(rows):
            words = " ".join(lm.vocab[i] for i in row)
            line = f"{float(logp[n - 1][k]) / math.log(10):.9f}\t{words}"
            if n < lm.order:
                line += f"\t{float(backoff[n - 1][k]) / math.log(10):.9f}"
            out.append(line)
        out.append("")
    return "\n".join([*out, "\\end\\", ""])


def test_an_arpa_file_gives_the_probabilities_of_the_model_that_wrote_it(tmp_path: Path) -> None:
    lm = build_lm(SENTENCES, order=3)
    (tmp_path / "lm.arpa").write_text("made by a test\n" + to_arpa(lm))
    with gzip.open(tmp_path / "lm.arpa.gz", "wt") as f:
        f.write(to_arpa(lm))
    for name in ("lm.arpa", "lm.arpa.gz"):
        got = read_arpa(tmp_path / name)
        assert got.vocab == lm.vocab and got.order == 3
        words = range(len(lm))
        for ctx in [(), *itertools.product(words, repeat=1), *itertools.product(words, repeat=2)]:
            for w in words:
                assert got.logprob(w, ctx) == pytest.approx(lm.logprob(w, ctx), abs=1e-6)
        for s in [*SENTENCES, "the log ran on a cat", "zebra sat"]:
            assert got.sentence_logprob(s.split()) == pytest.approx(
                lm.sentence_logprob(s.split()), abs=1e-5
            )


def test_back_off_arithmetic_and_an_added_unk(tmp_path: Path) -> None:
    path = tmp_path / "tiny.arpa"
    path.write_text(
        "\\data\\\nngram 1=4\nngram 2=2\n\n\\1-grams:\n-99\t<s>\t-0.5\n-1\t</s>\n-0.5\ta\t-0.25\n"
        "-0.75\tb\n\n\\2-grams:\n-0.1\t<s> a\n-0.2\ta b\n\n\\end\\\n"
    )
    lm = read_arpa(path)
    ln10 = math.log(10)
    a, b, s, e = (lm.ids[w] for w in ("a", "b", "<s>", "</s>"))
    assert lm.logprob(b, (a,)) == pytest.approx(-0.2 * ln10, abs=1e-6)  # stored
    assert lm.logprob(e, (a,)) == pytest.approx((-0.25 - 1) * ln10, abs=1e-6)  # backed off
    assert lm.logprob(a, (s,)) == pytest.approx(-0.1 * ln10, abs=1e-6)
    assert lm.vocab[-1] == "<unk>" and lm.logprob(lm.unk) == pytest.approx(-99 * ln10)
    assert lm.source == {"arpa": "tiny.arpa"}


def test_words_in_capitals_are_read_in_lower_case(tmp_path: Path) -> None:
    """LibriSpeech's ARPA LMs are in capitals with <UNK>: read as the beam search asks."""
    lm = build_lm(SENTENCES, order=2)
    upper = to_arpa(lm).replace("<unk>", "<UNK>")
    upper = "\n".join(line.upper() if "\t" in line else line for line in upper.split("\n"))
    (tmp_path / "caps.arpa").write_text(upper.replace("<S>", "<s>").replace("</S>", "</s>"))
    got = read_arpa(tmp_path / "caps.arpa")
    assert got.vocab == lm.vocab
    assert got.logprob(got.ids["cat"], (got.ids["the"],)) == pytest.approx(
        lm.logprob(lm.ids["cat"], (lm.ids["the"],)), abs=1e-6
    )
    (tmp_path / "twice.arpa").write_text(
        "\\data\\\nngram 1=3\n\n\\1-grams:\n-1\t<s>\n-1\t</s>\n-1\t<S>\n\n\\end\\\n"
    )
    with pytest.raises(SpeechRTError, match="in two cases"):
        read_arpa(tmp_path / "twice.arpa")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("\\data\\\nngram 1=3\n\n\\1-grams:\n-1\t<s>\n-1\t</s>\n\n\\end\\\n", "2 1-grams"),
        ("\\data\\\nngram 1=2\nngram 2=1\n\n\\1-grams:\n-1\t<s>\n-1\t</s>\n\n\\2-grams:\n"
         "-1\t<s> zebra\n\n\\end\\\n", "zebra"),
        ("\\data\\\nngram 1=2\n\n\\1-grams:\n-1\t<s>\nminus one\t</s>\n\n\\end\\\n",
         ":6: not a 1-gram"),
        ("\\data\\\nngram 1=2\n\n\\1-grams:\n-1\t<s>\n-1\t</s>\n", "no ARPA model"),
        ("\\data\\\nngram one=2\n", ":2: not an 'ngram N=COUNT' line"),
        ("\\data\\\nngram 1=1\n\n\\1-grams:\n-1\t</s>\n\n\\end\\\n", "lack <s>"),
        ("hello\n", "no ARPA model"),
    ],
)  # fmt: skip
def test_malformed_arpa_files_are_refused(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.arpa"
    path.write_text(text)
    with pytest.raises(SpeechRTError, match=match):
        read_arpa(path)


def test_convert_writes_an_lm_the_beam_search_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lm = build_lm(SENTENCES, order=2)
    (tmp_path / "lm.arpa").write_text(to_arpa(lm))
    assert main(["convert", str(tmp_path / "lm.arpa"), str(tmp_path / "lm")]) == 0
    assert "2-gram word LM of" in capsys.readouterr().out
    loaded = load_lm(tmp_path / "lm")
    assert loaded.vocab == lm.vocab
    for w, c in itertools.product(range(len(lm)), repeat=2):  # fp16 on disk: 0.008 nats at -16
        assert abs(loaded.logprob(w, (c,)) - lm.logprob(w, (c,))) <= 0.01
    assert main(["convert", str(tmp_path / "lm.arpa"), str(tmp_path / "x"), "--dtype", "fp16"]) == 2
    assert "not an ARPA LM" in capsys.readouterr().err
    assert np.isfinite(loaded.arrays[0][0]).all()
