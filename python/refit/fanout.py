"""Fan-out inside a cluster: one engine fetches, its peers receive the bytes
over the engines' own process group (docs/python.md, "Fan-out through a
process group").

Engines of one node (or one cluster) need the same objects. With a
:class:`FanoutReceiver` on every member of a ``torch.distributed`` process
group, only the group's first rank (the leader) reads the store; every new
object it finds there (announcements, chunks, manifests, decisions, the
ranks' parts) is broadcast to the other members, which keep them in a local
mirror store that their own :class:`refit.Receiver` reads, and each applies on
its own GPU (or host memory) as usual. What a member writes (its vote, its
re-send requests) goes back to the leader, which stores it in the store:
votes, the joint commit and every check of docs/protocol.md stay as they
are, since objects keep their authentication and the mirror is just another
store. The leader's reads of the store are the only ones; the payload
crosses the store's link once per group.

The pump (one broadcast from the leader and one gather per round, every
``poll_interval``) runs on a thread of its own while ``sync()`` runs, and
only then: every member must call ``sync()`` (and ``close()``) at the same
point, as for any collective, and the group must not run other collectives
meanwhile (give a group of its own, ``torch.distributed.new_group(...)``,
where the engine's is busy). With the NCCL backend the bytes travel as CUDA
tensors of the current device; with gloo (CPU) as host tensors.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from . import _native
from .errors import InvalidArgumentError
from .sync import Receiver, SyncReport

__all__ = ["FanoutReceiver"]

_HEAD_KEY = "head"  # the store's head object (docs/protocol.md)


def _dist() -> Any:
    import torch.distributed as dist  # noqa: PLC0415 (only for fan-out)
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            "refit.FanoutReceiver needs an initialized torch.distributed process group "
            "(torch.distributed.init_process_group)", "INVALID_ARGUMENT")
    return dist


class _Pump:
    """Moves objects between the store (leader) and the members' mirrors."""

    def __init__(self, dist: Any, group: Any, leader: int, store_url: str,
                 mirror_url: Optional[str]) -> None:
        self._dist = dist
        self._group = group
        self._leader = leader
        self._is_leader = dist.get_rank() == leader
        self._store = _native.Store(store_url) if self._is_leader else None
        self._mirror = _native.Store(mirror_url) if mirror_url else None
        self._sent: Dict[str, int] = {}      # leader: key -> size broadcast
        self._head = b""                     # leader: the head object sent last
        self._mirrored: Set[str] = set()     # member: keys the leader sent
        self._forwarded: Dict[str, bytes] = {}  # member: own key -> digest sent back
        self.rounds = 0
        self.bytes_broadcast = 0
        self.objects_forwarded = 0

    def _device(self) -> Any:
        import torch  # noqa: PLC0415
        backend = self._dist.get_backend(self._group)
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None

    def _broadcast(self, payload: Optional[bytes]) -> bytes:
        # Sizes first, then the bytes as one uint8 tensor (NCCL moves
        # tensors of the current CUDA device, gloo host tensors).
        import torch  # noqa: PLC0415
        device = self._device()
        size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64,
                            device=device)
        self._dist.broadcast(size, src=self._leader, group=self._group)
        n = int(size.item())
        if n == 0:
            return b""
        if self._is_leader:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if device is not None:
                buf = buf.to(device)
        else:
            buf = torch.empty(n, dtype=torch.uint8, device=device)
        self._dist.broadcast(buf, src=self._leader, group=self._group)
        self.bytes_broadcast += n
        return b"" if self._is_leader else bytes(buf.cpu().numpy().tobytes())

    def round(self, done: bool) -> bool:
        """One round; True when every member said it is done."""
        self.rounds += 1
        # 1. Leader -> members: the store's objects not sent yet.
        blob = None
        if self._is_leader:
            new: List[Tuple[str, bytes]] = []
            for key, size in self._store.list(""):
                # Objects are written once, except the head, which every
                # commit replaces (with one of the same size).
                if self._sent.get(key) == size and key != _HEAD_KEY:
                    continue
                try:
                    data = self._store.get(key)
                except FileNotFoundError:
                    continue  # deleted meanwhile (retention)
                self._sent[key] = size
                if key == _HEAD_KEY:
                    if data == self._head:
                        continue
                    self._head = data
                new.append((key, data))
            blob = pickle.dumps(new) if new else b""
        got = self._broadcast(blob)
        if got and self._mirror is not None:
            for key, data in pickle.loads(got):
                self._mirror.put(key, data)
                self._mirrored.add(key)
        # 2. Members -> leader: what the members wrote (votes, requests).
        own: List[Tuple[str, bytes]] = []
        if self._mirror is not None:
            for key, _ in self._mirror.list(""):
                if key in self._mirrored:
                    continue
                # A member may write a key again (a re-send request): compare.
                data = self._mirror.get(key)
                digest = hashlib.sha256(data).digest()
                if self._forwarded.get(key) == digest:
                    continue
                own.append((key, data))
                self._forwarded[key] = digest
        gathered: List[Any] = [None] * self._dist.get_world_size(self._group)
        self._dist.all_gather_object(gathered, (own, done), group=self._group)
        if self._is_leader:
            for member_objects, _ in gathered:
                for key, data in member_objects:
                    self._store.put(key, data)
                    self._sent[key] = len(data)  # the members have it already
                    self.objects_forwarded += 1
        return all(d for _, d in gathered)


