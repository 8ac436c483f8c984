"""Text-to-speech pipeline: text -> ids -> mel -> audio, batched, per-item deterministic.

normalize/split -> text_to_ids -> ids_to_mel (acoustic) -> mel_to_audio (vocoder) -> denoise
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speechrt.device import resolve_device, resolve_precision
from speechrt.errors import MaxDecoderStepsWarning, SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.repo import ComponentInfo, load_component
from speechrt.runtime.base import Runner
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.stages import TTSStages

MAX_PIECE_CHARS = 300  # long input is split at sentence boundaries into pieces of at most this
# ... and a piece whose normalised form is longer ("12345" reads as 40 symbols) is cut at spaces
# into pieces of at most this many symbol ids: about 30 s of speech, what the model reads at once
MAX_PIECE_SYMBOLS = 400
PAUSE_SECONDS = 0.2  # silence inserted between the pieces of one text


@dataclass
class Piece:
    """One sentence-sized unit of work: item `item` of the request, piece `index` within it."""

    item: int
    index: int
    ids: list[int]
    seed: int


def piece_seed(item_seed: int, index: int) -> int:
    # Pieces of one text draw independent noise; the same (seed, index) always gives the same draw.
    return (item_seed * 1_000_003 + index) % (2**63 - 1)


class TTS:
    """A voice: acoustic model + vocoder (+ optional denoiser), loaded from model directories."""

    def __init__(
        self,
        acoustic: str | Path | None = None,
        vocoder: str | Path | None = None,
        device: str = "auto",
        precision: str = "fp32",
        backend: str = "eager",
        buckets: Buckets | None = None,
    ) -> None:
        """Model directories (neither: the bundled default voice, speechrt.defaults);
        `backend`: eager, cuda, onnx or auto (speechrt.runtime). Every backend runs the same
        stages over the components' graphs (speechrt.runtime.graphs); eager calls them as-is."""
        from speechrt.defaults import voice_dirs
        from speechrt.runtime import resolve_backend
        from speechrt.text import TextProcessor

        acoustic, vocoder = voice_dirs(acoustic, vocoder)

        self.device = resolve_device(device)
        self.dtype = resolve_precision(precision)
        self.precision = precision
        self.backend = resolve_backend(backend, self.device.type, [acoustic, vocoder])
        self.acoustic_dir, self.vocoder_dir = Path(acoustic), Path(vocoder)
        # Runners start from float32 weights (cuda casts what it runs in half; onnx is float32).
        load_dtype = self.dtype if self.backend == "eager" else torch.float32
        # the loaded nn.Modules, checked by role; the stages run their graphs
        self.acoustic: Any
        self.vocoder: Any
        self.acoustic, self.acoustic_info = self._load(acoustic, "acoustic", load_dtype)
        self.vocoder, self.vocoder_info = self._load(vocoder, "vocoder", load_dtype)
        if self.acoustic_info.mel is None or self.vocoder_info.mel is None:
            raise SpeechRTError("acoustic model or vocoder lacks a mel config in its model.json")
        self.acoustic_info.mel.check_matches(self.vocoder_info.mel)
        self.mel = self.vocoder_info.mel
        self.text = TextProcessor.from_meta(self.acoustic_info.meta)
        self.stages = TTSStages(
            self.backend,
            self.device,
            precision,
            (self.acoustic, self.acoustic_info, acoustic),
            (self.vocoder, self.vocoder_info, vocoder),
            buckets,
        )

    def _load(
        self, model_dir: str | Path, role: str, dtype: torch.dtype
    ) -> tuple[torch.nn.Module, ComponentInfo]:
        model, info = load_component(model_dir, self.device, dtype)
        if getattr(model, "role", None) != role:
            raise SpeechRTError(f"{model_dir}: a {info.kind} model is not an {role} model")
        return model, info

    def runners(self) -> dict[str, Runner]:
        """{graph name: runner} of every graph its stages run (the /v2 component models share
        them: one copy of each graph, whatever the route)."""
        return self.stages.runners()

    @property
    def sampling_rate(self) -> int:
        return self.mel.sampling_rate

    # -- stages --------------------------------------------------------------------------------

    def text_to_pieces(self, texts: Sequence[str], seeds: Sequence[int]) -> list[Piece]:
        """Split each text into sentence pieces and encode them to symbol ids: every piece has
        at most MAX_PIECE_SYMBOLS ids, however much normalisation lengthened its text."""
        from speechrt.text import split_sentences

        pieces = []
        for item, (text, seed) in enumerate(zip(texts, seeds, strict=True)):
            if not isinstance(text, str) or not text.strip():
                raise SpeechRTError(f"text {item + 1} is empty")
            parts = split_sentences(text, MAX_PIECE_CHARS)
            encoded = [
                ids
                for p in parts
                if self.text.has_speech(p)
                for ids in self.text.encode_pieces(p, MAX_PIECE_SYMBOLS)
            ]
            if not encoded:
                raise SpeechRTError(f"text {item + 1} has nothing to speak: {text[:40]!r}")
            pieces += [Piece(item, j, ids, piece_seed(seed, j)) for j, ids in enumerate(encoded)]
        return pieces

    # Stage functions, each timed separately by the benchmark; tensors stay on the device.

    def batch_to_tensors(self, batch: list[Piece]) -> tuple[torch.Tensor, ...]:
        """Pieces -> ids (B, L) zero-padded, lengths (B,), seeds (B,), on the device."""
        lengths = torch.tensor([len(p.ids) for p in batch], dtype=torch.long)
        ids = torch.zeros(len(batch), int(lengths.max()), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, : len(p.ids)] = torch.tensor(p.ids)
        seeds = torch.tensor([p.seed for p in batch], dtype=torch.long)
        return ids.to(self.device), lengths.to(self.device), seeds

    def ids_to_mel(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        options: SynthesisOptions,
        seeds: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, L), lengths (B,) -> mel (B, n_mels, T) float32, mel_lengths (B,)"""
        return self.stages.acoustic(ids, lengths, options, seeds)

    def mel_to_audio(
        self, mel: torch.Tensor, mel_lengths: torch.Tensor, options: SynthesisOptions, seeds
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """mel (B, n_mels, T) -> audio (B, S) float32, audio_lengths (B,)"""
        return self.stages.vocoder(mel, mel_lengths, options, seeds)

    def denoise(
        self, audio: torch.Tensor, audio_lengths: torch.Tensor, strength: float
    ) -> torch.Tensor:
        """audio (B, S) -> audio (B, S) with the vocoder's bias spectrum subtracted."""
        return self.stages.denoiser(audio, audio_lengths, strength)

    @staticmethod
    def to_numpy(audio: torch.Tensor, audio_lengths: torch.Tensor) -> list[np.ndarray]:
        """The one device -> host copy: (B, S) -> B waveforms trimmed to their lengths."""
        host = audio.clamp(-1.0, 1.0).cpu().numpy()
        return [host[i, : int(n)].copy() for i, n in enumerate(audio_lengths.tolist())]

    @torch.inference_mode()
    def ids_to_audio(self, batch: list[Piece], options: SynthesisOptions) -> list[np.ndarray]:
        """One padded batch through acoustic -> vocoder (-> denoiser); audio trimmed per item."""
        ids, lengths, seeds = self.batch_to_tensors(batch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", MaxDecoderStepsWarning)
            mel, mel_lengths = self.ids_to_mel(ids, lengths, options, seeds)
        for w in caught:
            if isinstance(w.message, MaxDecoderStepsWarning) and 0 <= w.message.item < len(batch):
                p = batch[w.message.item]
                warnings.warn(
                    MaxDecoderStepsWarning(
                        f"text {p.item + 1}, sentence {p.index + 1}: the acoustic model reached "
                        "its max decoder steps before its stop gate fired; its audio is cut there",
                        item=p.item,
                    ),
                    stacklevel=2,
                )
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        audio, audio_lengths = self.mel_to_audio(mel, mel_lengths, options, seeds)
        if options.denoise > 0:
            audio = self.denoise(audio, audio_lengths, options.denoise)
        return self.to_numpy(audio, audio_lengths)

    def synthesize(
        self,
        texts: Sequence[str],
        options: SynthesisOptions | None = None,
        batch_size: int = 8,
        seeds: Sequence[int] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[np.ndarray]:
        """texts -> one float32 waveform in [-1, 1] per text, at `self.sampling_rate`.

        Item i draws its randomness from seeds[i] (default options.seed + i), so its audio does not
        depend on the other items. `progress(n)` is called with the number of pieces done per batch.
        """
        if isinstance(texts, str):
            raise SpeechRTError("texts must be a list of strings, e.g. synthesize([text])")
        options = options or SynthesisOptions()
        if batch_size < 1:
            raise SpeechRTError(f"batch size must be >= 1, got {batch_size}")
        seeds = list(seeds) if seeds is not None else [options.seed + i for i in range(len(texts))]
        pieces = self.text_to_pieces(texts, seeds)
        # Length-sorted batches keep padding small; results are put back in order below.
        order = sorted(range(len(pieces)), key=lambda k: len(pieces[k].ids), reverse=True)
        audio: dict[int, np.ndarray] = {}
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            for k, wav in zip(
                idx, self.ids_to_audio([pieces[k] for k in idx], options), strict=True
            ):
                audio[k] = wav
            if progress:
                progress(len(idx))
        pause = np.zeros(int(PAUSE_SECONDS * self.sampling_rate), dtype=np.float32)
        out: list[list[np.ndarray]] = [[] for _ in texts]
        for k, p in enumerate(pieces):
            out[p.item] += [pause, audio[k]] if out[p.item] else [audio[k]]
        return [np.concatenate(parts) for parts in out]
