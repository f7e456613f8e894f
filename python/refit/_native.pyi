# Type stubs of the extension module refit._native (python/src/module.cc).
# tests/test_stubs.py checks that they name exactly what the module defines.
from typing import Any, Dict, List, Sequence, Tuple

# (name, safetensors dtype, buffer-protocol object or DLPack capsule)
Triple = Tuple[str, str, Any]

class DiffReport:
    tensors: int
    changed_tensors: int
    total_elements: int
    changed_elements: int
    full_bytes: int
    chunks: int
    payload_bytes: int
    chunk_bytes: int
    file_bytes: int
    chunks_by_kind: Dict[str, int]
    seconds: float
    @property
    def changed_percent(self) -> float: ...

class ApplyReport:
    chunks: int
    chunks_applied: int
    chunks_skipped: int
    chunks_restored: int
    changed_elements: int
    checkpoint_bytes: int
    pages_written: int
    page_size: int
    seconds: float
    headers_written: int
    headers_unchanged: int
    headers_not_carried: List[str]

class VerifyReport:
    matches_target: bool
    matches_base: bool
    tensors: int
    mismatched: List[str]
    headers_checked: bool
    header_differs: List[str]

class TensorInspect:
    name: str
    dtype: str
    elements: int
    changed: int
    chunks: int
    payload_bytes: int
    chunk_bytes: int
    kinds: Dict[str, int]
    bound_bytes: float

class InspectReport:
    format_version: int
    version: int
    base_version: int
    file_bytes: int
    total_elements: int
    changed_elements: int
    full_bytes: int
    chunks: int
    payload_bytes: int
    chunk_bytes: int
    kinds: Dict[str, int]
    bound_bytes: float
    bound_valid: bool
    tensors: List[TensorInspect]
    @property
    def changed_percent(self) -> float: ...

class PublishReport:
    version: int
    base_version: int
    committed: bool
    dropped: List[str]
    reason: str
    diff: DiffReport
    bytes_uploaded: int
    resends_served: int
    encode_upload_seconds: float
    commit_seconds: float
    seconds: float
    snapshot: bool
    versions_deleted: int
    snapshots_deleted: int
    retention_error: str
    @property
    def changed_percent(self) -> float: ...
    @property
    def full_bytes(self) -> int: ...

class StepResult:
    # "idle", "committed", "aborted", "caught_up", "snapshot" or "prepared"
    @property
    def outcome(self) -> str: ...
    version: int
    chunks_applied: int
    chunks_skipped: int
    chunks_resent: int
    changed_elements: int
    bytes_fetched: int
    chunks_before_manifest: int
    chunks_read_early: int
    seconds: float
    tail_seconds: float
    versions_folded: int
    recovered: str
    changed_tensors: List[str]
    pause_seconds: float
    pause_kernel_ms: float
    pause_verify_ms: float
    staged_host_bytes: int
    staged_device_bytes: int
    seal_seconds: float
    after_hash_seconds: float
    base_from_kept_digests: bool
    # Seconds of a step that applied one version, by part (base_check, fetch,
    # chunk_wait, apply_wait, apply_cpu, check, flush, vote, decision_wait,
    # activate); zeros otherwise.
    @property
    def stages(self) -> Dict[str, float]: ...

class Checkpoint:
    def __init__(self, path: str, writable: bool) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def sharded(self) -> bool: ...
    @property
    def writable(self) -> bool: ...
    def tensors(self) -> List[Tuple[str, str, List[int]]]: ...
    def array(self, name: str) -> Any: ...
    def sync(self) -> None: ...

class Publisher:
    def __init__(self, store: str, baseline: str, members: Sequence[str], key: bytes | None,
                 key_file: str, sign_key: bytes | None, sign_key_file: str, vote_timeout: float, policy: str, threads: int,
                 chunk_bytes: int, upload_threads: int, snapshot_every: int,
                 keep_versions: int, device_initial: Sequence[Triple] | None = None,
                 pinned_host: bool = False, durable_path: str = "",
                 conditional: bool = False, pack_bytes: int = 0) -> None: ...
    @property
    def committed_version(self) -> int: ...
    @property
    def device(self) -> int: ...
    def durable(self) -> Dict[str, Any] | None: ...
    def flush_durable(self) -> None: ...
    def publish(self, version: int, tensors: Sequence[Triple]) -> PublishReport: ...
    def publish_checkpoint(self, version: int, path: str) -> PublishReport: ...
    def serve(self, version: int, seconds: float) -> None: ...

