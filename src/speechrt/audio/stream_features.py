"""The streaming front end of the ASR features: samples in any chunking -> the log-mel frames of
`speechrt.audio.features.log_mel_numpy`, each as soon as its STFT window is complete, normalised
with the running per-feature mean and std of the frames so far (speechrt.asr.streaming says why
and what that means for the text). Once finished, its statistics are the whole utterance's and
its features equal `log_mel_numpy`'s (tested). It keeps the state (the pre-emphasis across
chunks, the padded samples not yet framed, the running sums); the frames themselves are
`features.frames_log_mel`'s. numpy only.
"""

from __future__ import annotations

import numpy as np

from speechrt.audio.features import FeatureConfig, frames_log_mel
from speechrt.errors import SpeechRTError


class StreamingFrontEnd:
    """Samples (any chunking) -> the log-mel frames of `log_mel_numpy`, before normalisation.

    Frame t reads the pre-emphasised samples [t*hop - n_fft/2, t*hop + n_fft/2) (reflected at
    the start; at the end only once `finish` says where the end is). Frames are kept from
    `drop(t)`'s t on; the running sums over every valid frame give the normalisation.
    """

    def __init__(self, cfg: FeatureConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.half = cfg.n_fft // 2
        self.rng = np.random.default_rng(seed)
        self.samples = 0  # samples pushed
        self.last = 0.0  # the last (dithered) sample, for the pre-emphasis of the next chunk
        self.head = np.zeros(0)  # pre-emphasised samples until there are enough to reflect
        # the padded signal from the window of the next frame to compute on (padded index
        # next * hop)
        self.padded: np.ndarray | None = None
        self.frames = np.zeros((cfg.n_mels, 0))  # raw log-mel (n_mels, T) from frame f0 on
        self.f0 = 0
        self.next = 0  # the next frame to compute
        self.sum = np.zeros(cfg.n_mels)  # running sums of the valid frames
        self.sumsq = np.zeros(cfg.n_mels)
        self.count = 0
        self.done = False

    @property
    def n_frames(self) -> int:
        """Frames computed so far (absolute)."""
        return self.next

    def push(self, audio: np.ndarray) -> None:
        """audio (N,) float at cfg.sample_rate."""
        if self.done:
            raise SpeechRTError("the stream is finished")
        x = np.asarray(audio, dtype=np.float64)
        if x.size == 0:
            return
        if self.cfg.dither > 0:
            x = x + self.cfg.dither * self.rng.standard_normal(x.size)
        y = x.copy()
        if self.cfg.preemph:
            y[1:] -= self.cfg.preemph * x[:-1]
            if self.samples:
                y[0] -= self.cfg.preemph * self.last
        self.last = float(x[-1])
        self.samples += x.size
        if self.padded is None:
            self.head = np.concatenate((self.head, y))
            if self.head.size <= self.half:
                return
            y = np.concatenate((self.head[self.half : 0 : -1], self.head))  # reflect the start
            self.padded, self.head = np.zeros(0), np.zeros(0)
        assert self.padded is not None
        self.padded = np.concatenate((self.padded, y))
        self._frames(final=False)

    def finish(self) -> None:
        """The end of the audio: reflect it, compute the last frames."""
        if self.done:
            return
        check = self.cfg.min_samples
        if self.samples < check:
            raise SpeechRTError(
                f"audio too short ({self.samples / self.cfg.sample_rate * 1000:.1f} ms; need "
                f"at least {check / self.cfg.sample_rate * 1000:.0f} ms)"
            )
        assert self.padded is not None
        # the padded signal's last `half` samples: y[n-2], y[n-3], ..., y[n-1-half]
        tail = self.padded[-self.half - 1 : -1][::-1]
        self.padded = np.concatenate((self.padded, tail))
        self._frames(final=True)
        self.done = True

    def _frames(self, final: bool) -> None:
        assert self.padded is not None
        cfg, hop = self.cfg, self.cfg.hop_length
        end = self.next * hop + self.padded.size  # padded samples available (absolute)
        last = (end - cfg.n_fft) // hop  # the last frame whose window is complete
        if final:
            last = min(last, self.samples // hop)  # 1 + N // hop frames in all
        if last < self.next:
            return
        mel = frames_log_mel(self.padded, last + 1 - self.next, cfg)  # (n_mels, frames)
        valid = cfg.valid_frames(self.samples) if final else last + 1
        n_valid = max(0, min(valid, last + 1) - self.next)
        self.sum += mel[:, :n_valid].sum(axis=1)
        self.sumsq += np.square(mel[:, :n_valid]).sum(axis=1)
        self.count += n_valid
        self.frames = np.concatenate((self.frames, mel), axis=1)
        self.padded = self.padded[(last + 1 - self.next) * hop :]  # from the next frame's window
        self.next = last + 1

    def drop(self, before: int) -> None:
        """Forget the frames before `before` (absolute)."""
        n = min(max(0, before - self.f0), self.frames.shape[1])
        self.frames, self.f0 = self.frames[:, n:], self.f0 + n

    def features(self, start: int, stop: int) -> np.ndarray:
        """Normalised frames [start, stop) (absolute; start >= f0) with the running statistics:
        (n_mels, stop - start) float32; frames at or past the valid ones zero once finished."""
        raw = self.frames[:, start - self.f0 : stop - self.f0]
        n = max(self.count, 2)
        mean = self.sum / n
        var = np.maximum(self.sumsq - n * mean**2, 0.0) / (n - 1)  # unbiased, as offline
        out = (raw - mean[:, None]) / (np.sqrt(var)[:, None] + self.cfg.std_eps)
        if self.done:
            out[:, max(0, self.cfg.valid_frames(self.samples) - start) :] = 0.0
        return out.astype(np.float32)
