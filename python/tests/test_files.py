"""refit.diff / apply / verify / inspect / load / save through the Python API."""

import os
import shutil

import numpy as np
import pytest

import refit
from refit import _native
from conftest import SYNTH_DTYPES, perturb, synthetic_model


def test_diff_apply_paths_round_trip(qwen, tmp_path):
    ckpt = tmp_path / "ckpt.safetensors"
    shutil.copy(qwen / "step0.safetensors", ckpt)
    os.chmod(ckpt, 0o644)
    for step in (1, 2, 3):
        delta = tmp_path / f"d{step}"
        rep = refit.diff(qwen / f"step{step - 1}.safetensors", qwen / f"step{step}.safetensors",
                         delta, version=step, base_version=step - 1)
        assert rep.total_elements == 3_198_144
        assert 1.0 < rep.changed_percent < 3.0
        assert rep.file_bytes == os.path.getsize(delta) < rep.full_bytes / 20
        info = refit.inspect(delta)
        assert (info.version, info.base_version) == (step, step - 1)
        assert info.changed_elements == rep.changed_elements
        assert sum(t.changed for t in info.tensors) == rep.changed_elements
        assert refit.verify(ckpt, delta).matches_base
        applied = refit.apply(delta, ckpt)
        assert applied.changed_elements == rep.changed_elements
        assert applied.chunks_applied == applied.chunks
        assert refit.verify(ckpt, delta).matches_target
    target = refit.load(qwen / "step3.safetensors")
    got = refit.load(ckpt)
    assert list(got) == list(target)
    for name in target:
        assert np.array_equal(got[name], target[name]), name


def test_diff_of_tensors_equals_diff_of_files(qwen, tmp_path):
    base = refit.load(qwen / "step1.safetensors")
    target = refit.load(qwen / "step2.safetensors")
    refit.diff(qwen / "step1.safetensors", qwen / "step2.safetensors", tmp_path / "files")
    # Plain dicts of uint16 bit patterns adopt the Checkpoint's BF16 dtypes.
    plain_target = {n: np.array(a) for n, a in target.items()}
    refit.diff(base, plain_target, tmp_path / "tensors")
    files = (tmp_path / "files").read_bytes()
    tensors = (tmp_path / "tensors").read_bytes()
    # The same header and chunks, byte for byte; the trailers differ only in
    # that a diff of files carries the target files' safetensors headers
    # (docs/format.md section 6), which tensors in memory do not have.
    def trailer_offset(b):
        return int.from_bytes(b[-24:-16], "little")
    assert trailer_offset(files) == trailer_offset(tensors)
    assert files[: trailer_offset(files)] == tensors[: trailer_offset(tensors)]
    a, b = refit.inspect(tmp_path / "files"), refit.inspect(tmp_path / "tensors")
    assert [(t.name, t.changed, t.chunks, t.chunk_bytes) for t in a.tensors] == [
        (t.name, t.changed, t.chunks, t.chunk_bytes) for t in b.tensors
    ]


def test_apply_writes_into_the_callers_arrays(qwen, tmp_path):
    delta = tmp_path / "d"
    refit.diff(qwen / "step0.safetensors", qwen / "step1.safetensors", delta)
    base = refit.load(qwen / "step0.safetensors")
    target = refit.load(qwen / "step1.safetensors")
    arrays = {n: np.array(a) for n, a in base.items()}
    views = {n: a[...] for n, a in arrays.items()}  # other objects on the same memory
    addresses = {n: a.ctypes.data for n, a in arrays.items()}
    for n, a in arrays.items():
        # The native layer resolves exactly the array's own memory ...
        assert _native.data_address("BF16", a) == addresses[n]
    rep = refit.apply(delta, arrays)
    assert rep.changed_elements == 90_309
    changed = 0
    for n, a in arrays.items():
        # ... and wrote there: the arrays did not move, and every view sees the target.
        assert a.ctypes.data == addresses[n]
        assert np.array_equal(views[n], target[n]), n
        changed += int(np.count_nonzero(views[n] != base[n]))
    assert changed == 90_309
    # Applying again is a no-op (each chunk at most once).
    again = refit.apply(delta, arrays)
    assert again.chunks_applied == 0 and again.chunks_skipped == again.chunks


