"""Greedy transducer decoding (RNN-T and TDT), batched by label looping, in NumPy.

For each item, from frame t = 0 and the prediction network's output for the start symbol (the
blank, whose embedding is zero):
    scores = joint(f_t, g)         token = argmax over tokens + blank; TDT: skip = durations[argmax
                                   over the duration scores], a blank that would skip 0 skips 1;
                                   RNN-T: a token skips 0 frames, a blank 1
    blank:  t += skip, score again with the same g until a token or the end of the item
    token:  emit (token, t, skip); g, state = predict(token, state); t += skip;
            after `max_symbols` tokens on one frame the frame is forced forward by one
This is NeMo's label-looping greedy decoder (GreedyBatchedRNNTInfer / TDT). Each item's steps
read only its own frames and state, so an item decodes the same alone and in a batch (NeMo's
batched TDT records a token's duration from the batch's last inner step; alone they agree).
Where decoding stands between frames is a `Cursor`: `resume` goes on from one, so a stream's
frames decode window by window as in one pass (speechrt.asr.chunked).

`predict(tokens (B,), h, c) -> (g (B, J), h, c)` and `joint(f (B, J), g (B, J)) -> (B, classes
[+ durations])` are the model's two step graphs: onnxruntime sessions on the onnx runner, the
torch modules on eager. The cuda runner keeps the same loop on the device
(speechrt.runtime.transducer_cuda).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

Predict = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
Joint = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class TransducerSpec:
    """What greedy decoding needs of a model's dims."""

    blank: int  # = vocab size; also the start symbol
    durations: tuple[int, ...]  # TDT skips; () for RNN-T
    max_symbols: int  # tokens on one frame before it is forced forward
    state_shape: tuple[int, int]  # (LSTM layers, hidden)


Token = tuple[int, int, int]  # (label, frame it was scored on, frames skipped after it)


def decide(logits: np.ndarray, spec: TransducerSpec) -> tuple[np.ndarray, np.ndarray]:
    """logits (B, classes [+ durations]) -> labels (B,), skips (B,)"""
    k = len(spec.durations)
    labels = logits[:, : spec.blank + 1].argmax(-1)
    blank = labels == spec.blank
    if k == 0:
        return labels, blank.astype(np.int64)  # RNN-T: a token stays, a blank moves on
    skips = np.asarray(spec.durations, dtype=np.int64)[logits[:, -k:].argmax(-1)]
    return labels, np.where(blank & (skips == 0), 1, skips)


@dataclass(frozen=True)
class Cursor:
    """Where greedy decoding of a batch stands between two calls (streaming carries it from one
    chunk of frames to the next): the frame t each item goes on from, the prediction network's
    output g for its last token and its LSTM state, and the frame of its last token with the
    tokens emitted on it (max_symbols). Frames count from the first frame of the next call."""

    t: np.ndarray  # (B,) int64; may lie past the frames given (a TDT skip over the end)
    g: np.ndarray  # (B, J)
    h: np.ndarray  # (layers, B, hidden)
    c: np.ndarray  # (layers, B, hidden)
    last_frame: np.ndarray  # (B,) int64; -1 before the first token
    on_frame: np.ndarray  # (B,) int64

    def shifted(self, frames: int) -> Cursor:
        """The same place, counted from `frames` frames later."""
        return replace(self, t=self.t - frames, last_frame=self.last_frame - frames)


def start(batch: int, predict: Predict, spec: TransducerSpec) -> Cursor:
    """The cursor at frame 0: the prediction network's output for the start symbol."""
    layers, hidden = spec.state_shape
    h = np.zeros((layers, batch, hidden), np.float32)
    g, h, c = predict(np.full(batch, spec.blank, dtype=np.int64), h, np.zeros_like(h))
    zeros = np.zeros(batch, dtype=np.int64)
    return Cursor(zeros, g, h, c, np.full(batch, -1, dtype=np.int64), zeros)


def greedy(
    f: np.ndarray, lengths: np.ndarray, predict: Predict, joint: Joint, spec: TransducerSpec
) -> list[list[Token]]:
    """f: (B, T, J) joint-projected encoder frames, lengths (B,) -> per item its tokens."""
    return resume(f, lengths, predict, joint, spec, start(f.shape[0], predict, spec))[0]


