"""The recogniser with a language model beside it: beam search by default, greedy on request,
the CLI flags, bad LM files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from dle_jasper import speechlike, talkative_model
from speechrt.asr import ASR
from speechrt.asr.beam import beam_tokens, lm_word
from speechrt.asr.ctc import tokens_to_words
from speechrt.cli import main
from speechrt.errors import SpeechRTError
from speechrt_train.ngram import build_lm

pytestmark = pytest.mark.usefixtures("one_thread")

SECONDS = (1.5, 2.5, 1.0)


@pytest.fixture(scope="module")
def audios() -> list[np.ndarray]:
    return [speechlike(s, 70 + i) for i, s in enumerate(SECONDS)]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory, audios: list[np.ndarray]) -> dict[str, Path]:
    """plain: a converted tiny model; with_lm: the same plus an LM made of words near what it
    says greedily (their first letters changed), so the search has real choices to make."""
    root = tmp_path_factory.mktemp("asr_lm")
    torch.save({"state_dict": talkative_model("quartznet").state_dict()}, root / "qn.pt")
    assert main(["convert", str(root / "qn.pt"), str(root / "plain")]) == 0
    said = [t.text for t in ASR(root / "plain").transcribe(audios)]
    near = [" ".join("e" + w[1:] for w in s.split()) for s in said]
    shutil.copytree(root / "plain", root / "with_lm")
    build_lm([*near, "the cat sat"], decoding={"beam_size": 8, "alpha": 0.5}).save(root / "with_lm")
    return {"plain": root / "plain", "with_lm": root / "with_lm"}


def test_lm_beside_the_model_means_beam_search(dirs: dict[str, Path], audios: list) -> None:
    asr = ASR(dirs["with_lm"], vad=False)  # one window per item, as segments() cuts it
    assert asr.decoder == "beam" and asr.beam_options is not None and asr.lm is not None
    assert asr.beam_options.beam_size == 8 and asr.beam_options.alpha == 0.5  # lm.json's
    got = asr.transcribe(audios)
    for audio, t in zip(audios, got, strict=True):
        segs = asr.segments(0, audio)
        lp, n = asr.log_probs(segs)
        tokens = beam_tokens(lp[0, : int(n[0])].numpy(), asr.labels, asr.lm, asr.beam_options)
        want = tokens_to_words(
            tokens, asr.labels, asr.frame_duration, clip=(0.0, audio.size / 16000)
        )
        assert t.text == want.text and tuple(t.words) == want.words
        for a, b in zip(t.words, t.words[1:], strict=False):
            assert 0 <= a.start <= a.end <= b.start <= b.end <= audio.size / 16000
    plain = ASR(dirs["plain"])
    assert plain.decoder == "greedy"
    greedy = ASR(dirs["with_lm"], decoder="greedy")
    assert greedy.decoder == "greedy" and greedy.lm is None
    assert [t.to_dict() | {"rtf": 0} for t in greedy.transcribe(audios)] == [
        t.to_dict() | {"rtf": 0} for t in plain.transcribe(audios)
    ]
    assert [t.text for t in got] != [t.text for t in plain.transcribe(audios)]  # the LM acts


def test_beam_is_batch_invariant_and_windows_keep_time(dirs: dict[str, Path], audios: list) -> None:
    asr = ASR(dirs["with_lm"])
    together = asr.transcribe(audios, batch_size=3)
    alone = [asr.transcribe([a], seeds=[i])[0] for i, a in enumerate(audios)]
    assert [t.text for t in together] == [t.text for t in alone]
    assert [t.words for t in together] == [t.words for t in alone]
    long = np.concatenate(audios)
    windowed = ASR(dirs["with_lm"], window=2.0, overlap=0.5).transcribe([long])[0]
    starts = [w.start for w in windowed.words]
    assert windowed.words and starts == sorted(starts) and windowed.words[-1].end <= 5.0


def test_overrides_and_wrong_combinations(dirs: dict[str, Path]) -> None:
    asr = ASR(dirs["plain"], lm=dirs["with_lm"], beam_size=3, alpha=0.2, beta=1.0)
    assert asr.decoder == "beam" and asr.beam_options is not None
    assert (asr.beam_options.beam_size, asr.beam_options.alpha, asr.beam_options.beta) == (
        3,
        0.2,
        1.0,
    )
    for kwargs, match in [
        ({"decoder": "beam"}, "needs a language model"),
        ({"alpha": 1.0}, "needs a language model"),
        ({"decoder": "greedy", "lm": dirs["with_lm"]}, "takes no LM"),
        ({"decoder": "greedy", "beam_size": 4}, "takes no beam_size"),
        ({"decoder": "viterbi"}, "unknown decoder"),
        ({"lm": dirs["plain"]}, "no lm.json"),
        ({"beam_size": 0, "lm": dirs["with_lm"]}, "beam_size"),
    ]:
        with pytest.raises(SpeechRTError, match=match):
            ASR(dirs["plain"], **kwargs)


def test_cli_decoder_flags(
    dirs: dict[str, Path], audios: list, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    files = []
    for i, a in enumerate(audios[:2]):
        files.append(str(tmp_path / f"u{i}.wav"))
        sf.write(files[-1], a, 16000, subtype="FLOAT")
    outputs = {}
    for name, args in [
        ("plain", ["--model", str(dirs["plain"])]),
        ("beam", ["--model", str(dirs["with_lm"])]),
        ("greedy", ["--model", str(dirs["with_lm"]), "--decoder", "greedy"]),
        ("lm", ["--model", str(dirs["plain"]), "--lm", str(dirs["with_lm"])]),
        ("beam1", ["--model", str(dirs["with_lm"]), "--beam-size", "1", "--alpha", "0"]),
    ]:
        assert main(["transcribe", *files, *args]) == 0, name
        outputs[name] = capsys.readouterr().out
    assert outputs["greedy"] == outputs["plain"] and outputs["lm"] == outputs["beam"]
    assert outputs["beam"] != outputs["plain"]
    want = ASR(dirs["with_lm"], beam_size=1, alpha=0.0).transcribe(files)
    assert outputs["beam1"].splitlines() == [
        f"{f}\t{t.text}" for f, t in zip(files, want, strict=True)
    ]
    assert main(["transcribe", files[0], "--model", str(dirs["plain"]), "--decoder", "beam"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "language model" in err
    assert (
        main(["transcribe", files[0], "--model", str(dirs["with_lm"]), "--beam-size", "100000"])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        err
        == "speechrt transcribe: error: beam_size must be an integer within [1, 1024], got 100000\n"
    )


def test_corrupt_lm_is_a_one_line_error(
    dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(dirs["with_lm"], bad)
    info = json.loads((bad / "lm.json").read_text())
    (bad / "lm.json").write_text(json.dumps({**info, "decoding": {"beam": 3}}))
    with pytest.raises(SpeechRTError, match="unknown beam options"):
        ASR(bad)
    (bad / "lm.json").write_text("{not json")
    with pytest.raises(SpeechRTError, match="corrupt language model") as e:
        ASR(bad)
    assert "\n" not in str(e.value)
    wav = tmp_path / "a.wav"
    sf.write(wav, speechlike(1.0, 5), 16000)
    assert main(["transcribe", str(wav), "--model", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("speechrt transcribe: error:")
    assert ASR(bad, decoder="greedy").decoder == "greedy"  # greedy never reads the LM


def test_server_decodes_as_it_was_started(
    dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from speechrt.serving import ServeConfig, Server

    config = ServeConfig(components=False)
    beam = Server.load(asr=dirs["with_lm"], device="cpu", config=config)
    greedy = Server.load(
        asr=dirs["with_lm"], device="cpu", config=config, decoding={"decoder": "greedy"}
    )
    assert beam.asr is not None and greedy.asr is not None
    assert (beam.asr.asr.decoder, greedy.asr.asr.decoder) == ("beam", "greedy")
    voice = ["--acoustic", str(tmp_path / "a"), "--vocoder", str(tmp_path / "v")]
    assert main(["serve", "--port", "0", *voice, "--lm", str(dirs["with_lm"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need a recogniser" in err


def test_a_parakeet_ctc_model_searches_its_pieces_with_a_word_lm(
    tiny_parakeet: dict[str, Path], tmp_path: Path
) -> None:
    """A converted Parakeet CTC model (SentencePiece pieces, some with capitals and
    punctuation) with an LM beside it decodes by beam search: its words and times are those of
    the search's tokens, and an LM of words near what it says greedily changes its text."""
    from parakeet_models import sound

    waves = [sound(2.0, seed=s) for s in (3, 4)]
    plain = ASR(tiny_parakeet["ctc"], backend="eager", vad=False)
    said = [t.text for t in plain.transcribe(waves)]
    assert all(said)
    words = [[lm_word(w) for w in s.split() if lm_word(w)] for s in said]  # as a plain LM holds
    near = [" ".join("e" + w[1:] for w in ws) for ws in words]
    model = tmp_path / "ctc"
    shutil.copytree(tiny_parakeet["ctc"], model)
    build_lm(near, decoding={"beam_size": 8, "alpha": 1.0}).save(model)
    asr = ASR(model, backend="eager", vad=False)
    assert asr.decoder == "beam"
    got = asr.transcribe(waves)
    for audio, t in zip(waves, got, strict=True):
        lp, n = asr.log_probs(asr.segments(0, audio))
        tokens = beam_tokens(lp[0, : int(n[0])].numpy(), asr.labels, asr.lm, asr.beam_options)
        want = tokens_to_words(
            tokens, asr.labels, asr.frame_duration, clip=(0.0, audio.size / 16000)
        )
        assert t.text == want.text and tuple(t.words) == want.words
    assert [t.text for t in got] != said  # the LM acts


