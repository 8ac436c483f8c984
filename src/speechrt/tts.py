"""Text-to-speech pipeline: text -> ids -> mel -> audio, batched, per-item deterministic.

normalize/split -> text_to_ids -> ids_to_mel (acoustic) -> mel_to_audio (vocoder) -> denoise

On the onnx backend (what `auto` picks on a CPU when the model directories hold their ONNX graphs,
as the bundled voice's do) the stages run on numpy arrays and torch is never imported; on eager
and cuda they run on torch tensors on the pipeline's device.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speechrt.errors import MaxDecoderStepsWarning, SpeechRTError
from speechrt.front_end import (  # noqa: F401  (re-exported: the voice's text front end)
    MAX_PIECE_CHARS,
    MAX_PIECE_SYMBOLS,
    piece_symbols,
    text_to_pieces,
)
from speechrt.options import SynthesisOptions
from speechrt.pieces import (  # noqa: F401  (re-exported: the pipeline's units)
    PAUSE_SECONDS,
    Piece,
    Span,
    TimedAudio,
    join_pieces,
    piece_seed,
    piece_words,
    word_times,
)
from speechrt.repo import ComponentInfo, read_info
from speechrt.runtime.base import Runner
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.stages import AcousticStage, TTSStages, VocoderStage, numpy_stages

if TYPE_CHECKING:
    import torch

# A stream's first audio: the first piece's first this-many mel frames (~0.37 s at 22.05 kHz
# and hop 256), vocoded on their own (with real right context: no seam) and sent while the rest
# of the piece is vocoded; it outlasts vocoding the rest of a piece many times over on a CPU
STREAM_HEAD_FRAMES = 32


def check_role(model_dir: str | Path, info: ComponentInfo, role: str) -> None:
    """Without building the module: an acoustic model's main graph outputs a mel, a vocoder's
    turns a mel into audio (the modules' `role`, told from the registry's contracts)."""
    from speechrt.registry import contract, graphs_of

    c = contract(next(iter(graphs_of(info.kind))), info.dims)
    is_role = {"acoustic": "mel" in c.output_names, "vocoder": "audio" in c.output_names}
    if not is_role[role]:
        raise SpeechRTError(f"{model_dir}: a {info.kind} model is not an {role} model")


class TTS:
    """A voice: acoustic model + vocoder (+ optional denoiser), loaded from model directories."""

    def __init__(
        self,
        acoustic: str | Path | None = None,
        vocoder: str | Path | None = None,
        device: str = "auto",
        precision: str = "fp32",
        backend: str = "auto",
        buckets: Buckets | None = None,
    ) -> None:
        """Model directories (neither: the bundled default voice, speechrt.defaults);
        `backend`: eager, cuda, onnx or auto (default; speechrt.runtime.resolve_backend: cuda
        on a GPU, else onnx where both directories hold their main ONNX graph, else eager).
        Every backend runs the same stages over the components' graphs
        (speechrt.runtime.graphs); eager calls them as-is."""
        from speechrt.defaults import voice_dirs, voice_name
        from speechrt.runtime import device_kind, resolve_backend
        from speechrt.text import TextProcessor

        acoustic, vocoder = voice_dirs(acoustic, vocoder)
        self.name = voice_name(acoustic)  # "default" for the bundled voice
        self.precision = precision
        dirs = [acoustic, vocoder]
        self.backend = resolve_backend(backend, device_kind(device), dirs, main_only=True)
        self.acoustic_dir, self.vocoder_dir = Path(acoustic), Path(vocoder)
        infos = [read_info(d) for d in dirs]
        # the loaded nn.Modules, checked by role (None on numpy stages); the stages run graphs
        self.acoustic: Any
        self.vocoder: Any
        self.numpy = numpy_stages(self.backend, [i.kind for i in infos])
        if self.numpy:
            self.device: Any = device_kind(device) if device == "auto" else device
            self.dtype: Any = None
            if precision != "fp32":
                raise SpeechRTError("the onnx backend runs the exported float32 graphs: use fp32")
            for d, info, role in zip(dirs, infos, ("acoustic", "vocoder"), strict=True):
                check_role(d, info, role)
            self.acoustic, self.acoustic_info = None, infos[0]
            self.vocoder, self.vocoder_info = None, infos[1]
        else:
            import torch

            from speechrt.device import resolve_device, resolve_precision

            self.device = resolve_device(device)
            self.dtype = resolve_precision(precision)
            # Runners start from float32 weights (cuda casts what it runs in half; onnx: fp32).
            load_dtype = self.dtype if self.backend == "eager" else torch.float32
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
            numpy=self.numpy,
        )

    def _load(
        self, model_dir: str | Path, role: str, dtype: torch.dtype
    ) -> tuple[torch.nn.Module, ComponentInfo]:
        from speechrt.repo import load_component

        model, info = load_component(model_dir, self.device, dtype)
        if getattr(model, "role", None) != role:
            raise SpeechRTError(f"{model_dir}: a {info.kind} model is not an {role} model")
        return model, info

    def runners(self) -> dict[str, Runner]:
        """{graph name: runner} of every graph its stages run (the /v2 component models share
        them: one copy of each graph, whatever the route)."""
        return self.stages.runners()

    @property
    def denoiser_missing(self) -> str | None:
        """Why this voice cannot denoise (options.denoise > 0), or None when it can."""
        return self.stages.denoiser_missing

    @property
    def sampling_rate(self) -> int:
        return self.mel.sampling_rate

    @property
    def n_speakers(self) -> int:
        """Speaker ids 0 .. n_speakers - 1 (SynthesisOptions.speaker) of a multi-speaker model."""
        return int(self.acoustic_info.dims.get("n_speakers", 1))

    # -- stages --------------------------------------------------------------------------------

    def text_to_pieces(
        self,
        texts: Sequence[str],
        seeds: Sequence[int],
        words: bool = False,
        max_symbols: int | None = None,
        pace: float = 1.0,
    ) -> list[Piece]:
        """The voice's text front end (module function text_to_pieces)."""
        return text_to_pieces(self.text, texts, seeds, words, max_symbols, pace)

    # Stage functions, each timed separately by the benchmark; tensors stay on the device.

    def batch_to_tensors(self, batch: list[Piece]) -> tuple[Any, ...]:
        """Pieces -> ids (B, L) zero-padded, lengths (B,), seeds (B,) int64: numpy arrays on
        numpy stages, else torch tensors on the host. Runners move them where they run: a
        replayed CUDA graph copies each into its own buffers, with no kernel launched to pad
        or fill them on the device."""
        lengths = np.array([len(p.ids) for p in batch], dtype=np.int64)
        ids = np.zeros((len(batch), int(lengths.max())), dtype=np.int64)
        for i, p in enumerate(batch):
            ids[i, : len(p.ids)] = p.ids
        seeds = np.array([p.seed for p in batch], dtype=np.int64)
        if self.numpy:
            return ids, lengths, seeds
        import torch

        return torch.from_numpy(ids), torch.from_numpy(lengths), torch.from_numpy(seeds)

    def ids_to_mel(
        self, ids: Any, lengths: Any, options: SynthesisOptions, seeds: Any
    ) -> tuple[Any, Any]:
        """ids (B, L), lengths (B,) -> mel (B, n_mels, T) float32, mel_lengths (B,)"""
        return self.stages.acoustic(ids, lengths, options, seeds)

    def mel_to_audio(
        self, mel: Any, mel_lengths: Any, options: SynthesisOptions, seeds: Any
    ) -> tuple[Any, Any]:
        """mel (B, n_mels, T) -> audio (B, S) float32, audio_lengths (B,)"""
        return self.stages.vocoder(mel, mel_lengths, options, seeds)

    def denoise(self, audio: Any, audio_lengths: Any, strength: float) -> Any:
        """audio (B, S) -> audio (B, S) with the vocoder's bias spectrum subtracted."""
        return self.stages.denoiser(audio, audio_lengths, strength)

    @staticmethod
    def to_numpy(audio: Any, audio_lengths: Any) -> list[np.ndarray]:
        """The one device -> host copy: (B, S) -> B waveforms trimmed to their lengths, each a
        row of one clipped host batch (views: no copy per item)."""
        return TTS.to_numpy_later(audio, audio_lengths)()

    @staticmethod
    def to_numpy_later(audio: Any, audio_lengths: Any) -> Callable[[], list[np.ndarray]]:
        """to_numpy in two steps: the copy is queued now (speechrt.device.to_host_later), the
        function returned waits for it and cuts the waveforms."""

        def cut(host: np.ndarray, n: np.ndarray) -> list[np.ndarray]:
            return [host[i, : int(k)] for i, k in enumerate(n.tolist())]

        if isinstance(audio, np.ndarray):  # (the numpy runners: no torch here)
            host, n = np.clip(audio, -1.0, 1.0), np.asarray(audio_lengths)
            return lambda: cut(host, n)
        from speechrt.device import to_host_later

        fetch = to_host_later(audio.clamp(-1.0, 1.0).float(), audio_lengths)
        return lambda: cut(*fetch())

    def ids_to_audio(
        self,
        batch: list[Piece],
        options: SynthesisOptions,
        on_head: Callable[[list[np.ndarray]], None] | None = None,
    ) -> list[np.ndarray]:
        """One padded batch through acoustic -> vocoder (-> denoiser); audio trimmed per item.

        `on_head(heads)`: where the vocoder runs in spans (a plain vocoder, no denoising) and
        every item is long enough, it hears each item's first STREAM_HEAD_FRAMES frames of
        audio before the rest is vocoded (each heads[i] is the start of the item's result, equal
        to one call's audio within float rounding); else it is not called."""
        if self.numpy:
            return self._ids_to_audio(batch, options, on_head=on_head)
        import torch

        with torch.inference_mode():
            return self._ids_to_audio(batch, options, on_head=on_head)

    def ids_to_audio_later(
        self, batch: list[Piece], options: SynthesisOptions
    ) -> Callable[[], list[np.ndarray]]:
        """ids_to_audio in two steps: the batch runs and its audio's copy to the host is queued
        now; the function returned waits for the copy and gives the waveforms. Between the two a
        server can start the next batch, which a GPU then runs as soon as this one is done."""
        if self.numpy:
            return self._ids_to_audio(batch, options, later=True)
        import torch

        with torch.inference_mode():
            return self._ids_to_audio(batch, options, later=True)

    @property
    def has_durations(self) -> bool:
        """Whether the acoustic model says how many frames each symbol gets (FastPitch)."""
        stage = self.stages.acoustic
        return (
            isinstance(stage, AcousticStage) and "durations" in stage.runner.contract.output_names
        )

    def ids_to_timed_audio(self, batch: list[Piece], options: SynthesisOptions) -> list[TimedAudio]:
        """ids_to_audio, with the mel frames each symbol got (the acoustic model's durations,
        rounded as its length regulator rounds them: floor(d / pace + 0.5))."""
        if not self.has_durations:
            raise SpeechRTError(
                f"word times need an acoustic model that outputs durations (FastPitch); "
                f"{self.acoustic_info.kind} does not"
            )
        if self.numpy:
            return self._ids_to_audio(batch, options, timed=True)
        import torch

        with torch.inference_mode():
            return self._ids_to_audio(batch, options, timed=True)

    def _ids_to_audio(
        self,
        batch: list[Piece],
        options: SynthesisOptions,
        timed: bool = False,
        on_head: Callable[[list[np.ndarray]], None] | None = None,
        later: bool = False,
    ) -> Any:
        """The batch's waveforms (timed: TimedAudio; later: a function that gives them)."""
        ids, lengths, seeds = self.batch_to_tensors(batch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", MaxDecoderStepsWarning)
            if timed:
                stage = self.stages.acoustic
                assert isinstance(stage, AcousticStage)  # ids_to_timed_audio: has_durations
                out = stage.outputs(ids, lengths, options, seeds)
                mel, mel_lengths, durations = out["mel"], out["mel_lengths"], out["durations"]
            else:
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
        if (
            on_head is not None
            and options.denoise == 0
            and isinstance(self.stages.vocoder, VocoderStage)
        ):
            h = STREAM_HEAD_FRAMES

            def heard(head: Any) -> None:  # head: (B, h * hop)
                on_head(self.to_numpy(head, np.full(len(batch), head.shape[1])))

            audio, audio_lengths = self.stages.vocoder(mel, mel_lengths, options, seeds, (h, heard))
        else:
            audio, audio_lengths = self.mel_to_audio(mel, mel_lengths, options, seeds)
        if options.denoise > 0:
            audio = self.denoise(audio, audio_lengths, options.denoise)
        if later:
            return self.to_numpy_later(audio, audio_lengths)
        waves = self.to_numpy(audio, audio_lengths)
        if not timed:
            return waves
        d = durations if isinstance(durations, np.ndarray) else durations.float().cpu().numpy()
        pace = np.float32(options.pace)
        frames = np.floor(d.astype(np.float32) / pace + np.float32(0.5)).astype(np.int64)  # (B, L)
        n_frames = np.asarray(mel_lengths.tolist())
        timed_audio = []
        for i, (wave, piece) in enumerate(zip(waves, batch, strict=True)):
            mine = frames[i, : len(piece.ids)]
            if int(mine.sum()) != int(n_frames[i]):  # the regulator rounded otherwise
                raise SpeechRTError(
                    f"durations give {int(mine.sum())} frames, the mel has {int(n_frames[i])}"
                )
            timed_audio.append(TimedAudio(wave, mine))
        return timed_audio

    def synthesize_with_words(
        self, text: str, options: SynthesisOptions | None = None, batch_size: int = 8
    ) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """text -> (waveform as synthesize([text]) gives it, [{word, start, end}] in seconds):
        the words as the text front end spells them, timed by the acoustic model's durations."""
        options = options or SynthesisOptions()
        pieces = self.text_to_pieces([text], [options.seed], words=True, pace=options.pace)
        timed: list[TimedAudio] = []
        start = 0
        while start < len(pieces):  # batches of consecutive pieces read alike
            end = start + 1
            while end < min(len(pieces), start + batch_size) and _alike(pieces[end], pieces[start]):
                end += 1
            timed += self.ids_to_timed_audio(pieces[start:end], pieces[start].options(options))
            start = end
        words = word_times(pieces, timed, self.mel.hop_length, self.sampling_rate)
        return join_pieces(pieces, [t.audio for t in timed], self.sampling_rate), words

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
        pieces = self.text_to_pieces(texts, seeds, pace=options.pace)
        # Length-sorted batches keep padding small (pieces read alike batch together: SSML
        # prosody); results are put back in order below.
        order = sorted(
            range(len(pieces)), key=lambda k: (*_reading(pieces[k]), -len(pieces[k].ids))
        )
        audio: dict[int, np.ndarray] = {}
        for _, group in itertools.groupby(order, key=lambda k: _reading(pieces[k])):
            same = list(group)
            for start in range(0, len(same), batch_size):
                idx = same[start : start + batch_size]
                batch = [pieces[k] for k in idx]
                for k, wav in zip(
                    idx, self.ids_to_audio(batch, batch[0].options(options)), strict=True
                ):
                    audio[k] = wav
                if progress:
                    progress(len(idx))
        return [
            join_pieces(
                [p for p in pieces if p.item == i],
                [audio[k] for k, p in enumerate(pieces) if p.item == i],
                self.sampling_rate,
            )
            for i in range(len(texts))
        ]


def _reading(piece: Piece) -> tuple[float, float]:
    return piece.rate, piece.pitch


def _alike(a: Piece, b: Piece) -> bool:
    return _reading(a) == _reading(b)
