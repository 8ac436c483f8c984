"""Voice activity detection: where in a recording someone speaks, from frame energies.

A recogniser trained on speech turns long silence and steady noise into words ("i i i"), and
leading or trailing silence changes its per-window feature normalisation. A recogniser whose
model.json turns the detector on (model_vad: the bundled one's does; a converted checkpoint's,
as its reference, does not) therefore transcribes only the regions it finds, each cut with the
same margin of context (zero-padded where the recording ends), so a recording padded with
silence gives the windows, and the transcript, of the unpadded one.

The detector is energy-based and adapts to the recording: a 20 ms frame (10 ms hop) is speech
when its energy exceeds the recording's noise floor (a low percentile of its frame energies,
digital silence left out) by a margin that grows with the recording's dynamic range. A recording
whose loud frames are hardly louder than its quiet ones (silence, hum, steady noise) has no
speech. Numpy only (no torch), bounded memory for hours of audio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

SILENCE_DB = -90.0  # frames below this (dBFS) are digital silence: left out of the statistics
CHUNK_SECONDS = 60  # frame energies are computed this much audio at a time (bounded memory)


@dataclass(frozen=True)
class VadOptions:
    """How speech regions are found and cut (seconds and decibels)."""

    min_range_db: float = 12.0  # loud (99th pct) minus quiet (10th pct) frames: less = no speech
    min_margin_db: float = 6.0  # speech is at least this far above the noise floor ...
    range_fraction: float = 0.25  # ... or this fraction of the dynamic range, whichever is more
    min_speech: float = 0.05  # shorter bursts (clicks) are not speech
    bridge: float = 0.3  # pauses shorter than this inside speech are speech
    split_gap: float = 1.0  # regions this far apart become separate windows
    context: float = 0.25  # audio kept (or zeros added) either side of a region

    def __post_init__(self) -> None:
        if self.min_range_db < 0 or self.min_margin_db < 0 or not 0 <= self.range_fraction <= 1:
            raise ValueError("VAD thresholds must be >= 0 (range_fraction within [0, 1])")
        if min(self.min_speech, self.bridge, self.split_gap, self.context) < 0:
            raise ValueError("VAD durations must be >= 0")


def model_vad(
    meta: Mapping[str, Any], override: bool | VadOptions | None = None, where: str = "model"
) -> VadOptions | None:
    """The detector a recogniser runs (None: none, all of the audio in fixed windows).

    `override` (the caller's --vad / --no-vad) wins: False is off, True is on with the model's
    options (or the defaults), VadOptions are these. Without one, the model's model.json decides:
    `meta["vad"]` true (the defaults) or an object of VadOptions fields turns the detector on;
    false or absent leaves it off, so a converted checkpoint transcribes as its reference does.
    SpeechRTError (naming `where`) for a setting that is neither."""
    from speechrt.errors import SpeechRTError

    setting = meta.get("vad", False)
    if isinstance(setting, bool):
        own = VadOptions() if setting else None
    elif isinstance(setting, Mapping):
        names = {f.name for f in fields(VadOptions)}
        unknown = sorted(set(setting) - names)
        if unknown:
            raise SpeechRTError(f"{where}: model.json vad: unknown option(s) {', '.join(unknown)}")
        try:
            own = VadOptions(**{k: float(v) for k, v in setting.items()})
        except (TypeError, ValueError) as e:
            raise SpeechRTError(f"{where}: model.json vad: {e}") from None
    else:
        raise SpeechRTError(f"{where}: model.json vad must be true, false or an object of options")
    if override is None:
        return own
    if isinstance(override, VadOptions):
        return override
    return (own or VadOptions()) if override else None


def frame_energies_db(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """audio (N,) -> (ceil(N / hop),) dBFS of 20 ms frames every 10 ms (frame i covers samples
    [i * hop, i * hop + 2 * hop), zero beyond the end)."""
    hop = sample_rate // 100
    n_blocks = -(-audio.shape[0] // hop)
    blocks = np.empty(n_blocks + 1, np.float64)  # sum of squares per 10 ms block, + a zero block
    blocks[-1] = 0.0
    step = CHUNK_SECONDS * 100  # blocks per chunk
    for b in range(0, n_blocks, step):
        x = audio[b * hop : (b + step) * hop].astype(np.float64)
        pad = -x.shape[0] % hop
        blocks[b : b + -(-x.shape[0] // hop)] = (
            np.square(np.pad(x, (0, pad))).reshape(-1, hop).sum(1)
        )
    energy = (blocks[:-1] + blocks[1:]) / (2 * hop)
    return 10.0 * np.log10(energy + 1e-12)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Boolean (T,) -> [start, end) index runs of True."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()
    return list(zip(starts, ends, strict=True))


def speech_threshold(db: np.ndarray, options: VadOptions) -> float:
    """Frame energies (dBFS) -> the level speech frames exceed (inf: none is speech)."""
    sound = db[db > SILENCE_DB]
    if sound.size == 0:
        return np.inf
    floor, loud = np.percentile(sound, [10.0, 99.0])
    spread = loud - floor
    if spread < options.min_range_db:
        return np.inf
    return float(floor + max(options.min_margin_db, options.range_fraction * spread))


def speech_regions(
    audio: np.ndarray, sample_rate: int, options: VadOptions = VadOptions()
) -> list[tuple[int, int]]:
    """audio (N,) float -> [start, end) sample ranges of speech, in order, without context."""
    db = frame_energies_db(audio, sample_rate)
    speech = db > speech_threshold(db, options)
    frames_per_s = 100
    # bridge short pauses, then drop bursts too short to be speech
    for a, b in _runs(~speech):
        if a > 0 and b < speech.shape[0] and (b - a) < options.bridge * frames_per_s:
            speech[a:b] = True
    hop = sample_rate // frames_per_s
    regions = []
    for a, b in _runs(speech):
        if (b - a) >= options.min_speech * frames_per_s:
            # frame i covers [i * hop, (i + 2) * hop): the region's samples, clipped to the audio
            regions.append((a * hop, min((b + 1) * hop, audio.shape[0])))
    return regions


def speech_windows(
    audio: np.ndarray, sample_rate: int, options: VadOptions = VadOptions()
) -> list[tuple[int, int]]:
    """[start, end) sample ranges to transcribe: speech regions closer than `split_gap` joined,
    widened by `context` each side. Ranges may reach outside [0, N): zeros fill that part."""
    joined: list[list[int]] = []
    gap = int(options.split_gap * sample_rate)
    for a, b in speech_regions(audio, sample_rate, options):
        if joined and a - joined[-1][1] < gap:
            joined[-1][1] = b
        else:
            joined.append([a, b])
    ctx = int(options.context * sample_rate)
    return [(a - ctx, b + ctx) for a, b in joined]


def cut(audio: np.ndarray, start: int, end: int) -> np.ndarray:
    """audio[start:end] with zeros where the range lies outside the audio."""
    lo, hi = max(start, 0), min(end, audio.shape[0])
    if lo == start and hi == end:
        return audio[start:end]
    out = np.zeros(end - start, audio.dtype)
    out[lo - start : hi - start] = audio[lo:hi]
    return out


class TurnDetector:
    """Speech starts and stops in audio that arrives in pieces: the realtime route's turn
    detection. The same frames and threshold as `speech_regions`, the statistics taken over the
    last `history` seconds; speech starts after `min_speech` above the threshold and stops after
    `silence` below it. Positions are samples since the first push."""

    def __init__(
        self,
        sample_rate: int,
        silence: float = 0.5,
        options: VadOptions = VadOptions(),
        history: float = 10.0,
    ) -> None:
        self.hop = sample_rate // 100
        self.options = options
        self.silence_frames = max(1, round(silence * 100))
        self.min_frames = max(1, round(options.min_speech * 100))
        self.history = np.full(max(1, round(history * 100)), -np.inf)  # dB, a ring
        self.rest = np.zeros(0, np.float32)  # samples short of a whole 10 ms block
        self.previous_block = 0.0  # sum of squares of the last block
        self.frames = 0  # frames seen
        self.speaking = False
        self.run = 0  # frames in a row on the other side of the threshold

    def push(self, audio: np.ndarray) -> list[tuple[str, int, int]]:
        """audio (N,) float -> ("start" | "stop", position, decided) events, in order: a start
        is placed where its run of speech frames began, a stop where its silence began;
        `decided` is the sample where the event became certain (within this push)."""
        x = np.concatenate([self.rest, audio.astype(np.float32)])
        n = x.shape[0] // self.hop
        self.rest = x[n * self.hop :]
        blocks = np.square(x[: n * self.hop].astype(np.float64)).reshape(n, self.hop).sum(1)
        events = []
        for b in blocks:
            db = 10.0 * np.log10((self.previous_block + b) / (2 * self.hop) + 1e-12)
            self.previous_block = b
            self.history[self.frames % self.history.shape[0]] = db
            self.frames += 1
            loud = db > speech_threshold(self.history, self.options)  # ~30 us a frame
            self.run = self.run + 1 if loud != self.speaking else 0
            if not self.speaking and self.run >= self.min_frames:
                self.speaking, self.run = True, 0
                start = (self.frames - self.min_frames) * self.hop
                events.append(("start", start, self.frames * self.hop))
            elif self.speaking and self.run >= self.silence_frames:
                self.speaking, self.run = False, 0
                stop = (self.frames - self.silence_frames) * self.hop
                events.append(("stop", stop, self.frames * self.hop))
        return events