def test_a_hybrids_ctc_head_takes_the_lm_and_its_transducer_leaves_it(
    tiny_parakeet: dict[str, Path], tmp_path: Path
) -> None:
    """A Parakeet TDT-CTC with an LM beside it: its transducer head decodes greedily (the LM
    unused, and said so by `decoder`), its CTC head (decoder="ctc") by beam search with it."""
    from parakeet_models import sound

    model = tmp_path / "hybrid"
    shutil.copytree(tiny_parakeet["tdt_ctc"], model)
    waves = [sound(2.0, seed=3)]
    greedy_ctc = ASR(model, backend="eager", vad=False, decoder="ctc").transcribe(waves)
    words = [lm_word(w) for w in greedy_ctc[0].text.split() if lm_word(w)]
    build_lm([" ".join("e" + w[1:] for w in words)], decoding={"alpha": 1.0}).save(model)
    transducer = ASR(model, backend="eager", vad=False)
    assert transducer.transducer and transducer.decoder == "greedy" and transducer.lm is None
    ctc = ASR(model, backend="eager", vad=False, decoder="ctc")
    assert not ctc.transducer and ctc.decoder == "beam" and ctc.lm is not None
    assert ctc.transcribe(waves)[0].text != greedy_ctc[0].text  # the LM acts
    for kwargs in ({"decoder": "beam"}, {"lm": model}, {"alpha": 0.5}):
        with pytest.raises(SpeechRTError, match="transducer decodes greedily"):
            ASR(model, backend="eager", **kwargs)
