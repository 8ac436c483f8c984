"""What the server drives of a voice: the typed seam between the services and speechrt.tts.

`Voice` is what the TTS engine and service need to answer a request (the text front end, and a
batch of pieces -> audio); speechrt.tts.TTS is one, and tests serve smaller stand-ins.
`LoadedVoice` is a voice loaded from model directories (speechrt.tts.TTS): its graphs, mel
config and optional steps (denoising, word times, two-step batches), which the server uses
where a voice has them (`loaded(voice)`). A recogniser has no such seam: the services take
speechrt.asr.ASR itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from speechrt.options import SynthesisOptions
from speechrt.pieces import Piece, TimedAudio

Audio = npt.NDArray[np.float32]  # (S,) samples in [-1, 1]

if TYPE_CHECKING:
    from speechrt.audio.mel import MelConfig
    from speechrt.repo import ComponentInfo
    from speechrt.runtime.base import Runner


class SpeechText(Protocol):
    """What the services ask of a voice's text processor (speechrt.text.TextProcessor)."""

    def has_speech(self, text: str) -> bool: ...  # anything to say ("**": no)


class TextToPieces(Protocol):
    """speechrt.front_end.text_to_pieces less its TextProcessor (Voice.text_to_pieces)."""

    def __call__(
        self,
        texts: Sequence[str],
        seeds: Sequence[int],
        words: bool = False,
        max_symbols: int | None = None,
        pace: float = 1.0,
    ) -> list[Piece]: ...


class Voice(Protocol):
    """The text front end and batches of pieces -> audio; see the module docstring."""

    @property
    def name(self) -> str: ...  # what `voice` names (speechrt.defaults.voice_name)

    @property
    def n_speakers(self) -> int: ...

    @property
    def sampling_rate(self) -> int: ...

    @property
    def text(self) -> SpeechText: ...

    @property
    def text_to_pieces(self) -> TextToPieces: ...  # a method of the voice, as TTS has

    def ids_to_audio(
        self,
        batch: list[Piece],
        options: SynthesisOptions,
        on_head: Callable[[list[Audio]], None] | None = None,
    ) -> list[Audio]: ...  # one (S,) float32 waveform per piece


@runtime_checkable
class LoadedVoice(Voice, Protocol):
    """A voice loaded from model directories (speechrt.tts.TTS); see the module docstring."""

    @property
    def backend(self) -> str: ...

    @property
    def mel(self) -> MelConfig: ...

    @property
    def acoustic_info(self) -> ComponentInfo: ...

    @property
    def vocoder_info(self) -> ComponentInfo: ...

    @property
    def denoiser_missing(self) -> str | None: ...  # why it cannot denoise, or None

    @property
    def has_durations(self) -> bool: ...  # frames per symbol: word times

    def runners(self) -> dict[str, Runner]: ...

    def ids_to_timed_audio(
        self, batch: list[Piece], options: SynthesisOptions
    ) -> list[TimedAudio]: ...

    def ids_to_audio_later(
        self, batch: list[Piece], options: SynthesisOptions
    ) -> Callable[[], list[Audio]]: ...


def loaded(voice: Voice) -> LoadedVoice | None:
    """`voice` as a LoadedVoice, or None for a stand-in that has only Voice's members."""
    return voice if isinstance(voice, LoadedVoice) else None
