"""Checkpoints and delta files: load, save, diff, apply, verify, inspect."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from . import _native
from ._tensors import Prepared, fspath, import_torch, is_torch, named_items, prepare, to_torch
from .errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]


class Checkpoint(Mapping):
    """A safetensors checkpoint (file, directory, or sharded directory), memory mapped.

    A read-only mapping from tensor name to a NumPy array that views the
    file's memory (no copy). BF16 and the float8 dtypes, which NumPy lacks,
    come as their bit patterns (uint16 / uint8); :attr:`dtypes` names the
    real dtype and :meth:`torch` gives a tensor of that dtype on the same
    memory. Arrays stay valid while they are referenced (they keep the
    mapping alive). With ``writable=True`` writes go to the file (call
    :meth:`sync` to make them durable).
    """

    def __init__(self, path: PathLike, writable: bool = False) -> None:
        self._native = _native.Checkpoint(os.fspath(path), writable)
        table = self._native.tensors()
        self._names: List[str] = [t[0] for t in table]
        self.dtypes: Dict[str, str] = {t[0]: t[1] for t in table}
        self.shapes: Dict[str, Tuple[int, ...]] = {t[0]: tuple(t[2]) for t in table}

    @property
    def path(self) -> str:
        return self._native.path

    @property
    def sharded(self) -> bool:
        return self._native.sharded

    @property
    def writable(self) -> bool:
        return self._native.writable

    def __getitem__(self, name: str) -> np.ndarray:
        return self._native.array(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self.dtypes

    def torch(self, name: str) -> Any:
        """The tensor as a CPU torch.Tensor of its real dtype, on the same memory."""
        return to_torch(self[name], self.dtypes[name])

    def tensor(self, name: str, framework: str = "numpy") -> Any:
        if framework == "numpy":
            return self[name]
        if framework == "torch":
            return self.torch(name)
        raise InvalidArgumentError(f"framework must be 'numpy' or 'torch', not {framework!r}",
                                   "INVALID_ARGUMENT")

    def sync(self) -> None:
        """msync + fsync every file (writable checkpoints)."""
        self._native.sync()

    def __repr__(self) -> str:
        return f"refit.Checkpoint({self.path!r}, {len(self)} tensors)"


def load(path: PathLike, writable: bool = False) -> Checkpoint:
    """Opens a checkpoint; see :class:`Checkpoint`."""
    return Checkpoint(path, writable)


def _prepare_side(tensors: Any, writable: bool, expected: Optional[Mapping[str, str]],
                  dtypes: Any) -> Prepared:
    if isinstance(tensors, Checkpoint):
        return prepare(tensors.items(), writable=writable, expected=None,
                       dtypes={**tensors.dtypes, **(dtypes or {})}
                       if not isinstance(dtypes, str) else dtypes)
    return prepare(named_items(tensors), writable=writable, expected=expected, dtypes=dtypes)


def save(path: PathLike, named_tensors: Any, *, dtypes: Any = None,
         metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes tensors to a .safetensors file atomically (sorted by name).

    ``dtypes`` gives the dtype of bit-pattern arrays (``{"w": "BF16"}``, or one
    string for all); torch tensors and NumPy float/int arrays carry their own.
    The tensors are assembled in memory, so this is meant for the baseline of
    small models and for tests.
    """
    p = _prepare_side(named_tensors, False, None, dtypes)
    _native.save(os.fspath(path), p.triples, dict(metadata or {}))


def copy_checkpoint(src: PathLike, dst: PathLike) -> None:
    """Copies a checkpoint file or directory (atomically per file, fsynced)."""
    _native.copy_checkpoint(os.fspath(src), os.fspath(dst))


