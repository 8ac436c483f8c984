"""`python -m speechrt_train lm` on a tiny fortunes tree: train split only, as spoken."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from speechrt.asr.lm import load_lm
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
    # the LM reads sentences of any length, not just those the corpus keeps (3-24 words) ...
    long = "This " + " ".join(f"{name(40_000 + k)}" for k in range(30)) + " stays."
    train.append(long)
    # ... but none that quotes a held-out sentence
    quoting = f"He said that {held[0][0].lower()}{held[0][1:-1]} and left."
    assert not any(is_heldout(s) for s in (train[-2], long, quoting))
    folder = tmp_path / "root" / FORTUNES_DIR
    folder.mkdir(parents=True)
    lines = [*train, twin_train, quoting, *held, twin_held]
    (folder / "tiny").write_text("\n%\n".join(lines) + "\n")
    words = tmp_path / "words"
    words.write_text("Zebra\nnaïve\nx-ray\no'clock\nit's\n'\nzebra\n")
    out = tmp_path / "lm"
    args = ["lm", "--out", str(out), "--fortunes-root", str(tmp_path / "root")]
    assert main([*args, "--words", str(words), "--alpha", "0.3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    side = summary["sources"]["fortunes train side"]
    assert side["sentences"] == len(train) and side["dropped_as_heldout"] == 2
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
    assert name(40_029) in vocab and "said" not in vocab  # the long one in, the quoting one out
    assert lm.decoding == {**DECODING, "alpha": 0.3}
    assert lm.source["words_listed"] == 3 and lm.source["sentences"] == len(train)


def test_lm_command_reads_extra_text(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--text-root: fortune files, dictd databases and WordNet examples, all LM text, minus
    anything that holds a held-out fortune sentence."""
    import gzip

    train, held, _ = fortunes()
    fortunes_root = tmp_path / "fortunes"
    (fortunes_root / FORTUNES_DIR).mkdir(parents=True)
    (fortunes_root / FORTUNES_DIR / "tiny").write_text("\n%\n".join([*train, *held]) + "\n")
    extra = tmp_path / "extra"
    (extra / FORTUNES_DIR).mkdir(parents=True)
    (extra / FORTUNES_DIR / "quotes").write_text("Zqfortune is here.\n%\nAnother zqquote.\n")
    (extra / "usr/share/dictd").mkdir(parents=True)
    jargon = "zqhack\n   A zqkludge that works. It zqruns.\n\nzqcruft\n   Old zqcode.\n"
    (extra / "usr/share/dictd/jargon.dict.dz").write_bytes(gzip.compress(jargon.encode()))
    wordnet = extra / "usr/share/wordnet"
    wordnet.mkdir(parents=True)
    held_line = held[0].rstrip(".")
    for pos in ("noun", "verb", "adj", "adv"):
        (wordnet / f"data.{pos}").write_text(
            "  1 This software and database is being provided\n"
            f'00001740 03 n 01 zq{pos} 0 000 | a thing; "the zq{pos}word ran"; "{held_line}"\n'
        )
    out = tmp_path / "lm"
    args = ["lm", "--out", str(out), "--fortunes-root", str(fortunes_root)]
    assert main([*args, "--text-root", str(extra)]) == 0
    sources = json.loads(capsys.readouterr().out)["sources"]
    assert sources["fortune files"]["sentences"] == 2
    assert sources["dictd jargon"]["sentences"] == 3  # one per ". " (a headword starts one)
    assert sources["wordnet examples"] == {"sentences": 4, "words": 12, "dropped_as_heldout": 1}
    vocab = set(load_lm(out).vocab)
    assert {"zqfortune", "zqquote", "zqkludge", "zqruns", "zqcode", "zqnounword"} <= vocab
    assert "software" not in vocab  # WordNet's license header is not text
    for s in held:
        assert not {w for w in transcript(s).split() if w.startswith("zq")} & vocab
    assert main([*args, "--text-root", str(tmp_path / "nothing")]) == 2
    assert "no fortune files, dictd databases or WordNet" in capsys.readouterr().err


def test_corpus_text_root_adds_train_sentences_only(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """corpus --text-root: the extra text's acceptable sentences join the train side (a WordNet
    example capitalised and stopped); none that the split holds out, none that holds a held-out
    fortune, no fortune twice; the held-out sentences stay exactly the fortunes' own."""
    from speechrt_train.corpus import assign
    from speechrt_train.language_model import speech_sentences
    from speechrt_train.texts import load_sentences, split

    train, held, _ = fortunes()
    root = tmp_path / "fortunes"
    (root / FORTUNES_DIR).mkdir(parents=True)
    (root / FORTUNES_DIR / "tiny").write_text("\n%\n".join([*train, *held]) + "\n")
    own = load_sentences(root)
    split_out = next(
        f"The zqsplit{i} is here." for i in range(1000) if is_heldout(f"The zqsplit{i} is here.")
    )
    extra = tmp_path / "extra"
    (extra / "usr/share/wordnet").mkdir(parents=True)
    examples = [
        "the zqdog ran home",  # -> "The zqdog ran home."
        "is the zqbird in?",  # -> "Is the zqbird in?"
        f"he said {held[0][0].lower()}{held[0][1:-1]}",  # holds a held-out fortune
        train[0].upper()[:-1].lower(),  # a fortune again (folded)
        "too short",
        split_out.rstrip("."),  # the split would hold it out
        "a very " + "long " * 30 + "one",
    ]
    for pos in ("noun", "verb", "adj", "adv"):
        body = "; ".join(f'"{e}"' for e in examples) if pos == "noun" else '"The zqcat sat."'
        (extra / f"usr/share/wordnet/data.{pos}").write_text(f"00001740 03 n 01 x 0 | a; {body}\n")
    got = [s.text for s in speech_sentences(extra, own)]
    assert sorted(got) == ["Is the zqbird in?", "The zqcat sat.", "The zqdog ran home."]
    merged = sorted(own + speech_sentences(extra, own), key=lambda s: s.key)
    assert split(merged)[1] == split(own)[1]
    tasks = assign({"slt": (len(split(merged)[0]), 3)}, merged)
    read = [s.text for t in tasks for s in t.sentences]
    assert "The zqdog ran home." in read and set(read[:3]) <= {s.text for s in split(own)[1]}

    args = ["corpus", "--out", str(tmp_path / "c"), "--fortunes-root", str(root), "--quiet"]
    assert main([*args, "--plan", "wide"]) == 2  # the fortunes alone are too few
    assert "plan wants more sentences" in capsys.readouterr().err
    assert main([*args, "--plan", "tiny", "--text-root", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no fortune files, dictd databases or WordNet" in err
