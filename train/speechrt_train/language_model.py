"""`python -m speechrt_train lm`: the recogniser's word trigram model, from the train split.

    every sentence of the fortunes (any length, texts.entries) -> those the split holds out
    dropped -> what the teacher voices read (speechrt's english_cleaners_v2: numbers,
    abbreviations in words) -> the recogniser's transcript form (asr_data.transcript: a-z, '
    and single spaces) -> any form that holds a held-out sentence's form dropped
    [+ extra English text from other Debian packages (`extra_texts`), same form, same filter]
    -> speechrt_train.ngram.build_lm (+ a word list, e.g. Debian's wamerican, lowercased and
    limited to words the labels can spell) -> lm.json + lm.safetensors

The decoding defaults written into lm.json (DECODING) were tuned on held-out sentences that no
evaluation uses (docs/models/README.md, "Language model").
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from speechrt.asr.lm import NGramLM
from speechrt.models.jasper import LABELS
from speechrt.text.sentences import split_sentences
from speechrt_train.asr_data import transcript
from speechrt_train.ngram import build_lm
from speechrt_train.texts import (
    Sentence,
    acceptable,
    entries,
    entry_text,
    fortune_files,
    is_heldout,
    load_sentences,
    text_key,
)

# speechrt.asr.beam.BeamOptions fields, tuned (docs/models/README.md)
DECODING: dict[str, Any] = {
    "beam_size": 32,
    "alpha": 0.7,  # tuned on dev for the step-36,119 recogniser (0.5 / 0.6 / 0.7 / 0.8 / 0.9:
    # 0.0711 / 0.0683 / 0.0654 / 0.0687 / 0.0691)
    "beta": 0.0,
    "oov_penalty": -3.0,
    "oov_char_penalty": -2.0,
    "prune_logp": -7.0,
    "max_chars": 8,
}
ORDER = 3
PRUNE = 2  # singleton trigrams dropped: 40 % smaller, the same dev WER


LONG = 400  # characters: the LM reads long sentences whole (the corpus keeps <= 160)
WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
_QUOTED = re.compile(r'"([^"]{8,})"')  # a WordNet gloss's examples: "he waited for the bus"


def spoken_forms(texts: list[str]) -> list[str]:
    """Each text as the recogniser is trained to write it (see asr_data.load_speech)."""
    from speechrt_train.align import make_processor, tp_plain

    tp = tp_plain(make_processor())
    return [transcript(tp.normalize(t).strip()) for t in texts]


def fortune_prose(root: str | Path) -> list[str]:
    """Every sentence of the fortune files under a Debian root (texts.fortune_files: no
    pictures or code), whatever its length, each once."""
    seen: dict[str, None] = {}
    for path in fortune_files(root):
        for entry in entries(path.read_text(encoding="utf-8", errors="replace")):
            prose = entry_text(entry)
            for s in split_sentences(prose, max_chars=LONG) if prose else []:
                seen.setdefault(s, None)
    return list(seen)


def dictd_prose(path: Path) -> list[str]:
    """The sentences of a dictd database (.dict.dz: gzip text), paragraph by paragraph."""
    text = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    out: dict[str, None] = {}
    for para in re.split(r"\n\s*\n", text):
        for s in split_sentences(" ".join(para.split()), max_chars=LONG):
            out.setdefault(s, None)
    return list(out)


def wordnet_examples(folder: Path) -> list[str]:
    """WordNet's example sentences (the quoted parts of each synset's gloss)."""
    out: dict[str, None] = {}
    for name in WORDNET_FILES:
        for line in (folder / name).read_text(encoding="utf-8", errors="replace").splitlines():
            if line and not line.startswith(" "):  # the license header lines start with spaces
                for s in _QUOTED.findall(line.split("|", 1)[-1]):
                    out.setdefault(s, None)
    return list(out)


def extra_texts(root: str | Path) -> dict[str, list[str]]:
    """English text from Debian packages unpacked under root (`dpkg -x PKG.deb root`), by source:
    fortune files (fortune-anarchism), dictd databases (dict-jargon: the Jargon File, dict-devil:
    Bierce's Devil's Dictionary) and WordNet's example sentences (wordnet-base). None of it is
    split: it is all LM text (the held-out filter still applies)."""
    root = Path(root)
    found: dict[str, list[str]] = {}
    if fortune_files(root):
        found["fortune files"] = fortune_prose(root)
    for path in sorted((root / "usr/share/dictd").glob("*.dict.dz")):
        found[f"dictd {path.name.split('.')[0]}"] = dictd_prose(path)
    wordnet = root / "usr/share/wordnet"
    if all((wordnet / n).is_file() for n in WORDNET_FILES):
        found["wordnet examples"] = wordnet_examples(wordnet)
    if not found:
        raise FileNotFoundError(f"no fortune files, dictd databases or WordNet under {root}")
    return found


def speech_sentences(text_root: str | Path, fortunes: list[Sentence]) -> list[Sentence]:
    """More sentences for the teachers to read (corpus --text-root): the extra text
    (`extra_texts`) cut to what the corpus accepts (texts.acceptable; a WordNet example gets a
    capital and a full stop first), minus the fortunes' own (folded), any sentence the split
    would hold out, and any that holds a held-out fortune sentence. Train side only."""
    held = HeldoutFilter.of(fortunes)
    seen = {s.text.lower() for s in fortunes}
    picked: dict[str, Sentence] = {}
    for name, raw in extra_texts(text_root).items():
        for text in raw:
            if name == "wordnet examples" and text:
                text = text[0].upper() + text[1:] + ("" if text[-1] in ".!?" else ".")
            folded = text.lower()
            if acceptable(text) and not is_heldout(text) and folded not in seen:
                seen.add(folded)
                picked[text] = Sentence(text_key(text), text)
    texts = list(picked)
    kept = [picked[t] for t, f in zip(texts, spoken_forms(texts), strict=True) if f and not held(f)]
    return sorted(kept, key=lambda s: s.key)


class HeldoutFilter:
    """Is a held-out sentence's form inside this form (as whole words)? Indexed by first word."""

    def __init__(self, forms: list[str]) -> None:
        self.by_first: defaultdict[str, list[list[str]]] = defaultdict(list)
        for words in (f.split() for f in forms):
            if words:
                self.by_first[words[0]].append(words)

    @classmethod
    def of(cls, sentences: list[Sentence]) -> HeldoutFilter:
        """The filter of the held-out ones among these sentences, in their spoken form."""
        return cls(spoken_forms([s.text for s in sentences if s.heldout]))

    def __call__(self, form: str) -> bool:
        w = form.split()
        return any(
            w[i : i + len(h)] == h for i, x in enumerate(w) for h in self.by_first.get(x, ())
        )


