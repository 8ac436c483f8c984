"""Tacotron 2 through runners: encoder -> decoder step loop -> postnet, as `generate_mel` does.

Same semantics as Tacotron2.generate_mel (tested): the prenet dropout masks are the model's own
per-item streams, an item whose gate first fires at step k gets k frames for the postnet and mel
length k - 1, and the loop ends when every item has stopped or at max_decoder_steps. Items that
stopped keep being computed until the batch ends (no re-batching): batch independence makes that
harmless, and static shapes are what CUDA graphs need.

One loop, `decoder_loop`, runs k decoder steps per call of a step callable. It never waits for
the device: each call's stop flags are copied to the host asynchronously and read after the next
call is queued, so the GPU always has work while the host decides (at most 2k steps are computed
past the last stop). `RunnerSteps` gives it one step per call through the decoder-step runner
(eager graphs, onnx: k = 1). `CudaSteps` compiles k steps of `FusedStep` (the decoder step with
its GEMMs merged, an exact rewrite) into one function at bucketed static shapes (batch, symbols)
and replays it as a CUDA graph whose decoder state stays in the graph's own buffers. The decoder
and encoder stay float32 (an autoregressive loop with a stop gate amplifies rounding); the
postnet runs in the requested precision.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.errors import MaxDecoderStepsWarning, SpeechRTError
from speechrt.models.tacotron2 import MASK_CHUNK, DecoderStep, Tacotron2Dims, _PrenetMasks
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


# k decoder steps of one bound batch, its state held by the callable: prenet masks (B, k, 2, P)
# -> frames (B, n_mels, k), gate logits (B, k). Outputs may be overwritten by the next call.
Steps = Callable[[Tensor], tuple[Tensor, Tensor]]


def decoder_loop(
    steps: Steps, k: int, masks: _PrenetMasks, n_items: int, max_steps: int, gate_threshold: float
) -> tuple[Tensor, list[int]]:
    """The decoder loop, k steps per call of `steps` (k divides MASK_CHUNK). A call's stop flags
    are read on the host only after the next call is queued. Rows past n_items are padding.

    -> frames (n_items, n_mels, steps run), the first step each item's gate fired (-1: never).
    """
    items = list(range(n_items))
    fired = [-1] * n_items
    out: Tensor | None = None
    pending: tuple[int, Tensor, torch.cuda.Event | None] | None = None
    end = 0
    for start in range(0, max_steps, k):
        at = start % MASK_CHUNK
        if at == 0:
            masks.next(start, items)  # draws the next MASK_CHUNK steps for every item
        frames, gates = steps(masks.chunk[:, at : at + k])
        if out is None:  # (n_items, n_mels, max_steps rounded up to k)
            out = frames.new_zeros(n_items, frames.shape[1], -(-max_steps // k) * k)
        out[:, :, start : start + k] = frames[:n_items]
        end = start + k
        flags = _to_host(torch.sigmoid(gates[:n_items].float()) > gate_threshold)
        if pending is not None and _record(pending, fired, max_steps):
            break
        pending = (start, *flags)
    else:
        if pending is not None:
            _record(pending, fired, max_steps)
    assert out is not None  # max_steps >= 1
    return out[:, :, : min(end, max_steps)], fired


def _to_host(x: Tensor) -> tuple[Tensor, torch.cuda.Event | None]:
    """x copied to pinned host memory without waiting; the event marks the copy's end."""
    if x.device.type != "cuda":
        return x, None
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def _record(
    pending: tuple[int, Tensor, torch.cuda.Event | None], fired: list[int], max_steps: int
) -> bool:
    """Note each item's first fired step from one call's stop flags (B, k); True: all stopped."""
    start, stop, event = pending
    if event is not None:
        event.synchronize()
    for i, j in stop.nonzero().tolist():  # row-major: an item's first step comes first
        if fired[i] < 0 and start + j < max_steps:
            fired[i] = start + j
    return min(fired) >= 0


class RunnerSteps:
    """One decoder step per call, through the decoder-step graph's runner (eager, onnx)."""

    k = 1

    def __init__(self, step: Runner) -> None:
        self.step = step

    def bind(self, d: Tacotron2Dims, memory: Tensor, processed: Tensor, mask: Tensor) -> Steps:
        """The step callable over this batch's encoding, from the zero state."""
        fixed = {"memory": memory, "processed_memory": processed, "mask": mask}
        state = initial_state(d, memory)
        frame = memory.new_zeros(memory.shape[0], d.n_mel_channels)

        def steps(masks: Tensor) -> tuple[Tensor, Tensor]:
            nonlocal frame, state
            feeds = {"decoder_input": frame, **state, **fixed, "prenet_masks": masks[:, 0]}
            out = self.step.run(feeds)
            frame = out["decoder_output"]
            state = {n: out["out_" + n] for n in STATE}
            return frame[:, :, None], out["gate_prediction"]

        return steps


