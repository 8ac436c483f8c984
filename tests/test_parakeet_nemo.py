"""Parakeet against NeMo itself: tiny seeded NeMo models saved as .nemo, with NeMo 3.0.0's own
outputs on three WAV files recorded beside them (tests/data/nemo/, made by
scripts/make_nemo_refs.py in a separate environment; NeMo never runs here).

For every reference model: `speechrt convert X.nemo DIR`, then features, encoder output and
CTC log-probs within 1e-4 of NeMo's (float32), and tokens, text and word timestamps identical,
on eager and onnx (and cuda on a GPU), through the Python API and `speechrt transcribe`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from speechrt.cli import main

DATA = Path(__file__).parent / "data" / "nemo"
REFS = sorted(p.stem for p in DATA.glob("*.json")) if DATA.is_dir() else []
TOL = 1e-4  # float32 encoder and log-probs: max abs error over max(1, max |reference|)


def reference(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def arrays(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as z:
        return dict(z)


@pytest.fixture(scope="module", params=REFS)
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(reference name, its JSON, the converted and exported model directory)"""
    name = request.param
    ref = reference(name)
    out = tmp_path_factory.mktemp(name) / "model"
    assert main(["convert", str(DATA / ref["nemo"]), str(out)]) == 0
    assert main(["export", str(out)]) == 0
    return name, ref, out


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return float(np.abs(got - want).max()) <= TOL * max(1.0, float(np.abs(want).max()))


def heads(ref: dict[str, Any]) -> dict[str, str]:
    """{result key in the reference: speechrt decoder}: the model's own head, or a hybrid's
    transducer and CTC heads."""
    if any("transducer" in f for f in ref["files"].values()):
        return {"transducer": "auto", "ctc": "ctc"}
    return {"result": "auto"}


def words_of(result: dict[str, Any]) -> list[tuple[str, float, float]]:
    return [(w["word"], w["start"], w["end"]) for w in result["timestamps"]["word"]]


def same_words(got: list[tuple[str, float, float]], want: list[tuple[str, float, float]]) -> bool:
    return len(got) == len(want) and all(
        g[0] == w[0] and abs(g[1] - w[1]) < 1e-6 and abs(g[2] - w[2]) < 1e-6
        for g, w in zip(got, want, strict=True)
    )


def test_there_are_references() -> None:
    assert len(REFS) >= 1


@pytest.mark.parametrize("backend", ["eager", "onnx"])
def test_features_match_nemo(converted: tuple, backend: str) -> None:
    """NeMo's preprocessor output (all frames, the zeroed last one too) against speechrt's
    torch (eager) and numpy (onnx) features."""
    from speechrt.asr import ASR

    name, ref, model_dir = converted
    asr = ASR(model_dir, backend=backend)
    want = arrays(ref["features"].removesuffix(".npz"))
    for file, fr in ref["files"].items():
        seg = asr.segments(0, asr.load_audio(DATA / fr["wav"]))
        feats, lengths, _ = asr.featurize(seg)
        got = np.asarray(feats[0] if backend == "onnx" else feats[0].numpy())
        assert got.shape == want[file].shape and int(lengths[0]) == fr["feature_length"]
        assert close(got, want[file]), (name, file)


def test_encoder_and_log_probs_match_nemo(converted: tuple) -> None:
    from speechrt.asr import ASR

    name, ref, model_dir = converted
    asr = ASR(model_dir, backend="eager", decoder="ctc" if "ctc" in heads(ref) else "auto")
    got_any = False
    want = arrays(name)
    for file, fr in ref["files"].items():
        audio = asr.load_audio(DATA / fr["wav"])
        assert audio.shape[0] == fr["num_samples"]
        seg = asr.segments(0, audio)
        feats, lengths, _ = asr.featurize(seg)
        assert int(lengths[0]) == fr["feature_length"]
        with torch.inference_mode():
            enc, n = asr.model.encoder(feats, lengths)
        assert int(n[0]) == fr["encoded_length"]
        encoded = enc[0, : int(n[0])].T.numpy()  # (D, T') as NeMo's encoder gives it
        assert close(encoded, want[f"{file}/encoded"]), name
        if f"{file}/log_probs" in want:
            with torch.inference_mode():
                lp = asr.model.ctc_log_probs(enc)[0, : int(n[0])].numpy()
            assert close(lp, want[f"{file}/log_probs"]), name
            got_any = True
    assert got_any or asr.model.dims.transducer


