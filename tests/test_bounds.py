"""speechrt.runtime.bounds: FastPitch's frames bounded before its decoder, on onnx, eager and
cuda (its runner run on the CPU, uncompiled: the same code path as on a GPU, without one)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from speechrt.defaults import VOICE_ACOUSTIC, default_model
from speechrt.errors import SpeechRTError
from speechrt.registry import graph
from speechrt.repo import load_component
from speechrt.runtime.bounds import attention_cells, row_groups, stack_rows
from speechrt.runtime.onnx import OnnxRunner, RegulatedOnnxRunner
from speechrt.runtime.stages import make_runner

ACOUSTIC = default_model(VOICE_ACOUSTIC)
bundled = pytest.mark.skipif(ACOUSTIC is None, reason="needs the bundled voice")
LIMIT = 2584  # 30 s of mel frames at 22.05 kHz / hop 256, the server's default


def feeds(lengths: list[int], pace: float = 1.0, width: int | None = None) -> dict:
    """FastPitch's inputs: random symbols, right-padded to `width` (default: the longest)."""
    width = width or max(lengths)
    rng = np.random.default_rng(len(lengths))
    n = np.array(lengths)
    ids = rng.integers(1, 100, (len(n), width)) * (np.arange(width)[None] < n[:, None])
    B = len(n)
    return {
        "ids": ids.astype(np.int64),
        "lengths": n.astype(np.int64),
        "pace": np.full(B, pace, np.float32),
        "pitch_shift": np.zeros(B, np.float32),
        "pitch_scale": np.ones(B, np.float32),
    }


def test_row_groups_keep_each_call_within_the_budget():
    costs = np.array([5, 1, 9, 2, 2])
    assert [g.tolist() for g in row_groups(costs, 100)] == [[0, 1, 2, 3, 4]]  # 5 x 9 fits
    groups = row_groups(costs, 10)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    for g in groups:
        assert len(g) == 1 or len(g) * costs[g].max() <= 10
    assert [g.tolist() for g in row_groups(np.array([30, 40]), 10)] == [[0], [1]]  # alone
    assert attention_cells(3, np.array([0, 4])).tolist() == [9, 25]


def test_stack_rows_restores_the_batch_order_and_pads():
    a = {"y": np.ones((2, 3)), "n": np.array([3, 3])}
    b = {"y": np.full((1, 5), 2.0), "n": np.array([5])}
    out = stack_rows([a, b], [np.array([2, 0]), np.array([1])])
    assert out["n"].tolist() == [3, 5, 3]
    np.testing.assert_array_equal(out["y"][1], [2, 2, 2, 2, 2])
    np.testing.assert_array_equal(out["y"][0], [1, 1, 1, 0, 0])


@bundled
def test_onnx_fastpitch_refuses_long_items_before_its_decoder():
    runner = make_runner("fastpitch", None, _info(), "onnx", "cpu", model_dir=ACOUSTIC, numpy=True)
    assert isinstance(runner, RegulatedOnnxRunner)
    assert runner.max_frames == graph("fastpitch").regulated.max_frames  # the model's own cap
    runner.max_frames = LIMIT
    with pytest.raises(SpeechRTError, match=r"would produce \d+ mel frames \(limit 2584\)"):
        runner.run(feeds([320], pace=0.1))
    # the durations session counts the frames the graph decodes
    f = feeds([40, 300, 120])
    runner.max_frames = None
    whole = runner.run(f)
    assert runner.frames(f, LIMIT * LIMIT).tolist() == whole["mel_lengths"].tolist()


@bundled
def test_onnx_fastpitch_runs_a_long_batch_in_groups_as_one_call_gives_it():
    """With a limit just over the longest row, two long rows in one call would hold more
    attention scores than one item at the limit: they run alone, the short rows together; the
    valid frames are what one call gives."""
    runner = make_runner("fastpitch", None, _info(), "onnx", "cpu", model_dir=ACOUSTIC, numpy=True)
    f = feeds([300, 60, 290, 4])
    runner.max_frames = None
    whole = runner.run(f)
    runner.max_frames = int(whole["mel_lengths"].max() * 1.05)
    calls: list[int] = []
    plain = OnnxRunner.run

    def counted(self: OnnxRunner, x: dict) -> dict:
        calls.append(len(x["ids"]))
        return plain(self, x)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OnnxRunner, "run", counted)
        grouped = runner.run(f)
    assert sorted(calls) == [1, 1, 2]  # the two long rows alone, the short ones together
    _same_valid_frames(grouped, whole)


