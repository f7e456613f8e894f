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


_POOL = concurrent.futures.ThreadPoolExecutor(4)


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
