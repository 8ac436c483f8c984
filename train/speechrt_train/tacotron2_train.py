"""Tacotron 2 trained on the TTS voice by teacher forcing: the model that shows whether a
half-precision decoder step keeps the stop step (it must attend and stop by itself).

    ids (B, L) -> encoder -> memory; for each mel frame t: DecoderStep(target frame t - 1,
    state, memory) -> frame t, gate t, attention (B, L) -> postnet -> mel (B, n_mels, T)

Losses as DLE's Tacotron2Loss: the mean squared error of the mel before and after the postnet
(over valid frames) and the gate's binary cross-entropy, target 1 from each item's last frame
on. One addition speeds up learning to attend on a corpus of a few thousand sentences: a
guided-attention loss (Tachibana et al., 2017) that penalises attention far from the diagonal,
weight `guide` (0: off). The prenet's dropout is on, as it is at inference. speechrt's
Tacotron 2 folds DLE's BatchNorms at conversion, so these convolutions train without them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from speechrt.arch.tacotron2 import PRESETS, Tacotron2Dims
from speechrt.models.tacotron2 import PRENET_DROPOUT, Tacotron2
from speechrt_train.loop import Batches
from speechrt_train.tts_data import TextBatch, TextTrainer, VoiceData


@dataclass(frozen=True)
class Tacotron2Config:
    preset: str = "default"  # DLE's published dims (speechrt.arch.tacotron2.PRESETS)
    batch_size: int = 32
    max_frames: int = 32 * 800  # padded mel frames per batch
    lr: float = 1e-3
    warmup: int = 500
    weight_decay: float = 1e-6
    grad_clip: float = 1.0
    guide: float = 1.0  # guided-attention loss weight
    guide_sigma: float = 0.2
    seed: int = 0
    amp: bool = True  # bf16 autocast on CUDA
    graphs: bool = False  # the step's decoder loop as CUDA graphs (GraphedStep; CUDA only)


@dataclass
class Tacotron2Out:
    mel: Tensor  # (B, n_mels, T) before the postnet
    mel_post: Tensor  # (B, n_mels, T)
    gate: Tensor  # (B, T) logits
    attention: Tensor  # (B, T, L)


def teacher_forced(
    model: Tacotron2, b: TextBatch, generator: torch.Generator | None = None
) -> Tacotron2Out:
    """The training forward: every decoder step reads the target's previous frame. The prenet's
    dropout masks come from `generator` (None: the global one)."""
    memory, processed = model.encoder(b.ids, b.lengths)  # (B, L, E), (B, L, A)
    return decode(model, memory, processed, b, generator)


def decode(
    model: Tacotron2,
    memory: Tensor,
    processed: Tensor,
    b: TextBatch,
    generator: torch.Generator | None = None,
    dropout: float = PRENET_DROPOUT,
) -> Tacotron2Out:
    """teacher_forced after the encoder: memory (B, L, E), processed (B, L, A) -> the decoder
    loop over b.mel's frames and the postnet (it reads b.lengths, b.mel, b.mel_lengths)."""
    L = memory.shape[1]
    pad = torch.arange(L, device=memory.device)[None] >= b.lengths[:, None]  # (B, L)
    B, n_mels, T = b.mel.shape
    previous = F.pad(b.mel, (1, -1)).to(memory.dtype)  # frame t - 1 at t, zeros at t = 0
    P = model.dims.prenet_dim
    u = torch.rand(T, B, 2, P, device=memory.device, generator=generator)
    keep = (u >= dropout).to(memory.dtype)
    keep = keep / (1.0 - dropout)
    state = model.initial_state(memory)
    frames, gates, attention = [], [], []
    for t in range(T):
        out = model.decoder(previous[:, :, t], *state, memory, processed, pad, keep[t])
        frames.append(out[0])
        gates.append(out[1])
        state = out[2:]
        attention.append(state[4])
    mel = torch.stack(frames, 2)  # (B, n_mels, T)
    return Tacotron2Out(
        mel, model.postnet(mel, b.mel_lengths), torch.cat(gates, 1), torch.stack(attention, 1)
    )


def guide_weights(lengths: Tensor, mel_lengths: Tensor, L: int, T: int, sigma: float) -> Tensor:
    """(B, T, L): 1 - exp(-(l / L_i - t / T_i)^2 / (2 sigma^2)) inside each item, 0 outside."""
    t = torch.arange(T, device=lengths.device)[None, :, None] / mel_lengths[:, None, None]
    l_ = torch.arange(L, device=lengths.device)[None, None, :] / lengths[:, None, None]
    w = 1.0 - torch.exp(-((l_ - t) ** 2) / (2 * sigma**2))
    inside = (t < 1.0) & (l_ < 1.0)  # (an item of no frames: t is nan or inf, never inside)
    return torch.where(inside, w, 0.0)