class FusedStep(nn.Module):
    """DecoderStep with fewer, larger GEMMs; the same function up to float rounding (tested).

    Each LSTM cell is one GEMM over [input, hidden] (W_ih | W_hh, b_ih + b_hh); the location
    conv (2 -> F, kernel K) and its dense layer (F -> A) are one conv (2 -> A, kernel K); the mel
    projection and the gate are one linear (n_mels + 1 outputs).
    """

    def __init__(self, step: DecoderStep) -> None:
        super().__init__()
        cat = torch.cat
        self.prenet = nn.ParameterList(
            [p.weight.detach().clone() for p in step.prenet]  # type: ignore[operator]
        )
        att, dec = step.attention_rnn, step.decoder_rnn
        self.att_w = nn.Parameter(cat((att.weight_ih, att.weight_hh), 1).detach())
        self.att_b = nn.Parameter((att.bias_ih + att.bias_hh).detach())
        self.dec_w = nn.Parameter(cat((dec.weight_ih, dec.weight_hh), 1).detach())
        self.dec_b = nn.Parameter((dec.bias_ih + dec.bias_hh).detach())
        self.query_w = nn.Parameter(step.query_layer.weight.detach().clone())
        loc = torch.einsum("af,fck->ack", step.location_dense.weight, step.location_conv.weight)
        self.location_w = nn.Parameter(loc.detach())  # (A, 2, K)
        self.location_pad = step.location_conv.padding[0]
        self.v = nn.Parameter(step.v.weight.detach()[0].clone())  # (A,)
        proj, gate = step.linear_projection, step.gate_layer
        self.out_w = nn.Parameter(cat((proj.weight, gate.weight)).detach())
        self.out_b = nn.Parameter(cat((proj.bias, gate.bias)).detach())

    def lstm_in(self, dtype: torch.dtype) -> FusedStep:
        """The two LSTM GEMMs' weights in `dtype` (bfloat16: at DLE's dims 71 of the step's 73
        MB of float32 weights): they take their input in it, accumulate in float32 and round
        their output to it; the state, attention, projection and gate stay as they are (the
        stop step's evidence: scripts/tacotron2_stop_steps.py). Returns self."""
        for p in (self.att_w, self.dec_w):
            p.data = p.data.to(dtype)
        return self

    def forward(
        self, decoder_input: Tensor, attention_hidden: Tensor, attention_cell: Tensor,
        decoder_hidden: Tensor, decoder_cell: Tensor, attention_weights: Tensor,
        attention_weights_cum: Tensor, attention_context: Tensor, memory: Tensor,
        processed_memory: Tensor, mask: Tensor, prenet_masks: Tensor,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        """DecoderStep.forward's inputs and outputs (DECODER_INPUTS -> DECODER_OUTPUTS)."""
        x = decoder_input
        for i, w in enumerate(self.prenet):
            x = F.relu(F.linear(x, w)) * prenet_masks[:, i]
        xh = torch.cat((x, attention_context, attention_hidden), 1)
        h, c = _lstm(xh, attention_cell, self.att_w, self.att_b)
        prev = torch.stack((attention_weights, attention_weights_cum), 1)  # (B, 2, T_in)
        location = F.conv1d(prev, self.location_w, padding=self.location_pad)  # (B, A, T_in)
        query = F.linear(h, self.query_w)  # (B, A)
        energies = torch.tanh(query[:, :, None] + location + processed_memory.transpose(1, 2))
        energies = torch.einsum("bat,a->bt", energies, self.v)  # (B, T_in)
        weights = F.softmax(energies.masked_fill(mask, float("-inf")), dim=1)
        context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)  # (B, E)
        dh, dc = _lstm(torch.cat((h, context, decoder_hidden), 1), decoder_cell,
                       self.dec_w, self.dec_b)  # fmt: skip
        out = F.linear(torch.cat((dh, context), 1), self.out_w, self.out_b)  # (B, n_mels + 1)
        weights_cum = attention_weights_cum + weights
        return out[:, :-1], out[:, -1:], h, c, dh, dc, weights, weights_cum, context