def lm_texts(
    fortunes_root: str | Path, text_root: str | Path | None = None
) -> tuple[list[str], dict[str, Any]]:
    """The LM's sentences (transcript form) and where they came from: the fortunes' train side
    (every sentence the split does not hold out) and any extra text, minus every form that holds
    a held-out one (two sentences can differ only in punctuation: the split hashes the text, the
    LM sees the transcript; a long sentence can quote a short held-out one)."""
    if not fortune_files(fortunes_root):
        raise FileNotFoundError(f"no fortune files under {fortunes_root} (unpack the .debs)")
    held = HeldoutFilter.of(load_sentences(fortunes_root))
    train_side = [s for s in fortune_prose(fortunes_root) if not is_heldout(s)]
    sources = {"fortunes train side": train_side}
    if text_root is not None:
        sources.update(extra_texts(text_root))
    texts: list[str] = []
    counts: dict[str, Any] = {}
    for name, raw in sources.items():
        forms = [f for f in spoken_forms(raw) if f]
        kept = [f for f in forms if not held(f)]
        texts += kept
        counts[name] = {"sentences": len(kept), "words": sum(len(f.split()) for f in kept)}
        counts[name]["dropped_as_heldout"] = len(forms) - len(kept)
    return texts, counts


def read_words(path: str | Path) -> list[str]:
    """A word list (one word a line): lowercased, only words the labels can spell, each once."""
    spellable = set(LABELS) - {" "}
    seen: dict[str, None] = {}
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        w = line.strip().lower()
        if w and set(w) <= spellable and any(c != "'" for c in w):
            seen[w] = None
    return list(seen)


def build(
    out: str | Path,
    fortunes_root: str | Path = "/",
    words: str | Path | None = None,
    order: int = ORDER,
    prune: int = PRUNE,
    decoding: dict[str, Any] | None = None,
    text_root: str | Path | None = None,
) -> dict[str, Any]:
    """Build and save the LM; returns a summary (also the provenance in lm.json)."""
    texts, counts = lm_texts(fortunes_root, text_root)
    extra = read_words(words) if words else []
    source: dict[str, Any] = {
        "built_by": "speechrt_train lm",
        "text": "as spoken (english_cleaners_v2), transcript form, held-out sentences dropped",
        "sentences": len(texts),
        "sources": counts,
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
