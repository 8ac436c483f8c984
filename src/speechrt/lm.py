"""Word n-gram language model: interpolated modified Kneser-Ney, kept in backoff form.

    sentences (normalised: lowercase words split by spaces) + optional word list
    -> n-gram counts (each sentence padded as <s> w1 ... wn </s>)
    -> Kneser-Ney adjusted counts (continuation counts below the top order)
    -> interpolated modified KN probabilities (Chen & Goodman's three discounts per order)
    -> backoff form: ln P(w | h) for every stored n-gram + ln backoff(h) per context,
       P(w | h) = P*(h w) if stored, else backoff(h) * P(w | h minus its oldest word)

Words of the word list that the sentences lack are in the vocabulary with no count: they share
the lowest order's leftover mass (interpolated with a uniform distribution over the vocabulary)
with <unk>, so they are spelled as words, but less likely than any word seen in the sentences.

On disk (no pickle):
    <dir>/lm.json           format_version, order, vocab (id = position), decoding defaults,
                            provenance, n-gram counts
    <dir>/lm.safetensors    logp.1 (V,), backoff.1 (V,); for n = 2..order: ids.n (N_n, n) int32
                            (sorted), logp.n (N_n,); backoff.n (N_n,) for n < order; float16
                            (float32 read too), natural logarithms, float32 in memory
This module imports no torch.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from speechrt.errors import SpeechRTError

FORMAT_VERSION = 1
INFO_FILE = "lm.json"
WEIGHTS_FILE = "lm.safetensors"
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
FLOATS = (np.dtype(np.float16), np.dtype(np.float32))  # of logp.n and backoff.n on disk
NEVER = -99.0  # ln P of <s>, which is never predicted (only a context)

Ngram = tuple[int, ...]


class NGramLM:
    """A backoff n-gram model over a word vocabulary; probabilities in natural logarithms."""

    def __init__(
        self,
        vocab: Sequence[str],
        logp: Sequence[np.ndarray],
        backoff: Sequence[np.ndarray],
        ids: Sequence[np.ndarray],
        decoding: dict[str, Any] | None = None,
        source: dict[str, Any] | None = None,
    ) -> None:
        """vocab: words by id (must hold <unk>, <s>, </s>); logp[n - 1]: (N_n,) ln P of the
        n-grams ids[n - 1] (N_n, n) (ids[0] is implicit: every word, in id order);
        backoff[n - 1]: (N_n,) ln backoff of those n-grams as contexts (orders below the top)."""
        self.vocab = list(vocab)
        self.ids = {w: i for i, w in enumerate(self.vocab)}
        self.order = len(logp)
        self.decoding = dict(decoding or {})
        self.source = dict(source or {})
        self.unk, self.bos, self.eos = self.ids[UNK], self.ids[BOS], self.ids[EOS]
        self.arrays = (list(logp), list(backoff), list(ids))
        n_vocab = len(self.vocab)
        if n_vocab ** max(self.order, 1) >= 2**63:
            raise SpeechRTError(f"a {self.order}-gram model over {n_vocab} words is too large")
        # n-grams as int keys sum(w_i * V^(n-1-i)): one dict lookup per query
        self._unigram = np.asarray(logp[0], dtype=np.float64).tolist()
        self._unigram_backoff = np.asarray(backoff[0], dtype=np.float64).tolist()
        self._logp: list[dict[int, float]] = [{}]
        self._backoff: list[dict[int, float]] = [{}]
        for n in range(2, self.order + 1):
            keys = _keys(ids[n - 1], n_vocab).tolist()
            values = np.asarray(logp[n - 1], np.float64).tolist()
            self._logp.append(dict(zip(keys, values, strict=True)))
            bo = np.asarray(backoff[n - 1], np.float64).tolist() if n < self.order else []
            self._backoff.append(dict(zip(keys, bo, strict=True)) if bo else {})
        # sorted spellable words: `is_prefix` bisects it
        self._sorted = sorted(w for w in self.vocab if w not in (UNK, BOS, EOS))
        unigram = np.asarray(logp[0], dtype=np.float64)
        self._sorted_logp = unigram[[self.ids[w] for w in self._sorted]]  # (V - 3,)
        self._best: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.vocab)

    def _key(self, ngram: Sequence[int]) -> int:
        key = 0
        for w in ngram:
            key = key * len(self.vocab) + w
        return key

    def logprob(self, word: int, context: Sequence[int] = ()) -> float:
        """ln P(word | context); context: preceding word ids, oldest first (any length)."""
        ctx = tuple(context[len(context) - self.order + 1 :]) if self.order > 1 else ()
        total = 0.0
        while ctx:
            n = len(ctx) + 1
            p = self._logp[n - 1].get(self._key((*ctx, word)))
            if p is not None:
                return total + p
            if n == 2:
                total += self._unigram_backoff[ctx[0]]
            else:
                total += self._backoff[n - 2].get(self._key(ctx), 0.0)
            ctx = ctx[1:]
        return total + self._unigram[word]

    def word_id(self, word: str) -> int | None:
        """The word's id, or None for an out-of-vocabulary word (or a special token)."""
        i = self.ids.get(word)
        return None if i is None or i in (self.bos, self.eos, self.unk) else i

    def is_prefix(self, partial: str) -> bool:
        """True when some vocabulary word starts with `partial`."""
        k = bisect.bisect_left(self._sorted, partial)
        return k < len(self._sorted) and self._sorted[k].startswith(partial)

    def prefix_logprob(self, partial: str) -> float | None:
        """The highest unigram ln P of the words that start with `partial`; None when none does
        (a look-ahead for a word still being spelled). Found values are remembered: at most one
        per prefix of a vocabulary word, however many non-words a server is asked to decode."""
        best = self._best.get(partial)
        if best is not None:
            return best
        lo = bisect.bisect_left(self._sorted, partial)
        hi = bisect.bisect_left(self._sorted, partial + "\U0010ffff", lo)
        if hi == lo:
            return None
        best = self._best[partial] = float(self._sorted_logp[lo:hi].max())
        return best

    def sentence_logprob(self, words: Sequence[str]) -> float:
        """ln P(<s> words </s>), out-of-vocabulary words scored as <unk>."""
        ctx = [self.bos]
        total = 0.0
        for w in [*words, EOS]:
            i = self.ids.get(w, self.unk)
            total += self.logprob(i, ctx)
            ctx.append(i)
        return total

    # -- storage -------------------------------------------------------------------------------

    def save(self, out_dir: str | Path) -> Path:
        """Write lm.json + lm.safetensors into out_dir."""
        from safetensors.numpy import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        logp, backoff, ids = self.arrays
        tensors = {"logp.1": logp[0], "backoff.1": backoff[0]}
        for n in range(2, self.order + 1):
            tensors[f"ids.{n}"] = ids[n - 1]
            tensors[f"logp.{n}"] = logp[n - 1]
            if n < self.order:
                tensors[f"backoff.{n}"] = backoff[n - 1]
        # fp16 on disk: its step is <= 0.008 nats above ln P = -16 (a quarter of the file saved)
        dtypes = {k: np.int32 if k.startswith("ids") else np.float16 for k in tensors}
        save_file(
            {k: np.ascontiguousarray(v, dtypes[k]) for k, v in tensors.items()},
            str(out / WEIGHTS_FILE),
        )
        info = {
            "format_version": FORMAT_VERSION,
            "kind": "ngram",
            "order": self.order,
            "log_base": "e",
            "counts": {str(n): int(len(logp[n - 1])) for n in range(1, self.order + 1)},
            "decoding": self.decoding,
            "source": self.source,
        }
        # readable header; the vocabulary (most of the file) on one line
        head = json.dumps(info, indent=1, ensure_ascii=False)[:-2]
        vocab = json.dumps(self.vocab, ensure_ascii=False)
        (out / INFO_FILE).write_text(f'{head},\n "vocab": {vocab}\n}}\n', encoding="utf-8")
        return out