def test_dlpack_capsules_are_borrowed_in_place(tmp_path):
    model = synthetic_model()
    target = perturb(model, 1)
    delta = tmp_path / "d"
    refit.diff({n: refit.as_dtype(a, SYNTH_DTYPES[n]) for n, a in model.items()}, target, delta)

    class OnlyDLPack:
        """Exposes an array through DLPack alone, as a PyTorch tensor does."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    arrays = {n: a.copy() for n, a in model.items()}
    for n, a in arrays.items():
        assert _native.data_address(SYNTH_DTYPES[n], a.__dlpack__()) == a.ctypes.data
    wrapped = {n: refit.as_dtype(OnlyDLPack(a), SYNTH_DTYPES[n]) for n, a in arrays.items()}
    refit.apply(delta, wrapped)
    for n in model:
        assert np.array_equal(arrays[n], target[n]), n


def test_dtypes_bit_patterns_and_float8(tmp_path):
    model = synthetic_model(seed=3)
    path = tmp_path / "m.safetensors"
    refit.save(path, model, dtypes=SYNTH_DTYPES, metadata={"step": "0"})
    ck = refit.load(path)
    assert ck.dtypes == SYNTH_DTYPES
    assert ck["model.embed.weight"].dtype == np.uint16      # BF16 as its bits
    assert ck["model.layers.0.q.weight"].dtype == np.uint8  # F8_E4M3 as its bits
    assert ck["model.layers.0.mlp.weight"].dtype == np.float32
    for n, a in model.items():
        assert np.array_equal(ck[n], a)
        assert ck.shapes[n] == a.shape
    # Without dtypes, uint16 stays U16: the delta then does not fit a BF16 checkpoint.
    target = perturb(model, 1)
    refit.diff(model, target, tmp_path / "untyped")
    with pytest.raises(refit.VersionMismatchError, match="different dtype"):
        refit.apply(tmp_path / "untyped", path)
    # Typed by the checkpoint on the other side, it does.
    refit.diff(ck, target, tmp_path / "typed")
    refit.apply(tmp_path / "typed", path)
    for n in model:
        assert np.array_equal(refit.load(path)[n], target[n])


def test_checkpoint_views_are_zero_copy_and_read_only(qwen, tmp_path):
    ck = refit.load(qwen / "step0.safetensors")
    a = ck["model.norm.weight"]
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1
    b = ck["model.norm.weight"]
    assert a.ctypes.data == b.ctypes.data  # both view the mapping
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        ck["nope"]
    # A writable checkpoint's views write through to the file.
    path = tmp_path / "w.safetensors"
    shutil.copy(qwen / "step0.safetensors", path)
    os.chmod(path, 0o644)
    w = refit.load(path, writable=True)
    w["model.norm.weight"][:4] = 7
    w.sync()
    del w
    assert list(refit.load(path)["model.norm.weight"][:4]) == [7, 7, 7, 7]


def test_sharded_checkpoint_directory(qwen, tmp_path):
    ck = refit.load(qwen / "sharded_step3")
    assert ck.sharded and len(ck) == 51
    flat = refit.load(qwen / "step3.safetensors")
    for n in flat:
        assert np.array_equal(ck[n], flat[n])
    shard_copy = tmp_path / "sharded"
    refit.copy_checkpoint(qwen / "sharded_step3", shard_copy)
    for f in shard_copy.iterdir():
        os.chmod(f, 0o644)
    refit.diff(qwen / "step3.safetensors", qwen / "step2.safetensors", tmp_path / "back")
    refit.apply(tmp_path / "back", shard_copy)
    assert refit.verify(shard_copy, tmp_path / "back").matches_target


def test_iterable_of_pairs_and_non_contiguous_read(tmp_path):
    model = synthetic_model()
    target = perturb(model, 2)
    typed = {n: refit.as_dtype(a, SYNTH_DTYPES[n]) for n, a in model.items()}
    refit.diff(typed, list(target.items()), tmp_path / "a")
    # A Fortran-ordered copy is read through a contiguous copy, same delta.
    fortran = {n: np.asfortranarray(a) for n, a in target.items()}
    refit.diff(typed, fortran, tmp_path / "b")
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
