"""Architectures, one file each, inference only; speechrt.registry names them by kind.

Every model class follows one contract:
    cls.kind / cls.role         registry name; "acoustic", "vocoder", "denoiser" or "asr"
    cls.Dims                    frozen dataclass of hyper-parameters, from speechrt.arch.<kind>
    cls(dims)                   builds the inference module

Reading other projects' checkpoints is speechrt.convert's job: nothing here imports it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

import torch

from speechrt.arch import untuple
from speechrt.errors import SpeechRTError
from speechrt.registry import model_class


def build_model(kind: str, dims: dict[str, Any] | Any) -> torch.nn.Module:
    """The module of `kind` with these dims (a Dims or a model.json dict, checked: every
    value of its declared type, integers >= 0). Under `torch.device("meta")` nothing is
    allocated, so absurd sizes can be compared with the weights' shapes first (repo.py)."""
    cls = model_class(kind)
    if isinstance(dims, dict):
        known = {f.name for f in dataclasses.fields(cls.Dims)}
        unknown = set(dims) - known
        if unknown:
            raise SpeechRTError(f"{kind}: unknown dims {sorted(unknown)}")
        hints = typing.get_type_hints(cls.Dims)
        for name, value in dims.items():
            if not _valid(untuple(value), hints[name]):
                raise SpeechRTError(
                    f"{kind}: dims.{name} = {value!r} is not a valid {_describe(hints[name])}"
                )
        dims = cls.Dims(**{k: untuple(v) for k, v in dims.items()})
    try:
        return cls(dims)
    except (RuntimeError, ValueError, TypeError, ZeroDivisionError, AssertionError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpeechRTError(f"{kind}: its dims do not make a model ({first})") from None


def _valid(value: Any, hint: Any) -> bool:
    """Is `value` (JSON-decoded, lists made tuples) of the Dims type `hint`?"""
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_valid(v, args[0]) for v in value)
        return len(args) == len(value) and all(
            _valid(v, a) for v, a in zip(value, args, strict=True)
        )
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_valid(value, a) for a in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # sizes, counts, strides: never negative
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if hint is type(None):
        return value is None
    return True  # any other type is left to the model's own checks


def _describe(hint: Any) -> str:
    """int -> "integer >= 0", tuple[int, ...] -> "tuple of integer >= 0", ..."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"tuple of {_describe(args[0])}"
    names = {int: "integer >= 0", float: "finite number", bool: "boolean", str: "string"}
    return names.get(hint) or str(hint)