def test_eager_fastpitch_decodes_a_long_batch_in_groups(tiny_voice):
    model, info = load_component(tiny_voice[0], "cpu", torch.float32)
    runner = make_runner("fastpitch", model, info, "eager", torch.device("cpu"))
    f = feeds([120, 20, 118, 7], pace=0.2)
    t = {k: torch.from_numpy(v) for k, v in f.items()}
    whole = {k: v.numpy() for k, v in runner.run(t).items()}
    longest = int(whole["mel_lengths"].max())
    runner.max_frames = int(longest * 1.2)  # two of the long rows do not fit in one call
    grouped = {k: v.numpy() for k, v in runner.run(t).items()}
    _same_valid_frames(grouped, whole)
    runner.max_frames = longest - 1
    with pytest.raises(SpeechRTError, match=f"would produce {longest} mel frames"):
        runner.run(t)


def test_cuda_fastpitch_takes_the_servers_bound_and_decodes_in_groups(tiny_voice):
    """The cuda runner kept FastPitch's own 16,384-frame cap: a server now bounds it as it
    bounds eager and onnx (Server's bound_frames), and a long batch decodes in groups of rows,
    each padded to a batch bucket, giving the valid frames one call gives."""
    from speechrt.serving import Limits
    from speechrt.serving.server import bound_frames
    from speechrt.serving.v2models import axis_limits

    model, info = load_component(tiny_voice[0], "cpu", torch.float32)
    runner = make_runner("fastpitch", model, info, "cuda", "cpu", compile_mode=None)
    assert runner.max_frames == graph("fastpitch").regulated.max_frames == 16384
    bound_frames(runner, axis_limits(info, Limits(), 1)["frames"])  # as Server does
    seconds = Limits().max_component_seconds  # of mel frames: 2,584 at 22.05 kHz, hop 256
    assert runner.max_frames == math.ceil(seconds * info.mel.sampling_rate / info.mel.hop_length)

    f = feeds([120, 20, 118, 7], pace=0.2)
    t = {k: torch.from_numpy(v) for k, v in f.items()}
    calls: list[int] = []  # the batch of each decoder call
    decode = runner.compiled["decode"]

    def counted(enc, reps, n):
        calls.append(len(enc))
        return decode(enc, reps, n)

    runner.compiled["decode"] = counted
    whole = {k: v.numpy() for k, v in runner.run(t).items()}
    assert calls == [4]
    longest = int(whole["mel_lengths"].max())
    runner.max_frames = int(longest * 1.2)  # two of the long rows do not fit in one call
    calls.clear()
    grouped = {k: v.numpy() for k, v in runner.run(t).items()}
    assert calls == [2, 1, 1]  # the short rows together, the long ones alone
    _same_valid_frames(grouped, whole)
    runner.max_frames = longest - 1
    calls.clear()
    with pytest.raises(SpeechRTError, match=f"would produce {longest} mel frames"):
        runner.run(t)
    assert calls == []  # refused before the decoder ran


def _info():
    from speechrt.repo import read_info

    return read_info(ACOUSTIC)


def _same_valid_frames(got: dict, want: dict) -> None:
    assert got["mel"].shape == want["mel"].shape
    np.testing.assert_array_equal(got["mel_lengths"], want["mel_lengths"])
    for b, n in enumerate(want["mel_lengths"].tolist()):
        np.testing.assert_allclose(got["mel"][b, :, :n], want["mel"][b, :, :n], atol=1e-4)
    for name in ("durations", "pitch", "energy"):
        if name in want:
            np.testing.assert_allclose(got[name], want[name], atol=1e-4)
