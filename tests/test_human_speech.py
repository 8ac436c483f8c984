"""The human-speech test set's manifest, references and scoring, on fake unpacked packages (the
real ones are fetched only by scripts/eval_human.py; nothing here touches the network)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speechrt.asr.wer import ErrorCounts
from speechrt_train.human_speech import (
    LENGTH_GROUPS,
    build_manifest,
    length_group,
    reference,
    score,
)


def _wav(path: Path, seconds: float, sr: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.zeros(int(seconds * sr), dtype=np.float32), sr, subtype="PCM_16")


@pytest.fixture
def packages(tmp_path: Path) -> dict[str, tuple[Path, dict[str, str]]]:
    ast = tmp_path / "asterisk"
    sounds = ast / "usr/share/asterisk/sounds/en_US_f_Allison"
    listing = (
        "; Core Asterisk Sounds in English\n"
        "agent-pass: Please enter your password, followed by the pound key.\n"
        "beep: [this is a simple beep tone]\n"
        "demo-enterkeywords: separated by * and then press the pound key.\n"
        "dictate/forhelp: press 0 for help\n"
        "letters/a: a\n"
        "silence/1: (1 second of silence)\n"
        "vm-intro: Leave your message after the tone. (simple tone sound plays)\n"
        "missing-file: This prompt has no audio.\n"
    )
    doc = ast / "usr/share/doc/asterisk-core-sounds-en"
    doc.mkdir(parents=True)
    (doc / "core-sounds-en.txt.gz").write_bytes(gzip.compress(listing.encode()))
    for name in ("agent-pass", "beep", "demo-enterkeywords", "dictate/forhelp", "letters/a",
                 "silence/1", "vm-intro"):  # fmt: skip
        _wav(sounds / f"{name}.wav", 0.5, 8000)
    alsa = tmp_path / "alsa"
    for name in ("Front_Left", "Rear_Center", "Noise"):
        _wav(alsa / f"usr/share/sounds/alsa/{name}.wav", 1.0, 48000)
    data = tmp_path / "ps/pocketsphinx/pocketsphinx-5.1.1/test/data"
    data.mkdir(parents=True)
    (np.zeros(16000, dtype="<i2")).tofile(data / "goforward.raw")
    _wav(data / "cards/001.wav", 0.25, 16000)
    (data / "cards/cards.transcription").write_text("<s> ten of clubs  </s> (001)\n")
    _wav(data / "librivox/book-0870.wav", 2.0, 16000)
    (data / "librivox/book-0870.txt").write_text(" he was not an ill disposed young man\n")
    _wav(data / "librivox/no-text.wav", 1.0, 16000)  # no transcript: not used
    return {
        "asterisk": (ast, {"asterisk-core-sounds-en-wav": "1.6.1-1"}),
        "alsa": (alsa, {"alsa-utils": "1.2.8-1"}),
        "pocketsphinx": (tmp_path / "ps", {"pocketsphinx": "5.1.1"}),
    }


def test_reference_normalises_like_the_wer_code() -> None:
    assert reference("Please enter 1 or 22, then press Pound.") == (
        "please enter one or twenty two then press pound"
    )
    assert reference("Don't hang up!  (tone plays)") == "don't hang up"
    assert reference("[ascending tones]") is None  # nothing spoken
    assert reference("<beep ascending>") is None
    assert reference("press * to pause") is None  # spoken form of * unknown


def test_manifest_from_fake_packages(packages, tmp_path: Path) -> None:
    out = tmp_path / "cache/manifest.jsonl"
    entries = build_manifest(packages, out)
    by_id = {e.id: e for e in entries}
    assert sorted(by_id) == [
        "alsa/Front_Left", "alsa/Rear_Center",
        "asterisk/agent-pass", "asterisk/dictate/forhelp", "asterisk/vm-intro",
        "pocketsphinx/cards/001", "pocketsphinx/data/goforward",
        "pocketsphinx/librivox/book-0870",
    ]  # fmt: skip
    assert by_id["asterisk/agent-pass"].text == (
        "please enter your password followed by the pound key"
    )
    assert by_id["asterisk/dictate/forhelp"].text == "press zero for help"
    assert by_id["asterisk/vm-intro"].text == "leave your message after the tone"
    assert by_id["alsa/Rear_Center"].text == "rear center"
    assert by_id["pocketsphinx/cards/001"].text == "ten of clubs"
    assert by_id["pocketsphinx/data/goforward"].text == "go forward ten meters"
    # the headerless .raw becomes a 16 kHz wav that any reader (and `speechrt eval`) opens
    info = sf.info(by_id["pocketsphinx/data/goforward"].audio_filepath)
    assert (info.samplerate, info.frames) == (16000, 16000)
    assert by_id["alsa/Front_Left"].duration == pytest.approx(1.0)
    ast = by_id["asterisk/agent-pass"]
    assert (ast.speaker, ast.version, ast.license) == ("Allison Smith", "1.6.1-1", "CC-BY-SA-3.0")
    assert ast.path.endswith("en_US_f_Allison/agent-pass.wav")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == [e.id for e in entries]
    assert {"audio_filepath", "duration", "text"} <= set(lines[0])  # speechrt eval's format
    assert all(Path(x["audio_filepath"]).is_absolute() for x in lines)


def test_score_is_corpus_level_per_source_and_overall(packages) -> None:
    entries = build_manifest(packages)
    hyps = {
        "alsa/Front_Left": "front left",  # 0 / 2
        "alsa/Rear_Center": "rear",  # 1 deletion / 2
        "pocketsphinx/cards/001": "ten of clubs and",  # 1 insertion / 3
    }
    tallies = score(entries, [hyps.get(e.id, e.text) for e in entries])
    lengths = {k for k in tallies if k.startswith("overall, wideband, ")}
    assert set(tallies) - lengths == {
        "asterisk",
        "alsa",
        "pocketsphinx",
        "overall",
        "overall, wideband",
    }
    assert tallies["alsa"].words == ErrorCounts(0, 1, 0, 4)
    assert tallies["alsa"].words.rate == pytest.approx(0.25)
    assert tallies["asterisk"].words.errors == 0
    ref_words = sum(len(e.text.split()) for e in entries)
    overall = tallies["overall"]
    assert overall.words.ref_len == ref_words
    assert overall.words.rate == pytest.approx(2 / ref_words)  # total edits / total words
    assert overall.utterances == len(entries)
    assert len(overall.speakers) == 1 + 1 + 3  # Allison Smith, alsa, goforward/cards/librivox
    assert overall.to_dict()["minutes"] == pytest.approx(
        sum(e.duration for e in entries) / 60, abs=0.01
    )
    wide = tallies["overall, wideband"]  # without the 8 kHz asterisk prompts
    assert wide.utterances == len(entries) - tallies["asterisk"].utterances
    assert wide.words.errors == 2
    # the wideband utterances again, each in the row of its reference's length in words
    assert lengths <= set(LENGTH_GROUPS) and len(lengths) >= 2
    for field in ("utterances", "word_errors", "ref_words"):
        assert sum(tallies[k].to_dict()[field] for k in lengths) == wide.to_dict()[field]
    assert tallies["overall, wideband, 2-3 words"].words == ErrorCounts(0, 1, 1, 2 + 2 + 3)
    for e in entries:
        if e.source != "asterisk":
            n = len(e.text.split())
            row = "1 word" if n == 1 else "2-3 words" if n <= 3 else "4-8 words" if n <= 8 else "9+"
            assert length_group(n).startswith(f"overall, wideband, {row}")
    with pytest.raises(ValueError):
        score(entries, ["too few"])


def test_rewritten_card_keeps_the_human_speech_section(tmp_path: Path) -> None:
    from speechrt_train.cards import kept_sections

    card = tmp_path / "quartznet.md"
    assert kept_sections(card) == ""
    card.write_text("# Card\n\nold numbers\n")
    assert kept_sections(card) == ""
    human = "\n## Real human speech (held out)\n\n| a | b |\n\nmore\n"
    card.write_text("# Card\n\nold numbers\n" + human)
    assert kept_sections(card) == human


def test_g722_variant_is_decoded_and_kept_out_of_overall(packages) -> None:
    G722 = pytest.importorskip("G722")  # the optional `human` extra
    files, _ = packages["asterisk"]
    sounds = files / "usr/share/asterisk/sounds/en_US_f_Allison"
    pcm = (np.sin(np.arange(8000) / 5.0) * 8000).astype(np.int16)
    (sounds / "agent-pass.g722").write_bytes(G722.G722(16000, 64000).encode(pcm))
    roots = dict(packages) | {"asterisk-g722": (files, {"asterisk-core-sounds-en-g722": "1"})}
    entries = build_manifest(roots)
    variant = [e for e in entries if e.source == "asterisk-g722"]
    assert [e.id for e in variant] == ["asterisk-g722/agent-pass"]
    assert sf.info(variant[0].audio_filepath).samplerate == 16000
    assert variant[0].duration == pytest.approx(0.5)
    tallies = score(entries, ["" for _ in entries])  # every reference word deleted
    assert tallies["asterisk-g722"].words.ref_len == len(variant[0].text.split())
    assert tallies["overall"].words.ref_len == sum(
        len(e.text.split()) for e in entries if e.source != "asterisk-g722"
    )
    assert tallies["overall, wideband"].words.ref_len == sum(
        len(e.text.split()) for e in entries if e.source != "asterisk"
    )