def test_batched_encoder_matches_nemo_batch(converted: tuple) -> None:
    """NeMo's padded batch of the three files against speechrt's batch, valid frames only."""
    from speechrt.asr import ASR

    name, ref, model_dir = converted
    asr = ASR(model_dir, backend="eager")
    want = arrays(name)
    segs = [asr.segments(i, asr.load_audio(DATA / ref["files"][f]["wav"]))[0]
            for i, f in enumerate(ref["batch"]["files"])]  # fmt: skip
    feats, lengths, _ = asr.featurize(segs)
    with torch.inference_mode():
        enc, n = asr.model.encoder(feats, lengths)
    assert n.tolist() == want["batch/encoded_length"].tolist()
    for i, k in enumerate(n.tolist()):
        assert close(enc[i, :k].T.numpy(), want["batch/encoded"][i, :, :k]), name


@pytest.mark.parametrize("backend", ["eager", "onnx"])
def test_transcripts_and_timestamps_equal_nemo(converted: tuple, backend: str) -> None:
    from speechrt.asr import ASR

    name, ref, model_dir = converted
    for key, decoder in heads(ref).items():
        asr = ASR(model_dir, backend=backend, decoder=decoder)
        for fr in ref["files"].values():
            result = fr[key]
            t = asr.transcribe([DATA / fr["wav"]])[0]
            assert t.text == result["text"], (name, key, backend)
            got = [(w.word, w.start, w.end) for w in t.words]
            assert same_words(got, words_of(result)), (name, key, got, words_of(result))


def test_a_word_lm_beside_a_converted_ctc_model_means_beam_search(
    converted: tuple, tmp_path: Path
) -> None:
    """A .nemo CTC model with an LM beside it searches its pieces (speechrt.asr.beam) and words
    its tokens by NeMo's rules, inside the audio. (Its text is the search's, not NeMo's greedy.)"""
    import shutil

    from speechrt.asr import ASR
    from speechrt_train.ngram import build_lm

    name, ref, model_dir = converted
    if heads(ref) != {"result": "auto"} or "ctc" not in name:
        pytest.skip("a CTC model")
    model = tmp_path / "with_lm"
    shutil.copytree(model_dir, model)
    build_lm([fr["result"]["text"] for fr in ref["files"].values()]).save(model)
    asr = ASR(model, backend="eager")
    assert asr.decoder == "beam"
    for fr in ref["files"].values():
        audio = asr.load_audio(DATA / fr["wav"])
        t = asr.transcribe([audio])[0]
        assert t.words and t.text
        for a, b in zip(t.words, t.words[1:], strict=False):
            assert 0 <= a.start <= a.end <= b.start <= b.end <= audio.size / asr.sample_rate


def test_cli_prints_nemo_text(converted: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    name, ref, model_dir = converted
    for key, decoder in heads(ref).items():
        wavs = [str(DATA / fr["wav"]) for fr in ref["files"].values()]
        assert main(["transcribe", *wavs, "--model", str(model_dir), "--decoder", decoder,
                     "--json"]) == 0  # fmt: skip
        lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
        assert [x["text"] for x in lines] == [fr[key]["text"] for fr in ref["files"].values()]


@pytest.mark.requires_cuda
def test_cuda_transcripts_equal_nemo(converted: tuple) -> None:
    """The cuda runner (fp16 encoder, the device loop) gives NeMo's text on the references.
    fp16, not bf16: the references' decisions win by >= 2.2e-3 of a row's largest logit, and
    on an H200 bf16 flipped 4 of 15 transcripts (tdt, ctc, hybrid) where fp16 kept all."""
    from speechrt.asr import ASR

    name, ref, model_dir = converted
    for key, decoder in heads(ref).items():
        asr = ASR(model_dir, device="cuda", backend="cuda", precision="fp16", decoder=decoder)
        for fr in ref["files"].values():
            audio = asr.load_audio(DATA / fr["wav"])
            assert asr.transcribe([audio])[0].text == fr[key]["text"], (name, key)
