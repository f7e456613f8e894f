"""Publisher and Receiver in one process: the publisher runs on a background
thread (publish_async) while receivers sync on this one, which works only
because native calls release the GIL."""

import concurrent.futures
import os
import shutil
import time

import numpy as np
import pytest

import refit
from conftest import SYNTH_DTYPES, perturb, synthetic_model


def writable_copy(src, dst):
    shutil.copy(src, dst)
    os.chmod(dst, 0o644)
    return dst


def assert_holds(tensors, expected):
    """Every tensor of `expected` has its values in `tensors`."""
    for n in expected:
        assert np.array_equal(tensors[n], expected[n]), n


def open_publisher(tmp_path, model, members, **options):
    """A store under tmp_path and a publisher over it whose baseline holds `model`."""
    store = str(tmp_path / "store")
    options.setdefault("vote_timeout", 30)
    pub = refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=members,
                          initial=model, dtypes=SYNTH_DTYPES, **options)
    return store, pub


def two_phase_receiver(store, member, model, **options):
    """A two-phase receiver of a copy of `model` in host memory, and that copy."""
    mine = {n: a.copy() for n, a in model.items()}
    rcv = refit.Receiver(store, member=member, tensors=mine, dtypes=SYNTH_DTYPES,
                         two_phase=True, **options)
    return rcv, mine


def test_fixture_trajectory_checkpoint_dirs(qwen, tmp_path):
    store = str(tmp_path / "store")
    base = writable_copy(qwen / "step0.safetensors", tmp_path / "baseline.safetensors")
    ckpts = []
    for m in ("r0", "r1"):
        d = tmp_path / m
        d.mkdir()
        ckpts.append(writable_copy(qwen / "step0.safetensors", d / "model.safetensors"))
    pub = refit.Publisher(store, baseline=base, members=["r0", "r1"], vote_timeout=30)
    rcvs = [refit.Receiver(store, member=m, checkpoint_dir=tmp_path / m) for m in ("r0", "r1")]
    assert pub.committed_version == 0 and rcvs[0].active_version == 0
    for step in (1, 2, 3):
        target = refit.load(qwen / f"step{step}.safetensors")
        # Plain uint16 arrays (BF16 bits) adopt the baseline's dtypes.
        arrays = {n: np.array(a) for n, a in target.items()}
        future = pub.publish_async(step, arrays)
        previous = refit.load(qwen / f"step{step - 1}.safetensors")
        expected_changed = [n for n in target if not np.array_equal(target[n], previous[n])]
        # Each member votes only after applying, so both sync at once.
        with concurrent.futures.ThreadPoolExecutor(len(rcvs)) as pool:
            reports = list(pool.map(lambda r: r.sync(step, timeout=30), rcvs))
        for r, report in zip(rcvs, reports):
            assert report.active_version == step
            assert report.committed_versions == [step]
            assert sorted(report.changed_tensors) == sorted(expected_changed)
            got = dict(r.changed_tensors())
            assert sorted(got) == sorted(expected_changed)
            for n, a in got.items():
                assert np.array_equal(a, target[n]), n
        pub_report = future.result(timeout=30)
        assert pub_report.committed and pub_report.version == step
        assert 1.0 < pub_report.changed_percent < 3.0
        assert 0 < pub_report.bytes_uploaded < pub_report.full_bytes / 20
        assert pub.committed_version == step
    final = refit.load(qwen / "step3.safetensors")
    for c in ckpts:
        got = refit.load(c)
        assert_holds(got, final)
    pub.close()


