"""Long mels are vocoded in chunks with real context either side: the same audio as one call."""

from __future__ import annotations

import pytest
import torch

from speechrt.models.hifigan import HiFiGAN, HiFiGANDims
from speechrt.options import SynthesisOptions
from speechrt.runtime import stages
from speechrt.runtime.stages import vocode_in_chunks
from speechrt.tts import TTS


def _model(preset: str) -> HiFiGAN:
    """The preset's kernels, dilations and rates (its receptive field), narrow channels."""
    model = HiFiGAN(HiFiGANDims.from_name(preset, upsample_initial_channel=32)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("preset", ["hifigan-v1", "hifigan-v3"])
def test_chunks_equal_one_call_with_lengths(preset: str) -> None:
    model = _model(preset)
    hop = model.dims.hop_length
    mel = torch.randn(2, 80, 170, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([170, 93])  # the second item ends inside the second chunk
    with torch.inference_mode():
        whole, whole_lengths = model.mel_to_audio(mel, lengths)
        chunked, chunked_lengths = vocode_in_chunks(model.mel_to_audio, mel, lengths, 40)
    assert torch.equal(chunked_lengths, whole_lengths)
    assert chunked.shape == whole.shape
    assert _rel(chunked, whole) < 1e-5
    assert not chunked[1, 93 * hop :].any()  # nothing past an item's end


@pytest.mark.parametrize("chunk", [None, 40])
def test_a_head_is_heard_first_and_is_the_start_of_the_audio(chunk: int | None) -> None:
    """A stream's first frames, vocoded alone with real right context: no seam."""
    model = _model("hifigan-v1")
    hop = model.dims.hop_length
    mel = torch.randn(2, 80, 170, generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([170, 120])
    heard: list[torch.Tensor] = []
    with torch.inference_mode():
        whole, _ = model.mel_to_audio(mel, lengths)
        audio, _ = vocode_in_chunks(model.mel_to_audio, mel, lengths, chunk, (32, heard.append))
    assert len(heard) == 1 and heard[0].shape == (2, 32 * hop)
    assert _rel(heard[0], whole[:, : 32 * hop]) < 1e-5
    assert torch.equal(audio[:, : 32 * hop], heard[0]) and _rel(audio, whole) < 1e-5
    with torch.inference_mode():  # an item too short for a head and its context: not heard
        vocode_in_chunks(
            model.mel_to_audio, mel, torch.tensor([170, 50]), chunk, (32, heard.append)
        )
    assert len(heard) == 1


def test_too_little_context_shows(monkeypatch) -> None:
    """The context is what makes chunks exact: with 2 frames the seams differ."""
    model = _model("hifigan-v1")
    mel, lengths = torch.randn(1, 80, 170), torch.tensor([170])
    monkeypatch.setattr(stages, "CHUNK_CONTEXT", 2)
    with torch.inference_mode():
        whole, _ = model.mel_to_audio(mel, lengths)
        chunked, _ = vocode_in_chunks(model.mel_to_audio, mel, lengths, 40)
    assert _rel(chunked, whole) > 1e-3


def test_the_cpu_pipeline_vocodes_long_mels_in_chunks(tiny_voice, monkeypatch) -> None:
    monkeypatch.setattr(stages, "CPU_CHUNK_FRAMES", 64)
    tts = TTS(*tiny_voice, device="cpu")
    mel = torch.randn(1, 80, 150, generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([150])
    calls: list[int] = []
    vocoder = tts.stages.vocoder
    vocode = vocoder.vocode

    def counted(m, n):
        calls.append(m.shape[-1])
        return vocode(m, n)

    monkeypatch.setattr(vocoder, "vocode", counted)
    with torch.inference_mode():
        whole, _ = tts.vocoder.mel_to_audio(mel, lengths)  # the model's own reference method
        audio, _ = tts.mel_to_audio(mel, lengths, SynthesisOptions(), None)
    assert calls == [88, 110, 46]  # 64-frame chunks, 24 frames of context either side (to T)
    assert _rel(audio, whole) < 1e-5
