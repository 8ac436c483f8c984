"""speechrt_train.pick: the rule, and one run over two candidates with stand-in readers."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model
from speechrt_train import pick
from speechrt_train.teachers import Utterance


def test_the_rule_keeps_the_round_trip_and_breaks_ties_early():
    rows = [
        {"asr": "shipped", "held_out": 0.30, "round_trip": 0.09},
        {"asr": "better", "held_out": 0.25, "round_trip": 0.10},
        {"asr": "same", "held_out": 0.25, "round_trip": 0.05},
        {"asr": "best but breaks the test", "held_out": 0.20, "round_trip": 0.11},
    ]
    assert pick.pick(rows)["asr"] == "better"
    assert pick.pick(rows[3:]) is None
    # within the margin of the shipped model: it stays; beyond it: the better one
    close = [{"asr": "shipped", "held_out": 0.1598, "round_trip": 0.09}]
    close.append({"asr": "a hair better", "held_out": 0.1592, "round_trip": 0.09})
    assert pick.pick(close)["asr"] == "shipped"
    assert pick.pick(close, margin=0.0)["asr"] == "a hair better"
    close.append({"asr": "clearly better", "held_out": 0.1550, "round_trip": 0.09})
    assert pick.pick(close)["asr"] == "clearly better"
    # the margin only ever keeps the shipped model, never another candidate
    broken = [{"asr": "shipped, over the bound", "held_out": 0.30, "round_trip": 0.11}]
    broken += [{"asr": "second", "held_out": 0.1601, "round_trip": 0.09}, close[1]]
    assert pick.pick(broken)["asr"] == "a hair better"


@pytest.mark.skipif(default_model(ASR_MODEL) is None, reason="no default recogniser bundled")
def test_pick_hears_every_held_out_voice_with_every_candidate(monkeypatch, tmp_path):
    read: list[str] = []

    class Reader:
        def __init__(self, prefix):
            pass

        def synthesize(self, voice, spoken):
            read.append(voice)
            rng = np.random.default_rng(len(read))
            return [Utterance(0.02 * rng.standard_normal(8000).astype(np.float32), 16000)] * 3

    sets = {"dev": ["one two three", "a fourth", "the fifth"], "ci_40": ["Hello there."]}
    monkeypatch.setattr(pick, "sentence_sets", lambda root, limit: sets)
    monkeypatch.setattr(pick, "Teachers", Reader)
    asr = str(default_model(ASR_MODEL))
    out = tmp_path / "pick.json"
    voice = str(default_model(VOICE_ACOUSTIC).parent)
    cache = tmp_path / "readings.npz"
    argv = ["pick", asr, asr, "--voice", voice, "--out", str(out), "--readings", str(cache)]
    monkeypatch.setattr(sys, "argv", argv)
    pick.main()
    result = json.loads(out.read_text())
    assert cache.exists()
    assert read == ["rms", "joe-x"] and result["voices"] == ["rms", "joe-x"]
    first, second = result["candidates"]
    assert first["asr"] == second["asr"] == asr
    assert first["held_out"] == pytest.approx((first["rms"] + first["joe-x"]) / 2, abs=1e-4)
    assert first["round_trip"] >= 0.0 and first["held_out"] >= 0.0
    # the same recogniser twice: the same figures, and the earlier one wins any tie
    assert first == second
    assert result["pick"] == (asr if first["round_trip"] <= 0.10 else None)
    # --readings again: the same audio from the file, no voice reads, the same figures
    monkeypatch.setattr(pick, "Teachers", None)
    monkeypatch.setattr(pick, "TTS", None)
    pick.main()
    again = json.loads(out.read_text())
    assert again == result and read == ["rms", "joe-x"]
    # --recorded: a recorded voice's held-out items join the held-out voices; its others do not
    shard = tmp_path / "actors.pt"
    torch.save(_recorded_shard(heldout=[True, False, True]), shard)
    monkeypatch.setattr(sys, "argv", argv + ["--recorded", str(shard)])
    pick.main()
    with_actors = json.loads(out.read_text())
    assert with_actors["voices"] == ["rms", "joe-x", "actors"]
    assert with_actors["items"] == {"rms": 3, "joe-x": 3, "actors": 2}
    first = with_actors["candidates"][0]
    mean = (first["rms"] + first["joe-x"] + first["actors"]) / 3
    assert first["held_out"] == pytest.approx(mean, abs=1e-4)
    assert {k: first[k] for k in ("rms", "joe-x")} == {
        k: result["candidates"][0][k] for k in ("rms", "joe-x")
    }
    torch.save(_recorded_shard(heldout=[False, False, False]), shard)
    with pytest.raises(SystemExit, match="no held-out items"):
        pick.main()


def _recorded_shard(heldout: list[bool]) -> dict:
    """A `people` corpus shard of len(heldout) clips of 0.3 s of noise."""
    rng = np.random.default_rng(0)
    clips = [(0.05 * rng.standard_normal(4800) * 32767).astype(np.int16) for _ in heldout]
    offsets = np.cumsum([0] + [len(c) for c in clips])
    return {
        "voice": "actors",
        "sample_rate": 16000,
        "keys": [f"clip{i}" for i in range(len(heldout))],
        "texts": ["Hello there."] * len(heldout),
        "spoken": ["hello there"] * len(heldout),
        "heldout": heldout,
        "codec": [""] * len(heldout),
        "audio": torch.from_numpy(np.concatenate(clips)),
        "audio_offsets": torch.from_numpy(offsets),
    }
