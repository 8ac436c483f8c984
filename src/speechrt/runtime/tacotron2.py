"""Tacotron 2 through runners: encoder -> decoder step loop -> postnet, as `generate_mel` does.

Same semantics as Tacotron2.generate_mel (tested): the prenet dropout masks are the model's own
per-item streams, an item whose gate first fires at step k gets k frames for the postnet and mel
length k - 1, and the loop ends when every item has stopped or at max_decoder_steps. Items that
stopped keep being computed until the batch ends (no re-batching): batch independence makes that
harmless, and static shapes are what CUDA graphs need.

`StepLoop` runs one decoder-step runner per step (eager graphs, onnx) and reads the gates every
step. `CudaStepLoop` compiles `k` decoder steps into one function at bucketed static shapes
(batch, symbols) and replays it as a CUDA graph, reading the gates back once per k steps; the
decoder and encoder stay float32 (an autoregressive loop with a stop gate amplifies rounding), the
postnet runs in the requested precision.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence

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


class StepLoop:
    """Runs the decoder-step runner once per step; the gate is read every step."""

    def __init__(self, step: Runner) -> None:
        self.step = step

    def run(
        self,
        d: Tacotron2Dims,
        memory: Tensor,
        processed: Tensor,
        mask: Tensor,
        masks: _PrenetMasks,
        max_steps: int,
    ) -> tuple[Tensor, list[int]]:
        """-> frames (B, n_mels, steps run), the first step each item's gate fired (-1: never)."""
        b = memory.shape[0]
        items = list(range(b))
        state = initial_state(d, memory)
        frame = memory.new_zeros(b, d.n_mel_channels)
        frames, fired = [], [-1] * b
        for step in range(max_steps):
            feeds = {"decoder_input": frame, **state, "memory": memory}
            feeds |= {"processed_memory": processed, "mask": mask}
            out = self.step.run(feeds | {"prenet_masks": masks.next(step, items)})
            frame = out["decoder_output"]
            state = {n: out["out_" + n] for n in STATE}
            frames.append(frame)
            stop = (torch.sigmoid(out["gate_prediction"].float()) > d.gate_threshold)[:, 0]
            for i in stop.nonzero()[:, 0].tolist():
                if fired[i] < 0:
                    fired[i] = step
            if min(fired) >= 0:
                break
        return torch.stack(frames, 2), fired


class CudaStepLoop:
    """k decoder steps per compiled, CUDA-graph-replayed call; gates read once per k steps."""

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
        self.graphs = mode == "reduce-overhead"
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

    @torch.inference_mode()
    def run(
        self,
        d: Tacotron2Dims,
        memory: Tensor,
        processed: Tensor,
        mask: Tensor,
        masks: _PrenetMasks,
        max_steps: int,
    ) -> tuple[Tensor, list[int]]:
        b, t = memory.shape[:2]
        bb, tb = self.buckets.size("batch", b), self.buckets.size("symbols", t)
        memory = pad_axis(pad_axis(memory, 0, bb, True), 1, tb, False)
        processed = pad_axis(pad_axis(processed, 0, bb, True), 1, tb, False)
        lengths = pad_axis((~mask).sum(1), 0, bb, True)
        mask = ~(torch.arange(tb, device=self.device)[None, :] < lengths[:, None])
        state = tuple(initial_state(d, memory).values())
        frame = memory.new_zeros(bb, d.n_mel_channels)
        items = list(range(b))
        chunks, fired = [], [-1] * b
        for start in range(0, max_steps, self.k):
            if start % MASK_CHUNK == 0:
                masks.next(start, items)  # draws the next MASK_CHUNK steps for every item
            block = masks.chunk[:, start % MASK_CHUNK : start % MASK_CHUNK + self.k]
            block = pad_axis(block.to(self.device, torch.float32), 0, bb, True)
            frames, gates, frame, state = self._steps(frame, state, memory, processed, mask, block)
            chunks.append(frames[:b].clone())
            frame, state = frame.clone(), tuple(s.clone() for s in state)
            stop = (torch.sigmoid(gates[:b].float()) > d.gate_threshold).cpu()  # one read per k
            for i, j in stop.nonzero().tolist():  # row-major: an item's first step comes first
                if fired[i] < 0 and start + j < max_steps:
                    fired[i] = start + j
            if min(fired) >= 0:
                break
        frames = torch.cat(chunks, 2)[:, :, :max_steps]
        return frames, fired


class Tacotron2Stage:
    """ids (B, L), lengths (B,) -> mel (B, n_mels, T), mel_lengths (B,): generate_mel's contract."""

    def __init__(
        self, dims: Tacotron2Dims, encoder: Runner, loop: StepLoop | CudaStepLoop, postnet: Runner
    ) -> None:
        self.dims, self.encoder, self.loop, self.postnet = dims, encoder, loop, postnet

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
        frames, fired = self.loop.run(d, memory, processed, mask, masks, max_steps)
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
        step = [self.loop.step] if isinstance(self.loop, StepLoop) else []
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
        loop: StepLoop | CudaStepLoop = CudaStepLoop(
            decoder, device, buckets or Buckets(), compile_mode
        )
    else:
        assert step is not None
        loop = StepLoop(step)
    return Tacotron2Stage(dims, encoder, loop, postnet)