def losses(out: Tacotron2Out, b: TextBatch, config: Tacotron2Config) -> dict[str, Tensor]:
    T = b.mel.shape[2]
    valid = torch.arange(T, device=b.mel.device)[None] < b.mel_lengths[:, None]  # (B, T)
    n = valid.sum() * b.mel.shape[1]
    target = b.mel.float()

    def masked_mse(pred: Tensor) -> Tensor:
        return ((pred.float() - target) ** 2 * valid[:, None]).sum() / n

    frame = torch.arange(T, device=b.mel.device)[None]
    stop = (frame >= b.mel_lengths[:, None] - 1).float()
    # DLE's mean over every item's frames up to the batch's longest (rows and frames of
    # GraphedStep's padding, items of no frames or past the longest, are left out)
    counted = (frame < b.mel_lengths.max()) & (b.mel_lengths[:, None] > 0)  # (B, T)
    gate = F.binary_cross_entropy_with_logits(out.gate.float(), stop, reduction="none")
    parts = {
        "mel": masked_mse(out.mel),
        "mel_post": masked_mse(out.mel_post),
        "gate": (gate * counted).sum() / counted.sum(),
    }
    if config.guide > 0:
        L = out.attention.shape[2]
        w = guide_weights(b.lengths, b.mel_lengths, L, T, config.guide_sigma)
        parts["guide"] = (out.attention.float() * w).sum() / valid.sum()
    parts["loss"] = sum(
        (v * config.guide if k == "guide" else v for k, v in parts.items()),
        torch.zeros((), device=b.mel.device),
    )
    return parts


def attention_focus(out: Tacotron2Out, b: TextBatch) -> Tensor:
    """Mean over valid frames of the attention's largest weight: near 1 once it attends."""
    T = out.attention.shape[1]
    valid = torch.arange(T, device=b.mel.device)[None] < b.mel_lengths[:, None]
    return (out.attention.float().amax(2) * valid).sum() / valid.sum()


class Tacotron2Trainer(TextTrainer):
    """One Tacotron 2, its optimizer and its data order (see loop.Trainer)."""

    def __init__(
        self,
        train: VoiceData,
        val: VoiceData | None,
        config: Tacotron2Config,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config, self.device = config, torch.device(device)
        self.train, self.val = train, val
        dims = Tacotron2Dims(**PRESETS[config.preset], n_mel_channels=train.mel_config.n_mels)
        torch.manual_seed(config.seed)
        self.model = Tacotron2(dims).to(self.device)
        with torch.no_grad():  # start the frames at the training mean (log-mel is ~ -7)
            self.model.decoder.linear_projection.bias.copy_(train.mel_mean())
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), config.lr, weight_decay=config.weight_decay
        )
        self.batches = Batches(train.frames(), config.batch_size, config.seed, config.max_frames)
        self.step_count = 0
        self.graphed = None
        if config.graphs:
            if self.device.type != "cuda":
                raise ValueError(f"graphs=true needs a CUDA device, not {device}")
            symbols = max(len(ids) for ids in train.ids)
            self.graphed = GraphedStep(self, config.batch_size, symbols)

    def _gradients(self, b: TextBatch) -> dict[str, Tensor]:
        if self.graphed is None:
            return super()._gradients(b)
        return self.graphed.gradients(b)

    def _forward(self, b: TextBatch, generator: torch.Generator | None) -> Tacotron2Out:
        return teacher_forced(self.model, b, generator)

    def _losses(self, out: Tacotron2Out, b: TextBatch) -> dict[str, Tensor]:
        return {**losses(out, b, self.config), "focus": attention_focus(out, b)}


FRAMES = 64  # GraphedStep: one graph per mel length rounded up to a multiple of this


