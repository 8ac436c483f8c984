"""CTC prefix beam search over characters or word pieces with a word n-gram language model.

Lexicon-free: beams are text prefixes, so a word the LM lacks can still be spelled. Labels are
what they read as: single characters with a space label between words (QuartzNet, Jasper), or
SentencePiece pieces whose leading space starts a word (Parakeet CTC: " the", "re", ","). A
beam is a text and the last label that made it, so the segmentations of one text into pieces add
up. A prefix's score is

    ln P_ctc(prefix) + alpha * ln P_lm(completed words) + beta * words + OOV penalties
                     + alpha * look-ahead(partial word) + beta

A word is scored by the LM when it is completed (a space, or the end of the utterance, which
also scores </s>). A word the LM lacks is scored as <unk> and pays `oov_penalty` plus
`oov_char_penalty` per character (a flat penalty alone would let a run of words fuse into one
long "word" that pays it once). While a word is being spelled it carries an estimate of what it
will cost: the best unigram ln P of the LM words it can still become, or, once no LM word starts
with it, the <unk> score and penalties; so a prefix that has just paid for a word does not lose
to one that has not paid yet, spelling is pulled towards real words early, and names still come
out when the audio insists. Words are looked up as `lm_word` gives them: lower case, without
the punctuation around them (a model that writes "Hello," finds "hello" in a plain-text LM).

Per frame only labels whose log-prob is above `prune_logp` (at most `max_chars` of them) are
tried. Word times come from the CTC forced alignment of the chosen text (speechrt.asr.ctc's
align_tokens, or align_pieces over every segmentation into pieces), so they are the greedy ones
whenever the text is the greedy text.
"""

from __future__ import annotations

import heapq
import math
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from speechrt.asr.ctc import Decoded, align_pieces, align_tokens, host, surfaces, tokens_to_words
from speechrt.asr.lm import NGramLM
from speechrt.errors import SpeechRTError

if TYPE_CHECKING:
    import torch

TINY = 1e-300  # stands in for a probability that underflowed to 0 (so its log is finite)
# The search costs ~beam_size x max_chars prefix extensions per frame, in Python: at 1024 the
# bundled recogniser decodes about 5 s of audio per CPU second (32, its default: 35 s).
MAX_BEAM_SIZE = 1024
MAX_CHARS = 64  # labels tried per frame
# stripped from a word's ends before the LM sees it (not the apostrophe: "dogs'", "'tis")
PUNCTUATION = "".join(c for c in string.punctuation if c != "'") + "¿¡«»“”‘’…—–"


def lm_word(word: str) -> str:
    """What the LM is asked about `word`: lower case, no punctuation around it ("" for none)."""
    return word.strip(PUNCTUATION).lower()


@dataclass(frozen=True)
class BeamOptions:
    """How the beam search decodes (defaults: lm.json's `decoding`, else these)."""

    beam_size: int = 32  # prefixes kept after each frame
    alpha: float = 0.6  # weight of the LM's natural-log probabilities
    beta: float = 1.0  # bonus per word (balances the LM's cost of every word)
    oov_penalty: float = -3.0  # per word the LM lacks (and while no LM word starts as spelled)
    oov_char_penalty: float = -2.0  # ... plus this per character of such a word
    prune_logp: float = -7.0  # a frame proposes only characters with ln P above this ...
    max_chars: int = 8  # ... and at most this many of them (the most likely labels)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise SpeechRTError(f"beam option {f.name} must be a finite number, got {v!r}")
        for name, top in (("beam_size", MAX_BEAM_SIZE), ("max_chars", MAX_CHARS)):
            v = getattr(self, name)
            if not isinstance(v, int) or not 1 <= v <= top:
                raise SpeechRTError(f"{name} must be an integer within [1, {top}], got {v!r}")

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


