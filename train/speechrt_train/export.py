"""Trained runs -> the model repository form speechrt ships, and their evaluation.

    runs/fastpitch/last.pt -> <out>/voice-acoustic/   FastPitch, meta.text = our front end
    runs/hifigan/last.pt   -> <out>/voice-vocoder/    HiFi-GAN, weight norm folded
    runs/quartznet/last.pt -> <out>/asr/              QuartzNet, BatchNorm folded, labels, features
    runs/fastconformer/last.pt -> <out>/asr-fastconformer/   Parakeet CTC (a converted .nemo's
                              form: pieces, labels, features), BatchNorm folded
each as model.json + model.safetensors (fp16 unless --fp32; speechrt loads either) + model.onnx
(the main graph, reading those weights: `speechrt export DIR --graph MAIN` writes the same), then
`evaluate`: through speechrt's own TTS and ASR pipelines, WER of the recogniser on the held-out
voice, and of our voice read back by our recogniser (and the teacher's, for reference).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speechrt.audio.features import FeatureConfig
from speechrt.audio.io import resample
from speechrt.audio.mel import MelConfig
from speechrt.models.fastpitch import FastPitch, FastPitchDims
from speechrt.models.hifigan import HiFiGAN, HiFiGANDims
from speechrt.models.jasper import LABELS, QuartzNetDims
from speechrt.registry import graphs_of
from speechrt.repo import WEIGHTS_FILE, ComponentInfo, read_info, save_component
from speechrt.runtime.export import export_dir
from speechrt_train.align import make_processor
from speechrt_train.asr_data import AUGMENTS, SpeechData, narrowband, transcript
from speechrt_train.fastpitch_train import PRESETS as FASTPITCH_PRESETS
from speechrt_train.hifigan_train import PRESETS as HIFIGAN_PRESETS
from speechrt_train.hifigan_train import plain_generator
from speechrt_train.loop import CHECKPOINT, LOG, check_weights, full
from speechrt_train.quartznet_train import PRESETS as QUARTZNET_PRESETS
from speechrt_train.quartznet_train import QuartzNetConfig, TrainableJasper, precise_bn

NAMES = {"fastpitch": "voice-acoustic", "hifigan": "voice-vocoder", "quartznet": "asr"}
NAMES["fastconformer"] = "asr-fastconformer"  # not yet a default: outside MAX_TOTAL_MB
MAX_TOTAL_MB = 40.0  # the shipped defaults together
ASR_KINDS = ("quartznet", "fastconformer", "parakeet_ctc")  # probed with speech features


def load_run(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run's last.pt (full) or compact file -> (trainer state, info: steps, seconds, and
    the run's last logged losses and evaluation)."""
    path = Path(path)
    run_dir = path if path.is_dir() else None
    if path.is_dir():
        path = path / CHECKPOINT
    state = torch.load(path, map_location="cpu", weights_only=True)
    trainer = state.get("trainer", state)
    info: dict[str, Any] = {
        "steps": int(trainer["step"]),
        "train_seconds": round(float(state["elapsed"]), 1),
        "config": trainer.get("config", {}),
    }
    if "averaged" in trainer:  # (speechrt_train average)
        info["averaged"] = trainer["averaged"]
    log = run_dir / LOG if run_dir else None
    if log is not None and log.exists():
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        losses = [r for r in records if "eval" not in r]
        evals = [r for r in records if "eval" in r]
        info["last_losses"] = losses[-1] if losses else {}
        info["last_eval"] = evals[-1]["eval"] if evals else {}
    return trainer, info


def fastpitch_component(trainer: dict[str, Any]) -> tuple[FastPitch, ComponentInfo]:
    preset = trainer.get("config", {}).get("preset", "fastpitch-small")
    model = FastPitch(FastPitchDims(**FASTPITCH_PRESETS[preset]))
    model.load_state_dict(full(trainer["model"]))
    meta = {"text": make_processor().to_meta(), "preset": preset}
    return model, ComponentInfo("fastpitch", model.dims, MelConfig(), meta)


def hifigan_component(trainer: dict[str, Any]) -> tuple[HiFiGAN, ComponentInfo]:
    preset = trainer.get("config", {}).get("preset", "hifigan-small")
    gen = HiFiGAN(HiFiGANDims(**HIFIGAN_PRESETS[preset]), weight_norm=True)
    gen.load_state_dict(full(trainer["gen"]))
    model = plain_generator(gen)
    return model, ComponentInfo("hifigan", model.dims, MelConfig(), {"preset": preset})


