import numpy as np
import pytest
import soundfile as sf
import torch

from speechrt.audio.io import encode_audio, read_audio, resample, write_audio
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
    with pytest.raises(SpeechRTError, match="unknown audio format"):
        write_audio(tmp_path / "a.mp3", audio, 22050)
    with pytest.raises(SpeechRTError, match="cannot write"):
        write_audio(tmp_path / "no" / "dir" / "a.wav", audio, 22050)


def test_resample_length_and_tone():
    t = np.arange(8000) / 8000
    audio = np.sin(2 * np.pi * 200 * t).astype(np.float32)
    out = resample(audio, 8000, 22050)
    assert len(out) == 22050
    spec = np.abs(np.fft.rfft(out))
    assert abs(spec.argmax() - 200) <= 1
