"""Publisher (trainer side) and Receiver (inference side) of the version protocol.

See docs/protocol.md for what happens underneath and docs/python.md for
examples.
"""

from __future__ import annotations

import concurrent.futures
import os
import tempfile
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._tensors import is_torch, named_items, prepare
from .errors import Error, InvalidArgumentError, NotFoundError
from .files import Checkpoint, PathLike, save

CommitHook = Callable[["SyncReport"], Any]


class Publisher:
    """Publishes versions of a model's weights to a store and coordinates their commit.

    store: a directory path or an ``s3://bucket/prefix`` URL.
    baseline: a checkpoint path the publisher keeps as its own copy of the
      committed version (patched in place on every commit). When it does not
      exist, ``initial`` (named tensors: the weights every receiver starts
      from) is written there first.
    members: the receivers' names; a version commits when all of them voted.
    layout, rank: the trainer's local layout of the canonical tensors and this
      rank in it. Only ``layout=None, rank=0`` (tensors already in canonical
      Hugging Face names and shapes) is supported so far.
    key / key_file: HMAC key (bytes, at least 16) authenticating every object.
    sign_key / sign_key_file: an Ed25519 private key (32 raw bytes, or a PEM
      file) signing every object the publisher writes; receivers check them
      with the public half (Receiver(verify_key=...)).
    vote_timeout: seconds to wait for the votes; policy "abort" (default) or
      "drop" (commit with those that voted).

    Not thread-safe, except that :meth:`publish_async` runs publishes on one
    background thread, in order.
    """

    def __init__(self, store: str, *, baseline: PathLike, members: Sequence[str],
                 layout: Any = None, rank: int = 0, initial: Any = None,
                 dtypes: Any = None, key: Optional[bytes] = None,
                 key_file: Optional[PathLike] = None, sign_key: Optional[bytes] = None,
                 sign_key_file: Optional[PathLike] = None, vote_timeout: float = 60.0,
                 policy: str = "abort", threads: int = 0, chunk_bytes: int = 0,
                 upload_threads: int = 4, snapshot_every: int = 0,
                 keep_versions: int = 0) -> None:
        if layout is not None:
            raise NotImplementedError(
                "refit.Publisher(layout=...) is not supported yet: publishing from several "
                "ranks needs multi-publisher versions, which the protocol does not have yet "
                "(docs/trainer.md, 'Not yet'); pass the tensors in canonical Hugging Face "
                "names and shapes with layout=None")
        if rank != 0:
            raise NotImplementedError(
                "refit.Publisher(rank=...) needs a layout (several ranks each owning part of "
                "the canonical tensors); with layout=None, publish from rank 0 only")
        if isinstance(members, str):
            raise InvalidArgumentError("members must be a list of names, not one string",
                                       "INVALID_ARGUMENT")
        self._layout = layout
        self._rank = rank
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
            keep_versions)
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    @property
    def committed_version(self) -> int:
        """The newest committed version (the store's head)."""
        return self._native.committed_version

    @property
    def baseline(self) -> str:
        return self._baseline

    def _canonical(self, named_tensors: Any) -> List[Tuple[str, Any]]:
        # The seam for trainer layouts: with a layout, local shards and fused
        # tensors map to canonical names and ranges here.
        return named_items(named_tensors)

    def publish(self, version: int, named_tensors: Any) -> "_native.PublishReport":
        """Publishes `named_tensors` as `version` and waits for the commit decision.

        The tensors are read in place (NumPy arrays, CPU torch tensors; CUDA
        tensors are copied to host first) and must not change until this
        returns. Returns a report: ``committed``, ``changed_percent``,
        ``bytes_uploaded``, ``seconds`` ...; an aborted version is reported
        (``committed`` False, ``reason``), not raised.
        """
        self.wait()
        return self._publish_now(version, self._canonical(named_tensors))

    def _publish_now(self, version: int, items: List[Tuple[str, Any]]) -> Any:
        with self._lock:
            p = prepare(items, writable=False, expected=self._dtypes)
            return self._native.publish(version, p.triples)

    def publish_async(self, version: int, named_tensors: Any, *,
                      copy: bool = True) -> "concurrent.futures.Future[Any]":
        """Starts publishing and returns at once, with a Future of the report.

        With ``copy=True`` (default) the tensors are first copied to host
        memory, so the training loop may update the model right away (the
        cost: one host copy of the model per version in flight). With
        ``copy=False`` they are read in place and must not change until the
        future is done. Versions publish one after another, in call order.
        """
        items = self._canonical(named_tensors)
        if copy:
            items = [(n, _snapshot(t)) for n, t in items]
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="refit-publish")
        return self._executor.submit(self._publish_now, version, items)

    def publish_checkpoint(self, version: int, path: PathLike) -> "_native.PublishReport":
        """Publishes the tensors of a checkpoint on disk as `version`."""
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
        """Waits for pending publishes and stops the background thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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
    on_commit: callables run with the SyncReport after a sync that committed
      something (e.g. refit.adapters.HttpReload to tell an engine to reload).
    """

    def __init__(self, store: str, *, member: str, checkpoint_dir: Optional[PathLike] = None,
                 tensors: Any = None, state_dir: Optional[PathLike] = None,
                 dtypes: Any = None, key: Optional[bytes] = None,
                 key_file: Optional[PathLike] = None, verify_key: Optional[bytes] = None,
                 verify_key_file: Optional[PathLike] = None, threads: int = 0,
                 poll_interval: float = 0.02, decision_timeout: float = 60.0,
                 resend_timeout: float = 30.0,
                 on_commit: Union[None, CommitHook, Iterable[CommitHook]] = None) -> None:
        if (checkpoint_dir is None) == (tensors is None):
            raise InvalidArgumentError("give exactly one of checkpoint_dir= and tensors=",
                                       "INVALID_ARGUMENT")
        self._targets: Optional[Dict[str, Any]] = None
        self._staged: Dict[str, Tuple[Any, Any]] = {}  # name -> (device tensor, host copy)
        self._tmp_state: Optional[tempfile.TemporaryDirectory] = None
        triples = None
        if tensors is not None:
            self._targets = dict(named_items(tensors))
            if state_dir is None:
                self._tmp_state = tempfile.TemporaryDirectory(prefix=f"refit-{member}-")
                state_dir = self._tmp_state.name
            host_items = []
            for name, t in self._targets.items():
                if is_torch(t) and t.device.type != "cpu":
                    host = t.detach().to("cpu").contiguous()
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
            float(decision_timeout), float(resend_timeout))
        self._last_changed: List[str] = []

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
        steps = self._open().sync(to_version or 0, float(timeout))
        changed: List[str] = []
        seen = set()
        for s in steps:
            if s.outcome not in _APPLIED:
                continue
            names = s.changed_tensors
            if s.outcome == "snapshot":
                names = list(Checkpoint(self._checkpoint).dtypes)
            for n in names:
                if n not in seen:
                    seen.add(n)
                    changed.append(n)
        self._last_changed = changed
        for name in changed:
            if name in self._staged:
                device, host = self._staged[name]
                device.copy_(host)
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
