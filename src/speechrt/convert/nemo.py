"""NeMo `.nemo` files of the Parakeet family -> Parakeet model directories, without NeMo.

A .nemo is a tar archive (plain or gzip) of `model_config.yaml` (OmegaConf: `${...}`
interpolations), `model_weights.ckpt` (a plain state dict) and the tokenizer's files. It is read
in memory: the YAML with yaml.safe_load, the weights with torch.load(weights_only=True), the
SentencePiece model's pieces by a few lines of protobuf parsing; nothing from the file runs.

The config's `target` class and keys say what the model is:
    EncDecCTCModelBPE                      -> parakeet_ctc
    EncDecRNNTBPEModel                     -> parakeet_transducer, head rnnt (tdt: loss tdt)
    EncDecHybridRNNTCTCBPEModel            -> parakeet_transducer, head rnnt_ctc / tdt_ctc
"""

from __future__ import annotations

import io
import pickle
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from speechrt.arch import Conversion
from speechrt.arch.parakeet import ParakeetCTCDims, ParakeetDims, ParakeetTransducerDims
from speechrt.audio.features import FeatureConfig
from speechrt.convert import Converted
from speechrt.errors import SpeechRTError

KINDS = {
    "EncDecCTCModelBPE": "ctc",
    "EncDecRNNTBPEModel": "rnnt",
    "EncDecHybridRNNTCTCBPEModel": "rnnt_ctc",
}
SUPPORTED = (
    "speechrt serves NeMo's CTC, RNN-T, TDT and hybrid TDT/RNN-T + CTC FastConformer models "
    "with SentencePiece tokenizers (Parakeet: EncDecCTCModelBPE, EncDecRNNTBPEModel, "
    "EncDecHybridRNNTCTCBPEModel)"
)
WINDOW_SECONDS = 120.0  # a converted model's recognition window (ASR's default: 20 s)
MAX_MEMBER = 8 << 30  # bytes: the largest member read (a 1.1B model's weights are ~4.3 GB)


def read_archive(path: str | Path) -> dict[str, bytes]:
    """The regular files of a .nemo (tar or tar.gz), by base name, read into memory."""
    path = Path(path)
    if not path.is_file():
        raise SpeechRTError(f"{path}: no such file")
    try:
        with tarfile.open(path, "r:*") as tar:
            out = {}
            for m in tar.getmembers():
                if not m.isfile():
                    continue  # directories; links and devices are never followed
                if m.size > MAX_MEMBER:
                    raise SpeechRTError(f"{path}: member {m.name} is {m.size} bytes; too large")
                f = tar.extractfile(m)
                assert f is not None
                out[Path(m.name).name] = f.read()
    except (tarfile.TarError, EOFError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpeechRTError(f"{path}: not a readable .nemo archive ({first})") from None
    for need in ("model_config.yaml", "model_weights.ckpt"):
        if need not in out:
            raise SpeechRTError(f"{path}: not a .nemo model (no {need})")
    return out


def resolve(config: Any) -> Any:
    """OmegaConf's `${a.b}` interpolations resolved against the root (a `model.` prefix, as
    NeMo's configs write some paths, is tried without it too)."""
    rx = re.compile(r"\$\{([^${}]+)\}")

    def lookup(ref: str, depth: int) -> Any:
        for path in (ref, ref.removeprefix("model.")):
            node: Any = config
            try:
                for part in path.split("."):
                    node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError, TypeError):
                continue
            return walk(node, depth + 1)
        raise SpeechRTError(f"model_config.yaml: cannot resolve ${{{ref}}}")

    def walk(node: Any, depth: int = 0) -> Any:
        if depth > 20:
            raise SpeechRTError("model_config.yaml: interpolations nest too deeply")
        if isinstance(node, dict):
            return {k: walk(v, depth) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, depth) for v in node]
        if isinstance(node, str):
            whole = rx.fullmatch(node)
            if whole:
                return lookup(whole.group(1), depth)
            return rx.sub(lambda m: str(lookup(m.group(1), depth)), node)
        return node

    return walk(config)


