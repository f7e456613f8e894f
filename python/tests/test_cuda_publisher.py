"""A publisher whose baseline lives in device memory: CUDA tensors are diffed
and encoded on the GPU. Checked against the CPU path (a checkpoint baseline)
chunk for chunk. Needs PyTorch with a CUDA device and a CUDA build of refit."""

import concurrent.futures
import json
import os

import numpy as np
import pytest

import refit
from refit import _native

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and getattr(_native, "has_cuda", False)),
    reason="needs a CUDA device and refit's CUDA module")

from cuda_models import host, initial_model, step  # noqa: E402




def objects(store):
    out = {}
    for root, _, files in os.walk(store):
        for f in files:
            path = os.path.join(root, f)
            key = os.path.relpath(path, store)
            if key.startswith("v/") and "/chunk/" in key:
                with open(path, "rb") as fh:
                    out[key] = fh.read()
    return out


_POOL = concurrent.futures.ThreadPoolExecutor(8)


def follow(rcv, version):
    """Syncs `rcv` to `version` on another thread (it votes while we publish)."""
    return _POOL.submit(rcv.sync, version, timeout=60)


def test_device_baseline_equals_the_cpu_path_over_twenty_versions(tmp_path):
    model = initial_model(1)
    dtypes = {n: ("F32" if n.endswith("f32") else "BF16") for n in model}
    gpu_store, cpu_store = str(tmp_path / "gpu"), str(tmp_path / "cpu")
    gpu = refit.Publisher(gpu_store, members=["r"], initial=model, vote_timeout=60)
    assert gpu.on_device and gpu.baseline == ""
    cpu = refit.Publisher(cpu_store, baseline=tmp_path / "b.safetensors", members=["r"],
                          initial=host(model), dtypes=dtypes, vote_timeout=60)
    mine_gpu, mine_cpu = host(model), host(model)
    rg = refit.Receiver(gpu_store, member="r", tensors=mine_gpu, dtypes=dtypes)
    rc = refit.Receiver(cpu_store, member="r", tensors=mine_cpu, dtypes=dtypes)
    live = model
    for v in range(1, 22):
        live = step(live, v)
        fg, fc = follow(rg, v), follow(rc, v)
        report = gpu.publish(v, live)
        assert report.committed, report.reason
        assert cpu.publish(v, host(live)).committed
        fg.result(timeout=60)
        fc.result(timeout=60)
        assert 1.0 < report.changed_percent < 3.0
    expected = host(live)
    for n in model:
        assert np.array_equal(mine_gpu[n], expected[n]), n
        assert np.array_equal(mine_cpu[n], expected[n]), n
    # Byte-identical chunks: receivers cannot tell the paths apart.
    assert objects(gpu_store) == objects(cpu_store)
    rg.close()
    rc.close()


def test_abort_keeps_the_device_baseline_and_async_copies(tmp_path):
    model = initial_model(2)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, members=["r"], initial=model, vote_timeout=0.5)
    # No receiver yet: version 1 aborts, the baseline stays at version 0.
    v1 = step(model, 10)
    assert not pub.publish(1, v1).committed
    assert pub.committed_version == 0
    mine = host(model)
    dtypes = {n: ("F32" if n.endswith("f32") else "BF16") for n in model}
    rcv = refit.Receiver(store, member="r", tensors=mine, dtypes=dtypes)
    assert rcv.sync(timeout=10).active_version == 0  # rolled nothing: it never applied
    pub2 = refit.Publisher(store, members=["r"], initial=model, vote_timeout=60)
    live = {n: t.clone() for n, t in step(model, 11).items()}
    expected = host(live)
    fut = pub2.publish_async(2, live)  # copy=True: copied on the device
    for t in live.values():           # the training loop goes on at once
        t.view(torch.uint8).reshape(-1)[:8] ^= 0x55
    rcv.sync(2, timeout=60)
    assert fut.result(timeout=60).committed
    for n in model:
        assert np.array_equal(mine[n], expected[n]), n
    pub2.close()
    rcv.close()


def test_wrong_initial_weights_and_host_tensors_are_refused(tmp_path):
    model = initial_model(3)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, members=["r"], initial=model, vote_timeout=60)
    with pytest.raises(refit.InvalidArgumentError, match="host memory"):
        pub.publish(1, {n: t.cpu() for n, t in model.items()})
    with pytest.raises(refit.InvalidArgumentError, match="baseline_memory"):
        refit.Publisher(store, members=["r"], initial=model, baseline_memory="disk")
    dtypes = {n: ("F32" if n.endswith("f32") else "BF16") for n in model}
    mine = host(model)
    rcv = refit.Receiver(store, member="r", tensors=mine, dtypes=dtypes)
    f = follow(rcv, 1)
    assert pub.publish(1, step(model, 20)).committed
    f.result(timeout=60)
    # A new publisher from version 0's weights while the head is version 1.
    stale = refit.Publisher(store, members=["r"], initial=model, vote_timeout=60)
    with pytest.raises(refit.Error, match="not the store's head version 1"):
        stale.publish(2, step(model, 21))
    rcv.close()