def resume(
    f: np.ndarray,
    lengths: np.ndarray,
    predict: Predict,
    joint: Joint,
    spec: TransducerSpec,
    cursor: Cursor,
) -> tuple[list[list[Token]], Cursor]:
    """greedy from `cursor` on: f (B, T, J), lengths (B,) -> per item its tokens (frames
    counted from f's first) and the cursor after its last frame. Decoding frames in pieces,
    each from the cursor the one before left (shifted to its first frame), takes the same
    decisions as decoding them at once."""
    B = f.shape[0]
    lengths = np.asarray(lengths, dtype=np.int64)
    out: list[list[Token]] = [[] for _ in range(B)]
    rows = np.arange(B)
    last = np.maximum(lengths - 1, 0)
    t, g, h, c = cursor.t, cursor.g, cursor.h, cursor.c
    last_frame = cursor.last_frame  # frame of each item's last token
    on_frame = cursor.on_frame  # tokens emitted on that frame
    active = t < lengths
    while active.any():
        was_active = active
        labels, skips = decide(joint(f[rows, np.minimum(t, last)], g), spec)
        at = t.copy()  # the frame each label was scored on
        t = t + skips * active
        active = t < lengths
        looking = active & (labels == spec.blank)
        while looking.any():  # blanks: move on with the same g until a token or the end
            at = np.where(looking, t, at)
            more, more_skips = decide(joint(f[rows, np.minimum(t, last)], g), spec)
            labels = np.where(looking, more, labels)
            skips = np.where(looking, more_skips, skips)
            t = np.where(looking, t + skips, t)
            active = t < lengths
            looking = active & (labels == spec.blank)
        found = was_active & (labels != spec.blank)
        if not found.any():
            continue
        for b in np.flatnonzero(found):
            out[b].append((int(labels[b]), int(at[b]), int(skips[b])))
        on_frame = np.where(found, np.where(last_frame == at, on_frame + 1, 1), on_frame)
        last_frame = np.where(found, at, last_frame)
        g2, h2, c2 = predict(np.where(found, labels, spec.blank), h, c)
        g = np.where(found[:, None], g2, g)
        h = np.where(found[None, :, None], h2, h)
        c = np.where(found[None, :, None], c2, c)
        force = active & found & (on_frame >= spec.max_symbols) & (last_frame == t)
        t = t + force
        active = t < lengths
    return out, Cursor(t, g, h, c, last_frame, on_frame)


class Steps:
    """A recogniser's transducer head: its predict and joint graphs on the pipeline's runner,
    and the greedy decoding that calls them. `runners`: {graph name: runner} behind them (the
    server's component models share them)."""

    def __init__(
        self,
        predict: Predict,
        joint: Joint,
        spec: TransducerSpec,
        runners: dict[str, Any] | None = None,
    ) -> None:
        self.predict, self.joint, self.spec = predict, joint, spec
        self.runners = runners or {}

    def decode(self, f: Any, lengths: Any) -> list[list[tuple[int, int, int]]]:
        """f (B, T', J) joint-projected encoder frames, lengths (B,) (numpy or torch) -> per
        item its (label, first frame, last frame) tokens: a token spans the frames it skips,
        so one that skips none ends where it starts (last = first - 1), as NeMo times it."""
        from speechrt.asr.ctc import host

        tokens = greedy(host(f).astype(np.float32, copy=False), host(lengths), self.predict,
                        self.joint, self.spec)  # fmt: skip
        return [[(lab, t, t + d - 1) for lab, t, d in item] for item in tokens]


class CudaSteps(Steps):
    """Steps whose decoding loop runs on the GPU (speechrt.runtime.transducer_cuda)."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.runners = {}  # the loop holds its own compiled steps

    def decode(self, f: Any, lengths: Any) -> list[list[tuple[int, int, int]]]:
        tokens = self.loop(f.float(), lengths.to(f.device))
        return [[(lab, t, t + d - 1) for lab, t, d in item] for item in tokens]


def spec_of(dims: dict[str, Any]) -> TransducerSpec:
    """The TransducerSpec of a Parakeet transducer's model.json dims."""
    return TransducerSpec(
        blank=int(dims["vocab_size"]),
        durations=tuple(int(d) for d in dims["durations"]),
        max_symbols=int(dims["max_symbols"]),
        state_shape=(int(dims["pred_layers"]), int(dims["pred_hidden"])),
    )


def make_steps(asr: Any, precision: str, device_loop: bool = True) -> Steps:
    """The predict and joint steps of an ASR pipeline's transducer, on its backend: the
    exported graphs on onnx, the graph wrappers on eager and cuda (one call per step). On
    cuda the decoding loop runs on the device (CudaSteps), unless device_loop is False: then
    the NumPy loop calls the graph wrappers there (streaming carries its Cursor on the host)."""
    if asr.backend == "cuda" and device_loop:  # one host read per block of steps
        from speechrt.runtime.transducer_cuda import CudaGreedy

        return CudaSteps(CudaGreedy(asr.model, dtype=asr.dtype))
    from speechrt.runtime.stages import make_runner

    runners = {
        name: make_runner(
            name,
            asr.model,
            asr.info,
            "eager" if asr.backend == "cuda" else asr.backend,
            asr.device,
            precision if asr.backend == "eager" else "fp32",
            asr.model_dir,
            numpy=asr.numpy,
        )  # fmt: skip
        for name in ("parakeet.predict", "parakeet.joint")
    }

    def run(name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if asr.numpy:
            return runners[name].run(feeds)
        import torch

        with torch.inference_mode():
            out = runners[name].run(
                {k: torch.from_numpy(v).to(asr.device) for k, v in feeds.items()}
            )
        return {k: v.float().cpu().numpy() for k, v in out.items()}

    def predict(tokens: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[Any, Any, Any]:
        out = run("parakeet.predict", {"tokens": tokens, "h": h, "c": c})
        return out["joint_predicted"], out["h_next"], out["c_next"]

    def joint(f: np.ndarray, g: np.ndarray) -> np.ndarray:
        feeds = {"joint_encoded": np.ascontiguousarray(f), "joint_predicted": g}
        return run("parakeet.joint", feeds)["logits"]

    return Steps(predict, joint, spec_of(asr.info.dims), runners)
