"""Word n-gram language model in backoff form: loading and querying (inference only).

    P(w | h) = P*(h w) if the n-gram h w is stored, else backoff(h) * P(w | h minus its oldest
    word); ln P* for every stored n-gram and ln backoff(h) per context. The model is estimated
    (interpolated modified Kneser-Ney) by the training package: speechrt_train.ngram.build_lm.

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
import shutil
from collections.abc import Sequence
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


class NgramTable:
    """n-gram key -> value: sorted key array searched on a miss, answers memoised. Building
    Python dicts of every n-gram instead costs about half a second for the bundled LM; a search
    asks for a few thousand of them."""

    def __init__(self, keys: np.ndarray, values: np.ndarray) -> None:
        order = np.argsort(keys, kind="stable")
        self.keys = np.asarray(keys)[order]  # (N,) int64, ascending
        self.values = np.asarray(values, dtype=np.float64)[order]  # (N,)
        self.memo: dict[int, float | None] = {}

    @classmethod
    def empty(cls) -> NgramTable:
        return cls(np.zeros(0, np.int64), np.zeros(0))

    def get(self, key: int) -> float | None:
        """The value of `key`, or None when the table lacks it."""
        if key in self.memo:
            return self.memo[key]
        i = int(np.searchsorted(self.keys, key))
        value = float(self.values[i]) if i < len(self.keys) and self.keys[i] == key else None
        self.memo[key] = value
        return value


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
        self._logp: list[NgramTable] = [NgramTable.empty()]
        self._backoff: list[NgramTable] = [NgramTable.empty()]
        for n in range(2, self.order + 1):
            keys = _keys(ids[n - 1], n_vocab)
            self._logp.append(NgramTable(keys, logp[n - 1]))
            top = n == self.order  # the top order is never a context
            self._backoff.append(NgramTable.empty() if top else NgramTable(keys, backoff[n - 1]))
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
                bo = self._backoff[n - 2].get(self._key(ctx))
                total += 0.0 if bo is None else bo
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
        shutil.copymode(out / INFO_FILE, out / WEIGHTS_FILE)  # (safetensors writes 0600)
        return out


def _keys(ids: np.ndarray, n_vocab: int) -> np.ndarray:
    """(N, n) word ids -> (N,) int64 keys (see NGramLM._key)."""
    keys = np.zeros(len(ids), dtype=np.int64)
    for col in np.asarray(ids, dtype=np.int64).T:
        keys = keys * n_vocab + col
    return keys


def read_arpa(path: str | Path, progress: bool = False) -> NGramLM:
    """An ARPA back-off model (KenLM's `lmplz` output, SRILM's, `.arpa` or `.arpa.gz`) as an
    NGramLM: log10 values become natural logarithms, every n-gram and back-off kept. A model
    without <unk> gets one at its least likely unigram's probability. Words are lower-cased, as
    the beam search asks for them (LibriSpeech's LMs are in capitals); two words that differ
    only in case are refused. Malformed files -> SpeechRTError naming the line. `progress`: a
    tqdm bar of lines read (on stderr)."""
    import gzip

    from tqdm import tqdm

    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    ln10 = float(np.log(10.0))
    counts: dict[int, int] = {}
    grams: list[list[tuple[float, list[str], float]]] = []  # per order: (log10 p, words, bo)
    section = 0  # 0: before \data\, -1: in it, n: in the n-grams, -2: after \end\
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = tqdm(f, unit=" lines", disable=not progress, desc=path.name)
            for number, line in enumerate(lines, 1):
                line = line.strip()
                if not line or section == -2:
                    continue
                if line == "\\data\\":
                    section = -1
                elif line == "\\end\\":
                    section = -2
                elif line.startswith("\\") and line.endswith("-grams:"):
                    head = line[1:].split("-")[0]
                    section = int(head) if head.isdigit() else 0
                    if section != len(grams) + 1 or section not in counts:
                        raise SpeechRTError(
                            f"{path}:{number}: {line} out of order or not in \\data\\"
                        )
                    grams.append([])
                elif section == -1 and line.startswith("ngram "):
                    order_, _, count = line[6:].partition("=")
                    if not (order_.strip().isdigit() and count.strip().isdigit()):
                        raise SpeechRTError(f"{path}:{number}: not an 'ngram N=COUNT' line")
                    counts[int(order_)] = int(count)
                elif section > 0:
                    fields = line.split()
                    try:
                        if len(fields) not in (section + 1, section + 2):
                            raise ValueError
                        bo = float(fields[-1]) if len(fields) == section + 2 else 0.0
                        grams[-1].append((float(fields[0]), fields[1 : section + 1], bo))
                    except ValueError:
                        raise SpeechRTError(f"{path}:{number}: not a {section}-gram line") from None
                elif section == 0:
                    continue  # (text before \data\ is a comment)
                else:
                    raise SpeechRTError(f"{path}:{number}: unexpected line in \\data\\")
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise SpeechRTError(f"{path}: not a readable ARPA file ({e})") from None
    if not grams or section != -2:
        raise SpeechRTError(f"{path}: no ARPA model (\\data\\ ... \\end\\)")
    for n, rows in enumerate(grams, 1):
        if len(rows) != counts.get(n):
            raise SpeechRTError(f"{path}: {len(rows)} {n}-grams, \\data\\ says {counts.get(n)}")
    vocab = [w[0].lower() for _, w, _ in grams[0]]
    logp1 = [p for p, _, _ in grams[0]]
    bo1 = [b for _, _, b in grams[0]]
    for special in (BOS, EOS):
        if special not in vocab:
            raise SpeechRTError(f"{path}: the unigrams lack {special}")
    if UNK not in vocab:
        vocab.append(UNK)
        logp1.append(min(logp1))
        bo1.append(0.0)
    ids = {w: i for i, w in enumerate(vocab)}
    if len(ids) != len(vocab):
        raise SpeechRTError(f"{path}: a unigram is listed twice (or in two cases)")
    logp = [np.asarray(logp1) * ln10]
    backoff = [np.asarray(bo1) * ln10]
    table = [np.zeros((len(vocab), 0), np.int32)]
    for n, rows in enumerate(grams[1:], 2):
        try:
            rows_ids = np.array([[ids[w.lower()] for w in words] for _, words, _ in rows], np.int32)
        except KeyError as e:
            raise SpeechRTError(f"{path}: a {n}-gram has the word {e} the unigrams lack") from None
        rows_ids = rows_ids.reshape(len(rows), n)
        order = np.lexsort(rows_ids.T[::-1]) if len(rows) else np.zeros(0, np.int64)
        table.append(rows_ids[order])
        logp.append(np.asarray([p for p, _, _ in rows])[order] * ln10)
        last = n == len(grams)
        backoff.append(np.zeros(0) if last else np.asarray([b for _, _, b in rows])[order] * ln10)
    return NGramLM(vocab, logp, backoff, table, source={"arpa": path.name})


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
