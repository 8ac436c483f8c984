"""Build tiny NeMo Parakeet-style models and record NeMo's own outputs as parity references.

NeMo is not a dependency of speechrt and never runs in CI: this script runs only in a separate
virtual environment with nemo_toolkit[asr]==3.0.0 (torch CPU), for example:

    python3.11 -m venv /work/nemovenv
    /work/nemovenv/bin/pip install torch "nemo_toolkit[asr]==3.0.0"
    /work/nemovenv/bin/python scripts/make_nemo_refs.py            # writes tests/data/nemo/

It builds, from NeMo's own classes and config keys (the dicts below are written here, following the
FastConformer configs' structure), five tiny seeded models, saves each with `save_to()` as
tests/data/nemo/<name>.nemo, and records per model and WAV: preprocessor features, encoder output,
CTC log-probs, greedy tokens, text and timestamps, plus one batched call of the three WAVs:

    ctc     EncDecCTCModelBPE, 80 mels, rel_pos attention, xscaling
    rnnt    EncDecRNNTBPEModel (plain RNN-T, 2-layer LSTM predictor), 80 mels, max_symbols 3
    tdt     EncDecRNNTBPEModel with the TDT loss, durations [0..4], 128 mels, no xscaling
    hybrid  EncDecHybridRNNTCTCBPEModel: TDT head + auxiliary CTC head, 80 mels
    local   EncDecCTCModelBPE with rel_pos_local_attn, att_context_size [16, 16]

The SentencePiece tokenizer (unigram, 128 pieces, cased and punctuated) is trained here on
sentences generated from a fixed seed plus tests/data/heldout_sentences.txt.

Random weights emit only blanks (or one token everywhere), so nemo_refs_models.randomize and
centre_heads randomise norms, BatchNorm statistics (so BatchNorm folding is exercised) and position
biases, give the output rows equal norms, centre them on the reference audio and set the blank bias
for a target blank rate, until greedy decoding emits a mix of words, <unk>, punctuation, several
tokens per frame (RNN-T max_symbols and TDT durations 0..4 are hit). The script then checks that
every greedy decision (CTC frame argmax, transducer token and duration argmax) wins by at least
MIN_GAP of the row's largest logit, so float noise in another implementation cannot flip a token;
a failed check stops it (`--search N` prints the margins and texts of seeds 1..N to pick others).
Two runs write identical .json/.npz files (the .nemo tars differ in artefact names and mtimes).

The WAVs are inputs, committed beside the outputs. They were made with speechrt's bundled voice and
resampled here (`--audio-from DIR` with a.wav, b.wav, c.wav at 22.05 kHz):

    speechrt synthesize "It's people I hate." --pace 0.85 -o a.wav
    speechrt synthesize "Good news from afar can bring you a welcome visitor, said God." -o b.wav
    speechrt synthesize "The human race has one really effective weapon, and that is laughter.
      Confidence is simply that quiet, assured feeling you have before you fall flat on your face.
      Anything cut to length will be too short." -o c.wav      (one line)

Outputs (tests/data/nemo/): <name>.nemo, <name>.npz (float32 arrays), <name>.json (texts, tokens,
timestamps, config facts), features_80mel.npz / features_128mel.npz (preprocessor output, shared by
the models with the same mel config).
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from nemo_refs_models import ROOT, WAVS, build, make_audio, train_tokenizer

OUT = ROOT / "tests" / "data" / "nemo"
# smallest allowed (top-1 - top-2) / max |logit| at any greedy decision, over the pre-softmax
# logits of the row: float noise in another implementation scales with the logits' magnitude and
# must not flip a decision
MIN_GAP = 1e-3

_CTC = dict(mels=80, layers=2, xscaling=True, head_scale=3.0, blank_rate=0.5)
_TRANSDUCER = dict(mels=80, layers=2, xscaling=True, head_scale=10.0, pred_scale=4.0,
                   blank_weight=1.0, blank_rate=0.1, max_symbols=10)  # fmt: skip
MODELS: dict[str, dict] = {
    # encoder dims; seed; output layer scale and blank rate, for transducers the predictor's scale
    # (nemo_refs_models.randomize / centre_heads). Seeds were searched (--search) so that greedy
    # decoding emits a mix of words and every decision passes MIN_GAP.
    "ctc": dict(_CTC, kind="ctc", d=48, heads=4, seed=6),
    "rnnt": dict(_TRANSDUCER, kind="rnnt", d=32, heads=2, seed=30, pred_layers=2, max_symbols=3,
                 blank_rate=0.3),
    "tdt": dict(_TRANSDUCER, kind="tdt", mels=128, d=40, layers=3, heads=4, xscaling=False,
                seed=30, pred_layers=2),
    "hybrid": dict(_TRANSDUCER, kind="hybrid", d=32, heads=4, seed=18, pred_layers=1,
                   ctc_scale=3.0, ctc_blank_rate=0.5),
    "local": dict(_CTC, kind="ctc", d=48, heads=4, seed=39, attention="rel_pos_local_attn",
                  context=[16, 16]),
}  # fmt: skip


def load_wav(name: str) -> np.ndarray:
    x, sr = sf.read(OUT / f"{name}.wav", dtype="float32")  # int16 / 32768
    assert sr == 16000 and x.ndim == 1, (sr, x.shape)
    return x


def jsonable(obj):
    """Hypothesis fields hold numpy / torch scalars and tensors: plain Python for JSON."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def rel_gaps(logits: torch.Tensor) -> torch.Tensor:
    """(top-1 - top-2) / max |logit| per row of pre-softmax logits: the argmax's margin."""
    top = logits.topk(2, -1).values
    return (top[..., 0] - top[..., 1]) / logits.abs().max(-1).values