def _lstm(xh: Tensor, c: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """An LSTMCell step over [x, h] (B, I + H), stacked weights (4H, I + H): gates i, f, g, o.
    A weight in another dtype than xh takes xh in its dtype; the gates and c stay in c's."""
    if w.dtype == xh.dtype:
        gates = F.linear(xh, w, b)
    else:
        gates = F.linear(xh.to(w.dtype), w).to(c.dtype) + b
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


@dataclass
class _Bound:
    """One bucket's static buffers: inputs, decoder state and the last call's outputs."""

    memory: Tensor  # (Bb, Tb, E)
    processed: Tensor  # (Bb, Tb, A)
    mask: Tensor  # (Bb, Tb) bool, True = pad
    masks: Tensor  # (Bb, k, 2, P)
    frame: Tensor  # (Bb, n_mels): the last frame
    state: tuple[Tensor, ...]  # STATE order
    frames: Tensor  # (Bb, n_mels, k)
    gates: Tensor  # (Bb, k)
    graph: torch.cuda.CUDAGraph | None = None


class CudaSteps:
    """k decoder steps per call, compiled and replayed as one CUDA graph per bucket (batch,
    symbols); the decoder state lives in the bucket's buffers, so a call copies in only the
    prenet masks. mode None runs the same code uncompiled and without graphs (e.g. on a CPU).
    lstm_dtype: FusedStep.lstm_in's (float32 unless the stop step is shown to hold)."""

    def __init__(
        self,
        decoder: DecoderStep,
        device: torch.device,
        buckets: Buckets,
        mode: str | None,
        k: int = 8,
        lstm_dtype: torch.dtype = torch.float32,
    ) -> None:
        if MASK_CHUNK % k:
            raise SpeechRTError(f"steps per graph must divide {MASK_CHUNK}, got {k}")
        self.decoder = FusedStep(decoder).to(device, torch.float32).eval().lstm_in(lstm_dtype)
        self.device, self.buckets, self.k = device, buckets, k
        self.graphs = mode == "reduce-overhead" and device.type == "cuda"
        self._steps = compile_fn(self.k_steps, "default" if self.graphs else mode)
        self._bound: dict[tuple[int, int], _Bound] = {}
        self._pool: Any = None

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

    def advance(self, b: _Bound) -> None:
        """k steps from the buffers' state; the new state and outputs written back in place."""
        frames, gates, frame, state = self._steps(
            b.frame, b.state, b.memory, b.processed, b.mask, b.masks
        )
        torch._foreach_copy_([b.frames, b.gates, b.frame, *b.state], [frames, gates, frame, *state])

    def bind(self, d: Tacotron2Dims, memory: Tensor, processed: Tensor, mask: Tensor) -> Steps:
        """The steps over this batch's encoding, padded to its buckets (rows past the batch are
        padding), from the zero state. One bound batch at a time per bucket."""
        b, t = memory.shape[:2]
        key = self.buckets.size("batch", b), self.buckets.size("symbols", t)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = self._buffers(d, *key, memory, processed)
        lengths = pad_axis((~mask).sum(1), 0, key[0], True)
        bound.mask.copy_(torch.arange(key[1], device=self.device)[None, :] >= lengths[:, None])
        bound.memory.copy_(pad_axis(pad_axis(memory, 0, key[0], True), 1, key[1], False))
        bound.processed.copy_(pad_axis(pad_axis(processed, 0, key[0], True), 1, key[1], False))
        for x in (bound.frame, bound.masks, *bound.state):
            x.zero_()
        if self.graphs and bound.graph is None:
            bound.graph = self._capture(bound)
            for x in (bound.frame, *bound.state):  # the warm-up and capture advanced them
                x.zero_()

        def steps(masks: Tensor) -> tuple[Tensor, Tensor]:
            bound.masks[: masks.shape[0]].copy_(masks, non_blocking=True)
            if bound.graph is not None:
                bound.graph.replay()
            else:
                self.advance(bound)
            return bound.frames, bound.gates

        return steps

    def _buffers(
        self, d: Tacotron2Dims, bb: int, tb: int, memory: Tensor, processed: Tensor
    ) -> _Bound:
        z = lambda *shape, dtype=torch.float32: torch.zeros(  # noqa: E731
            *shape, dtype=dtype, device=self.device
        )
        e, a = memory.shape[2], processed.shape[2]
        state = tuple(initial_state(d, z(bb, tb, e)).values())
        return _Bound(
            memory=z(bb, tb, e), processed=z(bb, tb, a), mask=z(bb, tb, dtype=torch.bool),
            masks=z(bb, self.k, 2, d.prenet_dim), frame=z(bb, d.n_mel_channels), state=state,
            frames=z(bb, d.n_mel_channels, self.k), gates=z(bb, self.k),
        )  # fmt: skip

    def _capture(self, b: _Bound) -> torch.cuda.CUDAGraph:
        """Compile and warm up on a side stream, then capture one `advance` of the buffers."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.advance(b)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self.advance(b)
        return graph


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
        steps = self.steps.bind(d, memory, processed, mask)
        frames, fired = decoder_loop(steps, self.steps.k, masks, b, max_steps, d.gate_threshold)
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
    decoder: DecoderStep | None = None,
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
