"""Inputs and tiny models for scripts/make_nemo_refs.py (NeMo venv only; see that script).

The WAVs, the SentencePiece tokenizer, NeMo 3.0.0 model configs written here (following the
FastConformer configs' structure, at tiny sizes), and the weight edits that make random models
emit varied, decisive greedy output.
"""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

ROOT = Path(__file__).resolve().parents[1]
WAVS = ("short", "medium", "long")
TDT_DURATIONS = [0, 1, 2, 3, 4]


def make_audio(src: Path, out: Path) -> None:
    """Resample speechrt's 22.05 kHz synthesis (a/b/c.wav in `src`) to 16 kHz int16 WAVs."""
    from scipy.signal import resample_poly

    for letter, name in zip("abc", WAVS, strict=True):
        x, sr = sf.read(src / f"{letter}.wav", dtype="float64")
        assert sr == 22050, sr
        y = resample_poly(x, 320, 441)  # 22050 * 320 / 441 = 16000
        y = np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)
        sf.write(out / f"{name}.wav", y, 16000, subtype="PCM_16")


# ---------------------------------------------------------------------------------------------
# tokenizer

WORDS = str.split(
    """
the a of to and in is it that was for on are with as his they be at one have this from or had by
hot word but what some we can out other were all there when up use your how said each she which
do their time if will way about many then them write would like so these her long make thing see
him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where
after back little only round man year came show every good me give our under name very through
just form sentence great think say help low line differ turn cause much mean before move right
boy old too same tell does set three want air well also play small end put home read hand port
large spell add even land here must big high such follow act why ask men change went light kind
off need house picture try us again animal point mother world near build self earth father head
stand own page should country found answer school grow study still learn plant cover food sun
four between state keep eye never last let thought city tree cross farm hard start might story
saw far sea draw left late run while press close night real life few north open seem together
next white children begin got walk example ease paper group always music those both mark often
letter until mile river car feet care second book carry took science eat room friend began idea
fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct leave
song measure door product black short class wind question happen complete ship area half rock
order fire south problem piece told knew pass since top whole king space heard best hour better
true during hundred five remember step early hold west ground interest reach fast sing listen
six table travel less morning ten simple several toward war lay against pattern slow center love
person money serve appear road map rain rule pull cold notice voice unit power town fine certain
fly fall lead cry dark machine note wait plan figure star box field rest correct able pound done
beauty drive stood contain front teach week final gave green oh quick develop ocean warm free
minute strong special mind behind clear tail produce fact street inch nothing course stay wheel
full force blue object decide surface deep moon island foot system busy test record boat common
gold possible plane dry wonder laugh thousand ago ran check game shape miss brought heat snow
bring yes distant fill east paint language among
"""
)
NAMES = str.split(
    """
Anna Boston Carl Denver Emma Friday George Helen India James Kate London Monday Nora Oscar Paris
Quinn Rome Sarah Tom Victor Wendy Xavier York Zoe NVIDIA OK TV
"""
)
CONTRACTIONS = str.split("it's don't I'm we're can't she'll they've isn't you'd")


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Cased, punctuated English-like sentences (fixed seed) plus the held-out sentences."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(4, 14)
        words = []
        for i in range(k):
            r = rng.random()
            pool = NAMES if r < 0.08 else CONTRACTIONS if r < 0.14 else WORDS
            words.append(rng.choice(pool))
            if i < k - 1 and rng.random() < 0.12:
                words[-1] += rng.choice([",", ",", ";", ":"])
        words[0] = words[0][0].upper() + words[0][1:]
        end = rng.choices([".", "?", "!", "..."], weights=[6, 2, 1, 0.5])[0]
        line = " ".join(words) + end
        out.append(f'"{line}"' if rng.random() < 0.05 else line)
    heldout = (ROOT / "tests" / "data" / "heldout_sentences.txt").read_text().splitlines()
    return out + [line.strip() for line in heldout if line.strip()]


