"""The model repository: one directory per component, loadable without the training code.

<dir>/model.json          kind, dims, mel config, text/labels metadata, source checkpoint + sha256
<dir>/model.safetensors   weights in inference form (weight norm / BatchNorm folded)
<dir>/model.onnx          written by `speechrt export` (reads its weights from model.safetensors)

Reading model.json imports no torch; building a module does.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speechrt.audio.mel import MelConfig
from speechrt.errors import SpeechRTError

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1
INFO_FILE = "model.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class ComponentInfo:
    """What a component *is*: everything in model.json."""

    kind: str  # registry name, e.g. "fastpitch", "hifigan", "quartznet"
    dims: dict[str, Any]  # the architecture dataclass as a dict
    mel: MelConfig | None = None  # TTS components: the mel transform they produce/consume
    meta: dict[str, Any] = field(default_factory=dict)  # text front end, labels, features, ...
    source: dict[str, Any] = field(default_factory=dict)  # checkpoint file name + sha256

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "dims": self.dims,
            "mel": self.mel.to_dict() if self.mel else None,
            "meta": self.meta,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ComponentInfo:
        if d.get("format_version") != FORMAT_VERSION:
            raise SpeechRTError(
                f"unsupported model.json format_version {d.get('format_version')!r}"
            )
        mel = MelConfig.from_dict(d["mel"]) if d.get("mel") else None
        return cls(d["kind"], d["dims"], mel, d.get("meta", {}), d.get("source", {}))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_component(
    out_dir: str | Path,
    info: ComponentInfo,
    state_dict: dict[str, torch.Tensor],
    dtype: torch.dtype | None = None,
) -> Path:
    """Write model.json + model.safetensors; `dtype` optionally casts float weights (e.g. fp16)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in state_dict.items():
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        tensors[k] = v.contiguous()
    save_file(tensors, str(out / WEIGHTS_FILE))
    dims = asdict(info.dims) if is_dataclass(info.dims) else info.dims
    info = ComponentInfo(info.kind, dims, info.mel, info.meta, info.source)
    (out / INFO_FILE).write_text(json.dumps(info.to_json(), indent=1) + "\n")
    # safetensors writes its file 0600: give it model.json's mode (0666 less the umask), or a
    # directory converted by one user would not load for another (a server's own account)
    shutil.copymode(out / INFO_FILE, out / WEIGHTS_FILE)
    return out


def read_info(model_dir: str | Path) -> ComponentInfo:
    path = Path(model_dir) / INFO_FILE
    if not Path(model_dir).is_dir():
        raise SpeechRTError(f"{model_dir}: not a model directory (run `speechrt convert` first)")
    try:
        return ComponentInfo.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise SpeechRTError(
            f"{model_dir}: no {INFO_FILE} (run `speechrt convert CKPT DIR`)"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise SpeechRTError(f"{path}: corrupt model description ({e})") from None


def load_state_dict(model_dir: str | Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(model_dir) / WEIGHTS_FILE
    if not path.exists():
        raise SpeechRTError(f"{model_dir}: no {WEIGHTS_FILE}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise SpeechRTError(f"{path}: corrupt weights file ({e})") from None


def weight_shapes(model_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from the safetensors header alone (no weight is read; no torch)."""
    from safetensors import SafetensorError, safe_open

    path = Path(model_dir) / WEIGHTS_FILE
    if not path.exists():
        raise SpeechRTError(f"{model_dir}: no {WEIGHTS_FILE}")
    try:
        with safe_open(str(path), framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as e:
        raise SpeechRTError(f"{path}: corrupt weights file ({e})") from None


def check_dims(model_dir: str | Path, info: ComponentInfo) -> None:
    """model.json's dims against the weights' shapes, before anything is allocated: the
    module is built on the meta device and its state dict's shapes compared with the
    safetensors header. SpeechRTError (one line) names the first difference."""
    import torch

    from speechrt.models import build_model

    shapes = weight_shapes(model_dir)
    try:
        with torch.device("meta"):
            model = build_model(info.kind, info.dims)
    except SpeechRTError as e:
        raise SpeechRTError(f"{Path(model_dir) / INFO_FILE}: {e}") from None
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problem = ""
    if wanted.keys() != shapes.keys():
        missing, extra = (
            sorted(wanted.keys() - shapes.keys()),
            sorted(shapes.keys() - wanted.keys()),
        )
        problem = f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}"
    else:
        for k, shape in wanted.items():
            if shape != shapes[k]:
                problem = f"{k}: the dims make {list(shape)}, the weights hold {list(shapes[k])}"
                break
    if problem:
        raise SpeechRTError(f"{model_dir}: weights do not match model.json ({problem})")


def check_weight_dims(model_dir: str | Path, info: ComponentInfo) -> None:
    """model.json's dims against the weights' shapes without torch, for backends that never
    build the module (onnx): each dim its architecture ties to a weight's axis
    (Architecture.weight_dims: symbols, speakers, mel channels, classes, ...) must equal that
    axis in the safetensors header. SpeechRTError (one line) names the first difference."""
    from speechrt.arch import as_dims
    from speechrt.registry import architecture

    arch = architecture(info.kind)
    try:
        dims = as_dims(arch.dims, info.dims)
    except (SpeechRTError, TypeError, ValueError) as e:
        raise SpeechRTError(f"{Path(model_dir) / INFO_FILE}: {e}") from None
    shapes = weight_shapes(model_dir)
    for field_name, (key, axis) in arch.weight_dims.items():
        if key not in shapes:  # a weight the dims leave out (one speaker: no speaker table)
            continue
        want, held = getattr(dims, field_name), shapes[key]
        if len(held) <= axis or held[axis] != want:
            raise SpeechRTError(
                f"{model_dir}: weights do not match model.json ({field_name} is {want}, but "
                f"{key} holds {list(held)})"
            )


def load_component(
    model_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[torch.nn.Module, ComponentInfo]:
    """Build the module described by model.json and load its weights (strict), in eval mode
    (`dtype` None: float32).
    The dims are checked against the weights' shapes first (check_dims), so a model.json
    with absurd sizes costs nothing."""
    import torch

    from speechrt.models import build_model

    info = read_info(model_dir)
    check_dims(model_dir, info)
    model = build_model(info.kind, info.dims)
    state = load_state_dict(model_dir)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else str(e)
        raise SpeechRTError(f"{model_dir}: weights do not match model.json ({detail})") from None
    return model.to(device=device, dtype=dtype or torch.float32).eval(), info
