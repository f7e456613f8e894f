"""PyTorch tensors through DLPack: CPU in place, CUDA through host staging.

Skipped where PyTorch is not installed (it is not a build dependency); the
CUDA tests need a CUDA device (docs/python.md gives the command)."""

import concurrent.futures

import pytest

import refit
from refit import _native

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def torch_model(ck, device):
    return {n: ck.torch(n).clone().to(device) for n in ck}


@pytest.mark.parametrize("device", DEVICES)
def test_apply_to_torch_tensors_in_place(qwen, tmp_path, device):
    delta = tmp_path / "d"
    refit.diff(qwen / "step0.safetensors", qwen / "step1.safetensors", delta)
    base = refit.load(qwen / "step0.safetensors")
    target = refit.load(qwen / "step1.safetensors")
    model = torch_model(base, device)
    assert all(t.dtype == torch.bfloat16 for t in model.values())
    pointers = {n: t.data_ptr() for n, t in model.items()}
    if device == "cpu":
        for n, t in model.items():
            assert _native.data_address("BF16", t.__dlpack__()) == pointers[n]
    report = refit.apply(delta, model)
    if device == "cuda" and _native.has_cuda:
        # Applied on the GPU, where the tensors live.
        assert isinstance(report, _native.GpuApplyReport)
        assert report.chunks_applied == report.chunks > 0
    for n, t in model.items():
        assert t.data_ptr() == pointers[n]
        assert torch.equal(t.cpu(), target.torch(n)), n
    again = refit.apply(delta, model)  # at most once
    assert again.chunks_applied == 0
    for n, t in model.items():
        assert torch.equal(t.cpu(), target.torch(n)), n


@pytest.mark.parametrize("device", DEVICES)
def test_wrong_base_writes_nothing(qwen, tmp_path, device):
    delta = tmp_path / "d"
    refit.diff(qwen / "step0.safetensors", qwen / "step1.safetensors", delta)
    step2 = refit.load(qwen / "step2.safetensors")
    model = torch_model(step2, device)
    with pytest.raises(refit.VersionMismatchError):
        refit.apply(delta, model)
    for n, t in model.items():
        assert torch.equal(t.cpu(), step2.torch(n)), n


@pytest.mark.parametrize("device", DEVICES)
def test_publish_parameters_and_receive_torch(qwen, tmp_path, device):
    store = str(tmp_path / "store")
    base = refit.load(qwen / "step0.safetensors")
    params = {n: torch.nn.Parameter(t) for n, t in torch_model(base, device).items()}
    pub = refit.Publisher(store, baseline=tmp_path / "baseline.safetensors", members=["r0", "r1"],
                          initial=params, vote_timeout=30)
    (tmp_path / "r0").mkdir()
    refit.save(tmp_path / "r0" / "model.safetensors", params)
    rcv0 = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0")
    mine = torch_model(base, device)
    rcv1 = refit.Receiver(store, member="r1", tensors=mine, state_dir=tmp_path / "r1")
    target = refit.load(qwen / "step1.safetensors")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(target.torch(n).to(device))
    future = pub.publish_async(1, params)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda r: r.sync(1, timeout=60), [rcv0, rcv1]))
    assert future.result(timeout=60).committed
    assert reports[0].changed_tensors == reports[1].changed_tensors
    got = dict(rcv0.changed_tensors(framework="torch"))
    assert got and all(t.dtype == torch.bfloat16 for t in got.values())
    for n, t in got.items():
        assert torch.equal(t, target.torch(n)), n
    for n, t in mine.items():
        assert t.device.type == device
        assert torch.equal(t.cpu(), target.torch(n)), n
    pub.close()


def test_float8_tensors(tmp_path):
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8_e4m3fn")
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(64, 32, generator=g).to(torch.float8_e4m3fn),
            "s": torch.rand(1, generator=g)}
    target = {"w": base["w"].clone(), "s": base["s"].clone()}
    target["w"].view(torch.uint8)[3, :5] ^= 1
    refit.diff(base, target, tmp_path / "d")
    refit.save(tmp_path / "b.safetensors", base)
    assert refit.load(tmp_path / "b.safetensors").dtypes == {"w": "F8_E4M3", "s": "F32"}
    work = {n: t.clone() for n, t in base.items()}
    refit.apply(tmp_path / "d", work)
    assert torch.equal(work["w"].view(torch.uint8), target["w"].view(torch.uint8))


def test_load_state_dict_adapter(qwen, tmp_path):
    base = refit.load(qwen / "step0.safetensors")
    target = refit.load(qwen / "step1.safetensors")

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.Parameter(base.torch("model.norm.weight").clone())

    m = Tiny()
    n = refit.adapters.load_state_dict(m, [("norm", target.torch("model.norm.weight"))])
    assert n == 1 and torch.equal(m.norm.data, target.torch("model.norm.weight"))
    with pytest.raises(refit.InvalidArgumentError, match="nope"):
        refit.adapters.load_state_dict(m, [("nope", target.torch("model.norm.weight"))])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_apply_cuda_through_host_memory(qwen, tmp_path, monkeypatch):
    # What a build without the CUDA module does with CUDA tensors.
    monkeypatch.setattr(_native, "has_cuda", False, raising=False)
    delta = tmp_path / "d"
    refit.diff(qwen / "step1.safetensors", qwen / "step2.safetensors", delta)
    model = torch_model(refit.load(qwen / "step1.safetensors"), "cuda")
    pointers = {n: t.data_ptr() for n, t in model.items()}
    report = refit.apply(delta, model)
    assert isinstance(report, _native.ApplyReport)
    target = refit.load(qwen / "step2.safetensors")
    for n, t in model.items():
        assert t.data_ptr() == pointers[n]
        assert torch.equal(t.cpu(), target.torch(n)), n


def test_unsigned_tensors_on_a_pytorch_without_them(tmp_path):
    import numpy as np
    path = tmp_path / "u.safetensors"
    refit.save(path, {"u": np.arange(6, dtype=np.uint16).reshape(2, 3),
                      "b": np.array([0x3F80, 0x4000], dtype=np.uint16)},
               dtypes={"u": "U16", "b": "BF16"})
    ck = refit.load(path)
    # BF16 bits read as uint16 reach every PyTorch (through int16 before 2.3).
    assert ck.torch("b").dtype == torch.bfloat16
    assert ck.torch("b").float().tolist() == [1.0, 2.0]
    if hasattr(torch, "uint16"):
        assert ck.torch("u").tolist() == [[0, 1, 2], [3, 4, 5]]
    else:
        with pytest.raises(refit.UnsupportedError, match="U16"):
            ck.torch("u")