def train_tokenizer(directory: Path) -> None:
    """SentencePiece unigram, 128 pieces, <unk> = 0, no bos/eos: tokenizer.model/.vocab, vocab.txt.

    Identity normalisation keeps tokenizer.model small (no 240 kB NFKC table); decoding ids to
    text, all that inference does, is the same either way.
    """
    import sentencepiece as spm

    (directory / "corpus.txt").write_text("\n".join(corpus()) + "\n")
    spm.SentencePieceTrainer.Train(
        input=str(directory / "corpus.txt"),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=128,
        model_type="unigram",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        normalization_rule_name="identity",
        shuffle_input_sentence=False,
        num_threads=1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
    # vocab.txt as NeMo's tokenizer scripts write it: "▁x" -> "x", "x" -> "##x", <unk> left out
    pieces = [sp.id_to_piece(i) for i in range(1, sp.get_piece_size())]
    lines = [(p[1:] or p) if p.startswith("▁") else f"##{p}" for p in pieces]
    (directory / "vocab.txt").write_text("\n".join(lines) + "\n")


def active_tokens(pieces: list[str], count: int = 28, seed: int = 0) -> list[int]:
    """Token ids that the scaled output layers favour: fewer competitors make the greedy
    decisions clearer, and the set covers what detokenisation must handle: <unk> (id 0), the bare
    "▁", punctuation, whole words ("▁the") and word-internal pieces ("ing")."""
    punct = [i for i, p in enumerate(pieces) if unicodedata.category(p[0]).startswith("P")]
    words = [i for i, p in enumerate(pieces) if p.startswith("▁") and len(p) >= 4]
    inner = [i for i, p in enumerate(pieces) if not p.startswith(("▁", "<")) and len(p) >= 3]
    rng = random.Random(seed)
    chosen = {0, 1, *punct[:6]}
    chosen |= set(rng.sample(words, min(len(words), 12)))
    chosen |= set(rng.sample(inner, min(len(inner), count - len(chosen))))
    return sorted(chosen)


# ---------------------------------------------------------------------------------------------
# model configs (NeMo 3.0.0 keys, FastConformer structure, tiny sizes)


def preprocessor_cfg(mels: int) -> dict:
    return {
        "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
        "sample_rate": 16000,
        "normalize": "per_feature",
        "window_size": 0.025,
        "window_stride": 0.01,
        "window": "hann",
        "features": mels,
        "n_fft": 512,
        "frame_splicing": 1,
        "dither": 1.0e-5,
        "pad_to": 0,
    }


def encoder_cfg(m: dict) -> dict:
    return {
        "_target_": "nemo.collections.asr.modules.ConformerEncoder",
        "feat_in": m["mels"],
        "feat_out": -1,
        "n_layers": m["layers"],
        "d_model": m["d"],
        "subsampling": "dw_striding",
        "subsampling_factor": 8,
        "subsampling_conv_channels": m["d"] // 2,
        "causal_downsampling": False,
        "reduction": None,
        "reduction_position": None,
        "reduction_factor": 1,
        "ff_expansion_factor": 4,
        "self_attention_model": m.get("attention", "rel_pos"),
        "n_heads": m["heads"],
        "att_context_size": m.get("context", [-1, -1]),
        "att_context_style": "regular",
        "xscaling": m["xscaling"],
        "untie_biases": True,
        "pos_emb_max_len": 5000,
        "conv_kernel_size": 9,
        "conv_norm_type": "batch_norm",
        "conv_context_size": None,
        "dropout": 0.1,
        "dropout_pre_encoder": 0.1,
        "dropout_emb": 0.0,
        "dropout_att": 0.1,
    }


def ctc_decoder_cfg() -> dict:
    return {
        "_target_": "nemo.collections.asr.modules.ConvASRDecoder",
        "feat_in": None,
        "num_classes": -1,
        "vocabulary": [],
    }


def model_cfg(m: dict, tokenizer_dir: Path) -> dict:
    cfg = {
        "sample_rate": 16000,
        "tokenizer": {"dir": str(tokenizer_dir), "type": "bpe"},
        "preprocessor": preprocessor_cfg(m["mels"]),
        "encoder": encoder_cfg(m),
        # transcribe() reads validation_ds.use_start_end_token
        "validation_ds": {
            "manifest_filepath": None,
            "sample_rate": 16000,
            "batch_size": 4,
            "shuffle": False,
            "use_start_end_token": False,
        },
    }
    if m["kind"] == "ctc":
        cfg["decoder"] = ctc_decoder_cfg()
        cfg["decoding"] = {"strategy": "greedy_batch"}
        return cfg
    tdt = m["kind"] in ("tdt", "hybrid")
    pred, joint = 32, 48
    cfg["model_defaults"] = {"enc_hidden": m["d"], "pred_hidden": pred, "joint_hidden": joint}
    if tdt:
        cfg["model_defaults"].update(tdt_durations=TDT_DURATIONS, num_tdt_durations=5)
    cfg["decoder"] = {
        "_target_": "nemo.collections.asr.modules.RNNTDecoder",
        "normalization_mode": None,
        "random_state_sampling": False,
        "blank_as_pad": True,
        "prednet": {
            "pred_hidden": pred,
            "pred_rnn_layers": m["pred_layers"],
            "t_max": None,
            "dropout": 0.2,
        },
    }
    cfg["joint"] = {
        "_target_": "nemo.collections.asr.modules.RNNTJoint",
        "log_softmax": None,
        "preserve_memory": False,
        "fuse_loss_wer": True,
        "fused_batch_size": 4,
        "jointnet": {"joint_hidden": joint, "activation": "relu", "dropout": 0.2},
        "num_extra_outputs": len(TDT_DURATIONS) if tdt else 0,
    }
    cfg["decoding"] = {"strategy": "greedy_batch", "greedy": {"max_symbols": m["max_symbols"]}}
    if tdt:
        cfg["decoding"].update(model_type="tdt", durations=TDT_DURATIONS)
        cfg["loss"] = {
            "loss_name": "tdt",
            "tdt_kwargs": {
                "fastemit_lambda": 0.0,
                "clamp": -1.0,
                "durations": TDT_DURATIONS,
                "sigma": 0.02,
                "omega": 0.1,
            },
        }
    else:
        cfg["loss"] = {
            "loss_name": "default",
            "warprnnt_numba_kwargs": {"fastemit_lambda": 0.0, "clamp": -1.0},
        }
    if m["kind"] == "hybrid":
        cfg["aux_ctc"] = {
            "ctc_loss_weight": 0.3,
            "use_cer": False,
            "ctc_reduction": "mean_batch",
            "decoder": ctc_decoder_cfg(),
            "decoding": {"strategy": "greedy"},
        }
    return cfg


def build(m: dict, tokenizer_dir: Path, audio: list[np.ndarray]):
    """Instantiate the NeMo model from its config (seeded), then edit its weights, centring the
    output layers on `audio` (the reference WAVs); returns it in eval mode."""
    from nemo.collections.asr.models import (
        EncDecCTCModelBPE,
        EncDecHybridRNNTCTCBPEModel,
        EncDecRNNTBPEModel,
    )
    from omegaconf import OmegaConf

    cls = {
        "ctc": EncDecCTCModelBPE,
        "rnnt": EncDecRNNTBPEModel,
        "tdt": EncDecRNNTBPEModel,
        "hybrid": EncDecHybridRNNTCTCBPEModel,
    }[m["kind"]]
    torch.manual_seed(m["seed"])
    model = cls(cfg=OmegaConf.create(model_cfg(m, tokenizer_dir)))
    randomize(model, m)
    model.eval()
    if audio:
        centre_heads(model, m, audio)
    return model


# ---------------------------------------------------------------------------------------------
# weights


@torch.no_grad()
def randomize(model, m: dict) -> None:
    """Make every weight matter and the greedy output varied (NeMo's init leaves norms at 1/0,
    BatchNorm statistics at 0/1, position biases at 0, and shrinks the subsampling's signal to a
    near-constant, so that random models emit only blanks or one token)."""
    g = torch.Generator().manual_seed(m["seed"])

    def randn(t: torch.Tensor, std: float) -> torch.Tensor:
        return torch.randn(t.shape, generator=g) * std

    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm | torch.nn.BatchNorm1d):
            module.weight.copy_(1.0 + randn(module.weight, 0.2))
            module.bias.copy_(randn(module.bias, 0.2))
        if isinstance(module, torch.nn.BatchNorm1d):  # exercises BatchNorm folding
            module.running_mean.copy_(randn(module.running_mean, 0.3))
            var = torch.rand(module.running_var.shape, generator=g) * 1.7 + 0.3
            module.running_var.copy_(var)
    for module in model.encoder.pre_encode.modules():  # He init: the signal survives 3 ReLU convs
        if isinstance(module, torch.nn.Conv2d | torch.nn.Linear):
            fan_in = module.weight[0].numel()
            module.weight.copy_(randn(module.weight, (2.0 / fan_in) ** 0.5))
            module.bias.copy_(randn(module.bias, 0.05))
    for name, p in model.named_parameters():
        if "pos_bias" in name:
            p.copy_(randn(p, 0.3))

    vocab = model.tokenizer.vocab_size
    pieces = [model.tokenizer.tokenizer.id_to_piece(i) for i in range(vocab)]
    active = active_tokens(pieces)
    if m["kind"] == "ctc":
        scale_head(model.decoder.decoder_layers[0], m["head_scale"], vocab, active)
        return
    # The default LSTM barely depends on its input token and its projection is small next to the
    # encoder's: amplify both so that an emitted token changes the next decision.
    for name, p in model.decoder.prediction["dec_rnn"].named_parameters():
        if "weight" in name:
            p.mul_(3.0)
    model.joint.pred.weight.mul_(m["pred_scale"])
    out = model.joint.joint_net[-1]  # Linear(joint_hidden, vocab + 1 [+ durations])
    scale_head(out, m["head_scale"], vocab, active, m.get("blank_weight"))
    if m["kind"] == "hybrid":
        head = model.ctc_decoder.decoder_layers[0]
        scale_head(head, m["ctc_scale"], vocab, active)


