"""Bad input raises refit.errors classes with messages naming the problem."""


import numpy as np
import pytest

import refit
from conftest import SYNTH_DTYPES, perturb, synthetic_model


@pytest.fixture
def delta01(qwen, tmp_path):
    d = tmp_path / "d01"
    refit.diff(qwen / "step0.safetensors", qwen / "step1.safetensors", d)
    return d


def test_hierarchy():
    for cls in (refit.InvalidArgumentError, refit.NotFoundError, refit.CorruptDataError,
                refit.VersionMismatchError, refit.TransportError, refit.DeadlineExceededError,
                refit.AbortedError, refit.AuthenticationError, refit.UnsupportedError):
        assert issubclass(cls, refit.Error)
    assert issubclass(refit.InvalidArgumentError, ValueError)
    assert issubclass(refit.NotFoundError, FileNotFoundError)
    assert issubclass(refit.DeadlineExceededError, TimeoutError)


def test_wrong_base_writes_nothing(qwen, tmp_path, delta01):
    arrays = {n: np.array(a) for n, a in refit.load(qwen / "step2.safetensors").items()}
    before = {n: a.copy() for n, a in arrays.items()}
    with pytest.raises(refit.VersionMismatchError) as e:
        refit.apply(delta01, arrays)
    assert e.value.code == "FAILED_PRECONDITION"
    for n in arrays:
        assert np.array_equal(arrays[n], before[n])


def test_corrupt_delta(qwen, tmp_path, delta01):
    data = bytearray(delta01.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(data))
    with pytest.raises(refit.CorruptDataError) as e:
        refit.inspect(bad)
    assert e.value.code == "DATA_LOSS"
    truncated = tmp_path / "short"
    truncated.write_bytes(bytes(data[:100]))
    with pytest.raises(refit.CorruptDataError):
        refit.apply(truncated, {})


def test_missing_paths(tmp_path):
    with pytest.raises(refit.NotFoundError, match="nope"):
        refit.inspect(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        refit.load(tmp_path / "nope.safetensors")


def test_bad_tensors(qwen, tmp_path, delta01):
    base = refit.load(qwen / "step0.safetensors")
    arrays = {n: np.array(a) for n, a in base.items()}
    # A missing tensor.
    partial = dict(arrays)
    partial.pop("lm_head.weight")
    with pytest.raises(refit.Error, match="lm_head.weight"):
        refit.apply(delta01, partial)
    # The wrong dtype (float32 is definitive, BF16 is expected).
    wrong = dict(arrays)
    wrong["model.norm.weight"] = arrays["model.norm.weight"].astype(np.float32)
    with pytest.raises(refit.InvalidArgumentError, match="model.norm.weight.*F32.*BF16"):
        refit.apply(delta01, wrong)
    # Read-only memory cannot be written in place.
    ro = dict(arrays)
    ro["model.norm.weight"] = base["model.norm.weight"]
    with pytest.raises(refit.InvalidArgumentError, match="model.norm.weight"):
        refit.apply(delta01, ro)
    # Neither can a non-contiguous array.
    strided = dict(arrays)
    big = np.zeros((arrays["lm_head.weight"].shape[0], arrays["lm_head.weight"].shape[1] * 2),
                   dtype=np.uint16)
    strided["lm_head.weight"] = big[:, ::2]
    with pytest.raises(refit.InvalidArgumentError, match="lm_head.weight.*contiguous"):
        refit.apply(delta01, strided)
    # Not tensors at all.
    with pytest.raises(refit.InvalidArgumentError, match="not-a-tensor|str"):
        refit.diff({"x": "not-a-tensor"}, {"x": "not-a-tensor"}, tmp_path / "o")
    with pytest.raises(refit.InvalidArgumentError, match="pairs"):
        refit.diff(42, {}, tmp_path / "o")
    with pytest.raises(refit.InvalidArgumentError, match="unknown dtype"):
        refit.as_dtype(arrays["lm_head.weight"], "BF17")


def test_mismatched_tensor_sets(tmp_path):
    model = synthetic_model()
    target = perturb(model, 1)
    target.pop("model.embed.weight")
    with pytest.raises(refit.InvalidArgumentError):
        refit.diff(model, target, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_publisher_arguments(tmp_path):
    base = tmp_path / "b.safetensors"
    refit.save(base, synthetic_model(), dtypes=SYNTH_DTYPES)
    with pytest.raises(refit.InvalidArgumentError, match="layout"):
        refit.Publisher(str(tmp_path / "s"), baseline=base, members=["r0"], layout=object())
    with pytest.raises(refit.InvalidArgumentError, match="not JSON"):
        refit.Publisher(str(tmp_path / "s"), layout="{not json", rank=0)
    with pytest.raises(NotImplementedError, match="rank"):
        refit.Publisher(str(tmp_path / "s"), baseline=base, members=["r0"], rank=1)
    with pytest.raises(refit.NotFoundError, match="initial="):
        refit.Publisher(str(tmp_path / "s"), baseline=tmp_path / "missing", members=["r0"])
    with pytest.raises(refit.InvalidArgumentError, match="member"):
        refit.Publisher(str(tmp_path / "s"), baseline=base, members=[])
    with pytest.raises(refit.InvalidArgumentError, match="policy"):
        refit.Publisher(str(tmp_path / "s"), baseline=base, members=["r0"], policy="maybe")
    with pytest.raises(refit.InvalidArgumentError, match="at least 16"):
        refit.Publisher(str(tmp_path / "s"), baseline=base, members=["r0"], key=b"short")
    with pytest.raises(refit.InvalidArgumentError, match="exactly one"):
        refit.Receiver(str(tmp_path / "s"), member="r0")
    with pytest.raises(refit.InvalidArgumentError):
        refit.Receiver(str(tmp_path / "s"), member="bad name!", checkpoint_dir=base)