def _keys(ids: np.ndarray, n_vocab: int) -> np.ndarray:
    """(N, n) word ids -> (N,) int64 keys (see NGramLM._key)."""
    keys = np.zeros(len(ids), dtype=np.int64)
    for col in np.asarray(ids, dtype=np.int64).T:
        keys = keys * n_vocab + col
    return keys


def has_lm(model_dir: str | Path) -> bool:
    """True when the directory holds an lm.json (load_lm checks the rest)."""
    return (Path(model_dir) / INFO_FILE).is_file()


def load_lm(lm_dir: str | Path) -> NGramLM:
    """Read lm.json + lm.safetensors; anything missing or inconsistent -> SpeechRTError."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    d = Path(lm_dir)
    path = d / INFO_FILE
    if not path.is_file():
        raise SpeechRTError(f"{d}: no {INFO_FILE} (build one with `python -m speechrt_train lm`)")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpeechRTError(f"{path}: corrupt language model description ({e})") from None
    if not isinstance(info, dict) or info.get("format_version") != FORMAT_VERSION:
        version = info.get("format_version") if isinstance(info, dict) else None
        raise SpeechRTError(f"{path}: unsupported lm.json format_version {version!r}")
    if info.get("kind") != "ngram" or info.get("log_base") != "e":
        raise SpeechRTError(f"{path}: not a natural-log n-gram model (kind, log_base)")
    order, vocab = info.get("order"), info.get("vocab")
    if not isinstance(order, int) or not 1 <= order <= 5:
        raise SpeechRTError(f"{path}: order must be an integer in 1..5, got {order!r}")
    if not isinstance(vocab, list) or not all(isinstance(w, str) for w in vocab):
        raise SpeechRTError(f"{path}: vocab must be a list of words")
    missing = {UNK, BOS, EOS} - set(vocab)
    if missing or len(set(vocab)) != len(vocab):
        raise SpeechRTError(f"{path}: vocab lacks {sorted(missing)} or repeats a word")
    decoding, source = info.get("decoding", {}), info.get("source", {})
    if not isinstance(decoding, dict) or not isinstance(source, dict):
        raise SpeechRTError(f"{path}: decoding and source must be objects")
    weights = d / WEIGHTS_FILE
    if not weights.is_file():
        raise SpeechRTError(f"{d}: no {WEIGHTS_FILE}")
    try:
        t = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise SpeechRTError(f"{weights}: corrupt language model file ({e})") from None
    v = len(vocab)
    logp, backoff, ids = [], [], []
    try:
        for n in range(1, order + 1):
            ids.append(np.zeros((v, 0), np.int32) if n == 1 else t.pop(f"ids.{n}"))
            rows = ids[-1].shape[0]
            lp = t.pop(f"logp.{n}")
            bo = t.pop(f"backoff.{n}") if n < order else np.zeros(0, np.float32)
            bad = ids[-1].dtype != np.int32 or ids[-1].shape != (rows, 0 if n == 1 else n)
            bad = bad or lp.dtype not in FLOATS or bo.dtype not in FLOATS
            logp.append(lp.astype(np.float32))
            backoff.append(bo.astype(np.float32))
            bad = bad or logp[-1].shape != (rows,)
            bad = bad or backoff[-1].shape != ((rows,) if n < order else (0,))
            bad = bad or not (np.isfinite(logp[-1]).all() and np.isfinite(backoff[-1]).all())
            bad = bad or (ids[-1].size > 0 and (ids[-1].min() < 0 or ids[-1].max() >= v))
            if bad:
                raise ValueError(f"{n}-gram arrays do not fit a {v}-word vocabulary")
    except (KeyError, ValueError) as e:
        raise SpeechRTError(f"{weights}: does not match {INFO_FILE} ({e})") from None
    if t:
        raise SpeechRTError(f"{weights}: unexpected arrays {sorted(t)} for order {order}")
    counts = {str(n): len(logp[n - 1]) for n in range(1, order + 1)}
    if info.get("counts", counts) != counts:
        raise SpeechRTError(f"{path}: n-gram counts {info.get('counts')} but the file has {counts}")
    return NGramLM(vocab, logp, backoff, ids, decoding, source)


# -- estimation ----------------------------------------------------------------------------------


def _discounts(adjusted: Iterable[int]) -> tuple[float, float, float]:
    """Modified KN discounts (D1, D2, D3+) from counts of counts (Chen & Goodman 1998)."""
    cc = Counter(min(c, 4) for c in adjusted)
    n1, n2, n3, n4 = (cc[k] for k in (1, 2, 3, 4))
    if min(n1, n2, n3, n4) == 0:
        return 0.5, 1.0, 1.5  # too little data for the estimate: a common fixed choice
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    # the estimate can leave (0, k] on odd count statistics; keep each discount inside it
    return tuple(min(max(x, 0.05), float(k)) for k, x in zip((1, 2, 3), d, strict=True))  # type: ignore[return-value]


def build_lm(
    sentences: Iterable[str],
    words: Iterable[str] = (),
    order: int = 3,
    prune: int = 1,
    decoding: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
) -> NGramLM:
    """Estimate an interpolated modified Kneser-Ney n-gram model.

    sentences: normalised text, words separated by spaces. words: extra vocabulary (see the
    module docstring). prune: top-order n-grams seen fewer times than this are dropped (2 drops
    singletons); the backoff weights are recomputed so every distribution still sums to 1.
    """
    if not 1 <= order <= 5:
        raise SpeechRTError(f"order must be in 1..5, got {order}")
    if prune < 1:
        raise SpeechRTError(f"prune must be >= 1, got {prune}")
    texts = [s.split() for s in sentences]
    names = {w for t in texts for w in t} | {w for w in words if w and not w.isspace()}
    vocab = [UNK, BOS, EOS, *sorted(names - {UNK, BOS, EOS})]
    index = {w: i for i, w in enumerate(vocab)}
    bos, eos = index[BOS], index[EOS]
    raw: list[Counter[Ngram]] = [Counter() for _ in range(order)]  # raw[n - 1]: n-grams
    for t in texts:
        toks = [bos, *(index[w] for w in t), eos]
        for n in range(1, order + 1):
            for i in range(len(toks) - n + 1):
                raw[n - 1][tuple(toks[i : i + n])] += 1
    del raw[0][(bos,)]
    # Adjusted counts: raw at the top order and for n-grams starting with <s> (nothing can come
    # before them); below, the number of distinct words seen just before the n-gram.
    adjusted: list[dict[Ngram, int]] = [dict() for _ in range(order)]
    adjusted[-1] = dict(raw[-1])
    for n in range(order - 1, 0, -1):
        left: Counter[Ngram] = Counter(g[1:] for g in raw[n])
        adjusted[n - 1] = {g: (c if g[0] == bos else left[g]) for g, c in raw[n - 1].items()}
    n_vocab = len(vocab)
    predicted = n_vocab - 1  # every word but <s>
    prob: list[dict[Ngram, float]] = []  # interpolated P(w | h) of each seen n-gram
    gamma: list[dict[Ngram, float]] = []  # leftover mass of each context h
    for n in range(1, order + 1):
        d = _discounts(adjusted[n - 1].values())
        total: defaultdict[Ngram, float] = defaultdict(float)
        mass: defaultdict[Ngram, float] = defaultdict(float)
        for g, c in adjusted[n - 1].items():
            total[g[:-1]] += c
            mass[g[:-1]] += d[min(c, 3) - 1]
        gam = {h: mass[h] / total[h] for h in total}
        if n == 1 and not total:  # no sentences: uniform over the vocabulary
            gam = {(): 1.0}
        p: dict[Ngram, float] = {}
        for g, c in adjusted[n - 1].items():
            h = g[:-1]
            lower = 1.0 / predicted if n == 1 else prob[n - 2][g[1:]]
            p[g] = (c - d[min(c, 3) - 1]) / total[h] + gam[h] * lower
        prob.append(p)
        gamma.append(gam)
    uniform = gamma[0][()] / predicted
    unigram = np.full(n_vocab, math.log(uniform) if uniform > 0 else NEVER)
    for (w,), pw in prob[0].items():
        unigram[w] = math.log(pw)
    unigram[bos] = NEVER
    kept = [
        {g: pg for g, pg in prob[n - 1].items() if n < order or raw[n - 1][g] >= prune}
        for n in range(1, order + 1)
    ]
    # sums of the kept n-grams' P and of their lower-order P, per context (for the backoffs)
    kept_sum: list[defaultdict[Ngram, float]] = [defaultdict(float) for _ in range(order)]
    lower_sum: list[defaultdict[Ngram, float]] = [defaultdict(float) for _ in range(order)]
    for n in range(2, order + 1):
        for g, pg in kept[n - 1].items():
            kept_sum[n - 1][g[:-1]] += pg
            lower_sum[n - 1][g[:-1]] += prob[n - 2][g[1:]]

    def backoff_of(h: Ngram) -> float:
        """ln backoff(h): gamma(h) when nothing of h was pruned, else what renormalises it."""
        n = len(h) + 1
        if h not in gamma[n - 1]:
            return 0.0  # never a context: P(w | h) = P(w | h[1:])
        if len(kept[n - 1]) == len(prob[n - 1]):
            return math.log(gamma[n - 1][h])
        left, lower = 1.0 - kept_sum[n - 1][h], 1.0 - lower_sum[n - 1][h]
        return math.log(max(left, 1e-12) / max(lower, 1e-12))

    logp = [unigram.astype(np.float32)]
    backoff = [
        np.array([backoff_of((w,)) if order > 1 else 0.0 for w in range(n_vocab)], np.float32)
    ]
    ids = [np.zeros((n_vocab, 0), np.int32)]
    for n in range(2, order + 1):
        grams = sorted(kept[n - 1])
        ids.append(np.array(grams, dtype=np.int32).reshape(len(grams), n))
        logp.append(np.array([math.log(kept[n - 1][g]) for g in grams], np.float32))
        bo = [backoff_of(g) for g in grams] if n < order else []
        backoff.append(np.array(bo, np.float32))
    return NGramLM(vocab, logp, backoff, ids, decoding, source)
