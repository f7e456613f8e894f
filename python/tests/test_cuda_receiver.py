"""Two-phase receivers in GPU memory: versions are staged while the weights
stay as they are, then applied in place on the GPU in one pause. Checked
bit for bit against the CPU path over many versions, with aborts, folds, a
snapshot, a failed activation that restores, staging smaller than a version,
and an engine-like module with fused parameters (vLLM-style qkv_proj and
gate_up_proj, tensor parallel) against its own load_weights. Needs PyTorch
with a CUDA device and a CUDA build of refit."""

import concurrent.futures
import json
import time

import numpy as np
import pytest

import refit
from refit import _native

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and getattr(_native, "has_cuda", False)),
    reason="needs a CUDA device and refit's CUDA module")

from cuda_models import DTYPES, host, initial_model, step  # noqa: E402

_POOL = concurrent.futures.ThreadPoolExecutor(4)


def clone(model):
    return {n: t.clone() for n, t in model.items()}


def same(a, b):
    return all(torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)) for n in a)


def follow(rcv, version):
    return _POOL.submit(rcv.sync, version, timeout=60)


def test_gpu_receiver_equals_the_cpu_path_over_twenty_versions(tmp_path):
    model = initial_model(1)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, members=["gpu", "cpu"], initial=model, vote_timeout=3)
    engine = clone(model)
    mine = host(model)
    rg = refit.Receiver(store, member="gpu", tensors=engine)
    rc = refit.Receiver(store, member="cpu", tensors=mine, dtypes=DTYPES)
    assert rg.two_phase and not rc.two_phase
    live, committed = model, model
    pauses = []
    for v in range(1, 23):
        live = step(committed, v)
        if v == 7:  # the CPU receiver is away: the version aborts, nothing was written
            f = _POOL.submit(rg.prepare, timeout=5)
            assert not pub.publish(v, live).committed
            assert f.result(timeout=60) is False
            assert same(engine, committed) and rg.active_version == 6
            live = committed
            continue
        fc = follow(rc, v)
        if v % 3 == 0:  # the engine pauses itself: prepare, then activate
            f = _POOL.submit(rg.prepare, timeout=30)
            assert pub.publish(v, live).committed
            assert f.result(timeout=60) is True
            assert same(engine, committed)  # still serving the previous version
            report = rg.activate()
        else:
            f = follow(rg, v)
            assert pub.publish(v, live).committed
            report = f.result(timeout=60)
        fc.result(timeout=60)
        assert report.committed_versions == [v]
        pauses.append(report.steps[-1].pause_seconds)
        committed = live
        assert same(engine, live), v
    expected = host(live)
    for n in model:
        assert np.array_equal(mine[n], expected[n]), n
    assert max(pauses) < 5.0
    # A late engine folds the committed versions into one pause.
    late_engine = clone(model)
    late = refit.Receiver(store, member="late", tensors=late_engine, max_fold_versions=32)
    report = late.sync(22, timeout=60)
    assert same(late_engine, live)
    assert report.steps[-1].outcome == "caught_up" and report.steps[-1].versions_folded == 21
    for r in (rg, rc, late):
        r.close()
    pub.close()


def test_failed_activation_restores_and_small_staging(tmp_path):
    model = initial_model(2)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, members=["r"], initial=model, vote_timeout=60)
    engine = clone(model)
    # Staging below one version: the payload waits in page-locked host memory.
    rcv = refit.Receiver(store, member="r", tensors=engine, staging_bytes=1)
    live = step(model, 5, rate=0.05)
    f = _POOL.submit(rcv.prepare, timeout=30)
    assert pub.publish(1, live).committed
    assert f.result(timeout=60) is True
    # The weights change under the receiver between prepare and activate.
    engine["d.mlp"].view(torch.int16)[-1, -1] ^= 0x40
    changed = clone(engine)
    with pytest.raises(refit.Error, match="restored"):
        rcv.activate()
    assert same(engine, changed) and rcv.active_version == 0
    with pytest.raises(refit.Error, match="does not hash"):
        rcv.sync(1, timeout=10)
    engine["d.mlp"].view(torch.int16)[-1, -1] ^= 0x40  # back to version 0
    report = rcv.sync(1, timeout=60)
    assert report.committed_versions == [1] and same(engine, live)
    assert report.steps[-1].staged_host_bytes > 0
    rcv.close()
    pub.close()