class _Scorer:
    """LM scores of prefixes: each prefix string's state is computed once, from its parent's."""

    def __init__(self, lm: NGramLM, options: BeamOptions) -> None:
        self.lm, self.opt = lm, options
        self.unk_unigram = lm.logprob(lm.unk)
        # prefix -> (score of completed words, LM context, start of the partial word, score)
        self.state: dict[str, tuple[float, tuple[int, ...], int, float]] = {
            "": (0.0, (lm.bos,), 0, 0.0)
        }

    def oov(self, word: str) -> float:
        """The penalty of a word (or partial word) that is not (the start of) an LM word."""
        return self.opt.oov_penalty + self.opt.oov_char_penalty * len(word)

    def word_score(self, word: str, context: tuple[int, ...]) -> tuple[float, int | None]:
        """(alpha ln P(word | context) + beta [+ oov_penalty], the id the context goes on with;
        None for punctuation alone: no word, no score)"""
        word = lm_word(word)
        if not word:
            return 0.0, None
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
            if wid is not None:
                ctx = (*ctx, wid)[-(self.lm.order - 1) :] if self.lm.order > 1 else ()
            st = (done, ctx, len(child), done)
        else:
            partial = lm_word(child[start:])
            best = self.lm.prefix_logprob(partial) if partial else 0.0
            if best is None:
                est = self.opt.alpha * self.unk_unigram + self.oov(partial)
            else:
                est = self.opt.alpha * best
            st = (done, ctx, start, done + est + self.opt.beta)
        self.state[child] = st
        return st[3]

    def append(self, text: str, chunk: str) -> str:
        """text + chunk with no leading or doubled space, each new prefix scored once."""
        for ch in chunk:
            if ch == " " and (not text or text[-1] == " "):
                continue
            child = text + ch
            if child not in self.state:
                self.extend(text, child, ch)
            text = child
        return text

    def final(self, prefix: str) -> float:
        """Score of the whole utterance: the last word completed, then </s>."""
        done, ctx, start, _ = self.state[prefix]
        if start < len(prefix):
            s, wid = self.word_score(prefix[start:], ctx)
            done += s
            if wid is not None:
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
    if not any(label[:1] == " " for label in labels):
        raise ValueError("beam search needs labels that start words: a space, or pieces after one")
    chunks = surfaces(labels)
    # A beam's key is its text, and with pieces also its last label (after a NUL): a text's
    # segmentations that end alike add up. With characters the text tells the last label.
    pieces = any(len(label) != 1 for label in labels)
    opt = options
    scorer = _Scorer(lm, opt)
    state = scorer.state  # also holds each piece key's entry (its text's)
    lp = np.asarray(log_probs, dtype=np.float64)
    # candidate labels per frame: the max_chars most likely above prune_logp
    top = np.argsort(-lp[:, :blank], axis=1, kind="stable")[:, : opt.max_chars]
    keep = (np.take_along_axis(lp[:, :blank], top, axis=1) > opt.prune_logp).tolist()
    top = top.tolist()
    # Path probabilities are kept linear (sums and products, no log-add per step) and rescaled
    # after every frame so that the best beam's is 1: ranking is unchanged by the common factor.
    probs = np.exp(lp).tolist()
    children: dict[str, dict[int, str]] = {}  # key -> label -> the child's key (once each)

    def child_key(key: str, c: int) -> str:
        text = key.partition("\0")[0] if pieces else key
        child = scorer.append(text, chunks[c])
        if not pieces:  # (the text is unchanged by a space where it ends in one, or is empty)
            return key if child == text else child
        out = f"{child}\0{c}"  # (also when the text is unchanged: c becomes the last label)
        state[out] = state[child]
        return out

    def rank(item: tuple[str, list[Any]]) -> float:
        return math.log((item[1][0] + item[1][1]) or TINY) + state[item[0]][3]

    # key -> [P(its paths ending in blank), P(those ending in its last label), that label]
    beams: dict[str, list[Any]] = {"": [1.0, 0.0, -1]}
    for t, row in enumerate(probs):
        cands = [(c, row[c]) for c, k in zip(top[t], keep[t], strict=True) if k]
        p_blank = row[blank]
        nxt: dict[str, list[Any]] = {}
        for key, (pb, pnb, last) in beams.items():
            total = pb + pnb
            e = nxt.get(key)
            if e is None:
                e = nxt[key] = [0.0, 0.0, last]
            e[0] += total * p_blank
            if last >= 0:  # the last label held for another frame
                e[1] += pnb * row[last]
            kids = children.get(key)
            if kids is None:
                kids = children[key] = {}
            for c, p in cands:
                ck = kids.get(c)
                if ck is None:
                    ck = kids[c] = child_key(key, c)
                if ck == key:
                    # the last label again after a blank, adding nothing to the text (a space
                    # where the text ends in one, a control piece); characters: a leading space
                    # is a blank
                    if key:
                        e[1] += pb * p
                    else:
                        e[0] += total * p
                    continue
                n = nxt.get(ck)
                if n is None:
                    n = nxt[ck] = [0.0, 0.0, c]
                # a repeated label needs a blank between the two
                n[1] += (pb if c == last else total) * p
        if len(nxt) > opt.beam_size:
            beams = dict(heapq.nlargest(opt.beam_size, nxt.items(), key=rank))
        else:
            beams = nxt
        scale = max(v[0] + v[1] for v in beams.values())
        if scale > 0:
            for v in beams.values():
                v[0] /= scale
                v[1] /= scale
    # "a b" and "a b " are one text, and so are a text's beams by last label: their paths add up
    final: dict[str, list[float]] = {}
    for key, (pb, pnb, _) in beams.items():
        text = key.partition("\0")[0]
        f = final.setdefault(text.rstrip(" "), [0.0, scorer.final(text)])
        f[0] += pb + pnb
    return max(final, key=lambda text: math.log(final[text][0] or TINY) + final[text][1])


def beam_tokens(
    log_probs: np.ndarray, labels: Sequence[str], lm: NGramLM, options: BeamOptions
) -> list[tuple[int, int, int]]:
    """log_probs: (T, len(labels) + 1) -> the best text as (label, first, last frame) tokens."""
    text = beam_search(log_probs, labels, lm, options)
    if all(len(label) == 1 for label in labels):
        return align_tokens(log_probs, text, labels)
    return align_pieces(log_probs, text, labels)


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
    Each item on its own, as speechrt.asr.ctc.greedy_decode but searched with the LM."""
    blank = len(labels)
    if log_probs.shape[-1] != blank + 1:
        raise ValueError(f"{log_probs.shape[-1]} classes for {len(labels)} labels + blank")
    lp = host(log_probs).astype(np.float32, copy=False)
    return [
        tokens_to_words(
            beam_tokens(lp[i, : int(n)], labels, lm, options), labels, frame_duration, offset
        )
        for i, n in enumerate(host(lengths).tolist())
    ]
