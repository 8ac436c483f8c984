"""Tacotron 2 (NVIDIA DeepLearningExamples): text ids -> mel spectrogram, autoregressive.

Three components, split as DLE's TensorRT export splits them, each a pure tensor function:

    encoder   sequences (B, L), sequence_lengths (B,) -> memory (B, L, E), processed_memory
    decoder   one step: DECODER_INPUTS -> DECODER_OUTPUTS (prenet dropout masks are an input)
    postnet   mel_outputs (B, n_mels, T) [, mel_lengths (B,)] -> mel_outputs_postnet

`generate_mel` drives the step on the host. The prenet dropout (p 0.5) stays on at inference as in
DLE; item i draws its masks from torch.Generator(seeds[i]) on the CPU: per decoder step one (2,
prenet_dim) block of uniforms u, mask = 2 * (u >= 0.5). Stopping is per item, as DLE at batch
size 1: an item whose stop gate (sigmoid > gate_threshold) first fires at step k has mel length
k - 1, and the postnet sees its k generated frames. Finished items leave the active batch. Where
DLE lets padding leak across items (encoder and postnet convolutions) we mask, so a batched item
equals the item run alone, which equals DLE at batch size 1 given the same dropout masks.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from speechrt.arch.tacotron2 import Tacotron2Dims
from speechrt.errors import MaxDecoderStepsWarning, SpeechRTError
from speechrt.models.inputs import check_ids
from speechrt.options import SynthesisOptions

PRENET_DROPOUT = 0.5  # DLE hard-codes it, training=True
MASK_CHUNK = 64  # decoder steps of dropout masks drawn per generator call (same stream as 1/step)

# The components' tensor contracts (names as DLE's ONNX export; prenet_masks is ours).
ENCODER_INPUTS = ("sequences", "sequence_lengths")
ENCODER_OUTPUTS = ("memory", "processed_memory")
STATE_NAMES = (
    "attention_hidden",  # (B, attention_rnn_dim)
    "attention_cell",  # (B, attention_rnn_dim)
    "decoder_hidden",  # (B, decoder_rnn_dim)
    "decoder_cell",  # (B, decoder_rnn_dim)
    "attention_weights",  # (B, T_in)
    "attention_weights_cum",  # (B, T_in)
    "attention_context",  # (B, encoder_embedding_dim)
)
DECODER_INPUTS = (
    ("decoder_input",)  # (B, n_mels): the previous frame (zeros at step 1)
    + STATE_NAMES
    + ("memory", "processed_memory", "mask", "prenet_masks")  # mask (B, T_in) bool, True = pad
)
DECODER_OUTPUTS = ("decoder_output", "gate_prediction") + tuple(f"out_{n}" for n in STATE_NAMES)
POSTNET_INPUTS = ("mel_outputs", "mel_lengths")
POSTNET_OUTPUTS = ("mel_outputs_postnet",)


def _length_mask(lengths: Tensor, size: int) -> Tensor:
    """lengths (B,) -> (B, size) bool, True at valid positions."""
    return torch.arange(size, device=lengths.device) < lengths.unsqueeze(1)


class Encoder(nn.Module):
    """sequences (B, L), sequence_lengths (B,) -> memory (B, L, E), processed_memory (B, L, A).

    Embedding -> n x [conv (BatchNorm folded) -> ReLU] -> BiLSTM over packed sequences -> memory;
    processed_memory = the attention's memory projection, computed once per utterance.
    """

    def __init__(self, d: Tacotron2Dims) -> None:
        super().__init__()
        if d.symbols_embedding_dim != d.encoder_embedding_dim:
            raise SpeechRTError("tacotron2: symbols_embedding_dim must equal encoder_embedding_dim")
        e, k = d.encoder_embedding_dim, d.encoder_kernel_size
        self.embedding = nn.Embedding(d.n_symbols, e)
        self.convs = nn.ModuleList(
            nn.Conv1d(e, e, k, padding=(k - 1) // 2) for _ in range(d.encoder_n_convolutions)
        )
        self.lstm = nn.LSTM(e, e // 2, 1, batch_first=True, bidirectional=True)
        self.memory_layer = nn.Linear(e, d.attention_dim, bias=False)

    def forward(self, sequences: Tensor, sequence_lengths: Tensor) -> tuple[Tensor, Tensor]:
        x = self.embedding(sequences).transpose(1, 2)  # (B, E, L)
        keep = _length_mask(sequence_lengths, x.shape[2]).unsqueeze(1).to(x.dtype)
        for conv in self.convs:  # padding is zeroed before each conv: batch-independent
            x = F.relu(conv(x * keep))
        packed = pack_padded_sequence(
            x.transpose(1, 2), sequence_lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        out, _ = self.lstm(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[2])
        return memory, self.memory_layer(memory)


class DecoderStep(nn.Module):
    """One decoder step, DECODER_INPUTS -> DECODER_OUTPUTS; pure given `prenet_masks` (B, 2, P)."""

    def __init__(self, d: Tacotron2Dims) -> None:
        super().__init__()
        e, a, p = d.encoder_embedding_dim, d.attention_dim, d.prenet_dim
        self.prenet = nn.ModuleList(
            [nn.Linear(d.n_mel_channels, p, bias=False), nn.Linear(p, p, bias=False)]
        )
        self.attention_rnn = nn.LSTMCell(p + e, d.attention_rnn_dim)
        self.query_layer = nn.Linear(d.attention_rnn_dim, a, bias=False)
        k = d.attention_location_kernel_size
        n_filters = d.attention_location_n_filters
        self.location_conv = nn.Conv1d(2, n_filters, k, padding=(k - 1) // 2, bias=False)
        self.location_dense = nn.Linear(n_filters, a, bias=False)
        self.v = nn.Linear(a, 1, bias=False)
        self.decoder_rnn = nn.LSTMCell(d.attention_rnn_dim + e, d.decoder_rnn_dim)
        self.linear_projection = nn.Linear(d.decoder_rnn_dim + e, d.n_mel_channels)
        self.gate_layer = nn.Linear(d.decoder_rnn_dim + e, 1)

    def forward(
        self,
        decoder_input: Tensor,
        attention_hidden: Tensor,
        attention_cell: Tensor,
        decoder_hidden: Tensor,
        decoder_cell: Tensor,
        attention_weights: Tensor,
        attention_weights_cum: Tensor,
        attention_context: Tensor,
        memory: Tensor,
        processed_memory: Tensor,
        mask: Tensor,
        prenet_masks: Tensor,
    ) -> tuple[Tensor, ...]:
        x = decoder_input
        for i, linear in enumerate(self.prenet):  # dropout as explicit masks (0 or 1 / (1 - p))
            x = F.relu(linear(x)) * prenet_masks[:, i]
        h, c = self.attention_rnn(
            torch.cat((x, attention_context), -1), (attention_hidden, attention_cell)
        )
        # location-sensitive attention over the memory
        prev = torch.stack((attention_weights, attention_weights_cum), 1)  # (B, 2, T_in)
        location = self.location_dense(self.location_conv(prev).transpose(1, 2))  # (B, T_in, A)
        query = self.query_layer(h).unsqueeze(1)  # (B, 1, A)
        energies = self.v(torch.tanh(query + location + processed_memory)).squeeze(2)
        weights = F.softmax(energies.masked_fill(mask, float("-inf")), dim=1)  # (B, T_in)
        context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)  # (B, E)
        weights_cum = attention_weights_cum + weights
        dh, dc = self.decoder_rnn(torch.cat((h, context), -1), (decoder_hidden, decoder_cell))
        hc = torch.cat((dh, context), 1)
        return (self.linear_projection(hc), self.gate_layer(hc), h, c, dh, dc, weights,
                weights_cum, context)  # fmt: skip


class Postnet(nn.Module):
    """mel_outputs (B, n_mels, T) [, mel_lengths (B,)] -> mel_outputs_postnet (B, n_mels, T).

    n x conv (BatchNorm folded), tanh after all but the last, added to the input. With
    mel_lengths, frames beyond each item's length are zeroed before every conv.
    """

    def __init__(self, d: Tacotron2Dims) -> None:
        super().__init__()
        n, c, k = d.postnet_n_convolutions, d.postnet_embedding_dim, d.postnet_kernel_size
        sizes = [d.n_mel_channels] + [c] * (n - 1) + [d.n_mel_channels]
        self.convs = nn.ModuleList(
            nn.Conv1d(i, o, k, padding=(k - 1) // 2)
            for i, o in zip(sizes[:-1], sizes[1:], strict=True)
        )

    def forward(self, mel_outputs: Tensor, mel_lengths: Tensor | None = None) -> Tensor:
        keep = None
        if mel_lengths is not None:
            keep = _length_mask(mel_lengths, mel_outputs.shape[2]).unsqueeze(1)
            keep = keep.to(mel_outputs.dtype)
        x = mel_outputs
        for i, conv in enumerate(self.convs):
            x = conv(x if keep is None else x * keep)
            if i < len(self.convs) - 1:
                x = torch.tanh(x)
        return mel_outputs + x


class _PrenetMasks:
    """Per-item dropout mask streams: item i draws from torch.Generator(seed_i) on the CPU."""

    def __init__(self, seeds: list[int], dim: int, dtype: torch.dtype, device: torch.device):
        self.gens = [torch.Generator().manual_seed(s) for s in seeds]
        self.dim, self.dtype, self.device = dim, dtype, device
        self.chunk = torch.empty(0)  # (B_active, MASK_CHUNK, 2, dim)

    def next(self, step: int, active: list[int]) -> Tensor:
        """Masks of decoder step `step` (0-based) for the active items: (B_active, 2, dim)."""
        if step % MASK_CHUNK == 0:
            u = torch.stack(
                [torch.rand(MASK_CHUNK, 2, self.dim, generator=self.gens[i]) for i in active]
            )
            keep = (u >= PRENET_DROPOUT).to(self.dtype) * (1.0 / (1.0 - PRENET_DROPOUT))
            if self.device.type == "cuda":  # pinned: the copy does not wait for the device
                keep = keep.pin_memory()
            self.chunk = keep.to(self.device, non_blocking=True)
        return self.chunk[:, step % MASK_CHUNK]

    def select(self, rows: Tensor) -> None:
        """Keep only these rows of the active batch (rows: (B_kept,) int64)."""
        self.chunk = self.chunk[rows.to(self.chunk.device)]


class Tacotron2(nn.Module):
    """DLE Tacotron 2: encoder, decoder step and postnet, driven by `generate_mel`."""

    kind = "tacotron2"
    role = "acoustic"
    Dims = Tacotron2Dims

    def __init__(self, dims: Tacotron2Dims) -> None:
        super().__init__()
        self.dims = dims
        self.encoder = Encoder(dims)
        self.decoder = DecoderStep(dims)
        self.postnet = Postnet(dims)

    def initial_state(self, memory: Tensor) -> tuple[Tensor, ...]:
        """Zero decoder state (STATE_NAMES order) for memory (B, T_in, E)."""
        b, t, e = memory.shape
        d = self.dims
        z = memory.new_zeros
        return (z(b, d.attention_rnn_dim), z(b, d.attention_rnn_dim), z(b, d.decoder_rnn_dim),
                z(b, d.decoder_rnn_dim), z(b, t), z(b, t), z(b, e))  # fmt: skip

    @torch.no_grad()
    def generate_mel(
        self,
        ids: Tensor,
        lengths: Tensor,
        options: SynthesisOptions,
        seeds: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """ids (B, L), lengths (B,) -> mel (B, n_mels, T) zero-padded, mel_lengths (B,) int64.

        Outputs are in the caller's order. seeds (B,): dropout seeds (None: options.seed + i).
        """
        ids, lengths = check_ids(ids, lengths, self.dims.n_symbols)
        b = ids.shape[0]
        item_seeds = _item_seeds(seeds, options, b)
        max_steps = options.max_decoder_steps
        max_steps = self.dims.max_decoder_steps if max_steps is None else max_steps
        if max_steps < 1:
            raise SpeechRTError(f"tacotron2: max_decoder_steps must be >= 1, got {max_steps}")
        w = self.encoder.embedding.weight
        ids, lengths_dev = ids.to(w.device), lengths.to(w.device)
        memory, processed = self.encoder(ids, lengths_dev)
        mask = ~_length_mask(lengths_dev, memory.shape[1])
        state = self.initial_state(memory)
        masks = _PrenetMasks(item_seeds, self.dims.prenet_dim, w.dtype, w.device)
        frame = memory.new_zeros(b, self.dims.n_mel_channels)
        active = list(range(b))  # caller indices of the items still decoding
        n_frames = [0] * b  # frames generated per item (what its postnet sees)
        mel_lengths = [0] * b  # frames before the gate fired (DLE's mel_lengths)
        buf = memory.new_zeros(b, self.dims.n_mel_channels, min(max_steps, 256))
        for step in range(max_steps):
            out = self.decoder(frame, *state, memory, processed, mask, masks.next(step, active))
            frame, gate, state = out[0], out[1], out[2:]
            if step == buf.shape[2]:
                buf = torch.cat((buf, torch.zeros_like(buf)), 2)[:, :, :max_steps]
            buf[torch.tensor(active, device=buf.device), :, step] = frame
            stop = (torch.sigmoid(gate.float()) > self.dims.gate_threshold).squeeze(1).tolist()
            for row, i in enumerate(active):
                if stop[row]:
                    n_frames[i], mel_lengths[i] = step + 1, step
                elif step + 1 == max_steps:
                    n_frames[i] = mel_lengths[i] = max_steps
                    warnings.warn(
                        MaxDecoderStepsWarning(
                            f"tacotron2: item {i} reached max_decoder_steps ({max_steps}) "
                            "before its stop gate fired",
                            item=i,
                        ),
                        stacklevel=3,  # the caller of generate_mel (under no_grad)
                    )
            if any(stop):  # compact the active batch; trim memory to the longest still active
                rows = torch.tensor([r for r, s in enumerate(stop) if not s], device=w.device)
                active = [i for i, s in zip(active, stop, strict=True) if not s]
                if not active:
                    break
                t_in = int(lengths[active].max())
                # attention_weights(_cum) are exactly 0 beyond each item's length: safe to trim
                state = tuple(
                    s[rows, :t_in] if j in (4, 5) else s[rows] for j, s in enumerate(state)
                )
                frame, mask = frame[rows], mask[rows, :t_in]
                memory, processed = memory[rows, :t_in], processed[rows, :t_in]
                masks.select(rows)
        counts = torch.tensor(n_frames, device=w.device)
        out_lengths = torch.tensor(mel_lengths, dtype=torch.long)
        mel = self.postnet(buf[:, :, : max(n_frames)], counts)
        t_out = max(mel_lengths)
        mel = mel[:, :, :t_out] * _length_mask(out_lengths.to(w.device), t_out).unsqueeze(1)
        return mel, out_lengths.to(w.device)


def _item_seeds(seeds: Tensor | None, options: SynthesisOptions, b: int) -> list[int]:
    if seeds is None:
        return [options.seed + i for i in range(b)]
    if seeds.shape != (b,):
        raise SpeechRTError(f"seeds must have shape ({b},), got {tuple(seeds.shape)}")
    return [int(s) for s in seeds.tolist()]