def test_snapshot_into_device_tensors(tmp_path):
    model = initial_model(3)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, members=["r"], initial=model, vote_timeout=60,
                          snapshot_every=2, keep_versions=1)
    engine = clone(model)
    rcv = refit.Receiver(store, member="r", tensors=engine)
    live = model
    for v in (1, 2, 3, 4):
        live = step(live, 40 + v)
        f = follow(rcv, v)
        assert pub.publish(v, live).committed
        f.result(timeout=60)
    fresh = {n: torch.zeros_like(t) for n, t in model.items()}
    new = refit.Receiver(store, member="new", tensors=fresh)
    report = new.sync(4, timeout=60)
    assert report.steps[-1].outcome == "snapshot" and same(fresh, live)
    for r in (rcv, new):
        r.close()
    pub.close()


# --- an engine-like module with fused parameters --------------------------

H, Q, KV, INTER = 256, 256, 64, 512   # hidden, q rows, k/v rows, intermediate


def canonical_shapes():
    return {"layer.q_proj.weight": (Q, H), "layer.k_proj.weight": (KV, H),
            "layer.v_proj.weight": (KV, H), "layer.o_proj.weight": (H, Q),
            "layer.gate_proj.weight": (INTER, H), "layer.up_proj.weight": (INTER, H),
            "layer.down_proj.weight": (H, INTER), "layer.norm.weight": (H,)}