def diff(base: Any, target: Any, out: PathLike, *, version: int = 1, base_version: int = 0,
         chunk_bytes: int = 0, threads: int = 0, allow_xor: bool = True,
         dtypes: Any = None) -> "_native.DiffReport":
    """Writes the delta that takes `base` to `target` into `out`.

    `base` and `target` are checkpoint paths, :class:`Checkpoint` objects, or
    named tensors (a mapping or (name, tensor) pairs of NumPy arrays or
    PyTorch tensors, read in place). A bit-pattern array (uint16 for BF16)
    takes the dtype of its counterpart on the other side, or from `dtypes`.
    """
    out_path = os.fspath(out)
    bp, tp = fspath(base), fspath(target)
    if bp is not None and tp is not None:
        return _native.diff_paths(bp, tp, out_path, version, base_version, chunk_bytes,
                                  threads, allow_xor)
    b = Checkpoint(bp) if bp is not None else base
    t = Checkpoint(tp) if tp is not None else target
    bprep = _prepare_side(b, False, None, dtypes)
    tprep = _prepare_side(t, False, _definitive(bprep), dtypes)
    # A bit-pattern base learns its dtypes from a typed target, too.
    bprep = _prepare_side(b, False, _definitive(tprep), dtypes)
    return _native.diff_tensors(bprep.triples, tprep.triples, out_path, version, base_version,
                                chunk_bytes, threads, allow_xor)


def _definitive(p: Prepared) -> Dict[str, str]:
    return {n: d for n, d in p.dtypes.items() if p.definitive[n]}


def apply(delta: PathLike, checkpoint: Any, *, threads: int = 0,
          sync: bool = True) -> "_native.ApplyReport":
    """Applies a delta in place.

    `checkpoint` is a checkpoint path (patched in the file, fsynced when
    `sync`) or named tensors, which refit writes into directly: NumPy arrays
    and CPU torch tensors in place; CUDA tensors all on one device in place
    on the GPU when the extension was built with the CUDA module
    (``refit._native.has_cuda``; the report is then a GpuApplyReport),
    otherwise through a host copy that is copied back. Raises
    :class:`refit.VersionMismatchError` (nothing written) when the tensors
    are not the delta's base.
    """
    path = fspath(checkpoint)
    if path is not None:
        return _native.apply_path(os.fspath(delta), path, threads, sync)
    _, _, table = _native.delta_tensors(os.fspath(delta))
    expected = {name: dtype for name, dtype, _, _ in table}
    if isinstance(checkpoint, Checkpoint):
        p = _prepare_side(checkpoint, True, expected, None)
    else:
        items = named_items(checkpoint)
        if _all_on_one_cuda_device(items):
            return _apply_cuda(os.fspath(delta), items, expected)
        # Staged device tensors are copied back only where the delta changes them.
        p = prepare(items, writable=True, expected=expected,
                    unchanged=[name for name, _, _, changed in table if not changed])
    report = _native.apply_tensors(os.fspath(delta), p.triples, threads)
    p.finish()
    return report


def _all_on_one_cuda_device(items: List[Tuple[str, Any]]) -> bool:
    if not getattr(_native, "has_cuda", False) or not items:
        return False
    devices = {t.device for _, t in items if is_torch(t)}
    return (len(devices) == 1 and all(is_torch(t) for _, t in items)
            and next(iter(devices)).type == "cuda")


def _apply_cuda(delta: str, items: List[Tuple[str, Any]], expected: Dict[str, str]) -> Any:
    # The GPU receiver writes the tensors where they live (no host copy).
    torch = import_torch()
    device = items[0][1].device
    p = prepare(items, writable=True, expected=expected, cuda_in_place=True)
    for name, t in items:
        if not t.is_contiguous():
            raise InvalidArgumentError(
                f"tensor {name!r} is not contiguous, so refit cannot write it in place",
                "INVALID_ARGUMENT")
    torch.cuda.synchronize(device)  # pending writes by the caller's streams land first
    return _native.apply_cuda(delta, p.triples, 256 << 20)


def verify(checkpoint: PathLike, delta: PathLike, *, threads: int = 0) -> "_native.VerifyReport":
    """Checks whether a checkpoint is exactly the delta's target (or its base)."""
    return _native.verify(os.fspath(checkpoint), os.fspath(delta), threads)


def inspect(delta: PathLike) -> "_native.InspectReport":
    """Decodes and checks every chunk of a delta and reports statistics."""
    return _native.inspect(os.fspath(delta))
