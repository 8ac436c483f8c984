"""Parakeet's streaming recogniser (speechrt.asr.chunked) on tiny random models: decoding carried
across windows takes the decisions of one pass, committed text only grows, the final text of
audio within one window is offline recognition's, longer audio stays close with bounded memory,
and the CLI streams on eager and onnx."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parakeet_models import sound
from speechrt.asr import ASR
from speechrt.asr.chunked import ChunkedRecognizer, recognizer
from speechrt.asr.ctc import collapse
from speechrt.asr.streaming import Partial
from speechrt.asr.transducer import greedy, resume, start
from speechrt.asr.wer import char_errors

HOP = 160
FRAME = 8 * HOP  # samples per output frame


def stream(rec: ChunkedRecognizer, audio: np.ndarray, piece: int = 1600) -> list[Partial]:
    partials = []
    for i in range(0, audio.size, piece):
        p = rec.push(audio[i : i + piece])
        if p is not None:
            partials.append(p)
    return partials


@pytest.mark.parametrize("head", ["tdt", "rnnt"])
def test_resume_in_pieces_takes_the_decisions_of_one_pass(head: str) -> None:
    """Frames decoded in pieces, each from the cursor the last one left, give greedy's tokens
    over all of them at once (two items of different lengths; TDT skips cross the cuts)."""
    from parakeet_models import steps_of, talkative

    durations = (0, 1, 2, 3, 4) if head == "tdt" else ()
    model = talkative("parakeet_transducer", head=head, durations=durations)
    predict, joint, spec = steps_of(model)
    rng = np.random.default_rng(3)
    f = (3 * rng.standard_normal((2, 50, model.dims.joint_hidden))).astype(np.float32)
    lengths = np.array([50, 33])
    want = greedy(f, lengths, predict, joint, spec)
    assert sum(len(w) for w in want) > 20
    cuts = [0, 7, 8, 20, 41, 50]
    got: list[list[tuple[int, int, int]]] = [[], []]
    cursor = start(2, predict, spec)
    for a, b in zip(cuts, cuts[1:], strict=False):
        n = np.minimum(lengths - a, b - a)  # <= 0: an item already over
        tokens, cursor = resume(f[:, a:b], n, predict, joint, spec, cursor)
        for item, mine in zip(got, tokens, strict=True):
            item += [(lab, t + a, d) for lab, t, d in mine]
        cursor = cursor.shifted(b - a)
    assert got == want


@pytest.mark.parametrize("decoder", ["auto", "ctc"])
def test_windows_carry_the_decoding_state_exactly(tiny_parakeet, decoder: str) -> None:
    """Windows that cut the frames anywhere (1 s left, 0.5 s right context, 6 s): with exact
    frames (a stand-in encoder that returns each window's slice of fixed frames) the committed
    tokens are one greedy pass's over all frames, the transducer's state (and CTC's last
    argmax) carried from window to window."""
    asr = ASR(tiny_parakeet["tdt_ctc"], decoder=decoder)
    audio = sound(6.0)
    n_frames = -(-(audio.size // HOP) // 8)
    rng = np.random.default_rng(4)
    width = 16 if asr.transducer else 41  # joint_hidden, or vocabulary + blank
    frames = (3 * rng.standard_normal((n_frames, width))).astype(np.float32)
    windows = []

    def encode(first: int, window: np.ndarray) -> tuple[np.ndarray, int]:
        n = -(-(window.size // HOP) // 8)
        windows.append((first, n))
        return frames[first : first + n], n

    rec = ChunkedRecognizer(asr, left=1.0, right=0.5, encode=encode)
    partials = stream(rec, audio)
    final = rec.finish(final_pass=False)
    assert len(partials) == 12 and not final.offline
    assert windows[-1][0] > 0 and len({first for first, _ in windows}) > 5  # windows slide
    if asr.transducer:
        steps = asr.steps
        (want,) = steps.decode(frames[None], np.array([n_frames]))
    else:
        want = collapse(frames.argmax(-1), 40)
    assert len(want) > 20 and rec.tokens == want
    committed = [p.committed for p in partials] + [final.text]
    assert all(b.startswith(a) for a, b in zip(committed, committed[1:], strict=False))
    assert all(p.text.startswith(p.committed) for p in partials)


@pytest.mark.parametrize(
    ("head", "decoder"), [("tdt_ctc", "auto"), ("tdt_ctc", "ctc"), ("ctc", "auto")]
)
def test_final_of_audio_within_one_window_is_offline(tiny_parakeet, head: str, decoder: str):
    """3 s, within the left context: a partial every 0.5 s, growing committed text behind
    the 2 s lookahead, and the streaming path's final text and words are offline's."""
    asr = ASR(tiny_parakeet[head], decoder=decoder)
    audio = sound(3.0, seed=1)
    (offline,) = asr.transcribe([audio])
    rec = recognizer(asr)
    assert isinstance(rec, ChunkedRecognizer)
    partials = stream(rec, audio)
    assert [p.seconds for p in partials] == pytest.approx([0.5 * (i + 1) for i in range(6)])
    assert partials[0].committed == "" and partials[-1].committed  # 1 s committed by 3 s
    assert all(p.text.startswith(p.committed) for p in partials)
    final = rec.finish(final_pass=False)
    assert len(offline.words) >= 5
    assert (final.text, final.words) == (offline.text, offline.words)
    assert partials[-1].text == offline.text  # the last partial saw all of the audio too
    again = recognizer(asr)
    stream(again, audio)
    final = again.finish()  # with the final pass: offline, as for every recogniser
    assert final.offline and final.text == offline.text


def test_long_stream_stays_close_with_bounded_audio(tiny_parakeet) -> None:
    """8 s in windows of 2 s left and 1 s right context: the committed text stays within a
    fifth of offline's characters (random weights: real models are closer), and the audio held
    stays within one window."""
    asr = ASR(tiny_parakeet["tdt_ctc"])
    audio = sound(8.0, seed=2)
    (offline,) = asr.transcribe([audio])
    rec = ChunkedRecognizer(asr, left=2.0, right=1.0)
    held = []
    for i in range(0, audio.size, 1600):
        rec.push(audio[i : i + 1600])
        held.append(rec.audio.size)
    final = rec.finish(final_pass=False)
    assert not final.offline and rec.base > 0
    assert char_errors(offline.text, final.text).errors <= 0.2 * len(offline.text)
    assert max(held) <= (2.0 + 0.5 + 1.0) * 16000 + 2 * FRAME


def test_stream_on_onnx_imports_no_torch(onnx_parakeet: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from parakeet_models import sound\n"
        "from speechrt.asr import ASR\n"
        "from speechrt.asr.chunked import recognizer\n"
        f"asr = ASR({str(onnx_parakeet)!r}, backend='onnx')\n"
        "audio = sound(2.0, seed=1)\n"
        "rec = recognizer(asr)\n"
        "parts = [rec.push(audio[i : i + 1600]) for i in range(0, audio.size, 1600)]\n"
        "assert sum(p is not None for p in parts) == 4\n"
        "final = rec.finish(final_pass=False)\n"
        "assert final.text and final.text == asr.transcribe([audio])[0].text\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    tests = str(Path(__file__).parent)
    env_path = [tests, *sys.path]
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(env_path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr


def test_cli_streams_and_picks_the_ctc_head(
    tiny_parakeet, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`transcribe --stream` prints the offline text; `--decoder ctc` reads the hybrid's CTC
    head (what ASR(decoder="ctc") gives, not the transducer's text)."""
    import soundfile as sf

    from speechrt.cli import main

    model = str(tiny_parakeet["tdt_ctc"])
    path = tmp_path / "a.wav"
    audio = sound(2.0, seed=1)
    sf.write(path, audio, 16000, subtype="FLOAT")
    texts = {}
    for decoder in ("auto", "ctc"):
        args = ["transcribe", str(path), "--model", model, "--decoder", decoder]
        assert main(args) == 0
        offline = capsys.readouterr().out
        assert main([*args, "--stream", "--chunk-ms", "100"]) == 0
        out, err = capsys.readouterr()
        assert out == offline and len(err.splitlines()) == 4  # a partial per 0.5 s
        texts[decoder] = offline.split("\t", 1)[1].strip()
    assert texts["ctc"] == ASR(model, decoder="ctc").transcribe([audio])[0].text
    assert texts["auto"] == ASR(model).transcribe([audio])[0].text != texts["ctc"]


def test_too_short_a_stream_and_a_finished_one_are_errors(tiny_parakeet) -> None:
    from speechrt.errors import SpeechRTError

    rec = recognizer(ASR(tiny_parakeet["ctc"]))
    assert rec.push(np.zeros(100, dtype=np.float32)) is None
    with pytest.raises(SpeechRTError, match="too short"):
        rec.finish()
    rec.push(sound(0.3))
    rec.finish(final_pass=False)
    with pytest.raises(SpeechRTError, match="finished"):
        rec.push(sound(0.1))