def scale_head(
    layer: torch.nn.Module,
    scale: float,
    blank: int,
    active: list[int],
    blank_weight: float | None = None,
) -> None:
    """Output layer rows (V + 1 [+ durations], fan_in): active token rows and duration rows get
    norm `scale`, the other tokens a third of it (they rarely win); equal norms make the argmax
    follow the input's direction rather than a few large rows. The blank row keeps its small
    random init, or for a transducer may be constant (`blank_weight`): after the joint's ReLU the
    input is >= 0, so a constant row grows with the input as the best token does."""
    w = layer.weight.view(layer.weight.shape[0], -1)
    norms = torch.full((w.shape[0], 1), scale / 3)
    norms[active] = scale
    norms[blank + 1 :] = scale  # TDT durations
    keep = w[blank].clone()
    w.copy_(w / w.norm(dim=1, keepdim=True) * norms)
    w[blank] = keep if blank_weight is None else scale * blank_weight / w.shape[1] ** 0.5


@torch.no_grad()
def centre_heads(model, m: dict, audio: list[np.ndarray]) -> None:
    """Bias every output row by minus its mean input over the reference audio, then set the blank
    bias so that blank wins a fraction `blank_rate` of the frames.

    The encoder output has a large component common to all frames, which would otherwise make the
    same few tokens win everywhere; centred, each token competes on the frames that point its way.
    The blank bias is put midway between two frames' margins, away from any tie. For a
    transducer the input is the joint's hidden layer for every frame with the predictor in its
    start state and one step after each active token (the states decoding visits), so the blank
    rate of the decoding is only roughly `blank_rate`."""
    encoded = []
    for x in audio:
        feats, n = model.preprocessor(
            input_signal=torch.from_numpy(x)[None], length=torch.tensor([len(x)])
        )
        enc, n_enc = model.encoder(audio_signal=feats, length=n)
        encoded.append(enc[0, :, : int(n_enc[0])].T)  # (Te, d_model)
    enc = torch.cat(encoded)
    blank = model.tokenizer.vocab_size
    heads = []
    if m["kind"] in ("ctc", "hybrid"):
        head = model.decoder if m["kind"] == "ctc" else model.ctc_decoder
        heads.append((head.decoder_layers[0], enc, m.get("ctc_blank_rate", m["blank_rate"])))
    if m["kind"] != "ctc":
        first = torch.tensor([[blank]])
        g, state = model.decoder.predict(first, None, add_sos=False, batch_size=1)
        tokens = torch.tensor(active_tokens(model.tokenizer.vocab))[:, None]
        state = [s.expand(-1, len(tokens), -1).contiguous() for s in state]
        g_next, _ = model.decoder.predict(tokens, state, add_sos=False, batch_size=len(tokens))
        preds = model.joint.pred(torch.cat([g[:, 0], g_next[:, 0]]))  # (states, joint_hidden)
        hidden = torch.relu(model.joint.enc(enc)[None] + preds[:, None]).flatten(0, 1)
        heads.append((model.joint.joint_net[-1], hidden, m["blank_rate"]))
    for layer, inputs, rate in heads:
        w = layer.weight.view(layer.weight.shape[0], -1)
        layer.bias -= w @ inputs.mean(0)
        logits = inputs @ w.T + layer.bias  # (frames, V + 1 [+ durations])
        margin = (logits[:, :blank].max(-1).values - logits[:, blank]).sort().values
        k = int(rate * len(margin))
        layer.bias[blank] += (margin[k - 1] + margin[k]) / 2
