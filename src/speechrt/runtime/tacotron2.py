"""Tacotron 2 through runners: encoder -> decoder step loop -> postnet, as `generate_mel` does.

Same semantics as Tacotron2.generate_mel (tested): the prenet dropout masks are the model's own
per-item streams, an item whose gate first fires at step k gets k frames for the postnet and mel
length k - 1, and the loop ends when every item has stopped or at max_decoder_steps. Items that
stopped keep being computed until the batch ends (no re-batching): batch independence makes that
harmless, and static shapes are what CUDA graphs need.

One loop, `decoder_loop`, runs k decoder steps per call of a step callable and reads the gates
once per call. `RunnerSteps` gives it one step per call through the decoder-step runner (eager
graphs, onnx: k = 1). `CudaSteps` compiles `k` decoder steps into one function at bucketed static
shapes (batch, symbols) and replays it as a CUDA graph; the decoder and encoder stay float32 (an
autoregressive loop with a stop gate amplifies rounding), the postnet runs in the requested
precision.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from speechrt.errors import MaxDecoderStepsWarning, SpeechRTError
from speechrt.models.tacotron2 import MASK_CHUNK, Tacotron2Dims, _PrenetMasks
from speechrt.options import SynthesisOptions
from speechrt.runtime.base import Runner
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.cuda import compile_fn, pad_axis

STATE = (
    "attention_hidden",
    "attention_cell",
    "decoder_hidden",
    "decoder_cell",
    "attention_weights",
    "attention_weights_cum",
    "attention_context",
)


def initial_state(d: Tacotron2Dims, memory: Tensor) -> dict[str, Tensor]:
    b, t, e = memory.shape
    z = memory.new_zeros
    sizes = (d.attention_rnn_dim, d.attention_rnn_dim, d.decoder_rnn_dim, d.decoder_rnn_dim, t, t)
    return {**{n: z(b, s) for n, s in zip(STATE, sizes, strict=False)}, STATE[-1]: z(b, e)}


# k decoder steps over one batch's encoding: (frame (B, n_mels), state, prenet masks
# (B, k, 2, P)) -> frames (B, n_mels, k), gate logits (B, k), last frame, state
Steps = Callable[
    [Tensor, tuple[Tensor, ...], Tensor], tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]
]


def decoder_loop(
    steps: Steps,
    k: int,
    frame: Tensor,
    state: tuple[Tensor, ...],
    masks: _PrenetMasks,
    n_items: int,
    max_steps: int,
    gate_threshold: float,
) -> tuple[Tensor, list[int]]:
    """The decoder loop, k steps per call of `steps` (k divides MASK_CHUNK); the gates are read
    once per call. Rows past n_items (batch padding) are dropped.

    -> frames (n_items, n_mels, steps run), the first step each item's gate fired (-1: never).
    """
    items = list(range(n_items))
    chunks, fired = [], [-1] * n_items
    for start in range(0, max_steps, k):
        at = start % MASK_CHUNK
        if at == 0:
            masks.next(start, items)  # draws the next MASK_CHUNK steps for every item
        frames, gates, frame, state = steps(frame, state, masks.chunk[:, at : at + k])
        chunks.append(frames[:n_items])
        stop = (torch.sigmoid(gates[:n_items].float()) > gate_threshold).cpu()
        for i, j in stop.nonzero().tolist():  # row-major: an item's first step comes first
            if fired[i] < 0 and start + j < max_steps:
                fired[i] = start + j
        if min(fired) >= 0:
            break
    return torch.cat(chunks, 2)[:, :, :max_steps], fired


class RunnerSteps:
    """One decoder step per call, through the decoder-step graph's runner (eager, onnx)."""

    k = 1

    def __init__(self, step: Runner) -> None:
        self.step = step

    def bind(
        self, d: Tacotron2Dims, memory: Tensor, processed: Tensor, mask: Tensor
    ) -> tuple[Steps, Tensor, tuple[Tensor, ...]]:
        """The step callable over this batch's encoding, its first frame and state."""
        fixed = {"memory": memory, "processed_memory": processed, "mask": mask}

        def steps(frame: Tensor, state: tuple[Tensor, ...], masks: Tensor) -> Any:
            feeds = {"decoder_input": frame, **dict(zip(STATE, state, strict=True)), **fixed}
            out = self.step.run(feeds | {"prenet_masks": masks[:, 0]})
            frame = out["decoder_output"]
            state = tuple(out["out_" + n] for n in STATE)
            return frame[:, :, None], out["gate_prediction"], frame, state

        first = memory.new_zeros(memory.shape[0], d.n_mel_channels)
        return steps, first, tuple(initial_state(d, memory).values())