class FanoutReceiver:
    """A :class:`refit.Receiver` of one member of a process group that shares
    one read of the store (module docstring).

    store: the store's URL, read by the group's leader only.
    member: this member's name (the publisher's ``members`` lists every one).
    group: a ``torch.distributed`` process group (default: the world);
      ``leader``: the rank in it that reads the store (default: its first).
    mirror_dir: where a member other than the leader keeps the objects it
      receives (default: a temporary directory, removed by close()).
    poll_interval: seconds between rounds of the pump.
    Every other argument is :class:`refit.Receiver`'s (tensors=, dtypes=,
    checkpoint_dir=, key=, ...).

    The constructor, ``sync()`` and ``close()`` are collective: every member
    calls them, in the same order.
    """

    def __init__(self, store: str, *, member: str, group: Any = None,
                 leader: Optional[int] = None, mirror_dir: Optional[str] = None,
                 poll_interval: float = 0.02, **receiver_options: Any) -> None:
        dist = _dist()
        self._dist = dist
        self._group = group
        if group is None:
            ranks: Optional[List[int]] = list(range(dist.get_world_size()))
        elif hasattr(dist, "get_process_group_ranks"):
            ranks = list(dist.get_process_group_ranks(group))
        else:
            ranks = None  # a PyTorch that cannot list a group's ranks
        if leader is None:
            if ranks is None:
                raise InvalidArgumentError(
                    "give leader= (a global rank of the group): this PyTorch cannot list "
                    "the group's ranks", "INVALID_ARGUMENT")
            leader = ranks[0]
        self._leader = int(leader)
        if ranks is not None and self._leader not in ranks:
            raise InvalidArgumentError(f"leader {leader} is not a rank of the group",
                                       "INVALID_ARGUMENT")
        self.is_leader = dist.get_rank() == self._leader
        self._tmp: Optional[str] = None
        mirror_url = None
        if not self.is_leader:
            if mirror_dir is None:
                self._tmp = tempfile.mkdtemp(prefix="refit-fanout-")
                mirror_dir = self._tmp
            mirror_url = os.fspath(mirror_dir)
        self._pump = _Pump(dist, group, self._leader, store, mirror_url)
        self._poll = float(poll_interval)
        # The store's current objects reach every mirror before the
        # receivers open there.
        self._pump.round(True)
        self.receiver = Receiver(store if self.is_leader else mirror_url, member=member,
                                 poll_interval=poll_interval, **receiver_options)

    @property
    def active_version(self) -> int:
        return self.receiver.active_version

    @property
    def stats(self) -> Dict[str, int]:
        """Rounds run, bytes broadcast (received, on members) and objects
        forwarded to the store (on the leader)."""
        p = self._pump
        return {"rounds": p.rounds, "bytes_broadcast": p.bytes_broadcast,
                "objects_forwarded": p.objects_forwarded}

    def sync(self, to_version: Optional[int] = None, *, timeout: float = 60.0) -> SyncReport:
        """:meth:`refit.Receiver.sync` on every member, with the pump running."""
        done = threading.Event()
        errors: List[BaseException] = []

        def pump() -> None:
            try:
                while not self._pump.round(done.is_set()):
                    time.sleep(self._poll)
            except BaseException as e:  # reported by sync()
                errors.append(e)

        thread = threading.Thread(target=pump, name="refit-fanout", daemon=True)
        thread.start()
        try:
            report = self.receiver.sync(to_version, timeout=timeout)
        finally:
            done.set()
            thread.join()
        if errors:
            raise errors[0]
        return report

    def close(self) -> None:
        """Closes the receiver and removes a temporary mirror."""
        self.receiver.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> "FanoutReceiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
