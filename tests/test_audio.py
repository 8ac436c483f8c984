import io

import numpy as np
import pytest
import soundfile as sf
import torch

from speechrt.audio import io as audio_io
from speechrt.audio.codecs import write_audio
from speechrt.audio.io import (
    StreamResampler,
    encode_audio,
    read_audio,
    resample,
)
from speechrt.audio.mel import MelConfig, mel_filterbank, mel_spectrogram
from speechrt.errors import SpeechRTError


def test_filterbank_matches_librosa_slaney():
    # Reference values from librosa.filters.mel(sr, n_fft, n_mels, fmin=0, fmax=8000).
    tts = mel_filterbank(22050, 1024, 80, 0.0, 8000.0)
    assert tts.shape == (80, 513)
    np.testing.assert_allclose(
        tts.sum(axis=1)[[0, 1, 10, 40, 79]],
        [0.04530278, 0.04530278, 0.04914393, 0.04654524, 0.04641479],
        rtol=1e-5,
    )
    assert tts[40].argmax() == 80 and abs(tts[40].max() - 0.01489547) < 1e-7
    asr = mel_filterbank(16000, 512, 64, 0.0, 8000.0)
    np.testing.assert_allclose(
        asr.sum(axis=1)[[0, 1, 10, 40, 63]],
        [0.02858679, 0.03518878, 0.03076565, 0.03208514, 0.03201951],
        rtol=1e-5,
    )
    assert asr[40].argmax() == 81 and abs(asr[40].max() - 0.007854707) < 1e-8


def test_mel_spectrogram_matches_numpy_dft():
    cfg = MelConfig()
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(4000) * 0.1).astype(np.float32)
    mel = mel_spectrogram(torch.from_numpy(audio), cfg).numpy()
    assert mel.shape == (80, 4000 // 256 + 1)
    # Independent computation: reflect pad, periodic Hann, explicit DFT matrix.
    padded = np.pad(audio.astype(np.float64), 512, mode="reflect")
    n = np.arange(1024)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / 1024)
    dft = np.exp(-2j * np.pi * np.outer(np.arange(513), n) / 1024)
    frames = np.stack([padded[t * 256 : t * 256 + 1024] * window for t in range(mel.shape[1])], 1)
    mag = np.abs(dft @ frames)
    ref = np.log(np.maximum(mel_filterbank(22050, 1024, 80, 0.0, 8000.0) @ mag, 1e-5))
    np.testing.assert_allclose(mel, ref, atol=1e-4)


def test_mel_config_mismatch_is_loud():
    a, b = MelConfig(), MelConfig(fmax=None, hop_length=300)
    a.check_matches(MelConfig())
    with pytest.raises(SpeechRTError, match="hop_length 256 vs 300"):
        a.check_matches(b)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_encode_and_read_roundtrip(fmt):
    t = np.arange(22050) / 22050
    audio = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    back, sr = read_audio(encode_audio(audio, 22050, fmt))
    assert sr == 22050
    np.testing.assert_allclose(back, audio, atol=1 / 32767 + 1e-6)


def test_pcm_is_raw_int16_and_clipped():
    data = encode_audio(np.array([0.0, 1.0, -1.0, 2.0], dtype=np.float32), 22050, "pcm")
    assert np.frombuffer(data, "<i2").tolist() == [0, 32767, -32767, 32767]


def test_read_audio_mixes_and_resamples(tmp_path):
    stereo = np.stack([np.full(8000, 0.2), np.full(8000, 0.4)], 1).astype(np.float32)
    path = tmp_path / "s.wav"
    sf.write(path, stereo, 8000, subtype="FLOAT")
    audio, sr = read_audio(path, target_sr=16000)
    assert sr == 16000 and len(audio) == 16000
    assert abs(float(audio[4000:12000].mean()) - 0.3) < 1e-3


def test_read_audio_errors(tmp_path):
    with pytest.raises(SpeechRTError, match="no such file"):
        read_audio(tmp_path / "missing.wav")
    with pytest.raises(SpeechRTError, match="not a readable audio file"):
        read_audio(b"this is not audio at all" * 10)


def test_write_audio_by_suffix(tmp_path):
    audio = np.zeros(100, dtype=np.float32)
    write_audio(tmp_path / "a.flac", audio, 22050)
    assert sf.info(str(tmp_path / "a.flac")).format == "FLAC"
    write_audio(tmp_path / "a.mp3", audio, 22050)
    assert sf.info(str(tmp_path / "a.mp3")).format == "MP3"
    with pytest.raises(SpeechRTError, match="unknown audio format"):
        write_audio(tmp_path / "a.aac", audio, 22050)
    with pytest.raises(SpeechRTError, match="cannot write"):
        write_audio(tmp_path / "no" / "dir" / "a.wav", audio, 22050)


def test_resample_length_and_tone():
    t = np.arange(8000) / 8000
    audio = np.sin(2 * np.pi * 200 * t).astype(np.float32)
    out = resample(audio, 8000, 22050)
    assert len(out) == 22050
    spec = np.abs(np.fft.rfft(out))
    assert abs(spec.argmax() - 200) <= 1