@pytest.mark.parametrize("memory", ["device", "pinned"])
def test_snapshot_and_pinned_baseline(tmp_path, memory):
    model = initial_model(4)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, members=["r"], initial=model, vote_timeout=60,
                          baseline_memory=memory, snapshot_every=2)
    dtypes = {n: ("F32" if n.endswith("f32") else "BF16") for n in model}
    mine = host(model)
    rcv = refit.Receiver(store, member="r", tensors=mine, dtypes=dtypes)
    live = model
    for v in (1, 2):
        live = step(live, 30 + v)
        f = follow(rcv, v)
        assert pub.publish(v, live).committed
        f.result(timeout=60)
    snap = os.path.join(store, "snap", "%020d" % 2)
    files = [os.path.join(root, f) for root, _, fs in os.walk(snap) for f in fs
             if "/file/" in os.path.join(root, f)]
    assert len(files) == 1
    got = refit.load(files[0])
    expected = host(live)
    for n in model:
        assert np.array_equal(got[n], expected[n]), n
    rcv.close()


def file_version(path):
    """The "refit_version" of a durable baseline file's header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return int(json.loads(f.read(n))["__metadata__"]["refit_version"])


def test_durable_baseline_file_restarts_a_trainer_at_the_head(tmp_path):
    """The baseline is written to a file in the background after each commit;
    a publisher reopened from the trainer's older weights starts from that
    file at the store's head and publishes on."""
    model = initial_model(5)
    store, durable = str(tmp_path / "store"), tmp_path / "durable.safetensors"
    dtypes = {n: ("F32" if n.endswith("f32") else "BF16") for n in model}
    with pytest.raises(refit.InvalidArgumentError, match="durable_baseline"):
        refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=["r"],
                        initial=host(model), dtypes=dtypes, durable_baseline=durable)
    pub = refit.Publisher(store, members=["r"], initial=model, vote_timeout=60,
                          durable_baseline=durable)
    assert pub.durable["written_version"] == 0 and not pub.durable["loaded"]
    mine = host(model)
    rcv = refit.Receiver(store, member="r", tensors=mine, dtypes=dtypes)
    live = model
    for v in range(1, 6):
        live = step(live, 40 + v)
        f = follow(rcv, v)
        assert pub.publish(v, live).committed  # does not wait for the file
        f.result(timeout=60)
    pub.close()  # waits for the newest commit to be in the file
    state = pub.durable
    assert state["written_version"] == 5 and state["error"] == "", state
    assert 1 <= state["writes"] <= 5
    got = refit.load(durable)
    expected = host(live)
    for n in model:
        assert np.array_equal(got[n], expected[n]), n
    assert file_version(durable) == 5
    # The trainer restarts from its version-0 weights: the baseline comes
    # from the file (the head), so the next version publishes and applies.
    again = refit.Publisher(store, members=["r"], initial=model, vote_timeout=60,
                            durable_baseline=durable)
    assert again.durable["loaded"] and again.durable["loaded_version"] == 5
    live = step(live, 50)
    f = follow(rcv, 6)
    assert again.publish(6, live).committed
    f.result(timeout=60)
    expected = host(live)
    for n in model:
        assert np.array_equal(mine[n], expected[n]), n
    again.close()
    assert file_version(durable) == 6
    # A file of other tensors is refused by name.
    other = {n + ".x": t for n, t in model.items()}
    with pytest.raises(refit.Error, match="durable baseline file"):
        refit.Publisher(str(tmp_path / "s2"), members=["r"], initial=other,
                        durable_baseline=durable)
    rcv.close()


