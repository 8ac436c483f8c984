"""Reading DLE/NGC training checkpoints safely and converting them into the model repository.

Nothing here unpickles arbitrary objects: `torch.load(..., weights_only=True)` only.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import torch

from speechrt.convert import Converted
from speechrt.errors import SpeechRTError
from speechrt.registry import converter, detectors, file_reader, model_class
from speechrt.repo import ComponentInfo, save_component, sha256_file

StateDict = dict[str, torch.Tensor]


def load_checkpoint(path: str | Path) -> dict:
    """torch.load with weights_only=True, turning every failure into one clear SpeechRTError."""
    path = Path(path)
    if not path.is_file():
        raise SpeechRTError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch < 2.13: "Unsupported global: GLOBAL m.f ..."; 2.13: "... unsupported GLOBAL m.f ..."
        found = re.search(r"unsupported (?:global: )?GLOBAL ([\w.]+)", str(e), re.IGNORECASE)
        if found is None:
            raise SpeechRTError(f"{path}: not a readable PyTorch checkpoint") from None
        raise SpeechRTError(
            f"{path}: checkpoint holds a pickled {found.group(1)} object; refusing to unpickle "
            "anything but tensors and plain values"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise SpeechRTError(f"{path}: not a readable PyTorch checkpoint ({e})") from None
    if not isinstance(ckpt, dict):
        raise SpeechRTError(f"{path}: expected a dict checkpoint, got {type(ckpt).__name__}")
    return ckpt


def strip_prefix(sd: StateDict, pattern: str = r"^module\.") -> StateDict:
    """Drop a DDP/apex prefix such as a leading 'module.'."""
    rx = re.compile(pattern)
    return {rx.sub("", k): v for k, v in sd.items()}


def fold_weight_norm(sd: StateDict) -> StateDict:
    """Replace every (name.weight_g, name.weight_v) pair by name.weight = g * v / ||v||.

    The norm runs over every dim except 0 (torch weight_norm's default dim=0), in float32.
    """
    out: StateDict = {}
    for k, v in sd.items():
        leaf = k.rsplit(".", 1)[-1]
        if leaf == "weight_g":
            continue
        if leaf == "weight_v":
            base = k[: -len("_v")]  # "<name>.weight"
            g = sd[base + "_g"].float()
            vf = v.float()
            norm = vf.flatten(1).norm(dim=1).view(-1, *([1] * (vf.dim() - 1)))
            out[base] = (g * vf / norm).to(v.dtype)
        else:
            out[k] = v
    return out


def tensors_of(ckpt: dict, *keys: str) -> StateDict:
    """The state dict in a training checkpoint: the first of `keys` present, or the dict itself."""
    for key in keys:
        if isinstance(ckpt.get(key), dict):
            return strip_prefix(ckpt[key])
    if ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        return strip_prefix(ckpt)
    raise SpeechRTError(f"no state dict found in checkpoint (looked for {', '.join(keys)})")


def detect_kind(ckpt: dict) -> str:
    """Guess the architecture of a DLE checkpoint from its state-dict keys."""
    for key in ("state_dict", "generator", "ema_state_dict", "model"):
        if isinstance(ckpt.get(key), dict):
            keys = set(strip_prefix(ckpt[key]))
            break
    else:
        keys = set(strip_prefix(ckpt)) if all(isinstance(k, str) for k in ckpt) else set()
    found = [kind for kind, match in detectors().items() if match(keys)]
    if len(found) != 1:
        what = "no known architecture" if not found else f"several ({', '.join(found)})"
        raise SpeechRTError(f"cannot tell the model kind ({what} matches); pass --kind")
    return found[0]


def convert_checkpoint(
    path: str | Path, out_dir: str | Path, kind: str | None = None, dtype: torch.dtype | None = None
) -> ComponentInfo:
    """DLE checkpoint or NeMo .nemo file -> model repository directory. Returns what was
    written."""
    conv: Converted
    reader = file_reader(Path(path).suffix)
    if reader is not None:  # another project's whole model file (.nemo)
        try:
            conv = reader(path)
        except KeyError as e:
            raise SpeechRTError(f"{path}: incomplete model file (missing {e})") from None
        if kind is not None and kind != conv.kind:
            raise SpeechRTError(f"{path}: a {conv.kind} model, not {kind}")
        kind = conv.kind
        model = model_class(kind)(conv.dims)
        for k, v in model.state_dict().items():  # NeMo's use_bias: false leaves biases out
            if k.endswith(".bias") and k not in conv.state_dict:
                conv.state_dict[k] = torch.zeros_like(v)
    else:
        ckpt = load_checkpoint(path)
        kind = kind or detect_kind(ckpt)
        try:
            conv = converter(kind)(ckpt)
        except KeyError as e:
            raise SpeechRTError(f"{path}: not a {kind} checkpoint (missing {e})") from None
        model = model_class(kind)(conv.dims)
    try:
        model.load_state_dict(conv.state_dict, strict=True)
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise SpeechRTError(
            f"{path}: does not match the {kind} layout ({' '.join(lines[1:3])})"
        ) from None
    info = ComponentInfo(
        kind=conv.kind,
        dims=conv.dims,
        mel=conv.mel,
        meta=conv.meta,
        source={"file": Path(path).name, "sha256": sha256_file(path)},
    )
    save_component(out_dir, info, conv.state_dict, dtype=dtype)
    return info
