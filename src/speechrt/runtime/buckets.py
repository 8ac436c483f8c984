"""Length buckets: pad every dynamic axis up to one of a few sizes, so that shapes repeat.

As in DLE FastSpeech's TensorRT multi-engine mode, each axis has a list of maximum lengths and an
input goes to the smallest bucket that fits. Unlike it, nothing is ever cropped: a size beyond the
largest bucket is rounded up to a multiple of that largest bucket. Models mask by lengths, so a
padded input gives the unpadded result within each item's length. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# axis name -> bucket sizes; "batch" is the batch axis. Axes not listed are not padded. Mel
# frames step by 64 up to 1024, then by 128: beyond 640 frames a vocoder runs under 10 %
# padding. ASR features keep coarse buckets: at 7 s, 704 frames ran no faster than 800 (Jasper,
# H100). Each bucket a process meets is compiled once, on first use.
_FRAMES = (*range(128, 1024, 64), *range(1024, 2048, 128), 2048)
DEFAULT_BUCKETS: dict[str, tuple[int, ...]] = {
    "batch": (1, 2, 4, 8, 16, 32, 64),
    "symbols": (32, 64, 96, 128, 192, 256, 384, 512),  # text (FastPitch, FastSpeech, Tacotron2)
    "frames": _FRAMES,  # mel frames (vocoders, postnet)
    "samples": tuple(n * 256 for n in _FRAMES),  # audio at 256 samples per frame (denoiser)
    "feature_frames": (200, 400, 800, 1600, 3200),  # ASR feature frames (10 ms each)
}


@dataclass(frozen=True)
class Buckets:
    """Per-axis bucket sizes, e.g. Buckets({"batch": (1, 8), "symbols": (32, 64, 128)})."""

    sizes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: dict(DEFAULT_BUCKETS))

    def __post_init__(self) -> None:
        for axis, sizes in self.sizes.items():
            if not sizes or any(s < 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
                raise ValueError(f"buckets for {axis!r} must be increasing sizes >= 1: {sizes}")

    def size(self, axis: str, n: int) -> int:
        """The padded size for an axis of size n (n itself for an axis without buckets)."""
        sizes = self.sizes.get(axis)
        if not sizes:
            return n
        for s in sizes:
            if s >= n:
                return s
        return -(-n // sizes[-1]) * sizes[-1]  # beyond the last: a multiple of it

    @classmethod
    def parse(cls, text: str) -> Buckets:
        """'batch=1,8;symbols=32,64,128' -> those axes replaced, the rest default; '' = default."""
        sizes = dict(DEFAULT_BUCKETS)
        for part in filter(None, (p.strip() for p in text.split(";"))):
            axis, _, values = part.partition("=")
            try:
                sizes[axis.strip()] = tuple(int(v) for v in values.split(",") if v.strip())
            except ValueError:
                raise ValueError(f"bad bucket list {part!r} (want axis=n1,n2,...)") from None
        return cls(sizes)

    @classmethod
    def none(cls) -> Buckets:
        """No padding at all (every call keeps its own shape)."""
        return cls({})
