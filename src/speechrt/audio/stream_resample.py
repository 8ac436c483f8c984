"""Resampling a stream: chunks in, the samples of `speechrt.audio.io.resample` of the whole signal
out, each as soon as the inputs it reads have arrived (the polyphase filter of `resample_poly`,
evaluated at absolute positions). Memory: the filter's span of input, whatever the length.
"""

from __future__ import annotations

from math import gcd

import numpy as np

from speechrt.audio.io import lowpass
from speechrt.errors import SpeechRTError


class StreamResampler:
    """push(chunk (N,) float) -> the output samples now final (float32); finish() -> the rest.

    The outputs concatenated equal resample(whole signal, orig_sr, target_sr) to float rounding.
    """

    def __init__(self, orig_sr: int, target_sr: int) -> None:
        if orig_sr <= 0 or target_sr <= 0:
            raise SpeechRTError(f"invalid sample rate: {orig_sr} -> {target_sr}")
        g = gcd(orig_sr, target_sr)
        self.up, self.down = target_sr // g, orig_sr // g
        self.identity = self.up == self.down
        h = lowpass(self.up, self.down)
        half = (h.shape[0] - 1) // 2
        pad = self.down - half % self.down
        self.pre = (half + pad) // self.down  # outputs resample_poly drops at the start
        self.taps = -(-(h.shape[0] + pad) // self.up)
        table = np.zeros(self.taps * self.up)
        table[pad : pad + h.shape[0]] = h * self.up
        self.table = table.reshape(self.taps, self.up)  # table[j, phase]
        self.buf = np.zeros(0)  # inputs from absolute index i0 on
        self.i0 = 0
        self.n_in = 0
        self.m = 0  # the next output to compute

    def push(self, chunk: np.ndarray) -> np.ndarray:
        x = np.asarray(chunk, dtype=np.float64)
        if self.identity:
            return x.astype(np.float32)
        self.buf = np.concatenate((self.buf, x))
        self.n_in += x.size
        # output m reads inputs base(m) - taps + 1 .. base(m), base(m) = (m + pre) * down // up
        last = (self.n_in * self.up - 1) // self.down - self.pre  # the last with base < n_in
        return self._outputs(last + 1)

    def finish(self) -> np.ndarray:
        if self.identity:
            return np.zeros(0, dtype=np.float32)
        return self._outputs(-(-self.n_in * self.up // self.down))  # ceil(N * up / down) in all

    def _outputs(self, stop: int) -> np.ndarray:
        if stop <= self.m:
            return np.zeros(0, dtype=np.float32)
        pos = (np.arange(self.m, stop) + self.pre) * self.down
        base, phase = pos // self.up, pos % self.up
        j = np.arange(self.taps)
        idx = base[:, None] - j[None, :]  # absolute input indices (M, taps)
        # before the start and past the end read zeros, as resample_poly's padding
        ok = (idx >= 0) & (idx < self.n_in)
        local = np.clip(idx - self.i0, 0, max(self.buf.size - 1, 0))
        vals = np.where(ok, self.buf[local] if self.buf.size else 0.0, 0.0)
        out = np.einsum("mj,jm->m", vals, self.table[:, phase])
        self.m = stop
        # keep the inputs the next output reads
        keep_from = max(0, (self.m + self.pre) * self.down // self.up - self.taps + 1)
        if keep_from > self.i0:
            drop = min(keep_from - self.i0, self.buf.size)
            self.buf, self.i0 = self.buf[drop:], self.i0 + drop
        return out.astype(np.float32)
