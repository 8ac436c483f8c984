"""Speech recognition pipeline: audio -> features -> log-probs -> CTC decoding -> timed words.

load_audio -> speech_segments (the speech regions that voice activity detection finds where the
model turns it on, long ones in overlapping windows; else fixed windows) -> features -> log_probs
-> decode

Decoding is greedy, or a CTC prefix beam search with a word n-gram LM (speechrt.asr.beam) when the
model directory holds one (lm.json + lm.safetensors) or one is given.

Each window is featurised on its own samples and the convolutions are masked, so an item's text
does not depend on its batch-mates. Windows are batched longest-first to keep padding small; a
window keeps the words whose centre lies in its own part of the audio (overlaps split midway).

On the onnx backend (what `auto` picks on a CPU when the model directory holds its ONNX graph, as
the bundled recogniser's does) features and log-probs are numpy arrays and torch is never
imported; on eager and cuda they are torch tensors on the pipeline's device.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speechrt.asr.beam import BeamOptions
from speechrt.asr.ctc import host
from speechrt.asr.decoding import Decoder, Heard, Segment, Transcript  # noqa: F401 (re-exported)
from speechrt.asr.head import Head, time_stride
from speechrt.asr.lm import NGramLM
from speechrt.asr.vad import VadOptions, cut, model_vad, speech_windows
from speechrt.audio.features import FeatureConfig, batch_features_numpy
from speechrt.audio.io import as_waveform
from speechrt.errors import SpeechRTError
from speechrt.repo import ComponentInfo, read_info
from speechrt.runtime.base import Runner

if TYPE_CHECKING:
    from speechrt.audio.telephone import BandFilter

AudioInput = np.ndarray | str | Path | bytes
DECODERS = ("auto", "greedy", "beam", "ctc")  # ctc: a hybrid transducer's CTC head

WINDOW_SECONDS = 20.0  # longer audio is cut into windows of this length ...
OVERLAP_SECONDS = 4.0  # ... overlapping by this much (each side keeps half of the overlap)


def _window_seed(seed: int, window: int) -> int:
    return (seed * 1_000_003 + window) % (2**63 - 1)


class ASR:
    """A speech recogniser loaded from a model directory (see `speechrt convert`)."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        device: str = "cpu",
        precision: str = "fp32",
        *,
        window: float | None = None,
        overlap: float = OVERLAP_SECONDS,
        dither: float | None = None,
        seed: int = 0,
        decode_padding: bool = True,
        backend: str = "auto",
        decoder: str = "auto",
        lm: str | Path | None = None,
        beam_size: int | None = None,
        alpha: float | None = None,
        beta: float | None = None,
        vad: bool | VadOptions | None = None,
    ) -> None:
        """`model_dir` None: the bundled default recogniser (speechrt.defaults). `dither`
        overrides the model's (0 = deterministic); noise is drawn per window from `seed`.
        `decode_padding` decodes the zero-padded tail frames too, as DLE inference.py does (at
        batch size 1); False decodes the valid frames only. `backend`: eager (the module),
        cuda, onnx or auto (default; speechrt.runtime.resolve_backend: cuda on a GPU, else
        onnx where the directory holds the ONNX graph, else eager) runs the acoustic model;
        the features are computed in numpy on onnx (no torch), else in torch
        (speechrt.runtime.featurizer: batched, and compiled on cuda).

        `decoder`: greedy; beam (CTC prefix beam search with a word LM: `lm`, a directory
        holding lm.json + lm.safetensors, else the model directory's own); auto (default): beam
        when there is an LM, else greedy; ctc: a hybrid transducer's CTC head, as auto (a
        transducer head decodes greedily, whatever LM lies beside it). `beam_size`, `alpha` (LM
        weight) and `beta` (word bonus) override the LM's tuned defaults (its lm.json).

        `vad`: transcribe only the speech that voice activity detection finds (speechrt.asr.vad)
        or all of the audio in fixed windows. None (default): as the model's model.json says
        (asr.vad.model_vad: off unless it turns the detector on, as the bundled recogniser's
        does); True / False: on / off whatever it says; VadOptions: on, with these."""
        from speechrt.defaults import asr_dir
        from speechrt.registry import contract, graphs_of
        from speechrt.runtime import device_kind, resolve_backend

        model_dir = asr_dir(model_dir)
        self.precision = precision
        self.backend = resolve_backend(backend, device_kind(device), [model_dir], main_only=True)
        self.model_dir = Path(model_dir)
        self.info: ComponentInfo = read_info(model_dir)
        # onnx: numpy arrays and no module; else an nn.Module of role "asr" and torch tensors
        self.numpy = self.backend == "onnx"
        self.model: Any = None
        if self.numpy:
            self.device: Any = device_kind(device) if device == "auto" else device
            self.dtype: Any = None
            main = next(iter(graphs_of(self.info.kind)))
            outputs = contract(main, self.info.dims).output_names
            if "log_probs" not in outputs and "joint_encoded" not in outputs:
                raise SpeechRTError(
                    f"{model_dir}: a {self.info.kind} model is not a speech recogniser"
                )
        else:
            import torch

            from speechrt.device import resolve_device, resolve_precision
            from speechrt.repo import load_component

            self.device = resolve_device(device)
            self.dtype = resolve_precision(precision)
            # Runners start from float32 weights (cuda casts what it runs; onnx is float32).
            load_dtype = self.dtype if self.backend == "eager" else torch.float32
            try:
                self.model, self.info = load_component(model_dir, self.device, load_dtype)
            except (TypeError, ValueError) as e:
                raise SpeechRTError(f"{model_dir}: corrupt model description ({e})") from None
            if getattr(self.model, "role", None) != "asr":
                raise SpeechRTError(
                    f"{model_dir}: a {self.info.kind} model is not a speech recogniser"
                )
        meta = self.info.meta
        try:
            self.labels: list[str] = [str(s) for s in meta["labels"]]
            self.features = FeatureConfig.from_dict(meta["features"])
            self.pad_leading = int(meta.get("pad_leading", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise SpeechRTError(f"{model_dir}: model.json lacks labels/features ({e})") from None
        if dither is not None:
            self.features = FeatureConfig.from_dict({**self.features.to_dict(), "dither": dither})
        self.head = Head.of(
            contract(next(iter(graphs_of(self.info.kind))), self.info.dims),
            self.info.dims, decoder, self.features, self.pad_leading, decode_padding,
            self.numpy, f"{model_dir}: a {self.info.kind} model",
        )  # fmt: skip
        self.transducer = self.head.transducer
        if len(self.labels) + 1 != self.head.n_classes:
            raise SpeechRTError(
                f"{model_dir}: {len(self.labels)} labels + blank for {self.head.n_classes} "
                "model outputs"
            )
        tuning = (beam_size, alpha, beta) != (None, None, None)
        if self.transducer and (decoder == "beam" or lm is not None or tuning):
            raise SpeechRTError(f"{model_dir}: a transducer decodes greedily (no beam search/LM)")
        # a transducer leaves an LM beside it unused; a hybrid's CTC head ("ctc") is any CTC's
        self.lm, self.beam_options = (
            (None, None)
            if self.transducer
            else self._decoder("auto" if decoder == "ctc" else decoder, lm, beam_size, alpha, beta)
        )
        self.decoder = "greedy" if self.lm is None else "beam"
        offset = -int(meta.get("pad_leading", 0)) * self.features.frame_shift
        nemo, head = None, "ctc"
        if "pieces" in meta:  # a converted .nemo: NeMo's words and times
            from speechrt.asr.nemo_text import NemoText

            nemo = NemoText.of([str(p) for p in meta["pieces"]], self.labels)
            if self.transducer:
                head = "tdt" if self.info.dims["durations"] else "rnnt"
        self.decoding = Decoder(
            tuple(self.labels), self.lm, self.beam_options, self.frame_duration, offset,
            self.sample_rate, nemo, head,
        )  # fmt: skip
        # the model's window (a converted .nemo's is long: NeMo encodes a file whole)
        window = float(meta.get("window_seconds", WINDOW_SECONDS)) if window is None else window
        if window < 1.0:
            raise SpeechRTError(f"window must be >= 1 s, got {window}")
        if not 0 <= overlap < window / 2:
            raise SpeechRTError(f"overlap must be within [0, window / 2), got {overlap}")
        self.window, self.overlap, self.seed = window, overlap, seed
        self.vad: VadOptions | None = model_vad(meta, vad, str(model_dir))
        from speechrt.runtime.stages import make_runner

        # every backend runs the model's main graph (eager calls the wrapper as-is)
        graph = next(iter(graphs_of(self.info.kind)))
        self.runner: Runner = make_runner(
            graph,
            self.model,
            self.info,
            self.backend,
            self.device,
            precision,
            model_dir,
            numpy=self.numpy,
        )
        self.steps: Any = None  # a transducer's predict and joint steps
        if self.transducer:
            from speechrt.asr.transducer import make_steps

            self.steps = make_steps(self, precision)
        self.featurizer: Any = None  # torch backends: speechrt.runtime.featurizer
        if not self.numpy:
            from speechrt.runtime.featurizer import make_featurizer

            self.featurizer = make_featurizer(self.features, self.backend, self.device)
        # cuda: log-mel and acoustic model replayed as one graph (FeaturesToLogProbs)
        self.front: Any = None
        if self.backend == "cuda":
            from speechrt.runtime.cuda import CudaRunner
            from speechrt.runtime.featurizer import FeaturesToLogProbs

            assert isinstance(self.runner, CudaRunner)
            if self.runner.graphs and self.featurizer.graphs:
                self.front = FeaturesToLogProbs(self.featurizer, self.runner, self.pad_leading)

    def runners(self) -> dict[str, Runner]:
        """{graph name: runner}: the graphs it runs (the /v2 component models share them): the
        main one, and a transducer's decoding steps on the eager and onnx backends."""
        steps = self.steps.runners if self.steps is not None else {}
        return {self.runner.contract.name: self.runner, **steps}

    def _decoder(
        self,
        decoder: str,
        lm: str | Path | None,
        beam_size: int | None,
        alpha: float | None,
        beta: float | None,
    ) -> tuple[NGramLM | None, BeamOptions | None]:
        """The LM and beam options to decode with; (None, None) = greedy."""
        from speechrt.asr.lm import has_lm, load_lm

        if decoder not in DECODERS:
            raise SpeechRTError(f"unknown decoder {decoder!r}; choose {', '.join(DECODERS)}")
        overrides = {"beam_size": beam_size, "alpha": alpha, "beta": beta}
        given = [k for k, v in overrides.items() if v is not None]
        if decoder == "greedy":
            if lm is not None or given:
                what = "LM" if lm is not None else ", ".join(given)
                raise SpeechRTError(f"the greedy decoder takes no {what} (use the beam decoder)")
            return None, None
        lm_dir = lm if lm is not None else (self.model_dir if has_lm(self.model_dir) else None)
        if lm_dir is None:
            if decoder == "beam" or given:
                raise SpeechRTError(
                    f"{self.model_dir}: beam search needs a language model: none beside the "
                    "model (lm.json); give one (--lm DIR)"
                )
            return None, None
        if not any(label[:1] == " " for label in self.labels):
            raise SpeechRTError(
                f"{self.model_dir}: beam search needs labels that start words (a space label, "
                "or word pieces that begin with one)"
            )
        model = load_lm(lm_dir)
        options = BeamOptions.from_dict(model.decoding).updated(**overrides)
        return model, options

    @property
    def sample_rate(self) -> int:
        return self.features.sample_rate

    @property
    def frame_duration(self) -> float:
        """Seconds per output (CTC) frame: the hop times the encoder's time stride."""
        return self.features.frame_shift * time_stride(self.info.dims)

    # -- stages --------------------------------------------------------------------------------

    def band_filter(self, source_rate: int) -> BandFilter | None:
        """The filter audio from a source at `source_rate` goes through once resampled to the
        model's rate: the telephone band for a narrowband source (<= 8 kHz) where the model's
        features ask for it (FeatureConfig.narrowband), else none."""
        from speechrt.audio.telephone import NARROWBAND_RATE, BandFilter

        if self.features.narrowband is None or source_rate > NARROWBAND_RATE:
            return None
        return BandFilter(self.sample_rate)

    def from_rate(self, audio: np.ndarray, source_rate: int) -> np.ndarray:
        """Mono audio (N,) at `source_rate` -> (M,) float32 at the model's rate, as the model
        hears such a source (resampled, then `band_filter`ed)."""
        from speechrt.audio.io import resample

        if source_rate != self.sample_rate:
            audio = resample(audio, source_rate, self.sample_rate)
        band = self.band_filter(source_rate)
        return band.whole(audio) if band is not None else np.asarray(audio, dtype=np.float32)

    def load_audio(self, source: AudioInput, name: str | None = None) -> np.ndarray:
        """A file path, file bytes or an array at the model's rate -> mono float32 (N,).
        A file at another rate is heard as `from_rate` hears it."""
        from speechrt.audio.io import read_audio

        name = name or (str(source) if isinstance(source, (str, Path)) else "audio")
        if isinstance(source, (str, Path, bytes)):
            if isinstance(source, bytes) and not source:
                raise SpeechRTError(f"{name}: empty file")
            audio, _ = read_audio(source, target_sr=self.sample_rate, band=self.band_filter)
            if not np.isfinite(audio).all():
                raise SpeechRTError(f"{name}: samples contain NaN or infinity")
        else:
            audio = as_waveform(source, name)
        return self.check_length(audio, name)

    def check_length(self, audio: np.ndarray, name: str = "audio") -> np.ndarray:
        """Waveform (N,) at the model's rate, unchanged, unless it is empty or shorter than the
        features' first frame needs (SpeechRTError)."""
        if audio.size == 0:
            raise SpeechRTError(f"{name}: audio is empty (0 samples)")
        if audio.size < self.features.min_samples:
            raise SpeechRTError(
                f"{name}: audio too short ({audio.size / self.sample_rate * 1000:.1f} ms; "
                f"need at least {self.features.min_samples / self.sample_rate * 1000:.0f} ms)"
            )
        return audio

    def segments(self, item: int, audio: np.ndarray, seed: int = 0) -> list[Segment]:
        """Cut one item into windows; the last window ends at the end of the audio.

        Window j draws its dither noise from a seed derived from (seed, j)."""
        sr, n = self.sample_rate, audio.shape[0]
        win = int(self.window * sr)
        step = win - int(self.overlap * sr)
        if n <= win:
            return [Segment(item, audio, 0.0, (-np.inf, np.inf), _window_seed(seed, 0))]
        starts = [0]
        while starts[-1] + win < n:
            starts.append(min(starts[-1] + step, n - win))
        # Consecutive windows split their overlap in the middle.
        cuts = [(starts[i + 1] + starts[i] + win) / 2 / sr for i in range(len(starts) - 1)]
        lows, highs = [-np.inf, *cuts], [*cuts, np.inf]
        return [
            Segment(item, audio[s : s + win], s / sr, (lo, hi), _window_seed(seed, j))
            for j, (s, lo, hi) in enumerate(zip(starts, lows, highs, strict=True))
        ]

    def speech_segments(self, item: int, audio: np.ndarray, seed: int = 0) -> list[Segment]:
        """The speech regions of one item (speechrt.asr.vad), each with its margin of context
        (zeros beyond the audio), cut into windows as `segments` cuts; none for silence or
        steady noise. Without VAD (self.vad None): `segments`."""
        if self.vad is None:
            return self.segments(item, audio, seed)
        sr, out = self.sample_rate, []
        duration = audio.shape[0] / sr
        for k, (start, end) in enumerate(speech_windows(audio, sr, self.vad)):
            for seg in self.segments(item, cut(audio, start, end), _window_seed(seed, k)):
                lo, hi = seg.keep
                seg.offset += start / sr
                seg.keep = (max(lo + start / sr, 0.0), min(hi + start / sr, duration))
                seg.item_seconds = duration
                out.append(seg)
        return out

    def featurize(self, batch: list[Segment]) -> tuple[Any, Any, list[int]]:
        """Windows -> features (B, F, T) incl. leading padding, valid frames (B,), samples each
        (numpy arrays on onnx, else torch tensors on the device)."""
        if self.numpy:
            rngs = None
            if self.features.dither > 0:  # per-window noise, as below
                rngs = [np.random.default_rng(seg.seed) for seg in batch]
            feats, lengths = batch_features_numpy([seg.audio for seg in batch], self.features, rngs)
            if self.pad_leading:
                feats = np.pad(feats, ((0, 0), (0, 0), (self.pad_leading, 0)))
                lengths = lengths + self.pad_leading
            return feats, lengths, [seg.audio.shape[0] for seg in batch]
        import torch

        with torch.inference_mode():
            return self._featurize_torch(batch)

    def _generators(self, batch: list[Segment]) -> list[Any] | None:
        """Per-window dither noise generators: independent of batch-mates and order."""
        if self.features.dither <= 0:
            return None
        import torch

        return [torch.Generator(device=self.device).manual_seed(seg.seed) for seg in batch]

    def _featurize_torch(self, batch: list[Segment]) -> tuple[Any, Any, list[int]]:
        import torch

        # one padded host batch, one copy to the device, one batched log-mel
        feats, lengths = self.featurizer([seg.audio for seg in batch], self._generators(batch))
        if self.pad_leading:
            feats = torch.nn.functional.pad(feats, (self.pad_leading, 0))
            lengths = lengths + self.pad_leading
        return feats, lengths, [seg.audio.shape[0] for seg in batch]

    def acoustic(self, feats: Any, lengths: Any, samples: list[int]) -> tuple[Any, Any]:
        """features (B, F, T) -> log-probs (B, T', V) and frames to decode per window (B,)."""
        if self.numpy:
            return self._acoustic(feats, lengths, samples)
        import torch

        with torch.inference_mode():
            return self._acoustic(feats, lengths, samples)

    def _acoustic(self, feats: Any, lengths: Any, samples: list[int]) -> tuple[Any, Any]:
        from speechrt.runtime.stages import as_float32

        out = self.runner.run({"features": as_float32(feats), "feature_lengths": lengths})
        return self.head(out, samples)

    def log_probs(self, batch: list[Segment]) -> tuple[Any, Any]:
        """Windows -> log-probs (B, T', V) float32 and frames to decode per window (B,):
        `featurize` then `acoustic`, or on cuda both in one graph (FeaturesToLogProbs)."""
        if self.front is None:
            return self.acoustic(*self.featurize(batch))
        out = self.front([seg.audio for seg in batch], self._generators(batch))
        return self.head(out, [seg.audio.shape[0] for seg in batch])

    def tokens(self, log_probs: Any, lengths: Any) -> list[list[tuple[int, int, int]]]:
        """log_probs (B, T', V), frames (B,) -> per window (label, first, last frame) tokens."""
        return self.decoding.tokens(log_probs, lengths)

    def decode(self, batch: list[Segment], log_probs: Any, lengths: Any) -> None:
        """Decoding per window (CTC, or a transducer's greedy loop over its joint-projected
        frames); keeps each window's own words (item time) in seg.words."""
        if self.transducer:
            for seg, tokens in zip(batch, self.steps.decode(log_probs, lengths), strict=True):
                self.decoding.keep_words(seg, tokens)
            return
        self.decoding.decode(batch, log_probs, lengths)

    def transcribe(
        self,
        audio: Sequence[AudioInput],
        batch_size: int = 16,
        seeds: Sequence[int] | None = None,
    ) -> list[Transcript]:
        """Arrays at the model's sample rate, file paths or file bytes -> one Transcript each.

        With dither on, item i draws its noise from seeds[i] (default: the ASR's seed + i).
        """
        return [self.finish(h) for h in self.hear(audio, batch_size, seeds)]

    def hear(
        self,
        audio: Sequence[AudioInput],
        batch_size: int = 16,
        seeds: Sequence[int] | None = None,
    ) -> list[Heard]:
        """The device half of `transcribe`: audio -> per item its windows (speech_segments),
        run through the acoustic model longest-first in batches, with their log-probs copied to
        the host. `finish` decodes them on the CPU: a server runs it off its device thread."""
        if isinstance(audio, (np.ndarray, str, Path, bytes)):
            raise SpeechRTError("transcribe takes a list of audio items")
        if batch_size < 1:
            raise SpeechRTError(f"batch size must be >= 1, got {batch_size}")
        waves = [
            self.load_audio(a, None if isinstance(a, (str, Path)) else f"audio {i + 1}")
            for i, a in enumerate(audio)
        ]
        seeds = list(seeds) if seeds is not None else [self.seed + i for i in range(len(waves))]
        if len(seeds) != len(waves):
            raise SpeechRTError(f"{len(seeds)} seeds for {len(waves)} audio items")
        segs = [seg for i, w in enumerate(waves) for seg in self.speech_segments(i, w, seeds[i])]
        order = sorted(range(len(segs)), key=lambda k: segs[k].audio.shape[0], reverse=True)
        for start in range(0, len(order), batch_size):
            self.hear_windows([segs[k] for k in order[start : start + batch_size]])
        per_item: list[list[Segment]] = [[] for _ in waves]
        for seg in segs:  # in time order within each item
            per_item[seg.item].append(seg)
        return [
            Heard(w.shape[0] / self.sample_rate, mine)
            for w, mine in zip(waves, per_item, strict=True)
        ]

    def hear_windows(self, batch: list[Segment]) -> None:
        """One batch of windows (of any items: each is featurised and run on its own samples)
        through the acoustic model: their log-probs (or a transducer's tokens) on the host in
        seg.log_probs (seg.tokens), the batch's compute time shared out by samples in
        seg.seconds. A server runs each window as a batch item of its own, so that a long
        recording takes turns with the requests behind it (speechrt.serving.pipelines)."""
        t0 = time.perf_counter()
        log_probs, lengths = self.log_probs(batch)
        if self.transducer:  # log_probs: the joint-projected encoder frames (B, T', J)
            for seg, tokens in zip(batch, self.steps.decode(log_probs, lengths), strict=True):
                seg.tokens = tokens
        else:
            lp = host(log_probs).astype(np.float32, copy=False)  # (B, T', V): one copy
            for seg, row, n in zip(batch, lp, host(lengths).tolist(), strict=True):
                seg.log_probs = row[: int(n)]
        elapsed = time.perf_counter() - t0
        total = sum(seg.audio.shape[0] for seg in batch)
        for seg in batch:
            seg.seconds = elapsed * seg.audio.shape[0] / total

    def finish(self, heard: Heard) -> Transcript:
        """The CPU half of `transcribe`: one item's windows decoded (greedy, or the beam search
        with the LM) and joined into its Transcript; its RTF counts both halves."""
        return self.decoding.finish(heard)
