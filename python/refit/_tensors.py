"""Turning Python tensors into what the native layer borrows.

Native calls take ``(name, dtype, object)`` triples, where ``object`` is a
buffer-protocol object (NumPy) or a DLPack capsule (PyTorch); the memory is
used in place. This module decides the safetensors dtype of each tensor and
stages what cannot be borrowed: device (CUDA) tensors go through a host copy
that is copied back after a write. PyTorch is imported only when a torch
tensor is seen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from .errors import InvalidArgumentError, UnsupportedError

# Element widths of the safetensors dtypes refit knows (include/refit/checkpoint.h).
DTYPE_WIDTHS: Dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}

_NUMPY_TO_DTYPE = {
    "float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32",
    "uint16": "U16", "uint8": "U8", "bool": "BOOL", "complex64": "C64",
    # ml_dtypes' extension types, when the caller uses them.
    "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}

_TORCH_TO_DTYPE = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16",
    "torch.bfloat16": "BF16", "torch.int64": "I64", "torch.int32": "I32",
    "torch.int16": "I16", "torch.int8": "I8", "torch.uint8": "U8", "torch.bool": "BOOL",
    "torch.uint16": "U16", "torch.uint32": "U32", "torch.uint64": "U64",
    "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e4m3fnuz": "F8_E4M3FNUZ", "torch.float8_e5m2fnuz": "F8_E5M2FNUZ",
    "torch.float8_e8m0fnu": "F8_E8M0", "torch.complex64": "C64",
}

# NumPy arrays of these dtypes are taken as raw bit patterns: they adopt the
# dtype the other side expects when its width matches (BF16 as uint16 ...).
_BIT_PATTERN_KINDS = ("u",)


class Typed:
    """A tensor with an explicit safetensors dtype; see :func:`refit.as_dtype`."""

    __slots__ = ("tensor", "dtype")

    def __init__(self, tensor: Any, dtype: str) -> None:
        if dtype not in DTYPE_WIDTHS:
            raise InvalidArgumentError(
                f"unknown dtype {dtype!r}; refit knows {sorted(DTYPE_WIDTHS)}", "INVALID_ARGUMENT")
        self.tensor = tensor
        self.dtype = dtype


def is_torch(t: Any) -> bool:
    return type(t).__module__.split(".")[0] == "torch" and hasattr(t, "data_ptr")


def import_torch() -> Any:
    try:
        import torch  # noqa: PLC0415 (imported lazily on purpose)
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("this refit feature needs PyTorch (pip install torch)") from e
    return torch


def named_items(named_tensors: Any) -> List[Tuple[str, Any]]:
    """A list of (name, tensor) from a mapping or an iterable of pairs."""
    if isinstance(named_tensors, Mapping):
        items = list(named_tensors.items())
    else:
        try:
            items = [tuple(p) for p in named_tensors]
        except TypeError as e:
            raise InvalidArgumentError(
                "named tensors must be a mapping or an iterable of (name, tensor) pairs, "
                f"not {type(named_tensors).__name__}", "INVALID_ARGUMENT") from e
    for p in items:
        if len(p) != 2 or not isinstance(p[0], str):
            raise InvalidArgumentError(
                f"expected (name, tensor) pairs with string names, got {p!r:.80}",
                "INVALID_ARGUMENT")
    return items  # type: ignore[return-value]


class Prepared:
    """Triples ready for a native call, plus what keeps them valid."""

    def __init__(self) -> None:
        self.triples: List[Tuple[str, str, Any]] = []
        self.dtypes: Dict[str, str] = {}
        self.definitive: Dict[str, bool] = {}
        self._finalizers: List[Callable[[], None]] = []
        self._keep: List[Any] = []

    def finish(self) -> None:
        """Copies staged host buffers back into device tensors (after a write)."""
        for f in self._finalizers:
            f()
        self._finalizers.clear()


def width_of(dtype: str) -> int:
    w = DTYPE_WIDTHS.get(dtype)
    if w is None:
        raise InvalidArgumentError(f"unknown dtype {dtype!r}", "INVALID_ARGUMENT")
    return w


def natural_dtype(name: str, t: Any) -> Tuple[str, bool]:
    """(safetensors dtype, definitive) of a tensor; not definitive = bit pattern."""
    if isinstance(t, Typed):
        return t.dtype, True
    if is_torch(t):
        d = _TORCH_TO_DTYPE.get(str(t.dtype))
        if d is None:
            raise InvalidArgumentError(f"tensor {name!r}: refit has no dtype for {t.dtype}",
                                       "INVALID_ARGUMENT")
        return d, True
    a = t if isinstance(t, np.ndarray) else None
    if a is None:
        if hasattr(t, "__dlpack__"):
            raise InvalidArgumentError(
                f"tensor {name!r} ({type(t).__name__}): give its dtype with "
                "refit.as_dtype(tensor, 'BF16') (any DLPack tensor works then)",
                "INVALID_ARGUMENT")
        try:
            a = np.asarray(memoryview(t))
        except TypeError as e:
            raise InvalidArgumentError(
                f"tensor {name!r} is a {type(t).__name__}: refit takes NumPy arrays, PyTorch "
                "tensors, or DLPack / buffer-protocol objects", "INVALID_ARGUMENT") from e
    d = _NUMPY_TO_DTYPE.get(a.dtype.name)
    if d is None:
        raise InvalidArgumentError(f"tensor {name!r}: refit has no dtype for numpy {a.dtype}",
                                   "INVALID_ARGUMENT")
    return d, a.dtype.kind not in _BIT_PATTERN_KINDS


def resolve_dtype(name: str, given: str, definitive: bool, expected: Optional[str]) -> str:
    """The dtype to use: `given`, or `expected` when `given` is a bit pattern of its width."""
    if expected is None or expected == given:
        return given
    if not definitive and width_of(given) == width_of(expected):
        return expected
    raise InvalidArgumentError(
        f"tensor {name!r} is {given} but {expected} is expected; pass an array of that "
        f"dtype, its bit pattern (numpy.uint{8 * width_of(expected)}), or "
        f"refit.as_dtype(tensor, {expected!r})", "INVALID_ARGUMENT")


def _torch_capsule(t: Any, name: str) -> Any:
    torch = import_torch()
    try:
        return t.__dlpack__()
    except (RuntimeError, TypeError, BufferError):
        # Some builds cannot export float8 or bool through DLPack: the same
        # memory as an integer of the same width carries the same bits.
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        w = t.element_size()
        if w not in ints:
            raise
        return t.view(ints[w]).__dlpack__()


def prepare(named: Iterable[Tuple[str, Any]], *, writable: bool,
            expected: Optional[Mapping[str, str]] = None,
            dtypes: Optional[Union[str, Mapping[str, str]]] = None,
            cuda_in_place: bool = False,
            unchanged: Optional[Iterable[str]] = None) -> Prepared:
    """Prepares (name, tensor) pairs for a native call.

    writable: the native call writes the tensors in place; device tensors are
      staged through host memory and copied back by Prepared.finish().
    expected: dtypes the other side holds (a baseline, a delta); bit-pattern
      arrays adopt them.
    dtypes: explicit dtypes, one for all (a string) or per name.
    cuda_in_place: hand CUDA tensors over as device memory (for native calls
      that run on the GPU) instead of staging them.
    unchanged: names the write leaves as they are; their staged host copies
      are not copied back.
    """
    p = Prepared()
    skip_back = set(unchanged or ())
    for name, t in named:
        explicit = dtypes if isinstance(dtypes, str) else (dtypes or {}).get(name)
        if explicit is not None:
            t = Typed(t.tensor if isinstance(t, Typed) else t, explicit)
        given, definitive = natural_dtype(name, t)
        dtype = resolve_dtype(name, given, definitive,
                              None if expected is None else expected.get(name))
        obj = t.tensor if isinstance(t, Typed) else t
        p.triples.append((name, dtype, _borrowable(p, name, obj, writable, cuda_in_place,
                                                   copy_back=name not in skip_back)))
        p.dtypes[name] = dtype
        p.definitive[name] = definitive or dtype != given
    return p


def _borrowable(p: Prepared, name: str, obj: Any, writable: bool,
                cuda_in_place: bool = False, copy_back: bool = True) -> Any:
    if is_torch(obj):
        t = obj.detach()
        if t.device.type != "cpu" and not cuda_in_place:
            host = t.to("cpu").contiguous()
            if writable and copy_back:
                p._finalizers.append(lambda dst=t, src=host: dst.copy_(src))
            p._keep.append(host)
            return _torch_capsule(host, name)
        if not t.is_contiguous():
            if writable:
                raise InvalidArgumentError(
                    f"tensor {name!r} is not contiguous, so refit cannot write it in place",
                    "INVALID_ARGUMENT")
            t = t.contiguous()
        p._keep.append(t)
        return _torch_capsule(t, name)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            if writable:
                raise InvalidArgumentError(
                    f"tensor {name!r} is not C-contiguous, so refit cannot write it in place",
                    "INVALID_ARGUMENT")
            obj = np.ascontiguousarray(obj)
        p._keep.append(obj)
        return obj
    if hasattr(obj, "__dlpack__"):
        p._keep.append(obj)
        return obj.__dlpack__()
    return obj


def to_torch(array: np.ndarray, dtype: str) -> Any:
    """A torch tensor on the same memory as `array`, with the dtype's torch type."""
    torch = import_torch()
    import warnings

    target = {
        "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
        "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
        "F8_E8M0": "float8_e8m0fnu",
    }.get(dtype)
    with warnings.catch_warnings():
        # Read-only mappings: torch warns that it cannot mark them read-only.
        warnings.simplefilter("ignore", UserWarning)
        try:
            t = torch.from_numpy(array)
        except TypeError:
            # PyTorch before 2.3 has no uint16/32/64 tensors. Bit patterns of
            # another dtype (BF16 is read as uint16) pass through the signed
            # integer of the same width; real unsigned integers cannot.
            signed = {2: np.int16, 4: np.int32, 8: np.int64}.get(array.dtype.itemsize)
            if target is None or array.dtype.kind != "u" or signed is None:
                raise UnsupportedError(
                    f"this PyTorch ({torch.__version__}) has no tensor type for {dtype} "
                    f"({array.dtype}) data; use the NumPy arrays (tensor(name, "
                    "framework='numpy')) or PyTorch 2.3 or newer", "UNIMPLEMENTED") from None
            t = torch.from_numpy(array.view(signed))
    if target is not None and hasattr(torch, target):
        t = t.view(getattr(torch, target))
    return t


def fspath(p: Any) -> Optional[str]:
    """The path of a str / PathLike, else None."""
    if isinstance(p, (str, os.PathLike)):
        return os.fspath(p)
    return None