class JointGaps:
    """Margins of every joint evaluation, from the pre-softmax logits of joint_net (with batch 1
    every evaluation is a greedy decision): token argmax over V + 1, duration argmax (TDT)."""

    def __init__(self, joint, vocab: int) -> None:
        self.joint, self.vocab = joint, vocab
        self.token: list[float] = []
        self.duration: list[float] = []

    def _hook(self, module, inputs, out: torch.Tensor) -> None:
        flat = out.reshape(-1, out.shape[-1]).float()
        self.token += rel_gaps(flat[:, : self.vocab + 1]).tolist()
        if flat.shape[-1] > self.vocab + 1:
            self.duration += rel_gaps(flat[:, self.vocab + 1 :]).tolist()

    def __enter__(self) -> JointGaps:
        self._handle = self.joint.joint_net.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


@torch.no_grad()
def forward_arrays(model, kind: str, xs: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Preprocessor -> encoder (-> CTC logits, log-probs) on a zero-padded batch, as transcribe()
    pads it."""
    lengths = torch.tensor([len(x) for x in xs])
    batch = torch.zeros(len(xs), int(lengths.max()))
    for i, x in enumerate(xs):
        batch[i, : len(x)] = torch.from_numpy(x)
    feats, feat_len = model.preprocessor(input_signal=batch, length=lengths)
    enc, enc_len = model.encoder(audio_signal=feats, length=feat_len)
    out = {"features": feats, "feature_length": feat_len, "encoded": enc, "encoded_length": enc_len}
    head = {"ctc": "decoder", "hybrid": "ctc_decoder"}.get(kind)
    if head:
        ctc = getattr(model, head)
        out["logits"] = ctc.decoder_layers(enc).transpose(1, 2)  # (B, Te, V + 1)
        out["log_probs"] = ctc(encoder_output=enc)
    return out


def ctc_record(hyp, blank: int, expected: np.ndarray) -> dict:
    log_probs = hyp.y_sequence  # with timestamps, transcribe() returns the (Te, V + 1) log-probs
    # transcribe() read the WAV itself: its log-probs must be the ones recorded from our arrays
    assert np.allclose(log_probs.numpy(), expected, atol=1e-4), "transcribe() saw other audio"
    labels = log_probs.argmax(-1).tolist()
    tokens = [t for i, t in enumerate(labels) if t != blank and (i == 0 or t != labels[i - 1])]
    return {
        "frame_labels": labels,
        "tokens": tokens,
        "text": hyp.text,
        "timestamps": jsonable(hyp.timestamp),
    }


def transducer_record(hyp) -> dict:
    rec = {
        "tokens": jsonable(hyp.y_sequence),
        "text": hyp.text,
        "timestamps": jsonable(hyp.timestamp),
    }
    if hyp.token_duration is not None and len(hyp.token_duration) > 0:
        rec["durations"] = jsonable(hyp.token_duration)
    return rec


def transcribe(model, batch_size: int) -> list:
    paths = [str(OUT / f"{n}.wav") for n in WAVS]
    hyps = model.transcribe(
        paths, batch_size=batch_size, timestamps=True, num_workers=0, verbose=False
    )
    model.eval()  # transcribe() restores the mode it found (train for a fresh model)
    return hyps[0] if isinstance(hyps, tuple) else hyps


def heads(kind: str) -> list[str]:
    return {"ctc": ["ctc"], "hybrid": ["transducer", "ctc"]}.get(kind, ["transducer"])


def use_head(model, kind: str, head: str) -> None:
    if kind == "hybrid":
        decoder_type = "ctc" if head == "ctc" else "rnnt"
        model.change_decoding_strategy(decoder_type=decoder_type, verbose=False)


def record(
    name: str, model, tokenizer_dir: Path
) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """NeMo's outputs for one model: (json record, model arrays, feature arrays)."""
    m = MODELS[name]
    kind = m["kind"]
    vocab = model.tokenizer.vocab_size
    xs = [load_wav(n) for n in WAVS]
    arrays: dict[str, np.ndarray] = {}
    feats: dict[str, np.ndarray] = {}
    decoding = model.cfg.decoding
    rec: dict = {
        "model": name,
        "nemo": f"{name}.nemo",
        "target": model.cfg.target,
        "nemo_version": __import__("nemo").__version__,
        "torch_version": torch.__version__,
        "features": f"features_{m['mels']}mel.npz",
        "vocab_size": vocab,
        "blank_id": vocab,
        # what NeMo's greedy decoding used (the config may leave it to NeMo's default)
        "max_symbols": getattr(model.decoding.decoding, "max_symbols", None),
        "durations": list(decoding.get("durations") or []),
        "supported_punctuation": sorted(model.decoding.supported_punctuation),
        "subsampling_factor": model.encoder.subsampling_factor,
        "window_stride": model.cfg.preprocessor.window_stride,
        "files": {},
    }
    for n, x in zip(WAVS, xs, strict=True):
        out = forward_arrays(model, kind, [x])
        T, Te = int(out["feature_length"][0]), int(out["encoded_length"][0])
        feats[n] = out["features"][0].numpy()  # (n_mels, T + 1): the last frame is zero padding
        arrays[f"{n}/encoded"] = out["encoded"][0].numpy()  # (d_model, Te or Te + 1)
        rec["files"][n] = {
            "wav": f"{n}.wav",
            "num_samples": len(x),
            "feature_length": T,
            "feature_frames": feats[n].shape[1],
            "encoded_length": Te,
            "encoded_frames": arrays[f"{n}/encoded"].shape[1],
        }
        if "log_probs" in out:
            arrays[f"{n}/log_probs"] = out["log_probs"][0, :Te].numpy()  # (Te, V + 1)
    batch = forward_arrays(model, kind, xs)
    feats["batch/feature_length"] = batch["feature_length"].numpy()
    arrays["batch/encoded"] = batch["encoded"].numpy()  # (3, d_model, Te_max [+ 1])
    arrays["batch/encoded_length"] = batch["encoded_length"].numpy()
    # batched features = the single ones on valid frames (to float noise) and zero elsewhere, so
    # only the single ones are stored
    diffs = []
    for i, n in enumerate(WAVS):
        T = int(batch["feature_length"][i])
        diffs.append(
            float((batch["features"][i, :, :T] - torch.from_numpy(feats[n][:, :T])).abs().max())
        )
        assert not batch["features"][i, :, T:].any()
    assert max(diffs) < 1e-5, diffs
    rec["batch_features_max_abs_diff"] = max(diffs)
    for head in heads(kind):
        use_head(model, kind, head)
        key = "result" if len(heads(kind)) == 1 else head
        if head == "ctc":
            results = [
                ctc_record(h, vocab, arrays[f"{n}/log_probs"])
                for h, n in zip(transcribe(model, 1), WAVS, strict=True)
            ]
            batched = [
                ctc_record(h, vocab, arrays[f"{n}/log_probs"])
                for h, n in zip(transcribe(model, len(WAVS)), WAVS, strict=True)
            ]
        else:
            results = [transducer_record(h) for h in transcribe(model, 1)]
            batched = [transducer_record(h) for h in transcribe(model, len(WAVS))]
        for n, r in zip(WAVS, results, strict=True):
            rec["files"][n][key] = r
        rec.setdefault("batch", {"files": list(WAVS)})[key] = batched
        # padding must not change the decoding
        for n, r, b in zip(WAVS, results, batched, strict=True):
            for k in ("tokens", "text"):
                assert r[k] == b[k], (name, n, head, k)
            assert r["timestamps"]["timestep"] == b["timestamps"]["timestep"], (name, n, head)
            if "durations" in r:
                # NeMo 3.0.0's batched TDT label looping reports, for an utterance that found its
                # token at the first try, the duration of the next joint evaluation whenever
                # another utterance of the batch needed more (the time index itself advances by
                # the right duration): durations and TDT end offsets of a batch can differ.
                diff = sum(x != y for x, y in zip(r["durations"], b["durations"], strict=True))
                rec["batch"].setdefault("durations_differing_from_batch_1", {})[n] = diff
    use_head(model, kind, "transducer")
    rec["min_decision_gap"] = decision_gaps(name, model)
    if m.get("attention") == "rel_pos_local_attn":
        rec["local_vs_full_attention"] = local_vs_full(model, m, tokenizer_dir, xs)
    return rec, arrays, feats


@torch.no_grad()
def local_vs_full(model, m: dict, tokenizer_dir: Path, xs: list[np.ndarray]) -> dict:
    """How much limited context changes the output: the same weights with full attention."""
    full = build(dict(m, attention="rel_pos", context=[-1, -1]), tokenizer_dir, [])
    full.load_state_dict(model.state_dict())
    out = {}
    for n, x in zip(WAVS, xs, strict=True):
        a, b = forward_arrays(model, "ctc", [x]), forward_arrays(full, "ctc", [x])
        Te = int(a["encoded_length"][0])
        diff = (a["encoded"][0, :, :Te] - b["encoded"][0, :, :Te]).abs().max()
        labels = [o["log_probs"][0, :Te].argmax(-1) for o in (a, b)]
        out[n] = {
            "encoded_max_abs_diff": float(diff),
            "frames_with_other_argmax": int((labels[0] != labels[1]).sum()),
        }
    return out


def decision_gaps(name: str, model) -> dict[str, float]:
    """Smallest margin of every greedy decision NeMo makes on the three WAVs, per head."""
    kind = MODELS[name]["kind"]
    vocab = model.tokenizer.vocab_size
    gaps: dict[str, float] = {}
    for n in WAVS:
        out = forward_arrays(model, kind, [load_wav(n)])
        Te = int(out["encoded_length"][0])
        if "logits" in out:
            gaps[f"ctc/{n}"] = float(rel_gaps(out["logits"][0, :Te]).min())
        if kind != "ctc":
            with JointGaps(model.joint, vocab) as jg:
                model.decoding.rnnt_decoder_predictions_tensor(
                    encoder_output=out["encoded"], encoded_lengths=out["encoded_length"]
                )
            gaps[f"token/{n}"] = min(jg.token)
            if jg.duration:
                gaps[f"duration/{n}"] = min(jg.duration)
    return gaps


def stats(name: str, model) -> str:
    """One line for --search: margins, tokens per frame, distinct tokens, texts."""
    kind = MODELS[name]["kind"]
    gaps = decision_gaps(name, model)
    lines = [f"min gap {min(gaps.values()):.2e}"]
    for n in WAVS:
        out = forward_arrays(model, kind, [load_wav(n)])
        Te = int(out["encoded_length"][0])
        for head in heads(kind):
            if head == "ctc":
                labels = out["log_probs"][0, :Te].argmax(-1).tolist()
                tokens = [
                    t
                    for i, t in enumerate(labels)
                    if t != model.tokenizer.vocab_size and (i == 0 or t != labels[i - 1])
                ]
                most = 1
            else:
                hyp = model.decoding.rnnt_decoder_predictions_tensor(
                    encoder_output=out["encoded"],
                    encoded_lengths=out["encoded_length"],
                    return_hypotheses=True,
                )[0]
                tokens = hyp.y_sequence.tolist()
                frames = hyp.timestamp  # a dict once transcribe(timestamps=True) has run
                frames = frames["timestep"] if isinstance(frames, dict) else frames.tolist()
                most = max(collections.Counter(frames).values(), default=0)
            text = model.tokenizer.ids_to_text(tokens)
            lines.append(
                f"{n}/{head}: {len(tokens)}/{Te} tokens, {len(set(tokens))} distinct, "
                f"<= {most} per frame: {text[:70]!r}"
            )
    return "\n  ".join(lines)


def check(rec: dict) -> list[str]:
    """Variety and decisiveness: what makes the references worth testing against."""
    problems = [
        f"decision gap {key} = {gap:.2e} < {MIN_GAP}"
        for key, gap in rec["min_decision_gap"].items()
        if gap < MIN_GAP
    ]
    words = 0
    for n, f in rec["files"].items():
        for key, r in f.items():
            if isinstance(r, dict):
                words = max(words, len(set(r["text"].split())))
                if len(r["tokens"]) < 5 or len(set(r["tokens"])) < 3:
                    problems.append(f"{n}/{key}: too few tokens {r['text']!r}")
    if words < 5:
        problems.append("no text has 5 different words")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--audio-from", type=Path, help="resample a/b/c.wav (22.05 kHz) from DIR first")
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="build only these models")
    ap.add_argument(
        "--search",
        type=int,
        metavar="N",
        help="print stats for seeds 1..N of the chosen models; write nothing",
    )
    args = ap.parse_args()
    from nemo.utils import logging as nemo_logging

    nemo_logging.setLevel(nemo_logging.ERROR)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # the references do not depend on the machine's thread count
    OUT.mkdir(parents=True, exist_ok=True)
    if args.audio_from:
        make_audio(args.audio_from, OUT)
    names = args.only or list(MODELS)
    audio = [load_wav(n) for n in WAVS]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = Path(tmp)
        train_tokenizer(tokenizer_dir)
        if args.search:
            for name in names:
                for seed in range(1, args.search + 1):
                    model = build(dict(MODELS[name], seed=seed), tokenizer_dir, audio)
                    print(f"{name} seed {seed}: {stats(name, model)}", flush=True)
            return
        features: dict[int, dict[str, np.ndarray]] = {}
        for name in names:
            model = build(MODELS[name], tokenizer_dir, audio)
            model.save_to(str(OUT / f"{name}.nemo"))
            rec, arrays, feats = record(name, model, tokenizer_dir)
            problems = check(rec)
            np.savez_compressed(OUT / f"{name}.npz", **arrays)
            (OUT / f"{name}.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
            mels = MODELS[name]["mels"]
            for k, v in features.get(mels, {}).items():  # same preprocessor, same features
                assert np.array_equal(v, feats[k]), (name, k)
            features[mels] = feats
            print(f"{name}: {stats(name, model)}", flush=True)
            if problems:
                raise SystemExit(f"{name}: " + "; ".join(problems))
    for mels, feats in features.items():
        np.savez_compressed(OUT / f"features_{mels}mel.npz", **feats)


if __name__ == "__main__":
    main()
