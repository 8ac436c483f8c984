"""What the server adds to speechrt.contracts: the pipeline models, component names, datatypes.

Every KServe v2 model is described by a `speechrt.contracts.Contract`; its `/v2/models/{name}`
metadata is `model_metadata(contract, name, platform)` and its infer requests are checked against
it (speechrt.serving.v2models.ContractModel.check).

- Components are served by the runtime's shared contracts, one v2 model per graph
  (component_names): `<kind>` for a kind's main graph when it is not named `<kind>.<part>`
  (fastpitch, fastspeech, hifigan, waveglow, jasper, quartznet, parakeet_ctc,
  parakeet_transducer), `<kind>.<part>` for every other graph (hifigan.denoiser,
  waveglow.denoiser, tacotron2.encoder, tacotron2.decoder_step, tacotron2.postnet,
  parakeet_transducer.predict, parakeet_transducer.joint).
- The pipelines `tts` and `asr` exist only in the server: their contracts are here (BYTES text).
"""

from __future__ import annotations

from typing import TypeAlias, TypedDict

import numpy as np
import numpy.typing as npt

from speechrt.contracts import DATATYPES as KSERVE_DATATYPES
from speechrt.contracts import Contract, TensorSpec
from speechrt.registry import component_names as component_names

# A host tensor of any KServe datatype: numbers, bools, or BYTES as an object array. (A string:
# numpy's scalar types take no subscript at run time.)
HostArray: TypeAlias = "npt.NDArray[np.generic[object]]"


class _Tensor(TypedDict):
    name: str
    datatype: str
    shape: list[int]  # -1: a dynamic axis


class TensorMetadata(_Tensor, total=False):
    """A KServe v2 metadata tensor, as JSON."""

    max_shape: list[int]  # an input's largest shape, where the server says it (v2models)


class ModelMetadata(TypedDict):
    """The KServe v2 `GET /v2/models/{name}` body, as JSON."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


def tensor_metadata(t: TensorSpec) -> TensorMetadata:
    """KServe v2 metadata tensor: {"name", "datatype", "shape"} with -1 for dynamic axes."""
    shape = [-1 if isinstance(a, str) else a for a in t.shape]
    return {"name": t.name, "datatype": KSERVE_DATATYPES[t.dtype], "shape": shape}


def model_metadata(c: Contract, model_name: str, platform: str = "speechrt") -> ModelMetadata:
    """The KServe v2 `GET /v2/models/{name}` response body for a graph's contract."""
    return {
        "name": model_name,
        "versions": ["1"],
        "platform": platform,
        "inputs": [tensor_metadata(t) for t in c.inputs],
        "outputs": [tensor_metadata(t) for t in c.outputs],
    }


def _numpy_dtypes() -> dict[str, np.dtype[np.generic[object]]]:
    """KServe datatype -> little-endian numpy dtype, for those numpy has (not BF16)."""
    out = {}
    for name, datatype in KSERVE_DATATYPES.items():
        try:
            out[datatype] = np.dtype(name).newbyteorder("<")
        except TypeError:
            continue
    return out


NUMPY_DTYPES: dict[str, np.dtype[np.generic[object]]] = _numpy_dtypes()


def datatype_of(arr: HostArray) -> str:
    """The KServe datatype of a numpy array."""
    for datatype, dtype in NUMPY_DTYPES.items():
        if dtype == arr.dtype.newbyteorder("<"):
            return datatype
    raise TypeError(f"no KServe datatype for {arr.dtype}")


def _t(name: str, dtype: str, *shape: str, doc: str = "", counts: str | None = None):
    return TensorSpec(name, dtype, shape, doc, counts=counts)


TTS = Contract(
    "tts",
    (_t("TEXT", "object", "batch", doc="UTF-8 texts; [B, 1] is accepted too"),),
    (
        _t("AUDIO", "float32", "batch", "samples", doc="zero-padded"),
        _t("AUDIO_LENGTHS", "int64", "batch", counts="samples"),
    ),
)

ASR = Contract(
    "asr",
    (
        _t("AUDIO", "float32", "batch", "samples", doc="at the model's rate, or `sample_rate`"),
        _t("AUDIO_LENGTHS", "int64", "batch", doc="optional: whole rows", counts="samples"),
    ),
    (_t("TEXT", "object", "batch"),),
)
