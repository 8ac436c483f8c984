"""CTC prefix beam search over characters with a word n-gram language model.

Lexicon-free: beams are character prefixes, so a word the LM lacks can still be spelled. A
prefix's score is

    ln P_ctc(prefix) + alpha * ln P_lm(completed words) + beta * words + oov_penalty * oov

where a word is scored by the LM when it is completed (a space, or the end of the utterance, which
also scores </s>); a completed word the LM lacks is scored as <unk> and pays `oov_penalty`, and so
does a partial word that no vocabulary word starts with (until it is completed), which pulls
spelling towards real words early while names still come out when the audio insists.

Per frame only characters whose log-prob is above `prune_logp` (at most `max_chars` of them) are
tried, which on a trained model is usually none or one. Word times come from the CTC forced
alignment of the chosen text (speechrt.ctc.align_tokens), so they are the greedy ones whenever the
text is the greedy text.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from speechrt.ctc import Decoded, align_tokens, tokens_to_words
from speechrt.errors import SpeechRTError
from speechrt.lm import NGramLM

NEG = -1e30  # ln 0 that keeps arithmetic finite


@dataclass(frozen=True)
class BeamOptions:
    """How the beam search decodes (defaults: lm.json's `decoding`, else these)."""

    beam_size: int = 16  # prefixes kept after each frame
    alpha: float = 0.8  # weight of the LM's natural-log probabilities
    beta: float = 1.5  # bonus per word (balances the LM's cost of every word)
    oov_penalty: float = -6.0  # per word the LM lacks, and on a partial word no LM word begins
    oov_char_penalty: float = -1.0  # ... plus this per character of such a word
    prune_logp: float = -10.0  # a frame proposes only characters with ln P above this ...
    max_chars: int = 8  # ... and at most this many of them (the most likely)

    def __post_init__(self) -> None:
        if self.beam_size < 1 or self.max_chars < 1:
            raise SpeechRTError("beam_size and max_chars must be >= 1")
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SpeechRTError(f"beam option {f.name} must be a finite number, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BeamOptions:
        """The known fields of d (lm.json's decoding block); unknown keys are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpeechRTError(f"unknown beam options {unknown}; known: {sorted(names)}")
        return cls(**d)

    def updated(self, **changes: Any) -> BeamOptions:
        """A copy with the given fields replaced (None values ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def _lse(a: float, b: float) -> float:
    """ln(e^a + e^b)."""
    if a < b:
        a, b = b, a
    return a + math.log1p(math.exp(b - a))


class _Scorer:
    """LM scores of prefixes: each prefix string's state is computed once, from its parent's."""

    def __init__(self, lm: NGramLM, options: BeamOptions) -> None:
        self.lm, self.opt = lm, options
        self.prefix_ok: dict[str, bool] = {}
        # prefix -> (score of completed words, LM context, start of the partial word, score)
        self.state: dict[str, tuple[float, tuple[int, ...], int, float]] = {
            "": (0.0, (lm.bos,), 0, 0.0)
        }

    def oov(self, word: str) -> float:
        """The penalty of a word (or partial word) that is not (the start of) an LM word."""
        return self.opt.oov_penalty + self.opt.oov_char_penalty * len(word)

    def word_score(self, word: str, context: tuple[int, ...]) -> tuple[float, int]:
        """(alpha ln P(word | context) + beta [+ oov_penalty], the id the context goes on with)"""
        wid = self.lm.word_id(word)
        if wid is None:
            lp = self.opt.alpha * self.lm.logprob(self.lm.unk, context) + self.oov(word)
            return lp + self.opt.beta, self.lm.unk
        return self.opt.alpha * self.lm.logprob(wid, context) + self.opt.beta, wid

    def extend(self, parent: str, child: str, ch: str) -> float:
        """Score of `child` = parent + ch (computed once per child string)."""
        got = self.state.get(child)
        if got is not None:
            return got[3]
        done, ctx, start, _ = self.state[parent]
        if ch == " ":  # parent's last word is complete
            s, wid = self.word_score(parent[start:], ctx)
            done += s
            ctx = (*ctx, wid)[-(self.lm.order - 1) :] if self.lm.order > 1 else ()
            st = (done, ctx, len(child), done)
        else:
            partial = child[start:]
            ok = self.prefix_ok.get(partial)
            if ok is None:
                ok = self.prefix_ok[partial] = self.lm.is_prefix(partial)
            st = (done, ctx, start, done + (0.0 if ok else self.oov(partial)))
        self.state[child] = st
        return st[3]

    def final(self, prefix: str) -> float:
        """Score of the whole utterance: the last word completed, then </s>."""
        done, ctx, start, _ = self.state[prefix]
        if start < len(prefix):
            s, wid = self.word_score(prefix[start:], ctx)
            done += s
            ctx = (*ctx, wid)
        return done + self.opt.alpha * self.lm.logprob(self.lm.eos, ctx)


def beam_search(
    log_probs: np.ndarray, labels: Sequence[str], lm: NGramLM, options: BeamOptions
) -> str:
    """log_probs: (T, len(labels) + 1) ln-probabilities, blank last -> the best text.

    The text has single spaces between words and none at either end (CTC paths that differ only
    in repeated, leading or trailing spaces are one prefix)."""
    blank = len(labels)
    if log_probs.ndim != 2 or log_probs.shape[1] != blank + 1:
        raise ValueError(f"log_probs {log_probs.shape} for {len(labels)} labels + blank")
    if any(len(c) != 1 for c in labels) or " " not in labels:
        raise ValueError("beam search needs single-character labels including a space")
    opt = options
    scorer = _Scorer(lm, opt)
    lp = np.asarray(log_probs, dtype=np.float64)
    # candidate characters per frame: the max_chars most likely above prune_logp
    top = np.argsort(-lp[:, :blank], axis=1, kind="stable")[:, : opt.max_chars]
    keep = np.take_along_axis(lp[:, :blank], top, axis=1) > opt.prune_logp
    rows = lp.tolist()
    index = {c: i for i, c in enumerate(labels)}
    # prefix -> [ln P(paths ending in blank), ln P(paths ending in its last character)]
    beams: dict[str, list[float]] = {"": [0.0, NEG]}
    for t, row in enumerate(rows):
        cands = [
            (labels[c], row[c]) for c, k in zip(top[t].tolist(), keep[t].tolist(), strict=True) if k
        ]
        p_blank = row[blank]
        nxt: dict[str, list[float]] = {}
        for prefix, (pb, pnb) in beams.items():
            total = _lse(pb, pnb)
            last = prefix[-1] if prefix else ""
            e = nxt.setdefault(prefix, [NEG, NEG])
            e[0] = _lse(e[0], total + p_blank)
            if last:  # the last character held for another frame
                e[1] = _lse(e[1], pnb + row[index[last]])
            for ch, p in cands:
                if ch == " " and (not prefix or last == " "):
                    # another space adds nothing to the text: a blank-like step of the prefix
                    if prefix:
                        e[1] = _lse(e[1], pb + p)
                    else:
                        e[0] = _lse(e[0], total + p)
                    continue
                child = prefix + ch
                scorer.extend(prefix, child, ch)
                c = nxt.setdefault(child, [NEG, NEG])
                # a repeated character needs a blank between the two
                c[1] = _lse(c[1], (pb if ch == last else total) + p)
        if len(nxt) > opt.beam_size:
            ranked = heapq.nlargest(
                opt.beam_size,
                nxt.items(),
                key=lambda kv: _lse(*kv[1]) + scorer.state[kv[0]][3],
            )
            beams = dict(ranked)
        else:
            beams = nxt
    # "a b" and "a b " are one text: their paths add up (their LM scores are equal)
    final: dict[str, float] = {}
    for prefix, (pb, pnb) in beams.items():
        text = prefix.rstrip(" ")
        final[text] = _lse(final.get(text, NEG), _lse(pb, pnb) + scorer.final(prefix))
    return max(final, key=final.__getitem__)


def beam_tokens(
    log_probs: np.ndarray, labels: Sequence[str], lm: NGramLM, options: BeamOptions
) -> list[tuple[int, int, int]]:
    """log_probs: (T, len(labels) + 1) -> the best text as (label, first, last frame) tokens."""
    return align_tokens(log_probs, beam_search(log_probs, labels, lm, options), labels)


def beam_decode(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    labels: Sequence[str],
    frame_duration: float,
    lm: NGramLM,
    options: BeamOptions,
    offset: float = 0.0,
) -> list[Decoded]:
    """log_probs: (B, T, len(labels) + 1) with the blank last; lengths: (B,) frames to decode.
    Each item on its own, as speechrt.ctc.greedy_decode but searched with the LM."""
    blank = len(labels)
    if log_probs.shape[-1] != blank + 1:
        raise ValueError(f"{log_probs.shape[-1]} classes for {len(labels)} labels + blank")
    lp = log_probs.detach().float().cpu().numpy()
    return [
        tokens_to_words(
            beam_tokens(lp[i, : int(n)], labels, lm, options), labels, frame_duration, offset
        )
        for i, n in enumerate(lengths.cpu().tolist())
    ]