class RankPublisher:
    def __init__(self, store: str, parts: str, layout: str, rank: int, committed: int,
                 baseline: str, initial: Sequence[Triple] | None, key: bytes | None,
                 key_file: str, threads: int, chunk_bytes: int, upload_threads: int,
                 device: int = -1, initial_amax: Dict[str, float] | None = None,
                 pack_bytes: int = 0) -> None: ...
    @property
    def committed_version(self) -> int: ...
    @property
    def owned_bytes(self) -> int: ...
    def publish(self, version: int, tensors: Sequence[Triple],
                amax: Dict[str, float] | None = None) -> Dict[str, Any]: ...
    def await_decision(self, timeout: float) -> bool: ...

class Coordinator:
    def __init__(self, store: str, parts: str, baseline: str, staging: str,
                 members: Sequence[str], ranks: Sequence[int], key: bytes | None,
                 key_file: str, vote_timeout: float, parts_timeout: float,
                 threads: int) -> None: ...
    @property
    def committed_version(self) -> int: ...
    def publish(self, version: int) -> Tuple[PublishReport, Dict[str, Any]]: ...

class Store:
    def __init__(self, url: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def put(self, key: str, data: bytes) -> None: ...
    def list(self, prefix: str = "") -> List[Tuple[str, int]]: ...
    def delete(self, key: str) -> None: ...

class DirectCoordinator:
    def __init__(self, store: str, members: Sequence[str], ranks: Sequence[int],
                 key: bytes | None, key_file: str, vote_timeout: float,
                 parts_timeout: float, table: str) -> None: ...
    @property
    def committed_version(self) -> int: ...
    def publish(self, version: int) -> Tuple[Dict[str, Any], Dict[str, Any]]: ...
    def parts_stored(self, version: int) -> List[int]: ...

class Receiver:
    def __init__(self, store: str, member: str, checkpoint: str,
                 tensors: Sequence[Triple] | None, state_dir: str,
                 key: bytes | None, key_file: str, verify_key: bytes | None,
                 verify_key_file: str, threads: int, poll_interval: float,
                 decision_timeout: float, resend_timeout: float,
                 max_fold_versions: int, two_phase: str = "", layout_json: str = "",
                 rank: int = 0, device_staging: int = ..., host_staging: int = ...) -> None: ...
    @property
    def active_version(self) -> int: ...
    @property
    def prepared(self) -> bool: ...
    def prepare(self, target: int) -> StepResult: ...
    def activate(self) -> StepResult: ...
    def step(self) -> StepResult: ...
    def sync(self, target: int, timeout: float) -> List[StepResult]: ...

def diff_paths(base: str, target: str, out: str, version: int, base_version: int,
               chunk_bytes: int, threads: int, allow_xor: bool) -> DiffReport: ...
def diff_tensors(base: Sequence[Triple], target: Sequence[Triple], out: str, version: int,
                 base_version: int, chunk_bytes: int, threads: int,
                 allow_xor: bool) -> DiffReport: ...
def apply_path(delta: str, checkpoint: str, threads: int, sync: bool) -> ApplyReport: ...
def apply_tensors(delta: str, tensors: Sequence[Triple], threads: int) -> ApplyReport: ...
def verify(checkpoint: str, delta: str, threads: int) -> VerifyReport: ...
def inspect(delta: str) -> InspectReport: ...
def delta_tensors(delta: str) -> Tuple[int, int, List[Tuple[str, str, List[int], bool]]]: ...
def save(path: str, tensors: Sequence[Triple], metadata: Dict[str, str]) -> None: ...
def copy_checkpoint(src: str, dst: str) -> None: ...
def generate_ed25519() -> Tuple[bytes, bytes]: ...
def data_address(dtype: str, tensor: Any) -> int: ...

# True when the extension was built with the CUDA module; only then do the
# two names below exist.
has_cuda: bool

class GpuApplyReport:
    chunks: int
    chunks_applied: int
    chunks_skipped: int
    records: int
    batches: int
    payload_bytes: int
    device_bytes: int
    seconds: float
    kernel_ms: float

def apply_cuda(delta: str, tensors: Sequence[Triple], staging_bytes: int) -> GpuApplyReport: ...
def range_hashes_cuda(tensors: Sequence[Triple]) -> List[Tuple[int, int]]: ...