def test_tensors_mode_patches_the_callers_arrays_in_place(tmp_path):
    model = synthetic_model(seed=5)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, baseline=tmp_path / "baseline.safetensors", members=["w0"],
                          initial=model, dtypes=SYNTH_DTYPES, vote_timeout=30)
    mine = {n: a.copy() for n, a in model.items()}
    addresses = {n: a.ctypes.data for n, a in mine.items()}
    views = {n: a[...] for n, a in mine.items()}
    rcv = refit.Receiver(store, member="w0", tensors=mine, dtypes=SYNTH_DTYPES,
                         state_dir=tmp_path / "w0")
    assert rcv.checkpoint_dir is None
    target = dict(model)
    target["model.layers.0.mlp.weight"] = perturb(model, 1)["model.layers.0.mlp.weight"]
    future = pub.publish_async(1, target, copy=True)
    report = rcv.sync(1, timeout=30)
    assert future.result(timeout=30).committed
    assert report.changed_tensors == ["model.layers.0.mlp.weight"]
    for n in model:
        # Written where the caller's arrays live: no copy anywhere.
        assert mine[n].ctypes.data == addresses[n]
        assert np.array_equal(views[n], target[n]), n
    pairs = list(rcv.changed_tensors())
    assert [n for n, _ in pairs] == ["model.layers.0.mlp.weight"]
    assert pairs[0][1] is mine["model.layers.0.mlp.weight"]
    rcv.close()
    # A receiver reopened over the same state and the same (version 1) tensors goes on.
    again = refit.Receiver(store, member="w0", tensors=mine, dtypes=SYNTH_DTYPES,
                           state_dir=tmp_path / "w0")
    assert again.active_version == 1
    target2 = perturb(target, 2)
    future = pub.publish_async(2, target2)
    assert again.sync(2, timeout=30).committed_versions == [2]
    assert future.result(timeout=30).committed
    assert_holds(mine, target2)
    again.close()
    pub.close()


def test_tensors_mode_default_state_is_temporary(tmp_path):
    model = synthetic_model(seed=6)
    store = str(tmp_path / "store")
    refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=["w0"], initial=model,
                    dtypes=SYNTH_DTYPES)
    mine = {n: a.copy() for n, a in model.items()}
    with refit.Receiver(store, member="w0", tensors=mine, dtypes=SYNTH_DTYPES) as rcv:
        state = rcv.state_dir
        assert os.path.isdir(state) and rcv.active_version == 0
        assert rcv.sync().steps == []
    assert not os.path.exists(state)
    with pytest.raises(refit.Error, match="closed"):
        rcv.sync()
    # Bit patterns without dtypes do not match the store's BF16 tensors.
    publish_one = refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=["w0"],
                                  vote_timeout=1)
    future = publish_one.publish_async(1, perturb(model, 1))
    with refit.Receiver(store, member="w0", tensors=mine) as untyped:
        with pytest.raises(refit.VersionMismatchError, match="model.embed.weight"):
            untyped.sync(1, timeout=10)
    assert not future.result(timeout=30).committed  # no vote: aborted
    publish_one.close()


def test_publish_async_copy_lets_the_loop_mutate(tmp_path):
    model = synthetic_model(seed=7)
    store, pub = open_publisher(tmp_path, model, ["r0"])
    refit.save(tmp_path / "r0.safetensors", model, dtypes=SYNTH_DTYPES)
    rcv = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                         state_dir=tmp_path / "r0state")
    live = {n: a.copy() for n, a in model.items()}
    expected = {}
    futures = []
    for step in (1, 2):
        nxt = perturb(live, step)
        for n in live:
            live[n][...] = nxt[n]
        expected[step] = {n: a.copy() for n, a in live.items()}
        futures.append(pub.publish_async(step, live, copy=True))
        # The training loop moves on at once: scribble over the live tensors.
        for a in live.values():
            a.reshape(-1).view(np.uint8)[:8] ^= 0x55
        for n in live:
            live[n][...] = expected[step][n]
    rcv.sync(2, timeout=30)
    assert [f.result(timeout=30).committed for f in futures] == [True, True]
    got = refit.load(tmp_path / "r0.safetensors")
    assert_holds(got, expected[2])
    pub.close()


def test_sync_deadline_and_idle(tmp_path):
    model = synthetic_model()
    store = str(tmp_path / "store")
    refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=["r0"],
                    initial=model, dtypes=SYNTH_DTYPES)
    refit.save(tmp_path / "r0.safetensors", model, dtypes=SYNTH_DTYPES)
    rcv = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                         state_dir=tmp_path / "st")
    idle = rcv.sync()
    assert idle.steps == [] and idle.changed_tensors == [] and idle.active_version == 0
    with pytest.raises(refit.DeadlineExceededError, match="version 5"):
        rcv.sync(5, timeout=0.2)


def test_abort_when_a_member_is_missing(tmp_path):
    model = synthetic_model()
    store, pub = open_publisher(tmp_path, model, ["r0", "gone"], vote_timeout=0.5)
    refit.save(tmp_path / "r0.safetensors", model, dtypes=SYNTH_DTYPES)
    rcv = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                         state_dir=tmp_path / "st", decision_timeout=10)
    future = pub.publish_async(1, perturb(model, 1))
    report = rcv.sync(timeout=10)
    while not report.steps and not future.done():
        report = rcv.sync(timeout=10)
    pub_report = future.result(timeout=30)
    assert not pub_report.committed and "gone" in pub_report.reason
    rcv.sync()
    assert rcv.active_version == 0
    got = refit.load(tmp_path / "r0.safetensors")
    assert_holds(got, model)  # rolled back
    pub.close()