def pad_batch(b: TextBatch, rows: int, symbols: int, frames: int = FRAMES) -> TextBatch:
    """b padded to (rows, symbols) and its mel to a multiple of `frames`: the extra rows have one
    symbol and no frames, so that no loss counts them (nor the extra symbols and frames)."""
    n, width = b.ids.shape
    if n > rows or width > symbols:
        raise ValueError(f"a batch of {n} x {width} symbols does not fit {rows} x {symbols}")
    T = -(-b.mel.shape[2] // frames) * frames

    def fit(x: Tensor, *shape: int, fill: float = 0) -> Tensor:
        out = x.new_full(shape, fill)
        out[tuple(slice(0, s) for s in x.shape)] = x
        return out

    return TextBatch(
        ids=fit(b.ids, rows, symbols),
        lengths=fit(b.lengths, rows, fill=1),
        durations=fit(b.durations, rows, symbols),
        pitch=fit(b.pitch, rows, symbols),
        energy=fit(b.energy, rows, symbols),
        mel=fit(b.mel, rows, b.mel.shape[1], T),
        mel_lengths=fit(b.mel_lengths, rows),
    )


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    batch: TextBatch  # its static inputs: lengths, mel, mel_lengths
    memory: Tensor  # (B, L, E), a leaf the graph differentiates
    processed: Tensor  # (B, L, A), the same
    parts: dict[str, Tensor]  # the losses
    memory_grad: Tensor
    processed_grad: Tensor


class GraphedStep:
    """A training step's decoder loop, postnet, losses and their backward replayed as one CUDA
    graph per mel length (rounded up to FRAMES). Run eagerly, the step is launch-bound: some 35
    small kernels per frame forward and twice as many backward, each behind Python and autograd
    (2.1 s a step of batch 32 and 640 frames at DLE's dims on an H200). Batches are padded to
    `rows` x `symbols` (pad_batch; tests/test_train_tacotron2.py shows the padding changes no
    loss or gradient).
    The encoder runs eagerly on either side (its BiLSTM packs by length on the host): the graph
    reads its memory and gives back that memory's gradient. The prenet's dropout masks come from
    the CUDA generator, advanced at each replay. Autocast's cache is off in the capture, so under
    bf16 each frame casts the weights afresh and their gradients sum in float32 (eagerly, the
    cached casts sum a decoder weight's gradient over the frames in bf16). H200, batch 64, 640
    frames: 0.45 s a step, 9.4x the eager step's frames/s (scripts/bench_tacotron2_train.py)."""

    def __init__(self, trainer: Tacotron2Trainer, rows: int, symbols: int) -> None:
        self.trainer, self.rows, self.symbols = trainer, rows, symbols
        model = trainer.model
        self.inner = [*model.decoder.parameters(), *model.postnet.parameters()]
        self.grads = [torch.zeros_like(p) for p in self.inner]  # every graph writes these
        self.pool = torch.cuda.graph_pool_handle()  # shared: one graph runs at a time
        self.graphs: dict[int, _Graph] = {}  # by padded frame count

    def gradients(self, b: TextBatch) -> dict[str, Tensor]:
        """TextTrainer._gradients for batch b: its losses, the gradients in .grad"""
        p = pad_batch(b, self.rows, self.symbols)
        with self.trainer._autocast():
            memory, processed = self.trainer.model.encoder(p.ids, p.lengths)
        T = p.mel.shape[2]
        if T not in self.graphs:
            self.graphs[T] = self._capture(p, memory, processed)
        g = self.graphs[T]
        with torch.no_grad():
            for static, x in ((g.batch.lengths, p.lengths), (g.batch.mel, p.mel),
                              (g.batch.mel_lengths, p.mel_lengths), (g.memory, memory),
                              (g.processed, processed)):  # fmt: skip
                static.copy_(x)
        g.graph.replay()
        torch.autograd.backward((memory, processed), (g.memory_grad, g.processed_grad))
        for param, grad in zip(self.inner, self.grads, strict=True):
            param.grad = grad
        return {k: v.clone() for k, v in g.parts.items()}  # (the next replay overwrites them)

    def _capture(self, p: TextBatch, memory: Tensor, processed: Tensor) -> _Graph:
        trainer = self.trainer
        batch = dataclasses.replace(
            p, lengths=p.lengths.clone(), mel=p.mel.clone(), mel_lengths=p.mel_lengths.clone()
        )
        m = memory.detach().clone().requires_grad_()
        q = processed.detach().clone().requires_grad_()

        def body() -> tuple[dict[str, Tensor], Tensor, Tensor]:
            with trainer._autocast(cache=False):
                out = decode(trainer.model, m, q, batch)
            parts = trainer._losses(out, batch)
            grads = torch.autograd.grad(parts["loss"], [*self.inner, m, q])
            for buf, grad in zip(self.grads, grads, strict=False):
                buf.copy_(grad)
            return {k: v.detach() for k, v in parts.items()}, grads[-2], grads[-1]

        side = torch.cuda.Stream()  # one eager run first (cuBLAS and cuDNN set themselves up)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            body()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            parts, memory_grad, processed_grad = body()
        return _Graph(graph, batch, m, q, parts, memory_grad, processed_grad)