def sentencepiece_pieces(model: bytes) -> list[tuple[str, int]]:
    """(piece, type) of a SentencePiece ModelProto, in id order: field 1 of the model is a
    repeated SentencePiece {1: piece, 2: score, 3: type (1 normal, 2 unknown, 3 control, 4 user
    defined, 5 unused, 6 byte)}."""

    def varint(b: bytes, i: int) -> tuple[int, int]:
        shift = value = 0
        while True:
            if i >= len(b):
                raise SpeechRTError("tokenizer model: truncated")
            byte = b[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, i

    def fields(b: bytes) -> list[tuple[int, Any]]:
        out: list[tuple[int, Any]] = []
        i = 0
        while i < len(b):
            key, i = varint(b, i)
            number, wire = key >> 3, key & 7
            value: int | bytes
            if wire == 0:
                value, i = varint(b, i)
            elif wire == 1:
                value, i = b[i : i + 8], i + 8
            elif wire == 2:
                n, i = varint(b, i)
                value, i = b[i : i + n], i + n
            elif wire == 5:
                value, i = b[i : i + 4], i + 4
            else:
                raise SpeechRTError(f"tokenizer model: unsupported protobuf wire type {wire}")
            out.append((number, value))
        return out

    pieces = []
    for number, value in fields(model):
        if number != 1:
            continue
        sub = dict(fields(value))
        pieces.append((sub.get(1, b"").decode("utf-8"), int(sub.get(3, 1))))
    if not pieces:
        raise SpeechRTError("tokenizer model: no pieces")
    return pieces


def surface(piece: str, kind: int) -> str:
    """What a piece reads as in text, as SentencePiece decodes it: "▁" is a space, the unknown
    piece " ⁇ ", control pieces nothing, a byte piece its byte (Latin-1 here)."""
    if kind == 2:
        return " \u2047 "
    if kind == 3:
        return ""
    if kind == 6 and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
        return chr(int(piece[3:5], 16))
    return piece.replace("\u2581", " ")


def nemo_file(files: dict[str, bytes], ref: Any, what: str) -> bytes:
    """A config path "nemo:<name>" (or a bare name) -> that member's bytes."""
    name = Path(str(ref).removeprefix("nemo:")).name
    if name not in files:
        raise SpeechRTError(f"the .nemo has no {what} ({name})")
    return files[name]


def feature_config(pre: dict[str, Any]) -> FeatureConfig:
    """AudioToMelSpectrogramPreprocessor at inference (no dither, pad_to 0)."""
    checks = {"normalize": "per_feature", "window": "hann", "frame_splicing": 1, "log": True}
    checks |= {"log_zero_guard_type": "add", "mag_power": 2.0, "exact_pad": False}
    for key, want in checks.items():
        if pre.get(key, want) != want:
            raise SpeechRTError(f"unsupported preprocessor setting {key}={pre[key]!r}")
    sr = int(pre.get("sample_rate", 16000))
    win = int(float(pre.get("window_size", 0.025)) * sr)
    guard = pre.get("log_zero_guard_value", 2**-24)
    if isinstance(guard, str):
        raise SpeechRTError(f"unsupported log_zero_guard_value {guard!r}")
    return FeatureConfig(
        sample_rate=sr,
        win_length=win,
        hop_length=int(float(pre.get("window_stride", 0.01)) * sr),
        n_fft=int(pre.get("n_fft") or 1 << (win - 1).bit_length()),
        n_mels=int(pre.get("features", pre.get("nfilt", 80))),
        fmin=float(pre.get("lowfreq") or 0.0),
        fmax=float(pre["highfreq"]) if pre.get("highfreq") else None,
        preemph=float(pre.get("preemph", 0.97)),
        log_guard=float(guard),
        std_eps=1e-5,
        pad_align=0,
        dither=0.0,
        center_pad="zeros",
        valid_rule="floor",
    )


def encoder_dims(enc: dict[str, Any]) -> dict[str, Any]:
    checks = {"subsampling": "dw_striding", "subsampling_factor": 8, "conv_norm_type": "batch_norm"}
    checks |= {"causal_downsampling": False, "pos_emb_max_len": None, "untie_biases": True}
    for key, want in checks.items():
        if want is not None and enc.get(key, want) != want:
            raise SpeechRTError(f"unsupported encoder setting {key}={enc[key]!r}")
    attention = enc.get("self_attention_model", "rel_pos")
    if attention not in ("rel_pos", "rel_pos_local_attn"):
        raise SpeechRTError(f"unsupported self_attention_model {attention!r}")
    context = [int(x) for x in enc.get("att_context_size") or [-1, -1]]
    if context != [-1, -1] and (context[0] != context[1] or context[0] < 0):
        raise SpeechRTError(f"limited-context attention {context} is supported only as [w, w]")
    if enc.get("att_context_style", "regular") != "regular" and context != [-1, -1]:
        raise SpeechRTError(f"unsupported att_context_style {enc['att_context_style']!r}")
    d_model = int(enc["d_model"])
    channels = int(enc.get("subsampling_conv_channels", -1))
    return dict(
        n_mels=int(enc["feat_in"]),
        d_model=d_model,
        n_layers=int(enc["n_layers"]),
        n_heads=int(enc["n_heads"]),
        ff_expansion=int(enc.get("ff_expansion_factor", 4)),
        conv_kernel=int(enc.get("conv_kernel_size", 31)),
        subsampling_channels=d_model if channels == -1 else channels,
        subsampling_layers=3,
        xscaling=bool(enc.get("xscaling", True)),
        att_context=None if context == [-1, -1] else context[0],
    )


def head_dims(cfg: dict[str, Any], head: str, vocab: int) -> dict[str, Any]:
    if head == "ctc":
        return dict(head="ctc", vocab_size=vocab)
    pred, joint = cfg["decoder"]["prednet"], cfg["joint"]["jointnet"]
    if cfg["decoder"].get("blank_as_pad", True) is not True:
        raise SpeechRTError("unsupported transducer decoder: blank_as_pad false")
    if int(pred.get("rnn_hidden_size", -1)) not in (-1, int(pred["pred_hidden"])):
        raise SpeechRTError("unsupported prediction network: rnn_hidden_size != pred_hidden")
    if joint.get("activation", "relu") != "relu":
        raise SpeechRTError(f"unsupported joint activation {joint['activation']!r}")
    loss = (cfg.get("loss") or {}).get("loss_name", "default")
    durations = tuple(int(d) for d in (cfg.get("model_defaults") or {}).get("tdt_durations", []))
    tdt = loss == "tdt"
    if tdt and not durations:
        raise SpeechRTError("a TDT model without model_defaults.tdt_durations")
    greedy = ((cfg.get("decoding") or {}).get("greedy")) or {}
    max_symbols = greedy.get("max_symbols") or greedy.get("max_symbols_per_step") or 10
    return dict(
        head=("tdt" if tdt else "rnnt") + head.removeprefix("rnnt"),
        vocab_size=vocab,
        pred_hidden=int(pred["pred_hidden"]),
        pred_layers=int(pred.get("pred_rnn_layers", 1)),
        joint_hidden=int(joint["joint_hidden"]),
        durations=durations if tdt else (),
        max_symbols=int(max_symbols),
    )


def state_dict(sd: dict[str, torch.Tensor], dims: ParakeetDims) -> dict[str, torch.Tensor]:
    """NeMo's keys -> ParakeetCTC / ParakeetTransducer's, BatchNorm folded into the depthwise
    convs, absent biases (use_bias false) as zeros."""
    out: dict[str, torch.Tensor] = {}
    convs = sorted(
        {int(m.group(1)) for k in sd if (m := re.match(r"encoder\.pre_encode\.conv\.(\d+)\.", k))}
    )
    for k, v in sd.items():
        v = v.float()
        if k.startswith("preprocessor.") or k.endswith("num_batches_tracked"):
            continue
        if m := re.match(r"encoder\.pre_encode\.conv\.(\d+)\.(\w+)$", k):
            out[f"encoder.pre_encode.convs.{convs.index(int(m.group(1)))}.{m.group(2)}"] = v
        elif ".conv.batch_norm." in k:
            continue  # folded below
        elif k.startswith("encoder."):
            out[k.replace(".depthwise_conv.conv.", ".depthwise_conv.")] = v
        elif k.startswith(("decoder.decoder_layers.0.", "ctc_decoder.decoder_layers.0.")):
            if dims.has_ctc and (k.startswith("ctc_decoder.") or not dims.transducer):
                out["ctc." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("decoder.prediction.embed."):
            out["predictor.embed.weight"] = v
        elif m := re.match(r"decoder\.prediction\.dec_rnn\.lstm\.(\w+)$", k):
            out[f"predictor.lstm.{m.group(1)}"] = v
        elif k.startswith(("joint.enc.", "joint.pred.")):
            out[k] = v
        elif k.startswith("joint.joint_net."):
            out["joint.out." + k.rsplit(".", 1)[1]] = v
        else:
            raise SpeechRTError(f"unexpected weight {k} in the .nemo")
    for i in range(dims.n_layers):
        p = f"encoder.layers.{i}.conv."
        bn = {n: sd[p + "batch_norm." + n].float() for n in ("weight", "bias")}
        bn |= {n: sd[p + "batch_norm." + n].float() for n in ("running_mean", "running_var")}
        w = out[p + "depthwise_conv.weight"]  # (D, 1, k)
        b = out.get(p + "depthwise_conv.bias", torch.zeros(w.shape[0]))
        scale = bn["weight"] / torch.sqrt(bn["running_var"] + 1e-5)
        out[p + "depthwise_conv.weight"] = w * scale[:, None, None]
        out[p + "depthwise_conv.bias"] = (b - bn["running_mean"]) * scale + bn["bias"]
    return out


def convert(path: str | Path) -> Converted:
    """The registry's reader of .nemo files: path -> Converted."""
    return from_nemo(path)[0]


def load_weights(path: str | Path, data: bytes) -> Any:
    """model_weights.ckpt, tensors and plain values only (torch.load weights_only=True)."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e), re.IGNORECASE)
        what = f" a pickled {found.group(1)} object;" if found else ""
        raise SpeechRTError(
            f"{path}: model_weights.ckpt holds{what} refusing to unpickle anything but tensors"
        ) from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as e:
        raise SpeechRTError(f"{path}: unreadable model_weights.ckpt ({e})") from None


def from_nemo(path: str | Path) -> tuple[Converted, dict[str, torch.Tensor]]:
    """A .nemo -> what the model repository stores, and the NeMo state dict it came from."""
    import yaml

    files = read_archive(path)
    try:
        cfg = resolve(yaml.safe_load(files["model_config.yaml"]))
    except yaml.YAMLError as e:
        raise SpeechRTError(f"{path}: unreadable model_config.yaml ({e})") from None
    target = str(cfg.get("target", "")).rsplit(".", 1)[-1]
    if target not in KINDS:
        raise SpeechRTError(f"{path}: a {target or 'model of unknown class'}; {SUPPORTED}")
    ckpt = load_weights(path, files["model_weights.ckpt"])
    if not isinstance(ckpt, dict) or not all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        raise SpeechRTError(f"{path}: model_weights.ckpt is not a state dict")
    tok = cfg.get("tokenizer") or {}
    if tok.get("type", "bpe") != "bpe" or not tok.get("model_path"):
        raise SpeechRTError(f"{path}: needs a SentencePiece tokenizer; {SUPPORTED}")
    pieces = sentencepiece_pieces(nemo_file(files, tok["model_path"], "tokenizer model"))
    enc = encoder_dims(cfg["encoder"])
    head = head_dims(cfg, KINDS[target], len(pieces))
    dims_cls = ParakeetCTCDims if head["head"] == "ctc" else ParakeetTransducerDims
    dims = dims_cls(**enc, **head)
    features = feature_config(cfg["preprocessor"])
    if features.n_mels != dims.n_mels:
        raise SpeechRTError(f"{path}: {features.n_mels} mel features for {dims.n_mels} inputs")
    meta = {
        "labels": [surface(p, t) for p, t in pieces],  # blank = len(labels), the last class
        "pieces": [p for p, _ in pieces],
        "features": features.to_dict(),
        "nemo_target": str(cfg.get("target")),
        # NeMo encodes a file whole: windows of 2 minutes keep its output on files up to that
        # (full attention over 1,500 encoder frames is ~72 MB of scores per item and head group)
        "window_seconds": WINDOW_SECONDS,
    }
    kind = "parakeet_ctc" if dims.head == "ctc" else "parakeet_transducer"
    return Converted(kind=kind, dims=dims, state_dict=state_dict(ckpt, dims), meta=meta), ckpt


CONVERSION = Conversion(read=convert)  # named by its registry entries (speechrt.arch.parakeet)