def quartznet_component(
    trainer: dict[str, Any], data: SpeechData | None = None, device: str = "cpu"
) -> tuple[torch.nn.Module, ComponentInfo]:
    """With `data` (training speech), the BatchNorm statistics are recomputed for the final
    weights (precise_bn) before they are folded."""
    from speechrt.models.jasper import QuartzNet

    config = trainer.get("config", {})
    preset = config.get("preset", "quartznet-5x5")
    augment = AUGMENTS[config.get("augment", QuartzNetConfig.augment)]
    features = FeatureConfig(  # as trained
        dither=float(config.get("dither", QuartzNetConfig.dither)), narrowband=narrowband(augment)
    )
    trainable = TrainableJasper(QuartzNetDims(**QUARTZNET_PRESETS[preset]))
    trainable.load_state_dict(full(trainer["model"]))
    if data is not None:
        precise_bn(trainable.to(device), data, features)
    model = QuartzNet(trainable.net.dims)
    model.load_state_dict(trainable.cpu().eval().folded_state_dict())
    meta = {
        "labels": list(LABELS),
        "features": features.to_dict(),  # speechrt draws the dither per window from a seed
        "pad_leading": 0,
        "preset": preset,
        "precise_bn": data is not None,
        "vad": True,  # voice activity detection on where it is served (asr.vad.model_vad)
    }
    return model, ComponentInfo("quartznet", model.dims, None, meta)


def fastconformer_component(trainer: dict[str, Any]) -> tuple[torch.nn.Module, ComponentInfo]:
    """A FastConformer run -> ParakeetCTC with its BatchNorms folded, and model.json's meta in
    a converted .nemo's form (labels = the pieces' surfaces, pieces), with the features it
    trained on."""
    from speechrt.arch.parakeet import ParakeetCTCDims
    from speechrt.models.parakeet import ParakeetCTC
    from speechrt_train.fastconformer_train import PRESETS as FC_PRESETS
    from speechrt_train.fastconformer_train import (
        FastConformerConfig,
        Tokenizer,
        TrainableParakeet,
        features_of,
    )

    config = trainer.get("config", {})
    preset = config.get("preset", FastConformerConfig.preset)
    tokenizer = Tokenizer.from_state(trainer["tokenizer"])
    dims = ParakeetCTCDims(**{**FC_PRESETS[preset], "vocab_size": len(tokenizer)})
    trainable = TrainableParakeet(dims)
    trainable.load_state_dict(full(trainer["model"]))
    model = ParakeetCTC(dims)
    model.load_state_dict(trainable.eval().folded_state_dict())
    meta = {
        "labels": tokenizer.labels(),  # blank = len(labels), the last class
        "pieces": [p for p, _ in tokenizer.pieces],
        "features": features_of(config).to_dict(),
        "preset": preset,
        "vad": True,
    }
    return model.eval(), ComponentInfo("parakeet_ctc", dims, None, meta)


def _probe(name: str, model: torch.nn.Module) -> list[torch.Tensor]:
    """A fixed input's outputs, in float32 (for the fp16 check)."""
    t = torch.arange(22050) / 22050
    wave = sum(torch.sin(2 * torch.pi * 140 * k * t) / k for k in range(1, 6)) * 0.2
    with torch.no_grad():
        if name == "fastpitch":
            ids = torch.tensor([make_processor().encode("Hello world, this is a test.")])
            out = model.infer(ids, torch.tensor([ids.shape[1]]))
            # the durations before rounding: rounded weights may move a rounded one by a frame
            return [out.durations, out.pitch, out.energy, out.mel]
        if name == "hifigan":
            from speechrt.audio.mel import mel_spectrogram

            return [model(mel_spectrogram(wave[None], MelConfig()))]
        from speechrt.runtime.featurizer import batch_features

        n_mels = int(getattr(model.dims, "n_mels", FeatureConfig().n_mels))
        feats, lengths = batch_features([wave[:16000]], FeatureConfig(n_mels=n_mels))
        return [model(feats, lengths)[0]]


def fp16_error(name: str, model: torch.nn.Module) -> float:
    """Relative RMS change of the probe output when the weights are rounded to fp16."""
    rounded = type(model)(model.dims)
    rounded.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    errors = []
    for a, b in zip(_probe(name, model.eval()), _probe(name, rounded.eval()), strict=True):
        if a.shape != b.shape:  # a mel whose rounded durations moved: the durations count
            continue
        if name in ASR_KINDS:  # compare probabilities, not log-probabilities of unlikely labels
            a, b = a.exp(), b.exp()
        rms = a.float().square().mean().sqrt().clamp(min=1e-12)
        errors.append(float((a - b).float().square().mean().sqrt() / rms))
    return max(errors)


