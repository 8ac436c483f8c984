"""Estimate speechrt's word n-gram language model: interpolated modified Kneser-Ney, stored in
the backoff form that speechrt.asr.lm loads and queries.

    sentences (normalised: lowercase words split by spaces) + optional word list
    -> n-gram counts (each sentence padded as <s> w1 ... wn </s>)
    -> Kneser-Ney adjusted counts (continuation counts below the top order)
    -> interpolated modified KN probabilities (Chen & Goodman's three discounts per order)
    -> backoff form: ln P(w | h) for every stored n-gram + ln backoff(h) per context,
       P(w | h) = P*(h w) if stored, else backoff(h) * P(w | h minus its oldest word)

Words of the word list that the sentences lack are in the vocabulary with no count: they share
the lowest order's leftover mass (interpolated with a uniform distribution over the vocabulary)
with <unk>, so they are spelled as words, but less likely than any word seen in the sentences.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from speechrt.asr.lm import BOS, EOS, NEVER, UNK, Ngram, NGramLM
from speechrt.errors import SpeechRTError


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