def test_authenticated_store(tmp_path):
    model = synthetic_model()
    key = bytes(range(32))
    store, pub = open_publisher(tmp_path, model, ["r0"], key=key)
    refit.save(tmp_path / "r0.safetensors", model, dtypes=SYNTH_DTYPES)
    wrong = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                           state_dir=tmp_path / "st", key=bytes(32))
    future = pub.publish_async(1, perturb(model, 1))
    with pytest.raises(refit.AuthenticationError):
        wrong.sync(1, timeout=10)
    right = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                           state_dir=tmp_path / "st", key=key)
    assert right.sync(1, timeout=30).active_version == 1
    assert future.result(timeout=30).committed
    pub.close()


def test_signed_store(tmp_path):
    model = synthetic_model()
    private, public = refit.generate_signing_key()
    assert len(private) == 32 and len(public) == 32
    store, pub = open_publisher(tmp_path, model, ["r0"], sign_key=private)
    refit.save(tmp_path / "r0.safetensors", model, dtypes=SYNTH_DTYPES)
    _, other_public = refit.generate_signing_key()
    wrong = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                           state_dir=tmp_path / "st", verify_key=other_public)
    target = perturb(model, 1)
    future = pub.publish_async(1, target)
    with pytest.raises(refit.AuthenticationError):
        wrong.sync(1, timeout=10)
    right = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                           state_dir=tmp_path / "st", verify_key=public)
    assert right.sync(1, timeout=30).active_version == 1
    assert future.result(timeout=30).committed
    got = refit.load(tmp_path / "r0.safetensors")
    assert_holds(got, target)
    with pytest.raises(refit.InvalidArgumentError):
        refit.Receiver(store, member="r1", checkpoint_dir=tmp_path / "r0.safetensors",
                       state_dir=tmp_path / "st1", verify_key=b"short")
    pub.close()


def test_memory_baselines_need_cuda_tensors(tmp_path):
    model = synthetic_model(seed=9)
    store = str(tmp_path / "store")
    # No baseline= and host tensors: a checkpoint baseline is needed.
    with pytest.raises(refit.InvalidArgumentError, match="baseline="):
        refit.Publisher(store, members=["r0"], initial=model, dtypes=SYNTH_DTYPES)
    with pytest.raises(refit.InvalidArgumentError, match="baseline_memory"):
        refit.Publisher(store, members=["r0"], initial=model, baseline_memory="gpu")
    with pytest.raises(refit.InvalidArgumentError, match="not baseline="):
        refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=["r0"],
                        initial=model, baseline_memory="device")
    # A baseline in device memory takes CUDA tensors (or needs the CUDA module).
    with pytest.raises((refit.InvalidArgumentError, refit.Error),
                       match="host memory|CUDA module"):
        refit.Publisher(store, members=["r0"], initial=model, dtypes=SYNTH_DTYPES,
                        baseline_memory="device")
    assert not os.path.exists(os.path.join(store, "head"))


def test_two_phase_host_receiver_prepares_without_writing(tmp_path):
    model = synthetic_model(seed=9)
    store, pub = open_publisher(tmp_path, model, ["w0"])
    rcv, mine = two_phase_receiver(store, "w0", model)
    assert rcv.two_phase and not rcv.prepared
    assert rcv.prepare() is False  # nothing published yet
    with pytest.raises(refit.Error, match="nothing prepared"):
        rcv.activate()
    current = model
    for v in (1, 2, 3):
        target = perturb(current, v)
        future = pub.publish_async(v, target)
        assert rcv.prepare(timeout=30) is True  # voted ready, committed
        assert future.result(timeout=30).committed
        assert rcv.prepared and rcv.active_version == v - 1
        assert_holds(mine, current)  # the engine still serves the active version
        report = rcv.activate()
        assert report.committed_versions == [v] and rcv.active_version == v
        step = report.steps[-1]
        assert step.pause_seconds > 0 and step.staged_host_bytes > 0
        assert step.seal_seconds > 0
        assert step.after_hash_seconds == 0  # one publisher: the manifest has them
        assert_holds(mine, target)
        current = target
    # sync() is prepare + activate.
    target = perturb(current, 4)
    future = pub.publish_async(4, target)
    assert rcv.sync(4, timeout=30).committed_versions == [4]
    assert future.result(timeout=30).committed
    assert_holds(mine, target)
    plain = refit.Receiver(store, member="w1", tensors={n: a.copy() for n, a in model.items()},
                           dtypes=SYNTH_DTYPES)
    with pytest.raises(refit.Error, match="two-phase"):
        plain.prepare()
    plain.close()
    rcv.close()
    pub.close()


