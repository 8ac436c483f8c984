"""The toy architecture's optional conversion file (src/speechrt/convert/<kind>.py): reads a
checkpoint of another project that holds one tensor, "toy_gain"."""

from __future__ import annotations

from speechrt.arch.toy import ToyDims

from speechrt.arch import Conversion
from speechrt.convert import Converted
from speechrt.convert.checkpoints import tensors_of


def detect(keys: set[str]) -> bool:
    return keys == {"toy_gain"}


def from_dle(ckpt: dict) -> Converted:
    gain = tensors_of(ckpt, "state_dict")["toy_gain"]
    return Converted("toy", ToyDims(n_channels=gain.shape[0]), {"gain": gain})


CONVERSION = Conversion(detect, from_dle)  # named by the entry, as tests/test_registry.py does