FP16_TOLERANCE = 0.01

BUILDERS = {
    "fastpitch": fastpitch_component,
    "hifigan": hifigan_component,
    "quartznet": quartznet_component,
    "fastconformer": fastconformer_component,
}


def export(
    runs: dict[str, str | Path],
    out_dir: str | Path,
    fp16: bool = True,
    speech: SpeechData | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Write each run (model name -> run dir or compact file) as a component under out_dir.
    `speech`: training speech for the recogniser's BatchNorm statistics (precise_bn)."""
    out = Path(out_dir)
    summary: dict[str, Any] = {}
    total = 0
    for name, path in runs.items():
        trainer, info = load_run(path)
        if name == "quartznet":
            model, component = quartznet_component(trainer, speech, device)
        else:
            model, component = BUILDERS[name](trainer)
        component.source = {"trained_by": "speechrt_train", "steps": info["steps"]}
        component.source["train_seconds"] = info["train_seconds"]
        if "averaged" in info:
            component.source["averaged"] = info["averaged"]
        error = fp16_error(name, model)
        dtype = torch.float16 if fp16 and error < FP16_TOLERANCE else None
        target = save_component(out / NAMES[name], component, model.state_dict(), dtype)
        # the main graph, which the CPU default (onnxruntime) runs; it reads the weights above
        export_dir(target, graphs=[next(iter(graphs_of(component.kind)))])
        size = sum(p.stat().st_size for p in target.iterdir())
        total += size if name in ("fastpitch", "hifigan", "quartznet") else 0
        params = sum(v.numel() for v in model.state_dict().values())
        summary[name] = {**info, "dir": NAMES[name], "parameters": params, "bytes": size}
        summary[name] |= {"dtype": "fp16" if dtype else "fp32", "fp16_rel_error": error}
    summary["total_mb"] = round(total / 1e6, 2)
    if total / 1e6 > MAX_TOTAL_MB:
        raise ValueError(f"the defaults take {total / 1e6:.1f} MB (limit {MAX_TOTAL_MB} MB)")
    return summary


def average_exported(
    dirs: list[str | Path], weights: list[float], out_dir: str | Path
) -> dict[str, Any]:
    """Exported model directories of one component -> their weighted mean in out_dir (weights
    >= 0 summing to 1): every float tensor of model.safetensors averaged in fp32 (stored fp16
    where the first input is and rounding moves the output by less than FP16_TOLERANCE),
    model.json the first's with source.averaged listing each input's steps and weight (and
    what it averaged in turn), then the main graph. For models exported with
    their normalisation folded (QuartzNet's BatchNorm into each convolution) the mean is taken
    of the folded weights; the model.json files must agree apart from their source."""
    from safetensors.torch import load_file

    check_weights(weights, len(dirs))
    infos = [read_info(d) for d in dirs]
    if infos[0].kind not in BUILDERS:
        raise ValueError(f"average: {infos[0].kind} is not a component speechrt_train makes")
    first = {k: v for k, v in infos[0].to_json().items() if k != "source"}
    for d, info in zip(dirs, infos, strict=True):
        if {k: v for k, v in info.to_json().items() if k != "source"} != first:
            raise ValueError(f"average: {d}'s model.json differs from {dirs[0]}'s")
    states = [load_file(str(Path(d) / WEIGHTS_FILE)) for d in dirs]
    shapes = {k: t.shape for k, t in states[0].items()}
    for d, state in zip(dirs, states, strict=True):
        if {k: t.shape for k, t in state.items()} != shapes:
            raise ValueError(f"average: {d}'s tensors differ from {dirs[0]}'s")
    mean = {}  # in fp32, then stored as the first input is where rounding changes little
    for name, tensor in states[0].items():
        if tensor.is_floating_point():
            tensor = sum(w * s[name].float() for w, s in zip(weights, states, strict=True))
        mean[name] = tensor
    from speechrt.models import build_model

    model = build_model(infos[0].kind, infos[0].dims)
    model.load_state_dict(mean)
    error = fp16_error(infos[0].kind, model)
    fp16 = any(t.dtype == torch.float16 for t in states[0].values())
    dtype = torch.float16 if fp16 and error < FP16_TOLERANCE else None
    sources = [info.source for info in infos]
    averaged = []
    for source, w in zip(sources, weights, strict=True):
        item: dict[str, Any] = {"step": int(source.get("steps", 0)), "weight": w}
        if source.get("averaged"):
            item["averaged"] = source["averaged"]
        averaged.append(item)
    info = infos[0]
    info.source = {
        "trained_by": "speechrt_train",
        "steps": max(a["step"] for a in averaged),
        "train_seconds": max(float(s.get("train_seconds", 0.0)) for s in sources),
        "averaged": averaged,
    }
    target = save_component(out_dir, info, mean, dtype)
    export_dir(target, graphs=[next(iter(graphs_of(info.kind)))])
    return {
        "out": str(target),
        "steps": info.source["steps"],
        "train_seconds": info.source["train_seconds"],
        "averaged": averaged,
        "parameters": sum(v.numel() for v in mean.values()),
        "bytes": sum(p.stat().st_size for p in target.iterdir()),
        "dtype": "fp16" if dtype else "fp32",
        "fp16_rel_error": error,
    }


def _asr_wer(asr: Any, audios: list[np.ndarray], refs: list[str]) -> tuple[float, list[str]]:
    from speechrt.asr.wer import wer

    # an untrained voice can say (almost) nothing: pad to the recogniser's shortest input
    shortest = asr.features.min_samples
    audios = [np.pad(a, (0, max(0, shortest - len(a)))) for a in audios]
    hyps = [t.text for t in asr.transcribe(audios, batch_size=16)]
    return wer(refs, hyps), hyps


def evaluate(
    defaults: str | Path,
    corpus: str | Path,
    heldout_voice: str = "rms",
    tts_voice: str = "slt-hts",
    n_sentences: int = 200,
    device: str = "auto",
) -> dict[str, Any]:
    """WERs through speechrt's runtime: ASR on `heldout_voice`, our voice through our ASR."""
    from speechrt.asr import ASR
    from speechrt.tts import TTS
    from speechrt_train.corpus import load_shard, utterance_audio

    d = Path(defaults)
    asr = ASR(d / "asr", device=device)
    tts = TTS(d / "voice-acoustic", d / "voice-vocoder", device=device)
    result: dict[str, Any] = {}
    shard = load_shard(Path(corpus) / f"{heldout_voice}.pt")
    idx = [i for i, h in enumerate(shard["heldout"]) if h][:n_sentences]
    audios = [utterance_audio(shard, i).numpy() for i in idx]
    refs = [transcript(shard["spoken"][i]) for i in idx]
    score, hyps = _asr_wer(asr, audios, refs)
    result["asr_heldout_voice"] = {"voice": heldout_voice, "sentences": len(idx), "wer": score}
    result["asr_examples"] = [
        {"ref": r, "hyp": h} for r, h in list(zip(refs, hyps, strict=True))[:5]
    ]

    teacher = load_shard(Path(corpus) / f"{tts_voice}.pt")
    idx = [i for i, h in enumerate(teacher["heldout"]) if h][:n_sentences]
    texts = [teacher["texts"][i] for i in idx]
    refs = [transcript(teacher["spoken"][i]) for i in idx]
    sr = teacher["sample_rate"]
    audios = [resample(utterance_audio(teacher, i).numpy(), sr, asr.sample_rate) for i in idx]
    score, _ = _asr_wer(asr, audios, refs)
    result["asr_teacher_voice_heldout_text"] = {"voice": tts_voice, "wer": score}

    t0 = time.perf_counter()
    ours = tts.synthesize(texts, batch_size=16)
    synth_seconds = time.perf_counter() - t0
    audios = [resample(a, tts.sampling_rate, asr.sample_rate) for a in ours]
    score, hyps = _asr_wer(asr, audios, refs)
    result["tts_intelligibility"] = {
        "sentences": len(texts),
        "wer": score,
        "audio_seconds": round(sum(len(a) for a in ours) / tts.sampling_rate, 1),
        "synthesis_seconds": round(synth_seconds, 2),
    }
    result["tts_examples"] = [
        {"ref": r, "hyp": h} for r, h in list(zip(refs, hyps, strict=True))[:5]
    ]
    hello = tts.synthesize(["Hello world."])[0]
    _, heard = _asr_wer(asr, [resample(hello, tts.sampling_rate, asr.sample_rate)], ["hello world"])
    result["hello_world"] = heard[0]
    return result


def write_metrics(path: str | Path, metrics: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(metrics, indent=1) + "\n")
