"""Triton's gRPC protocol (KServe v2 `inference.GRPCInferenceService`) on the HTTP routes' models.

The same models as /v2 (speechrt.serving.v2models: `tts`, `asr` and each component graph), with
the same checks and per-input limits (ContractModel.check) and the same metadata, configuration
and repository index (speechrt.serving.kserve), so `tritonclient.grpc` works as against Triton.
Inputs come as raw tensors (`raw_input_contents`, what tritonclient sends: little-endian, BYTES
as 4-byte length + bytes per element) or typed `contents`; outputs go back raw, as Triton sends
them. Request parameters are the HTTP route's (SynthesisOptions fields for `tts`,
`sample_rate` for `asr`).

Served: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig,
ModelInfer, RepositoryIndex. The others (streaming infer, statistics, shared memory, model
loading, trace and log settings) answer UNIMPLEMENTED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import numpy as np
from google.protobuf.json_format import ParseDict
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from speechrt.errors import SpeechRTError
from speechrt.serving import kserve
from speechrt.serving.grpc_calls import unary
from speechrt.serving.metrics import VERSION
from speechrt.serving.v2codec import check_shape, encode_bytes, from_raw
from speechrt.serving.v2metadata import NUMPY_DTYPES, HostArray, datatype_of

if TYPE_CHECKING:
    from speechrt.serving.server import Server
    from speechrt.serving.v2models import ContractModel

# KServe datatype -> the InferTensorContents field that carries it (FP16 and BF16: raw only)
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
# (tritonclient ships its generated protobuf modules without type stubs: mypy reads the message
# classes named below as untyped, and checks no field of them)


def parameter(p: pb.InferParameter) -> bool | int | str | float | None:
    """An InferParameter's value (bool, int, str or float); None when unset."""
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which is not None else None


def tensor(t: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> HostArray:
    """One InferInputTensor (its raw bytes, or None: its `contents`) -> its array."""
    name, datatype = t.name, t.datatype
    if datatype not in NUMPY_DTYPES:
        raise SpeechRTError(f"input {name!r}: unsupported datatype {datatype[:30]!r}")
    if any(k in t.parameters for k in SHARED_MEMORY):
        raise SpeechRTError(f"input {name!r}: shared memory is not supported; send the data")
    shape = check_shape(list(t.shape), name)
    if raw is not None:
        return from_raw(raw, datatype, shape, name)
    field = CONTENTS.get(datatype)
    if field is None:
        raise SpeechRTError(f"input {name!r}: {datatype} data comes as raw_input_contents")
    values = getattr(t.contents, field)
    count = int(np.prod(shape))
    if len(values) != count:
        raise SpeechRTError(
            f"input {name!r}: shape {list(shape)} needs {count} values, got {len(values)}"
        )
    if datatype == "BYTES":
        return np.array(list(values), dtype=object).reshape(shape)
    try:
        return np.array(values, dtype=NUMPY_DTYPES[datatype]).reshape(shape)
    except OverflowError:
        raise SpeechRTError(f"input {name!r}: a value does not fit {datatype}") from None


def inputs_of(request: pb.ModelInferRequest) -> tuple[dict[str, HostArray], dict[str, str]]:
    """A ModelInferRequest's inputs -> ({name: array}, {name: datatype})."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise SpeechRTError(
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: give one per input"
        )
    if not request.inputs:
        raise SpeechRTError("the request has no inputs")
    inputs: dict[str, HostArray] = {}
    datatypes: dict[str, str] = {}
    for i, t in enumerate(request.inputs):
        if t.name in inputs:
            raise SpeechRTError(f"input {t.name!r} given twice")
        inputs[t.name] = tensor(t, raw[i] if raw else None)
        datatypes[t.name] = t.datatype
    return inputs, datatypes


def response_of(
    m: ContractModel, request: pb.ModelInferRequest, outputs: dict[str, HostArray]
) -> pb.ModelInferResponse:
    """The requested outputs (all, if none named) as raw tensors."""
    wanted = [o.name for o in request.outputs] or list(outputs)
    for o in request.outputs:
        if o.name not in outputs:
            raise SpeechRTError(f"model {m.name!r} has no output {o.name!r}")
        if "classification" in o.parameters:
            raise SpeechRTError("the classification extension is not supported")
    response = pb.ModelInferResponse(model_name=m.name, model_version=VERSION, id=request.id)
    for name in wanted:
        arr = outputs[name]
        response.outputs.add(name=name, datatype=datatype_of(arr), shape=list(arr.shape))
        if arr.dtype == object:
            response.raw_output_contents.append(encode_bytes(arr))
        else:
            little = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
            response.raw_output_contents.append(little.tobytes())
    return response


class TritonService(pb_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService over a Server's KServe v2 models."""

    def __init__(self, server: Server) -> None:
        self.srv = server

    @unary
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @unary
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.srv.ready)

    @unary
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        m = kserve.find_model(self.srv, request.name, request.version)
        return pb.ModelReadyResponse(ready=kserve.is_ready(self.srv, m.name))

    @unary
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return ParseDict(kserve.SERVER_METADATA, pb.ServerMetadataResponse())

    @unary
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        m = kserve.find_model(self.srv, request.name, request.version)
        # (each input's max_shape, speechrt's, has no field here: ModelConfig has the limits)
        meta = m.metadata()
        return ParseDict(meta, pb.ModelMetadataResponse(), ignore_unknown_fields=True)

    @unary
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        m = kserve.find_model(self.srv, request.name, request.version)
        config = kserve.config_of(m, self.srv.config.batch)
        # (max_dims, speechrt's, has no field in Triton's ModelConfig: see ModelMetadata)
        parsed = ParseDict(config, mc.ModelConfig(), ignore_unknown_fields=True)
        return pb.ModelConfigResponse(config=parsed)

    @unary
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        if request.repository_name:
            raise SpeechRTError(
                "this server has one model repository, without a name; leave repository_name out"
            )
        entries = kserve.repository(self.srv, request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries]
        )

    @unary
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        m = kserve.find_model(self.srv, request.model_name, request.model_version)
        async with self.srv.metrics.track(m.name):
            inputs, datatypes = inputs_of(request)
            params: dict[str, object] = {k: parameter(v) for k, v in request.parameters.items()}
            outputs = await m.infer(m.check(inputs, datatypes), params)
            return response_of(m, request, outputs)


def add_service(grpc_server: grpc.aio.Server, server: Server) -> str:
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(TritonService(server), grpc_server)
    return "inference.GRPCInferenceService"
