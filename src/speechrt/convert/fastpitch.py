"""DLE FastPitch checkpoints (train.py's dict) -> dims, state dict, mel config, text meta."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from torch import Tensor

from speechrt.arch import Conversion
from speechrt.arch.fastpitch import FastPitchDims
from speechrt.audio.mel import MelConfig
from speechrt.convert import Converted
from speechrt.convert.checkpoints import tensors_of
from speechrt.errors import SpeechRTError


def detect(keys: set[str]) -> bool:
    return "encoder.word_emb.weight" in keys and "pitch_emb.weight" in keys


def from_dle(ckpt: dict) -> Converted:
    """DLE FastPitch checkpoint (train.py's dict) -> dims, state dict, mel config, text meta."""
    sd = tensors_of(ckpt, "state_dict")
    sd = {k: v for k, v in sd.items() if not k.startswith("attention.")}  # training aligner
    if "encoder.word_emb.weight" not in sd:
        raise SpeechRTError("not a FastPitch checkpoint (no encoder.word_emb.weight)")
    dims = _dims_from(ckpt.get("config") or {}, sd)
    setup = ckpt.get("train_setup") or {}
    fmax = setup.get("mel_fmax", 8000.0)
    mel = MelConfig(
        sampling_rate=int(setup.get("sampling_rate", 22050)),
        n_fft=int(setup.get("filter_length", 1024)),
        hop_length=int(setup.get("hop_length", 256)),
        win_length=int(setup.get("win_length", 1024)),
        n_mels=dims.n_mel_channels,
        fmin=float(setup.get("mel_fmin", 0.0)),
        fmax=None if fmax is None else float(fmax),
    )
    cleaners = setup.get("text_cleaners") or ["english_cleaners_v2"]  # inference.py default
    if isinstance(cleaners, (list, tuple)):  # DLE stores a list (nargs='*')
        cleaners = cleaners[0] if len(cleaners) == 1 else list(cleaners)
    text = {
        "symbol_set": setup.get("symbol_set", "english_basic"),
        "cleaners": cleaners,
        # inference.py's --p-arpabet defaults to 0.0 and train_setup overrides it when > 0;
        # the released model was trained with 1.0 and records it.
        "p_arpabet": float(setup.get("p_arpabet") or 0.0),
    }
    return Converted("fastpitch", dims, sd, mel, {"text": text})


def _dims_from(config: dict[str, Any], sd: dict[str, Tensor]) -> FastPitchDims:
    """Config keys win; what the config lacks is read off the weight shapes, else DLE defaults."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(FastPitchDims)}  # name -> "int" etc.
    unknown = {k for k in config if k not in fields and not k.startswith("p_")}  # p_*: dropouts
    if unknown:
        raise SpeechRTError(f"fastpitch: unknown config keys {sorted(unknown)}")
    n_sym, dim = sd["encoder.word_emb.weight"].shape
    seen: dict[str, Any] = {
        "n_symbols": n_sym,
        "symbols_embedding_dim": dim,
        "in_fft_output_size": dim,
        "out_fft_output_size": dim,
        "n_mel_channels": sd["proj.weight"].shape[0],
        "energy_conditioning": "energy_emb.weight" in sd,
        "n_speakers": sd["speaker_emb.weight"].shape[0] if "speaker_emb.weight" in sd else 1,
        "pitch_conditioning_formants": sd["pitch_emb.weight"].shape[1],
        "pitch_embedding_kernel_size": sd["pitch_emb.weight"].shape[2],
    }
    if "energy_emb.weight" in sd:
        seen["energy_embedding_kernel_size"] = sd["energy_emb.weight"].shape[2]
    for prefix, conv in (
        ("in_fft_", r"encoder\.layers\.\d+\.pos_ff\.CoreNet\.0"),
        ("out_fft_", r"decoder\.layers\.\d+\.pos_ff\.CoreNet\.0"),
        ("dur_predictor_", r"duration_predictor\.layers\.\d+\.conv"),
        ("pitch_predictor_", r"pitch_predictor\.layers\.\d+\.conv"),
        ("energy_predictor_", r"energy_predictor\.layers\.\d+\.conv"),
    ):
        ws = [v for k, v in sd.items() if re.fullmatch(conv + r"\.weight", k)]
        if ws:  # the layer count; (out, in, kernel) of the first conv
            size = "conv1d_" if "fft" in prefix else ""
            seen[prefix + "n_layers"] = len(ws)
            seen[prefix + size + "filter_size"] = ws[0].shape[0]
            seen[prefix + size + "kernel_size"] = ws[0].shape[2]
    for stack, prefix in (("encoder", "in_fft_"), ("decoder", "out_fft_")):
        o_net = sd.get(f"{stack}.layers.0.dec_attn.o_net.weight")
        if o_net is not None:  # (d_model, n_heads * d_head): the split needs n_heads (default 1)
            seen[prefix + "d_head"] = o_net.shape[1] // int(config.get(prefix + "n_heads", 1))
    values = {**seen, **{k: v for k, v in config.items() if k in fields}}
    cast = {"int": int, "float": float, "bool": bool}
    values = {k: cast[fields[k]](v) for k, v in values.items()}
    return FastPitchDims(**values)


CONVERSION = Conversion(detect, from_dle)  # named by its registry entry (speechrt.arch)
