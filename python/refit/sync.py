"""Publisher (trainer side) and Receiver (inference side) of the version protocol.

See docs/protocol.md for what happens underneath and docs/python.md for
examples.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._tensors import is_torch, named_items, prepare
from .errors import Error, InvalidArgumentError, NotFoundError, UnsupportedError
from .files import Checkpoint, PathLike, save

CommitHook = Callable[["SyncReport"], Any]


def _layout_text(layout: Any) -> str:
    """A layout as JSON text: from a dict, a path, or the text itself."""
    if isinstance(layout, dict):
        return json.dumps(layout)
    if not isinstance(layout, (str, os.PathLike)):
        raise InvalidArgumentError("layout= must be a layout file path, its JSON text or a "
                                   f"dict, not {type(layout).__name__}", "INVALID_ARGUMENT")
    if not str(layout).lstrip().startswith("{"):
        with open(os.fspath(layout), encoding="utf-8") as f:
            return f.read()
    return str(layout)


class Coordinator:
    """Turns the parts that several trainer ranks publish into versions (docs/trainer.md).

    Waits until every rank in ``ranks`` has uploaded its part of a version,
    then runs the joint commit with ``members`` (the receivers). Two ways:

    - **Direct** (``baseline=None``, the default): the ranks upload their
      parts to the store itself, and receivers apply the ranks' chunks
      where they lie (docs/protocol.md, "Versions from many ranks"). The
      coordinator only decides: it reads part lists and votes, holds no
      model and needs no disk. ``table`` is a checkpoint at the store's
      head version, read once for its tensor table, needed only while the
      store records none (its first version); it is read through a few
      small buffers, not mapped, so the model never enters the
      coordinator's memory.
    - **Assembled** (``baseline`` given): parts go to ``parts`` (default:
      the store); the coordinator applies them to its staging copy of the
      canonical checkpoint (``staging``, default: baseline + ".staging")
      and publishes that, for receivers that cannot apply a direct version
      (those of older releases; every receiver here applies them, CUDA
      tensors' two-phase receivers on the device).
    """

    def __init__(self, store: str, *, members: Sequence[str], ranks: Sequence[int],
                 baseline: Optional[PathLike] = None, parts: Optional[str] = None,
                 staging: Optional[PathLike] = None, table: Optional[PathLike] = None,
                 key: Optional[bytes] = None, key_file: Optional[PathLike] = None,
                 vote_timeout: float = 60.0, parts_timeout: float = 600.0,
                 threads: int = 0) -> None:
        key_path = os.fspath(key_file) if key_file else ""
        self._direct = baseline is None
        if self._direct:
            if parts is not None or staging is not None:
                raise InvalidArgumentError(
                    "parts= and staging= belong to the assembling coordinator (baseline=); "
                    "a direct coordinator reads the ranks' parts from the store itself",
                    "INVALID_ARGUMENT")
            self._native: Any = _native.DirectCoordinator(
                store, list(members), [int(r) for r in ranks], key, key_path,
                float(vote_timeout), float(parts_timeout),
                os.fspath(table) if table is not None else "")
            return
        baseline = os.fspath(baseline)
        staging = os.fspath(staging) if staging is not None else baseline + ".staging"
        self._native = _native.Coordinator(
            store, parts or "", baseline, staging, list(members), [int(r) for r in ranks], key,
            key_path, float(vote_timeout), float(parts_timeout), threads)

    @property
    def direct(self) -> bool:
        """Whether receivers apply the ranks' chunks directly (no baseline)."""
        return self._direct

    @property
    def committed_version(self) -> int:
        return self._native.committed_version

    def publish(self, version: int) -> Tuple[Any, Dict[str, Any]]:
        """Waits for every rank's part of `version` and decides it.

        Returns the version's report (``committed``, ``reason``, ...: a
        dict for a direct coordinator, a PublishReport for an assembling
        one) and the parts' totals (chunks, bytes, changed elements, wait
        seconds; and apply seconds when assembled).
        """
        return self._native.publish(version)

    def parts_stored(self, version: int) -> List[int]:
        """The ranks whose part list of `version` is stored (direct only)."""
        if not self._direct:
            raise InvalidArgumentError("parts_stored() is the direct coordinator's",
                                       "INVALID_ARGUMENT")
        return list(self._native.parts_stored(version))


class Publisher:
    """Publishes versions of a model's weights to a store and coordinates their commit.

    store: a directory path or an ``s3://bucket/prefix`` URL.
    baseline: a checkpoint path the publisher keeps as its own copy of the
      committed version (patched in place on every commit). When it does not
      exist, ``initial`` (named tensors: the weights every receiver starts
      from) is written there first.
    members: the receivers' names; a version commits when all of them voted.
    layout, rank: one trainer rank of a job whose ranks each hold part of the
      model (docs/trainer.md): ``layout`` is a layout file path, its JSON
      text or a dict (docs/layout.md; ``refit layout generate`` writes one),
      and ``publish`` takes this rank's local tensors by their local names.
      The rank uploads its part to ``parts`` (a store URL; default: the
      store) and waits for the version's decision, serving re-sends of its
      own regions meanwhile; a :class:`Coordinator` decides the version
      once every rank reported (with parts in the store itself and no
      baseline, receivers apply the ranks' chunks directly). The
      rank's baseline is the canonical checkpoint ``baseline`` at the
      committed version, or its own local tensors ``initial``. With
      ``baseline_memory="device"`` the rank keeps its owned bytes in device
      memory (of ``initial``'s CUDA device, or the current one with
      ``baseline=``) and encodes on the GPU; publish() then takes CUDA
      tensors of that device. The GPU rank encoder takes pieces whose local
      bits are the checkpoint's, stored in canonical order (row and column
      shards, fused tensors, replicas); a layout with converted pieces (FP32
      masters, FP8) or transposed storage raises UnsupportedError there.
      It is the default when ``initial`` holds CUDA tensors (and no
      ``baseline``) and the layout's pieces of this rank allow it; else the
      default is "file", the CPU encoder (CUDA tensors are copied to host
      memory on each publish). With
      ``layout=None`` (default) the tensors are canonical (Hugging Face
      names and shapes) and this object is the coordinator itself.
    key / key_file: HMAC key (bytes, at least 16) authenticating every object.
    sign_key / sign_key_file: an Ed25519 private key (32 raw bytes, or a PEM
      file) signing every object the publisher writes; receivers check them
      with the public half (Receiver(verify_key=...)).
    vote_timeout: seconds to wait for the votes; policy "abort" (default) or
      "drop" (commit with those that voted).
    baseline_memory: where the baseline lives. "file" (the default when
      ``baseline`` is given): the checkpoint at ``baseline``, diffed on the
      CPU. "device" (the default when ``baseline`` is None and ``initial``
      holds CUDA tensors): a copy of ``initial`` in device memory; publish()
      then takes CUDA tensors of that device, which are diffed and encoded
      on the GPU, and only the encoded chunks come to host memory; commits
      advance the baseline on the device. "pinned": the same with the
      baseline in page-locked host memory, read by the GPU over the bus (for
      a device short of memory; encoding is bound by the bus then). Device
      memory is not durable: after a restart, open the publisher again
      from weights at the store's head version (it refuses others), or
      keep a durable file.
    durable_baseline: with a baseline in memory, a safetensors file the
      baseline is written to after each commit, in the background (through
      a 64 MiB page-locked buffer; the file always holds one committed
      version whole, its metadata "refit_version"; commits faster than a
      write are coalesced). When the file exists at open, the baseline starts
      from it instead of ``initial``'s values (``initial`` still gives the
      tensors' names, shapes and device): a trainer restarted from an older
      checkpoint of its own publishes against the store's head. ``durable``
      reports its state; close() waits until it holds the newest commit.
    conditional: versions may also carry conditional XOR chunks (kind 5,
      docs/format.md section 4.3: the changes coded given the base every
      receiver holds), where they are smaller; off by default. Receivers
      that apply on the CPU (checkpoint, in-memory, two-phase host) take
      them; GPU receivers refuse such a version before writing anything,
      and a baseline in device memory cannot publish them. With ``layout=``
      (trainer ranks) it is not available.
    pack_bytes: chunk packs (docs/protocol.md, "Chunk packs"): consecutive
      chunks whose sealed objects are smaller than this are stored together,
      one object of at most this many bytes, for checkpoints of many small
      tensors (each object costs a PUT, or a file and two fsyncs in a
      directory store). 0 (default): one object per chunk; receivers of
      releases before packs cannot read packed versions. With ``layout=``
      (trainer ranks) the chunks of the rank's part are packed the same
      way (its part list gives each chunk's place in its pack); the
      coordinator and the receivers must be of a release that reads packed
      parts.

    Not thread-safe, except that :meth:`publish_async` runs publishes on one
    background thread, in order.
    """

    def __init__(self, store: str, *, baseline: Optional[PathLike] = None,
                 members: Optional[Sequence[str]] = None,
                 layout: Any = None, rank: int = 0, initial: Any = None,
                 dtypes: Any = None, key: Optional[bytes] = None,
                 key_file: Optional[PathLike] = None, sign_key: Optional[bytes] = None,
                 sign_key_file: Optional[PathLike] = None, vote_timeout: float = 60.0,
                 policy: str = "abort", threads: int = 0, chunk_bytes: int = 0,
                 upload_threads: int = 4, snapshot_every: int = 0,
                 keep_versions: int = 0, parts: Optional[str] = None,
                 decision_timeout: float = 600.0,
                 baseline_memory: Optional[str] = None,
                 durable_baseline: Optional[PathLike] = None,
                 conditional: bool = False, pack_bytes: int = 0,
                 initial_amax: Optional[Dict[str, float]] = None) -> None:
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self._layout = layout
        self._rank = rank
        self._device = False
        if pack_bytes < 0:
            raise InvalidArgumentError(f"pack_bytes must be >= 0, not {pack_bytes}",
                                       "INVALID_ARGUMENT")
        if layout is not None:
            if conditional:
                raise InvalidArgumentError(
                    "conditional=True is for a publisher of canonical tensors "
                    "(layout=None); a trainer rank uploads its chunks as its part",
                    "INVALID_ARGUMENT")
            self._init_rank(store, layout, rank, baseline, initial, key, key_file, threads,
                            chunk_bytes, upload_threads, parts, decision_timeout,
                            baseline_memory, initial_amax, int(pack_bytes))
            return
        if initial_amax is not None:
            raise InvalidArgumentError(
                "initial_amax= is for a trainer rank (layout=) that owns part of a tensor "
                "whose scale is the amax of the whole tensor", "INVALID_ARGUMENT")
        if rank != 0:
            raise NotImplementedError(
                "refit.Publisher(rank=...) needs a layout (several ranks each owning part of "
                "the canonical tensors); with layout=None, publish from rank 0 only")
        if members is None or (baseline is None and initial is None):
            raise InvalidArgumentError("refit.Publisher needs baseline= and members= "
                                       "(or layout= and rank= for one trainer rank)",
                                       "INVALID_ARGUMENT")
        if isinstance(members, str):
            raise InvalidArgumentError("members must be a list of names, not one string",
                                       "INVALID_ARGUMENT")
        memory = baseline_memory
        if memory is None:
            memory = "device" if baseline is None and _any_cuda(initial) else "file"
        if memory not in ("file", "device", "pinned"):
            raise InvalidArgumentError("baseline_memory must be 'file', 'device' or 'pinned', "
                                       f"not {memory!r}", "INVALID_ARGUMENT")
        if durable_baseline is not None and memory == "file":
            raise InvalidArgumentError(
                "durable_baseline= is for a baseline in memory (baseline_memory='device' or "
                "'pinned'); a checkpoint baseline is durable already", "INVALID_ARGUMENT")
        if memory != "file":
            if conditional:
                raise InvalidArgumentError(
                    "conditional=True needs baseline_memory='file': conditional XOR chunks "
                    "are encoded on the CPU only", "INVALID_ARGUMENT")
            if baseline is not None or initial is None:
                raise InvalidArgumentError(
                    f"baseline_memory={memory!r} keeps the baseline in memory: give initial= "
                    "(the CUDA tensors every receiver starts from), not baseline=",
                    "INVALID_ARGUMENT")
            self._device = True
            self._baseline = ""
            p = prepare(named_items(initial), writable=False, dtypes=dtypes, cuda_in_place=True)
            self._dtypes = dict(p.dtypes)
            _sync_cuda(initial)
            self._native = _native.Publisher(
                store, "", list(members), key, os.fspath(key_file) if key_file else "",
                sign_key, os.fspath(sign_key_file) if sign_key_file else "",
                float(vote_timeout), policy, threads, chunk_bytes, upload_threads,
                snapshot_every, keep_versions, device_initial=p.triples,
                pinned_host=memory == "pinned",
                durable_path=os.fspath(durable_baseline) if durable_baseline else "",
                pack_bytes=int(pack_bytes))
            self._decision_timeout = float(decision_timeout)
            return
        if baseline is None:
            raise InvalidArgumentError("refit.Publisher needs baseline= (a checkpoint path) "
                                       "or, for a baseline in memory, CUDA tensors in "
                                       "initial=", "INVALID_ARGUMENT")
        baseline = os.fspath(baseline)
        if not os.path.exists(baseline):
            if initial is None:
                raise NotFoundError(
                    f"baseline checkpoint {baseline!r} does not exist; pass initial= (the "
                    "weights every receiver starts from) to create it", "NOT_FOUND")
            save(baseline, initial, dtypes=dtypes)
        self._baseline = baseline
        self._dtypes = dict(Checkpoint(baseline).dtypes)
        self._native = _native.Publisher(
            store, baseline, list(members), key, os.fspath(key_file) if key_file else "",
            sign_key, os.fspath(sign_key_file) if sign_key_file else "", float(vote_timeout), policy, threads, chunk_bytes, upload_threads, snapshot_every,
            keep_versions, conditional=bool(conditional), pack_bytes=int(pack_bytes))
        self._decision_timeout = float(decision_timeout)

    def _init_rank(self, store: str, layout: Any, rank: int, baseline: Optional[PathLike],
                   initial: Any, key: Optional[bytes], key_file: Optional[PathLike],
                   threads: int, chunk_bytes: int, upload_threads: int,
                   parts: Optional[str], decision_timeout: float,
                   baseline_memory: Optional[str],
                   initial_amax: Optional[Dict[str, float]], pack_bytes: int) -> None:
        # One trainer rank of a version published by many (docs/trainer.md):
        # this rank's local tensors, in its own layout, become its part.
        text = _layout_text(layout)
        local = {}
        try:
            parsed = json.loads(text)
        except ValueError as e:
            raise InvalidArgumentError(f"layout is not JSON: {e}", "INVALID_ARGUMENT") from None
        for r in parsed.get("ranks", []) if isinstance(parsed, dict) else []:
            if r.get("rank") == rank:
                local = {t["name"]: t["dtype"] for t in r.get("tensors", [])}
        if not local:
            raise InvalidArgumentError(f"the layout has no rank {rank}", "INVALID_ARGUMENT")
        self._dtypes = local
        if baseline is None and initial is None:
            raise InvalidArgumentError(
                "a rank publisher needs baseline= (the canonical checkpoint at the "
                "committed version) or initial= (this rank's local tensors at it)",
                "INVALID_ARGUMENT")
        memory = baseline_memory
        if memory is None:
            # The GPU encoder where the layout allows it, for CUDA tensors.
            on_gpu = (baseline is None and _any_cuda(initial)
                      and getattr(_native, "has_cuda", False))
            memory = "device" if on_gpu else "file"
            fallback = on_gpu
        else:
            fallback = False
        if memory not in ("file", "device"):
            raise InvalidArgumentError(
                "with layout=, baseline_memory must be 'file' (the CPU encoder) or 'device' "
                f"(the GPU encoder), not {memory!r}", "INVALID_ARGUMENT")
        self._baseline = os.fspath(baseline) if baseline is not None else ""
        self._decision_timeout = float(decision_timeout)
        args = (store, parts or "", text, rank, -1, self._baseline)
        rest = (key, os.fspath(key_file) if key_file else "", threads, chunk_bytes,
                upload_threads)
        if memory == "device":
            # The GPU rank encoder (opt-in): the owned bytes in device memory.
            device = _cuda_device_of(initial) if baseline is None else _current_cuda_device()
            triples = None
            if baseline is None:
                self._initial = prepare(named_items(initial), writable=False, expected=local,
                                        cuda_in_place=True)
                _sync_cuda(initial)
                triples = self._initial.triples
            try:
                self._native = _native.RankPublisher(*args, triples, *rest, device=device,
                                                     pack_bytes=pack_bytes)
                self._device = True
                return
            except UnsupportedError:
                if not fallback:
                    raise
                # Converted pieces or transposed storage: the CPU encoder.
        triples = None
        if baseline is None:
            self._initial = prepare(named_items(initial), writable=False, expected=local)
            triples = self._initial.triples
        self._native = _native.RankPublisher(*args, triples, *rest, initial_amax=initial_amax,
                                             pack_bytes=pack_bytes)

    @property
    def committed_version(self) -> int:
        """The newest committed version (the store's head)."""
        return self._native.committed_version

    @property
    def baseline(self) -> str:
        """The baseline checkpoint's path ("" when the baseline is in memory)."""
        return self._baseline

    @property
    def on_device(self) -> bool:
        """Whether the baseline is in memory and publish() encodes on the GPU."""
        return self._device

    @property
    def durable(self) -> Optional[Dict[str, Any]]:
        """The durable baseline file's state (None without one): ``loaded``
        (the baseline started from it) and ``loaded_version``,
        ``written_version`` (the newest version in the file), ``writes``,
        ``last_write_seconds`` and ``error`` (the last write's, "" if it
        worked)."""
        if not self._device or self._layout is not None:
            return None
        return self._native.durable()

    def _canonical(self, named_tensors: Any) -> List[Tuple[str, Any]]:
        # The seam for trainer layouts: with a layout, local shards and fused
        # tensors map to canonical names and ranges here.
        return named_items(named_tensors)

    def publish(self, version: int, named_tensors: Any, *,
                amax: Optional[Dict[str, float]] = None) -> "_native.PublishReport":
        """Publishes `named_tensors` as `version` and waits for the commit decision.

        The tensors are read in place (NumPy arrays, CPU torch tensors; CUDA
        tensors are copied to host first, except with a baseline in memory,
        which encodes them on the GPU where they are) and must not change
        until this returns. Returns a report: ``committed``, ``changed_percent``,
        ``bytes_uploaded``, ``seconds`` ...; an aborted version is reported
        (``committed`` False, ``reason``), not raised.

        ``amax`` (a trainer rank, ``layout=``): ``{canonical name: float}``,
        the whole tensor's largest magnitude for each per-tensor FP8 or NVFP4
        tensor this rank owns only part of (e.g. an all-reduce MAX of every
        owner's local amax); every owner must pass the same values.
        """
        self.wait()
        return self._publish_now(version, self._canonical(named_tensors), amax=amax)

    def _publish_now(self, version: int, items: List[Tuple[str, Any]],
                     wait_streams: bool = True,
                     amax: Optional[Dict[str, float]] = None) -> Any:
        if amax is not None and self._layout is None:
            raise InvalidArgumentError(
                "amax= is for a trainer rank (layout=) that owns part of a tensor whose "
                "scale is the amax of the whole tensor", "INVALID_ARGUMENT")
        with self._lock:
            p = prepare(items, writable=False, expected=self._dtypes,
                        cuda_in_place=self._device)
            if self._device and wait_streams:
                _sync_cuda(items)
            if self._layout is None:
                return self._native.publish(version, p.triples)
            # A rank: upload the part, then wait for the version's decision
            # (the coordinator assembles it once every rank reported).
            report = self._native.publish(version, p.triples, amax)
            report["committed"] = self._native.await_decision(self._decision_timeout)
            return report

    def publish_async(self, version: int, named_tensors: Any, *, copy: bool = True,
                      amax: Optional[Dict[str, float]] = None
                      ) -> "concurrent.futures.Future[Any]":
        """Starts publishing and returns at once, with a Future of the report.

        With ``copy=True`` (default) the tensors are first copied (to host
        memory; with a baseline in memory, to device memory, which takes
        milliseconds), so the training loop may update the model right away
        (the cost: one copy of the model per version in flight). With
        ``copy=False`` they are read in place and must not change until the
        future is done. Versions publish one after another, in call order.
        ``amax``: as for publish().
        """
        items = self._canonical(named_tensors)
        ready = None
        if copy and self._device:
            # Copies on the device, ordered after the training step's work on
            # the current stream; the publishing thread waits for them.
            items = [(n, t.detach().clone() if is_torch(t) else t) for n, t in items]
            ready = _record_cuda_event(items)
        elif copy:
            items = [(n, _snapshot(t)) for n, t in items]
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="refit-publish")
        if ready is None:
            return self._executor.submit(self._publish_now, version, items, True, amax)

        def run() -> Any:
            ready.synchronize()
            return self._publish_now(version, items, wait_streams=False, amax=amax)
        return self._executor.submit(run)

    def publish_checkpoint(self, version: int, path: PathLike) -> "_native.PublishReport":
        """Publishes the tensors of a checkpoint on disk as `version`."""
        if self._layout is not None:
            raise NotImplementedError("a rank publisher publishes its local tensors; "
                                      "publish_checkpoint is for canonical checkpoints")
        self.wait()
        with self._lock:
            return self._native.publish_checkpoint(version, os.fspath(path))

    def serve(self, version: int, seconds: float) -> None:
        """Serves re-send requests of late receivers for `version` for a while."""
        self.wait()
        with self._lock:
            self._native.serve(version, float(seconds))

    def wait(self) -> None:
        """Waits until every publish_async call has finished."""
        if self._executor is not None:
            self._executor.submit(lambda: None).result()

    def close(self) -> None:
        """Waits for pending publishes and stops the background thread; with a
        durable baseline file, waits until it holds the newest commit (raises
        if its write failed)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._device and self._layout is None:
            self._native.flush_durable()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _cuda_tensors(named: Any) -> List[Any]:
    if named is None:
        return []
    items = named.items() if isinstance(named, dict) else named
    try:
        return [t for _, t in items if is_torch(t) and t.device.type == "cuda"]
    except (TypeError, ValueError):
        return []


def _any_cuda(named: Any) -> bool:
    return bool(_cuda_tensors(named))


def _cuda_device_of(named: Any) -> int:
    """The one CUDA device index of the CUDA tensors in `named`."""
    devices = {t.device.index for t in _cuda_tensors(named)}
    if len(devices) != 1:
        raise InvalidArgumentError(
            "a baseline in device memory needs initial= tensors on one CUDA device "
            f"(found devices {sorted(d for d in devices if d is not None)})",
            "INVALID_ARGUMENT")
    d = devices.pop()
    return 0 if d is None else int(d)


def _current_cuda_device() -> int:
    import torch  # noqa: PLC0415 (only for a baseline in device memory)
    return int(torch.cuda.current_device())


def _sync_cuda(named: Any) -> None:
    """Waits for the work queued on the tensors' devices' current streams."""
    tensors = _cuda_tensors(named)
    if tensors:
        import torch  # noqa: PLC0415 (only with CUDA tensors)
        for d in {t.device for t in tensors}:
            torch.cuda.current_stream(d).synchronize()


def _record_cuda_event(named: Any) -> Any:
    tensors = _cuda_tensors(named)
    if not tensors:
        return None
    import torch  # noqa: PLC0415 (only with CUDA tensors)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensors[0].device))
    return event


def _pinned_copy(t: Any) -> Any:
    """A host copy of a device tensor, page-locked when the platform allows."""
    t = t.detach()
    try:
        host = t.new_empty(t.shape, device="cpu", pin_memory=True)
    except RuntimeError:  # no page-locked memory to be had
        return t.to("cpu").contiguous()
    host.copy_(t)
    return host


def _snapshot(t: Any) -> Any:
    if is_torch(t):
        t = t.detach()
        return t.to("cpu", copy=True) if t.device.type == "cpu" else t.to("cpu")
    if isinstance(t, np.ndarray):
        return np.array(t, copy=True, order="C")
    return t


class SyncReport:
    """What one :meth:`Receiver.sync` did."""

    def __init__(self, active_version: int, steps: List[Any], changed: List[str],
                 checkpoint_dir: Optional[str]) -> None:
        self.active_version = active_version
        #: every step that did something (refit._native.StepResult: outcome,
        #: version, chunks_applied, changed_tensors, seconds ...)
        self.steps = steps
        #: names of the tensors the committed versions changed, in order
        self.changed_tensors = changed
        #: the checkpoint the receiver patches (None for tensors=)
        self.checkpoint_dir = checkpoint_dir

    @property
    def committed_versions(self) -> List[int]:
        return [s.version for s in self.steps if s.outcome in _APPLIED]

    @property
    def aborted_versions(self) -> List[int]:
        return [s.version for s in self.steps if s.outcome == "aborted"]

    def __repr__(self) -> str:
        return (f"SyncReport(active_version={self.active_version}, committed="
                f"{self.committed_versions}, {len(self.changed_tensors)} tensors changed)")


_APPLIED = ("committed", "caught_up", "snapshot")


class Receiver:
    """Follows the versions of a store and keeps local weights at a committed version.

    Give exactly one of:

    checkpoint_dir: a checkpoint (directory or .safetensors file) the
      receiver patches in place, as an engine that loads from disk keeps it.
    tensors: named tensors in memory (NumPy arrays, torch tensors on the CPU
      or CUDA) that the receiver patches in place: host tensors directly,
      without a copy; CUDA tensors through a host copy, from which each
      commit copies only the changed tensors to the device. They must hold
      the receiver's active version when it opens: version 0 with a fresh
      `state_dir` (the default, a temporary one), else the version that
      `state_dir` recorded. Nothing makes them durable.

    member: this receiver's name in the publisher's members.
    state_dir: the journal and active-version pointer. Defaults to
      ``<checkpoint_dir>.refit-<member>`` next to the checkpoint, or a
      temporary directory (removed by :meth:`close`) with `tensors`.
    dtypes: with `tensors`, the dtypes of bit-pattern arrays (uint16 arrays
      holding BF16: ``dtypes="BF16"`` or per name); torch tensors and NumPy
      float arrays carry their own.
    key / key_file: the store's shared HMAC key; verify_key /
      verify_key_file: the publisher's Ed25519 public key (32 raw bytes, or a
      PEM file); then only objects it signed are accepted.
    max_fold_versions: a receiver several committed versions behind applies
      up to this many in one pass over the weights and activates the last
      (catch-up by folding); 1 applies them one by one. ``sync(version)``
      never folds past `version`.
    on_commit: callables run with the SyncReport after a sync that committed
      something (e.g. refit.adapters.HttpReload to tell an engine to reload).

    Two-phase receivers (docs/protocol.md, "Two-phase receivers"): CUDA
    tensors are applied on their GPU in two phases: :meth:`prepare` fetches,
    checks and stages a version (in device memory up to `staging_bytes`,
    else in page-locked host memory up to `host_staging_bytes`) while the
    engine keeps serving, votes and waits for the commit; :meth:`activate`
    is the pause that applies it in place (restoring every tensor if
    anything fails). :meth:`sync` does both. ``two_phase=True`` does the same
    for host tensors; ``two_phase=False`` keeps the older path for CUDA
    tensors (a host copy, patched on the CPU and copied back).
    layout / rank: with CUDA tensors, `tensors` are rank `rank`'s local
      tensors of this layout (docs/layout.md: a path, JSON text or dict), e.g.
      an engine's fused qkv_proj / gate_up_proj parameters or its
      tensor-parallel shards; chunks are applied straight into them.
    """

    def __init__(self, store: str, *, member: str, checkpoint_dir: Optional[PathLike] = None,
                 tensors: Any = None, state_dir: Optional[PathLike] = None,
                 dtypes: Any = None, key: Optional[bytes] = None,
                 key_file: Optional[PathLike] = None, verify_key: Optional[bytes] = None,
                 verify_key_file: Optional[PathLike] = None, threads: int = 0,
                 poll_interval: float = 0.02, decision_timeout: float = 60.0,
                 resend_timeout: float = 30.0, max_fold_versions: int = 16,
                 on_commit: Union[None, CommitHook, Iterable[CommitHook]] = None,
                 two_phase: Optional[bool] = None, layout: Any = None, rank: int = 0,
                 staging_bytes: int = 512 << 20, host_staging_bytes: int = 8 << 30) -> None:
        if (checkpoint_dir is None) == (tensors is None):
            raise InvalidArgumentError("give exactly one of checkpoint_dir= and tensors=",
                                       "INVALID_ARGUMENT")
        self._targets: Optional[Dict[str, Any]] = None
        self._staged: Dict[str, Tuple[Any, Any]] = {}  # name -> (device tensor, host copy)
        self._tmp_state: Optional[tempfile.TemporaryDirectory] = None
        self._mode = ""  # "", "host" or "cuda" (two-phase)
        self._pending: List[Any] = []  # steps of prepare() not reported yet
        triples = None
        if tensors is not None:
            self._targets = dict(named_items(tensors))
            if state_dir is None:
                self._tmp_state = tempfile.TemporaryDirectory(prefix=f"refit-{member}-")
                state_dir = self._tmp_state.name
            on_gpu = _any_cuda(self._targets)
            if layout is not None and not on_gpu:
                raise InvalidArgumentError("layout= places canonical tensors into CUDA tensors; "
                                           "give the engine's CUDA tensors", "INVALID_ARGUMENT")
            if on_gpu and two_phase is not False and _native.has_cuda:
                self._mode = "cuda"
                self._prepared = prepare(list(self._targets.items()), writable=True,
                                         dtypes=dtypes, cuda_in_place=True)
                triples = self._prepared.triples
            else:
                if two_phase:
                    self._mode = "cuda" if on_gpu else "host"
                    if on_gpu:
                        raise Error("this build of refit has no CUDA module: two-phase "
                                    "receivers of CUDA tensors need one", "UNIMPLEMENTED")
                host_items = []
                for name, t in self._targets.items():
                    if is_torch(t) and t.device.type != "cpu":
                        # Page-locked, so the copies back run at the bus's
                        # speed and overlap one another.
                        host = _pinned_copy(t)
                        self._staged[name] = (t, host)
                        t = host
                    host_items.append((name, t))
                self._prepared = prepare(host_items, writable=True, dtypes=dtypes)
                triples = self._prepared.triples
            self._checkpoint = ""
            self._state_dir = os.fspath(state_dir)
        else:
            self._checkpoint = os.fspath(checkpoint_dir)  # type: ignore[arg-type]
            self._state_dir = (os.fspath(state_dir) if state_dir is not None else
                               self._checkpoint.rstrip("/") + f".refit-{member}")
        os.makedirs(self._state_dir, exist_ok=True)
        if on_commit is None:
            self._hooks: List[CommitHook] = []
        elif callable(on_commit):
            self._hooks = [on_commit]
        else:
            self._hooks = list(on_commit)
        self.member = member
        self._native = _native.Receiver(
            store, member, self._checkpoint, triples, self._state_dir, key,
            os.fspath(key_file) if key_file else "", verify_key,
            os.fspath(verify_key_file) if verify_key_file else "", threads, float(poll_interval),
            float(decision_timeout), float(resend_timeout), int(max_fold_versions),
            self._mode, _layout_text(layout) if layout is not None else "", int(rank),
            int(staging_bytes), int(host_staging_bytes))
        self._last_changed: List[str] = []
        self._poll = float(poll_interval)
        self.last_copy_seconds = 0.0

    @property
    def active_version(self) -> int:
        return self._open().active_version

    def _open(self) -> Any:
        if self._native is None:
            raise Error(f"receiver {self.member!r} is closed", "FAILED_PRECONDITION")
        return self._native

    @property
    def checkpoint_dir(self) -> Optional[str]:
        """The checkpoint this receiver patches (None with tensors=)."""
        return self._checkpoint or None

    @property
    def state_dir(self) -> str:
        return self._state_dir

    def close(self) -> None:
        """Releases the tensors and removes a temporary state directory."""
        self._native = None
        self._prepared = None
        if self._tmp_state is not None:
            self._tmp_state.cleanup()
            self._tmp_state = None

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def sync(self, to_version: Optional[int] = None, *, timeout: float = 60.0) -> SyncReport:
        """Applies pending versions, votes, and waits for each decision.

        to_version None: handles every version available now and returns
        (possibly having done nothing). An integer: waits until the active
        version reaches it, polling the store, for up to `timeout` seconds
        (refit.DeadlineExceededError after that). The GIL is released while
        native work runs; Ctrl-C interrupts between steps.
        """
        if to_version is not None and to_version <= 0:
            raise InvalidArgumentError("to_version must be positive (or None)",
                                       "INVALID_ARGUMENT")
        native = self._open()
        if self._mode == "cuda":
            _sync_cuda(self._targets)  # work queued on the weights runs first
        steps = self._pending + native.sync(to_version or 0, float(timeout))
        self._pending = []
        return self._report(steps)

    @property
    def two_phase(self) -> bool:
        """Whether this receiver prepares versions apart from activating them."""
        return bool(self._mode)

    @property
    def prepared(self) -> bool:
        """Whether a committed version is staged, waiting for :meth:`activate`."""
        return bool(self._mode) and self._open().prepared

    def prepare(self, to_version: Optional[int] = None, *, timeout: float = 0.0) -> bool:
        """Stages the next committed version without writing any tensor.

        Two-phase receivers only. Fetches and checks the version's chunks,
        checks the tensors against its base, stages the payload, votes
        ready and waits for the decision, while the engine keeps serving.
        Returns True once a version is staged and committed (call
        :meth:`activate` in the engine's next pause), False when none is
        available within `timeout` seconds (0: look once). Aborted versions
        are passed over (the next report lists them). Several committed
        versions are folded into one preparation, never past `to_version`.
        """
        native = self._open()
        if not self._mode:
            raise Error("prepare() is for two-phase receivers (CUDA tensors, or two_phase=True)",
                        "FAILED_PRECONDITION")
        deadline = time.monotonic() + float(timeout)
        while True:
            step = native.prepare(to_version or 0)
            if step.outcome == "prepared":
                return True
            if step.outcome != "idle":
                self._pending.append(step)
                continue
            if time.monotonic() >= deadline:
                return False
            time.sleep(self._poll)

    def activate(self) -> SyncReport:
        """The pause: applies the prepared version in place and activates it.

        On failure every tensor was restored to the version it held and the
        receiver stays there (the error says why; the next prepare() stages
        the committed version again).
        """
        native = self._open()
        if self._mode == "cuda":
            _sync_cuda(self._targets)
        steps = self._pending + [native.activate()]
        self._pending = []
        return self._report(steps)

    def _report(self, steps: List[Any]) -> SyncReport:
        changed: List[str] = []
        seen = set()
        for s in steps:
            if s.outcome not in _APPLIED:
                continue
            names = s.changed_tensors
            if s.outcome == "snapshot" and self._checkpoint:
                names = list(Checkpoint(self._checkpoint).dtypes)
            for n in names:
                if n not in seen:
                    seen.add(n)
                    changed.append(n)
        self._last_changed = changed
        t0 = time.perf_counter()
        devices = set()
        for name in changed:
            if name in self._staged:
                device, host = self._staged[name]
                device.copy_(host, non_blocking=host.is_pinned())
                devices.add(device.device)
        if devices:
            import torch  # noqa: PLC0415 (only with CUDA tensors)
            for d in devices:
                torch.cuda.current_stream(d).synchronize()
        #: seconds the last sync spent copying changed tensors to the device
        self.last_copy_seconds = time.perf_counter() - t0
        report = SyncReport(self.active_version, steps, changed, self.checkpoint_dir)
        if report.committed_versions:
            for hook in self._hooks:
                hook(report)
        return report

    def changed_tensors(self, framework: str = "numpy") -> Iterator[Tuple[str, Any]]:
        """(name, tensor) for every tensor the last sync's versions changed.

        With checkpoint_dir the tensors view the patched checkpoint's memory
        (read-only NumPy arrays, or CPU torch tensors of the real dtype with
        framework="torch"), ready for an engine's ``load_weights(iterable)``;
        they see later versions too, as the file is patched in place.
        With tensors= they are the caller's own (already updated) tensors.
        """
        if self._targets is not None:
            for n in self._last_changed:
                yield n, self._targets[n]
            return
        ckpt = Checkpoint(self._checkpoint)
        for n in self._last_changed:
            yield n, ckpt.tensor(n, framework)

    def tensors(self, framework: str = "numpy") -> Iterator[Tuple[str, Any]]:
        """(name, tensor) for every tensor the receiver keeps current."""
        if self._targets is not None:
            yield from self._targets.items()
            return
        ckpt = Checkpoint(self._checkpoint)
        for n in ckpt:
            yield n, ckpt.tensor(n, framework)