# -- bounded decoding: header first, then blocks -------------------------------------------------


def flac_bytes(seconds: float, sr: int, channels: int, unknown_length: bool = False) -> bytes:
    """Silence as FLAC, written a second at a time; `unknown_length` zeroes STREAMINFO's total
    sample count (a file that does not say how long it is)."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", sr, channels, format="FLAC", subtype="PCM_16") as f:
        for start in range(0, int(seconds * sr), sr):
            f.write(np.zeros((min(sr, int(seconds * sr) - start), channels), dtype=np.int16))
    data = bytearray(buf.getvalue())
    if unknown_length:
        # "fLaC", a block header, then STREAMINFO: 18 bytes in, a 64-bit field ends in the count
        assert data[:4] == b"fLaC"
        field = int.from_bytes(data[18:26], "big") >> 36 << 36
        data[18:26] = field.to_bytes(8, "big")
    return bytes(data)


@pytest.mark.parametrize(
    "orig,target,block", [(44100, 16000, 4096), (48000, 16000, 999), (8000, 16000, 777)]
)
def test_stream_resampler_matches_whole_signal(orig, target, block):
    x = np.random.default_rng(0).standard_normal(orig * 2 + 123).astype(np.float32) * 0.3
    r = StreamResampler(orig, target)
    pieces = [r.push(x[i : i + block]) for i in range(0, x.shape[0], block)]
    got = np.concatenate([*pieces, r.flush()])
    want = resample(x, orig, target)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_read_audio_in_blocks_equals_whole_file(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    audio = (rng.standard_normal((22050, 3)) * 0.2).astype(np.float32)
    path = tmp_path / "three.wav"
    sf.write(path, audio, 22050, subtype="FLOAT")
    whole, _ = read_audio(path, target_sr=16000)
    monkeypatch.setattr(audio_io, "BLOCK_SAMPLES", 3 * 1000)  # 1000 frames a block
    blocks, sr = read_audio(path, target_sr=16000)
    assert sr == 16000
    np.testing.assert_allclose(blocks, whole, rtol=0, atol=1e-6)
    np.testing.assert_allclose(whole, resample(audio.mean(axis=1), 22050, 16000), atol=1e-6)


def test_read_audio_refuses_a_long_header_before_decoding(monkeypatch):
    bomb = flac_bytes(30, 48000, 8)  # 30 s of 8-channel silence in a few kB

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded samples of a file its header already refuses")

    monkeypatch.setattr(sf.SoundFile, "read", no_decoding)
    with pytest.raises(SpeechRTError, match="audio is 30.0 s long; the limit is 10 s"):
        read_audio(bomb, target_sr=16000, max_seconds=10)


def test_read_audio_refuses_a_file_longer_than_it_says(monkeypatch):
    unknown = flac_bytes(12, 8000, 2, unknown_length=True)
    assert sf.info(io.BytesIO(unknown)).frames >= audio_io.UNKNOWN_FRAMES
    seen: list[int] = []
    read = sf.SoundFile.read

    def counting(self, *args, **kwargs):
        data = read(self, *args, **kwargs)
        seen.append(data.shape[0])
        return data

    monkeypatch.setattr(sf.SoundFile, "read", counting)
    monkeypatch.setattr(audio_io, "BLOCK_SAMPLES", 2 * 8000)  # a second a block
    with pytest.raises(SpeechRTError, match="longer than the limit of 10 s"):
        read_audio(unknown, target_sr=16000, max_seconds=10)
    assert sum(seen) == 11 * 8000  # decoding stopped at the first block past the limit
    audio, sr = read_audio(unknown, target_sr=16000, max_seconds=15)  # within it: all of it
    assert sr == 16000 and audio.shape == (12 * 16000,)


def test_read_audio_refuses_absurd_headers(tmp_path):
    path = tmp_path / "many.wav"
    sf.write(path, np.zeros((10, audio_io.MAX_CHANNELS + 1), dtype=np.int16), 16000)
    with pytest.raises(SpeechRTError, match="65 channels; at most 64 are read"):
        read_audio(path)
    sf.write(path, np.zeros(10, dtype=np.int16), 384000)
    with pytest.raises(SpeechRTError, match="sample rate 384000 Hz is outside"):
        read_audio(path, target_sr=16000)


def test_join_pieces_pauses_between_pieces_and_keeps_a_lone_piece():
    from speechrt.pieces import PAUSE_SECONDS, Piece, join_pieces

    sr = 1000
    a, b = np.full(5, 0.25, np.float32), np.full(3, -0.5, np.float32)
    lone = Piece(0, 0, [1], 0)
    assert join_pieces([lone], [a], sr) is a  # no silences: the audio itself, not a copy
    second = Piece(0, 1, [2], 0, after=0.002)
    joined = join_pieces([lone, second], [a, b], sr)
    gap = int(round(PAUSE_SECONDS * sr))
    assert joined.dtype == np.float32 and len(joined) == 5 + gap + 3 + 2
    assert (joined[:5] == a).all() and (joined[5 : 5 + gap] == 0).all()
    assert (joined[5 + gap : 8 + gap] == b).all() and (joined[-2:] == 0).all()