def _tp2_layout(master_dtype="BF16"):
    """Two tensor-parallel ranks: w row-parallel (each rank a column half:
    strided regions), u column-parallel (row halves), b replicated."""
    def piece(canon, rows, cols, local, canon_map):
        return {"canonical": canon, "rows": rows, "cols": cols, "local": local,
                "canon": canon_map}
    ranks = []
    for r in (0, 1):
        ranks.append({"rank": r, "tensors": [
            {"name": "w", "dtype": master_dtype, "shape": [512, 384],
             "pieces": [piece("w", 512, 384, [0, 384, 1], [r * 384, 768, 1])]},
            {"name": "u", "dtype": "BF16", "shape": [512, 256],
             "pieces": [piece("u", 512, 256, [0, 256, 1], [r * 512 * 256, 256, 1])]},
            {"name": "b", "dtype": "BF16", "shape": [300],
             "pieces": [piece("b", 1, 300, [0, 300, 1], [0, 300, 1])]}]})
    return {"format": "refit-layout", "version": 1,
            "canonical": [{"name": "b", "dtype": "BF16", "shape": [300]},
                          {"name": "u", "dtype": "BF16", "shape": [1024, 256]},
                          {"name": "w", "dtype": "BF16", "shape": [512, 768]}],
            "ranks": ranks}


def _tp2_local(canon, r):
    return {"w": canon["w"][:, r * 384:(r + 1) * 384].contiguous(),
            "u": canon["u"][r * 512:(r + 1) * 512].contiguous(), "b": canon["b"].clone()}


def _part_chunks(store):
    out = {}
    for root, _, files in os.walk(store):
        for f in files:
            key = os.path.relpath(os.path.join(root, f), store)
            if key.startswith("parts/") and "/chunk/" in key:
                with open(os.path.join(root, f), "rb") as fh:
                    out[key] = fh.read()
    return out


def test_rank_publishers_encode_on_the_device_as_on_the_cpu(tmp_path):
    layout = _tp2_layout()
    canon = initial_model(5, {"w": (512, 768), "u": (1024, 256), "b": (300,)})
    base = tmp_path / "base.safetensors"
    refit.save(base, host(canon), dtypes="BF16")
    stores = {"gpu": str(tmp_path / "gpu"), "cpu": str(tmp_path / "cpu")}
    key = b"k" * 32
    ranks, coords, rcvs, mine = {}, {}, {}, {}
    # A two-phase receiver on the GPU too: it applies the ranks' strided
    # regions in device memory and votes their hashes after the version.
    on_gpu = {n: t.clone() for n, t in canon.items()}
    gpu_rcv = refit.Receiver(stores["gpu"], member="g", tensors=on_gpu, key=key,
                             decision_timeout=60)
    for kind, store in stores.items():
        members = ["r", "g"] if kind == "gpu" else ["r"]
        coords[kind] = refit.Coordinator(store, members=members, ranks=[0, 1], table=base,
                                         key=key, vote_timeout=60, parts_timeout=60)
        memory = "device" if kind == "gpu" else "file"
        ranks[kind] = [refit.Publisher(store, layout=layout, rank=r, key=key,
                                       initial=_tp2_local(canon, r), baseline_memory=memory,
                                       decision_timeout=60) for r in (0, 1)]
        assert [p.on_device for p in ranks[kind]] == [kind == "gpu"] * 2
        mine[kind] = host(canon)
        rcvs[kind] = refit.Receiver(store, member="r", tensors=mine[kind],
                                    dtypes={n: "BF16" for n in mine[kind]},
                                    key=key, decision_timeout=60)
    for v in range(1, 9):
        canon = step(canon, 100 + v, rate=0.02 if v % 2 else 0.2)
        for kind in stores:
            futures = [_POOL.submit(coords[kind].publish, v), follow(rcvs[kind], v)]
            if kind == "gpu":
                futures.append(follow(gpu_rcv, v))
            futures += [_POOL.submit(ranks[kind][r].publish, v, _tp2_local(canon, r))
                        for r in (0, 1)]
            results = [f.result(timeout=120) for f in futures]
            assert results[0][0]["committed"], results[0][0]["reason"]
            assert all(res["committed"] for res in results[-2:])
            want = host(canon)
            for name, arr in want.items():
                np.testing.assert_array_equal(mine[kind][name].reshape(arr.shape), arr)
                if kind == "gpu":
                    bits = on_gpu[name].view(torch.int16)
                    assert torch.equal(bits, canon[name].view(torch.int16)), (name, v)
        assert _part_chunks(stores["gpu"]) == _part_chunks(stores["cpu"])


def test_rank_publisher_on_the_device_refuses_converted_pieces(tmp_path):
    layout = _tp2_layout(master_dtype="F32")
    canon = initial_model(6, {"w": (512, 768), "u": (1024, 256), "b": (300,)})
    local = _tp2_local(canon, 0)
    local["w"] = local["w"].float()
    store = str(tmp_path / "s")
    assert not refit.Publisher(store, layout=layout, rank=0, initial=local).on_device
    with pytest.raises(refit.UnsupportedError, match="converted"):
        refit.Publisher(store, layout=layout, rank=0, initial=local, baseline_memory="device")
