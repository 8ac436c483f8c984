"""Audio front end: mel spectrograms, file I/O, resampling."""

from speechrt.audio.mel import MelConfig, mel_filterbank, mel_spectrogram

__all__ = ["MelConfig", "mel_filterbank", "mel_spectrogram"]