def test_pausing_engine_adapter_activates_between_batches(tmp_path):
    from refit.adapters import PausingEngine
    model = synthetic_model(seed=10)
    store, pub = open_publisher(tmp_path, model, ["e0"])
    rcv, mine = two_phase_receiver(store, "e0", model, poll_interval=0.005)
    with pytest.raises(refit.InvalidArgumentError, match="two-phase"):
        PausingEngine(refit.Receiver(store, member="x", tensors=dict(mine), dtypes=SYNTH_DTYPES))
    current = model
    with PausingEngine(rcv, poll_interval=0.005) as engine:
        assert engine.activate_if_ready() is None
        for v in (1, 2):
            target = perturb(current, v)
            future = pub.publish_async(v, target)
            report = None
            for _ in range(6000):  # the engine's batches
                report = engine.activate_if_ready()
                if report is not None:
                    break
                assert_holds(mine, current)  # between activations it serves one version
                time.sleep(0.005)
            assert report is not None and report.committed_versions == [v]
            assert future.result(timeout=30).committed
            assert_holds(mine, target)
            current = target
    rcv.close()
    pub.close()


def test_conditional_chunks_reach_cpu_receivers(qwen, tmp_path):
    """Publisher(conditional=True): versions may carry conditional XOR chunks
    (kind 5), which checkpoint receivers apply bit for bit; they make the
    fixture steps' uploads smaller."""
    uploaded = {}
    for conditional in (False, True):
        root = tmp_path / ("cond" if conditional else "plain")
        root.mkdir()
        store = str(root / "store")
        base = writable_copy(qwen / "step0.safetensors", root / "baseline.safetensors")
        (root / "r0").mkdir()
        ckpt = writable_copy(qwen / "step0.safetensors", root / "r0" / "model.safetensors")
        pub = refit.Publisher(store, baseline=base, members=["r0"], vote_timeout=30,
                              conditional=conditional)
        rcv = refit.Receiver(store, member="r0", checkpoint_dir=root / "r0")
        uploaded[conditional] = 0
        kinds = {}
        for step in (1, 2):
            target = refit.load(qwen / f"step{step}.safetensors")
            future = pub.publish_async(step, {n: np.array(a) for n, a in target.items()})
            assert rcv.sync(step, timeout=30).active_version == step
            report = future.result(timeout=30)
            assert report.committed
            uploaded[conditional] += report.bytes_uploaded
            for k, n in report.diff.chunks_by_kind.items():
                kinds[k] = kinds.get(k, 0) + n
        assert ("conditional-xor" in kinds) == conditional
        assert_holds(refit.load(ckpt), refit.load(qwen / "step2.safetensors"))
        pub.close()
    assert uploaded[True] < 0.9 * uploaded[False], uploaded


def test_conditional_needs_a_file_baseline(tmp_path):
    model = synthetic_model(3)
    with pytest.raises(refit.InvalidArgumentError, match="conditional"):
        refit.Publisher(str(tmp_path / "store"), initial=model, members=["r0"],
                        baseline_memory="device", conditional=True)


def test_chunk_packs_reach_receivers(tmp_path):
    model = synthetic_model(seed=7)
    store, pub = open_publisher(tmp_path, model, ["r"], pack_bytes=1 << 20, chunk_bytes=64 << 10)
    mine = {n: a.copy() for n, a in model.items()}
    rcv = refit.Receiver(store, member="r", tensors=mine, dtypes=SYNTH_DTYPES)
    target = perturb(model, 8)
    future = pub.publish_async(1, target)
    report = rcv.sync(1, timeout=30)
    assert future.result(timeout=30).committed
    assert report.active_version == 1
    assert_holds(mine, target)
    # Several chunks, fewer objects: packs hold the small ones together.
    chunks = os.listdir(os.path.join(store, "v", "00000000000000000001", "chunk"))
    assert 0 < len(chunks) < future.result().diff.chunks
    with pytest.raises(refit.InvalidArgumentError, match="pack_bytes"):
        refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=["r"],
                        pack_bytes=-1)
