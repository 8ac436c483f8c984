"""`python -m speechrt_train lm`: the recogniser's word trigram model, from the train split.

    fortune sentences (texts.py) -> train split only -> what the teacher voices read
    (speechrt's english_cleaners_v2: numbers, abbreviations in words) -> the recogniser's
    transcript form (asr_data.transcript: a-z, ' and single spaces) -> sentences whose form
    equals a held-out sentence's dropped -> speechrt.lm.build_lm (+ a word list, e.g. Debian's
    wamerican, lowercased and limited to words the labels can spell) -> lm.json + lm.safetensors

The decoding defaults written into lm.json (DECODING) were tuned on held-out sentences that no
evaluation uses (docs/models/README.md, "Language model").
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from speechrt.lm import NGramLM, build_lm
from speechrt.models.jasper import LABELS
from speechrt_train.asr_data import transcript
from speechrt_train.texts import Sentence, load_sentences, split

# speechrt.beam.BeamOptions fields, tuned (docs/models/README.md)
DECODING: dict[str, Any] = {
    "beam_size": 32,
    "alpha": 0.6,
    "beta": 1.0,
    "oov_penalty": -3.0,
    "oov_char_penalty": -2.0,
    "prune_logp": -7.0,
    "max_chars": 8,
}
ORDER = 3
PRUNE = 2  # singleton trigrams dropped: 40 % smaller, the same dev WER (docs/models/README.md)


def spoken_forms(sentences: list[Sentence]) -> list[str]:
    """Each sentence as the recogniser is trained to write it (see asr_data.load_speech)."""
    from speechrt_train.align import make_processor, tp_plain

    tp = tp_plain(make_processor())
    return [transcript(tp.normalize(s.text).strip()) for s in sentences]


def read_words(path: str | Path) -> list[str]:
    """A word list (one word a line): lowercased, only words the labels can spell, each once."""
    spellable = set(LABELS) - {" "}
    seen: dict[str, None] = {}
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        w = line.strip().lower()
        if w and set(w) <= spellable and any(c != "'" for c in w):
            seen[w] = None
    return list(seen)


def lm_texts(sentences: list[Sentence]) -> tuple[list[str], dict[str, int]]:
    """The train split's transcripts, minus any that equal a held-out one (two sentences can differ
    only in punctuation: the split hashes the text, the LM sees the transcript)."""
    train, heldout = split(sentences)
    held = set(spoken_forms(heldout))
    forms = spoken_forms(train)
    kept = [f for f in forms if f and f not in held]
    return kept, {"train_sentences": len(train), "dropped_as_heldout": len(forms) - len(kept)}


def build(
    out: str | Path,
    fortunes_root: str | Path = "/",
    words: str | Path | None = None,
    order: int = ORDER,
    prune: int = PRUNE,
    decoding: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build and save the LM; returns a summary (also the provenance in lm.json)."""
    sentences = load_sentences(fortunes_root)
    if not sentences:
        raise FileNotFoundError(f"no fortune files under {fortunes_root} (unpack the .debs)")
    texts, counts = lm_texts(sentences)
    extra = read_words(words) if words else []
    source: dict[str, Any] = {
        "built_by": "speechrt_train lm",
        "text": "fortunes, train split, as spoken (english_cleaners_v2), transcript form",
        "sentences": len(texts),
        **counts,
        "order": order,
        "prune": prune,
        "smoothing": "interpolated modified Kneser-Ney",
    }
    if words:
        source["words_file"] = Path(words).name
        source["words_sha256"] = hashlib.sha256(Path(words).read_bytes()).hexdigest()
        source["words_listed"] = len(extra)
    lm: NGramLM = build_lm(texts, extra, order, prune, {**DECODING, **(decoding or {})}, source)
    lm.save(out)
    size = sum((Path(out) / f).stat().st_size for f in ("lm.json", "lm.safetensors"))
    return {
        **source,
        "vocab": len(lm),
        "ngrams": [len(a) for a in lm.arrays[0]],
        "bytes": size,
        "decoding": lm.decoding,
    }
