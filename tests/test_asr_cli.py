"""`speechrt transcribe` and `speechrt eval` end to end with a tiny converted model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from dle_jasper import speechlike, talkative_model
from speechrt.asr import ASR
from speechrt.asr.wer import char_errors, word_errors
from speechrt.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("asr_cli")
    torch.save({"state_dict": talkative_model("quartznet").state_dict()}, root / "qn.pt")
    assert main(["convert", str(root / "qn.pt"), str(root / "qn")]) == 0
    return root / "qn"


@pytest.fixture(scope="module")
def asr(model_dir: Path) -> ASR:
    return ASR(model_dir)


def test_transcribe_lines_json_and_bad_file(
    model_dir: Path, asr: ASR, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    files = []
    for i, sec in enumerate((1.0, 2.0)):
        files.append(tmp_path / f"u{i}.wav")
        sf.write(files[-1], speechlike(sec, 40 + i), 16000, subtype="FLOAT")
    want = asr.transcribe([str(f) for f in files])
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF....WAVEfmt garbage")
    assert (
        main(["transcribe", str(files[0]), str(bad), str(files[1]), "--model", str(model_dir)]) == 2
    )
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{f}\t{t.text}" for f, t in zip(files, want, strict=True)]
    assert err.count("\n") == 1 and "bad.wav" in err and "Traceback" not in err
    assert main(["transcribe", *map(str, files), "--model", str(model_dir), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["file"] for r in rows] == [str(f) for f in files]
    assert [r["text"] for r in rows] == [t.text for t in want]
    assert rows[1]["duration"] == 2.0 and rows[1]["rtf"] > 0
    assert rows[1]["words"] == [w.to_dict() for w in want[1].words]


def test_missing_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["transcribe", "x.wav", "--model", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("speechrt transcribe: error:")


def _expected(asr: ASR, items: list[tuple[str, np.ndarray | None, str]]) -> tuple[int, int]:
    hyps = [asr.transcribe([a])[0].text if a is not None else "" for _, a, _ in items]
    words = sum(word_errors(r, h).errors for (_, _, r), h in zip(items, hyps, strict=True))
    chars = sum(char_errors(r, h).errors for (_, _, r), h in zip(items, hyps, strict=True))
    return words, chars


def test_eval_librispeech_dir(
    model_dir: Path, asr: ASR, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chapter = tmp_path / "ls" / "19" / "198"
    chapter.mkdir(parents=True)
    a0, a1 = speechlike(1.5, 50), speechlike(1.0, 51)
    sf.write(chapter / "19-198-0000.flac", a0, 16000, subtype="PCM_24")
    sf.write(chapter / "19-198-0001.flac", a1, 16000, subtype="PCM_24")
    first = asr.transcribe([chapter / "19-198-0000.flac"])[0].text
    lines = [f"19-198-0000 {first.upper()}", "19-198-0001 HELLO, WORLD", "19-198-0002 GONE FILE"]
    (chapter / "19-198.trans.txt").write_text("\n".join(lines) + "\n")
    out_csv = tmp_path / "out.csv"
    code = main(["eval", "--manifest", str(tmp_path / "ls"), "--model", str(model_dir),
                 "--csv", str(out_csv)])  # fmt: skip
    assert code == 2  # one utterance's audio is missing
    out, err = capsys.readouterr()
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["id"] for r in rows] == ["19-198-0000", "19-198-0001", "19-198-0002"]
    assert rows[0]["wer"] == "0.0000" and rows[0]["hypothesis"] == first
    assert rows[2]["error"] and rows[2]["hypothesis"] == "" and "19-198-0002" in err
    ref_words = len(first.split()) + 2 + 2
    hyp1 = asr.transcribe([sf.read(chapter / "19-198-0001.flac", dtype="float32")[0]])[0].text
    errors = word_errors("hello world", hyp1).errors + 2
    summary = out.strip().splitlines()[-1]
    assert summary.startswith(f"WER {100 * errors / ref_words:.2f}% ({errors}/{ref_words} words)")
    assert "3 utterances" in summary and "1 unreadable" in summary


def test_eval_jsonl_manifest(
    model_dir: Path, asr: ASR, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "wavs").mkdir()
    items = []
    for i, sec in enumerate((0.8, 1.3, 2.2)):
        audio = speechlike(sec, 60 + i)
        sf.write(tmp_path / "wavs" / f"{i}.wav", audio, 16000, subtype="FLOAT")
        items.append((f"wavs/{i}.wav", audio, f"Ref number {i}'s text!"))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"audio_filepath": p, "duration": 1.0, "text": t}) + "\n"
            for p, _, t in items
        )  # fmt: skip
    )
    assert main(["eval", "--manifest", str(manifest), "--model", str(model_dir)]) == 0
    words, chars = _expected(asr, items)
    n_words = sum(len(t.split()) for _, _, t in items)
    assert f"({words}/{n_words} words)" in capsys.readouterr().out
    assert chars > 0


def test_eval_bad_manifest(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "m.jsonl").write_text('{"text": "no audio path"}\n')
    assert main(["eval", "--manifest", str(tmp_path / "m.jsonl"), "--model", str(model_dir)]) == 2
    assert main(["eval", "--manifest", str(tmp_path / "nope"), "--model", str(model_dir)]) == 2
    (tmp_path / "emptydir").mkdir()
    assert main(["eval", "--manifest", str(tmp_path / "emptydir"), "--model", str(model_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "Traceback" not in err


def test_eval_a_parakeet(tiny_parakeet, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """References equal to the transducer's own transcripts: no errors; its CTC head
    (--decoder ctc) reads the same audio otherwise."""
    from parakeet_models import sound

    model = tiny_parakeet["tdt_ctc"]
    asr = ASR(model)
    lines = []
    for i in range(2):
        audio = sound(1.5 + i, seed=20 + i)
        sf.write(tmp_path / f"{i}.wav", audio, 16000, subtype="FLOAT")
        text = asr.transcribe([audio])[0].text
        lines.append(json.dumps({"audio_filepath": f"{i}.wav", "text": text}) + "\n")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(lines))
    assert main(["eval", "--manifest", str(manifest), "--model", str(model)]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("WER 0.00% (0/") and "2 utterances" in summary
    args = ["eval", "--manifest", str(manifest), "--model", str(model), "--decoder", "ctc"]
    assert main(args) == 0
    assert not capsys.readouterr().out.strip().splitlines()[-1].startswith("WER 0.00%")