class EngineLayer(torch.nn.Module):
    """A vLLM-style layer on tensor-parallel rank `rank` of `tp`: q, k and v
    rows concatenated in qkv_proj, gate and up rows in gate_up_proj, o_proj
    and down_proj split by columns, norm replicated."""

    def __init__(self, rank, tp):
        super().__init__()
        self.rank, self.tp = rank, tp
        z = dict(device="cuda", dtype=torch.bfloat16)
        self.qkv_proj = torch.nn.Parameter(torch.zeros((Q + 2 * KV) // tp, H, **z),
                                           requires_grad=False)
        self.gate_up_proj = torch.nn.Parameter(torch.zeros(2 * INTER // tp, H, **z),
                                               requires_grad=False)
        self.o_proj = torch.nn.Parameter(torch.zeros(H, Q // tp, **z), requires_grad=False)
        self.down_proj = torch.nn.Parameter(torch.zeros(H, INTER // tp, **z),
                                            requires_grad=False)
        self.norm = torch.nn.Parameter(torch.zeros(H, **z), requires_grad=False)

    def load_weights(self, weights):
        """The engine's own loader: canonical (name, tensor) pairs."""
        r, tp = self.rank, self.tp
        q, kv, i = Q // tp, KV // tp, INTER // tp
        for name, w in weights:
            part = name.split(".")[1]
            if part in ("q_proj", "k_proj", "v_proj"):
                rows = {"q_proj": q, "k_proj": kv, "v_proj": kv}[part]
                at = {"q_proj": 0, "k_proj": q, "v_proj": q + kv}[part]
                self.qkv_proj.data[at:at + rows] = w[r * rows:(r + 1) * rows]
            elif part in ("gate_proj", "up_proj"):
                at = 0 if part == "gate_proj" else i
                self.gate_up_proj.data[at:at + i] = w[r * i:(r + 1) * i]
            elif part == "o_proj":
                self.o_proj.data[:] = w[:, r * q:(r + 1) * q]
            elif part == "down_proj":
                self.down_proj.data[:] = w[:, r * i:(r + 1) * i]
            else:
                self.norm.data[:] = w


def engine_layout(tp):
    """The layout (docs/layout.md) of every engine rank's parameters."""
    canonical = [{"name": n, "dtype": "BF16", "shape": list(s)}
                 for n, s in canonical_shapes().items()]
    ranks = []
    q, kv, i = Q // tp, KV // tp, INTER // tp
    for r in range(tp):
        def rows(canon, at, n, cols=H):
            return {"canonical": canon, "rows": n, "cols": cols, "local": [at * cols, cols, 1],
                    "canon": [r * n * cols, cols, 1]}

        def colsplit(canon, width, total):
            return {"canonical": canon, "rows": H, "cols": width, "local": [0, width, 1],
                    "canon": [r * width, total, 1]}
        ranks.append({"rank": r, "tensors": [
            {"name": "qkv_proj", "dtype": "BF16", "shape": [(Q + 2 * KV) // tp, H],
             "pieces": [rows("layer.q_proj.weight", 0, q), rows("layer.k_proj.weight", q, kv),
                        rows("layer.v_proj.weight", q + kv, kv)]},
            {"name": "gate_up_proj", "dtype": "BF16", "shape": [2 * i, H],
             "pieces": [rows("layer.gate_proj.weight", 0, i), rows("layer.up_proj.weight", i, i)]},
            {"name": "o_proj", "dtype": "BF16", "shape": [H, q],
             "pieces": [colsplit("layer.o_proj.weight", q, Q)]},
            {"name": "down_proj", "dtype": "BF16", "shape": [H, i],
             "pieces": [colsplit("layer.down_proj.weight", i, INTER)]},
            {"name": "norm", "dtype": "BF16", "shape": [H],
             "pieces": [{"canonical": "layer.norm.weight", "rows": 1, "cols": H,
                         "local": [0, H, 1], "canon": [0, H, 1]}]}]})
    return {"format": "refit-layout", "version": 1, "canonical": canonical, "ranks": ranks}


@pytest.mark.parametrize("tp", [1, 2])
def test_fused_engine_parameters_equal_the_engines_own_loader(tmp_path, tp):
    model = initial_model(7, canonical_shapes())
    store = str(tmp_path / "store")
    members = [f"e{r}" for r in range(tp)]
    pub = refit.Publisher(store, members=members, initial=model, vote_timeout=60)
    layout = engine_layout(tp)
    engines, receivers = [], []
    for r in range(tp):
        e = EngineLayer(r, tp)
        e.load_weights(model.items())
        engines.append(e)
        receivers.append(refit.Receiver(store, member=f"e{r}", layout=json.dumps(layout),
                                        rank=r, tensors=dict(e.named_parameters())))
    live = model
    for v in range(1, 6):
        live = step(live, 70 + v, rate=0.03)
        fs = [follow(rcv, v) for rcv in receivers]
        assert pub.publish(v, live).committed
        for f in fs:
            assert f.result(timeout=60).committed_versions == [v]
        for r, e in enumerate(engines):
            reference = EngineLayer(r, tp)
            reference.load_weights(live.items())
            for (n, p), (_, q) in zip(e.named_parameters(), reference.named_parameters()):
                assert torch.equal(p.view(torch.int16), q.view(torch.int16)), (v, r, n)
    for rcv in receivers:
        rcv.close()
    pub.close()


def test_pausing_engine_adapter_with_fused_parameters(tmp_path):
    from refit.adapters import PausingEngine
    model = initial_model(9, canonical_shapes())
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, members=["e0"], initial=model, vote_timeout=60)
    layer = EngineLayer(0, 1)
    layer.load_weights(model.items())
    rcv = refit.Receiver(store, member="e0", layout=engine_layout(1), rank=0,
                         tensors=dict(layer.named_parameters()), poll_interval=0.005)
    live = model
    with PausingEngine(rcv, poll_interval=0.005) as engine:
        for v in (1, 2, 3):
            live = step(live, 90 + v)
            future = _POOL.submit(pub.publish, v, live)
            report = None
            while report is None:  # the engine's batches, pausing in between
                report = engine.activate_if_ready()
                time.sleep(0.001)
            assert future.result(timeout=60).committed
            assert report.committed_versions == [v]
            reference = EngineLayer(0, 1)
            reference.load_weights(live.items())
            for (n, p), (_, q) in zip(layer.named_parameters(), reference.named_parameters()):
                assert torch.equal(p.view(torch.int16), q.view(torch.int16)), (v, n)
    rcv.close()
    pub.close()