class CudaSteps:
    """k decoder steps per compiled, CUDA-graph-replayed call at bucketed static shapes
    (batch, symbols); the decoder stays float32."""

    def __init__(
        self,
        decoder: torch.nn.Module,
        device: torch.device,
        buckets: Buckets,
        mode: str | None,
        k: int = 8,
    ) -> None:
        if MASK_CHUNK % k:
            raise SpeechRTError(f"steps per graph must divide {MASK_CHUNK}, got {k}")
        self.decoder = copy.deepcopy(decoder).to(device, torch.float32).eval()
        self.device, self.buckets, self.k = device, buckets, k
        self._steps: Callable = compile_fn(self.k_steps, mode)

    def k_steps(
        self, frame: Tensor, state: tuple[Tensor, ...], memory: Tensor, processed: Tensor,
        mask: Tensor, masks: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]:  # fmt: skip
        """masks (B, k, 2, P) -> frames (B, n_mels, k), gates (B, k), last frame, state."""
        frames, gates = [], []
        for j in range(self.k):
            out = self.decoder(frame, *state, memory, processed, mask, masks[:, j])
            frame, state = out[0], tuple(out[2:])
            frames.append(frame)
            gates.append(out[1][:, 0])
        return torch.stack(frames, 2), torch.stack(gates, 1), frame, state

    def bind(
        self, d: Tacotron2Dims, memory: Tensor, processed: Tensor, mask: Tensor
    ) -> tuple[Steps, Tensor, tuple[Tensor, ...]]:
        """The compiled steps over this batch's encoding padded to its buckets (rows past the
        batch are padding), their first frame and state."""
        b, t = memory.shape[:2]
        bb, tb = self.buckets.size("batch", b), self.buckets.size("symbols", t)
        memory = pad_axis(pad_axis(memory, 0, bb, True), 1, tb, False)
        processed = pad_axis(pad_axis(processed, 0, bb, True), 1, tb, False)
        lengths = pad_axis((~mask).sum(1), 0, bb, True)
        mask = ~(torch.arange(tb, device=self.device)[None, :] < lengths[:, None])

        @torch.inference_mode()
        def steps(frame: Tensor, state: tuple[Tensor, ...], masks: Tensor) -> Any:
            block = pad_axis(masks.to(self.device, torch.float32), 0, bb, True)
            frames, gates, frame, state = self._steps(frame, state, memory, processed, mask, block)
            # a replayed CUDA graph overwrites its outputs: keep copies
            return frames.clone(), gates.clone(), frame.clone(), tuple(s.clone() for s in state)

        first = memory.new_zeros(bb, d.n_mel_channels)
        return steps, first, tuple(initial_state(d, memory).values())


class Tacotron2Stage:
    """ids (B, L), lengths (B,) -> mel (B, n_mels, T), mel_lengths (B,): generate_mel's contract."""

    def __init__(
        self, dims: Tacotron2Dims, encoder: Runner, steps: RunnerSteps | CudaSteps, postnet: Runner
    ) -> None:
        self.dims, self.encoder, self.steps, self.postnet = dims, encoder, steps, postnet

    def __call__(
        self, ids: Tensor, lengths: Tensor, options: SynthesisOptions, seeds: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        d = self.dims
        b = ids.shape[0]
        seed_list = [options.seed + i for i in range(b)] if seeds is None else seeds.tolist()
        max_steps = options.max_decoder_steps or d.max_decoder_steps
        if max_steps < 1:
            raise SpeechRTError(f"tacotron2: max_decoder_steps must be >= 1, got {max_steps}")
        ids = ids[:, : int(lengths.max())]
        enc = self.encoder.run({"sequences": ids, "sequence_lengths": lengths})
        memory, processed = enc["memory"], enc["processed_memory"]
        device = memory.device
        mask = ~(torch.arange(ids.shape[1], device=device)[None, :] < lengths.to(device)[:, None])
        masks = _PrenetMasks([int(s) for s in seed_list], d.prenet_dim, torch.float32, device)
        steps, frame, state = self.steps.bind(d, memory, processed, mask)
        frames, fired = decoder_loop(
            steps, self.steps.k, frame, state, masks, b, max_steps, d.gate_threshold
        )
        n_frames = [f + 1 if f >= 0 else max_steps for f in fired]
        mel_lengths = [f if f >= 0 else max_steps for f in fired]
        for i, f in enumerate(fired):
            if f < 0:
                warnings.warn(
                    MaxDecoderStepsWarning(
                        f"tacotron2: item {i} reached max_decoder_steps ({max_steps}) "
                        "before its stop gate fired",
                        item=i,
                    ),
                    stacklevel=2,
                )
        counts = torch.tensor(n_frames, device=device)
        mel = self.postnet.run(
            {"mel_outputs": frames[:, :, : max(n_frames)].contiguous(), "mel_lengths": counts}
        )["mel_outputs_postnet"]
        t_out = max(mel_lengths)
        out_lengths = torch.tensor(mel_lengths, dtype=torch.long, device=device)
        keep = torch.arange(t_out, device=device)[None, None, :] < out_lengths[:, None, None]
        return mel[:, :, :t_out] * keep, out_lengths

    def runners(self) -> list[Runner]:
        """The runners it holds (the cuda loop compiles its own decoder step)."""
        step = [self.steps.step] if isinstance(self.steps, RunnerSteps) else []
        return [self.encoder, *step, self.postnet]


def tacotron2_stage(
    dims: Tacotron2Dims,
    runners: Sequence[Runner | None],
    backend: str,
    decoder: torch.nn.Module | None = None,
    device: torch.device | None = None,
    buckets: Buckets | None = None,
    compile_mode: str | None = "reduce-overhead",
) -> Tacotron2Stage:
    """The stage from (encoder, decoder step, postnet) runners; cuda replaces the step runner
    (None there)."""
    encoder, step, postnet = runners
    assert encoder is not None and postnet is not None
    if backend == "cuda":
        assert decoder is not None and device is not None
        steps: RunnerSteps | CudaSteps = CudaSteps(
            decoder, device, buckets or Buckets(), compile_mode
        )
    else:
        assert step is not None
        steps = RunnerSteps(step)
    return Tacotron2Stage(dims, encoder, steps, postnet)
