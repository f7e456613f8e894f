"""Versions published by several trainer ranks (docs/trainer.md): each rank
passes its local tensors in its own layout (a column shard, a replicated
bias, an FP32 master cast to BF16), a Coordinator decides each version
once every rank reported (assembling it from a baseline, or directly:
receivers apply the ranks' chunks), and receivers end bit-exact with the
canonical model."""

import json
import os
import threading

import numpy as np
import pytest

import refit


def bf16(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def piece(canon, rows, cols, local, canon_map):
    return {"canonical": canon, "rows": rows, "cols": cols, "local": local, "canon": canon_map}


LAYOUT = {
    "format": "refit-layout", "version": 1,
    "canonical": [
        {"name": "b", "dtype": "BF16", "shape": [6]},
        {"name": "v", "dtype": "BF16", "shape": [4, 6]},
        {"name": "w", "dtype": "BF16", "shape": [8, 6]},
    ],
    "ranks": [
        {"rank": 0, "tensors": [
            {"name": "w0", "dtype": "BF16", "shape": [8, 3],
             "pieces": [piece("w", 8, 3, [0, 3, 1], [0, 6, 1])]},
            {"name": "bias", "dtype": "BF16", "shape": [6],
             "pieces": [piece("b", 1, 6, [0, 6, 1], [0, 6, 1])]}]},
        {"rank": 1, "tensors": [
            {"name": "w1", "dtype": "BF16", "shape": [8, 3],
             "pieces": [piece("w", 8, 3, [0, 3, 1], [3, 6, 1])]},
            {"name": "bias", "dtype": "BF16", "shape": [6],
             "pieces": [piece("b", 1, 6, [0, 6, 1], [0, 6, 1])]},
            {"name": "m", "dtype": "F32", "shape": [4, 6],
             "pieces": [piece("v", 4, 6, [0, 6, 1], [0, 6, 1])]}]},
    ],
}


def canonical(s):
    return {"w": np.concatenate([s["w0"], s["w1"]], axis=1), "b": s["bias"], "v": bf16(s["m"])}


def local(s, rank):
    if rank == 0:
        return {"w0": s["w0"], "bias": s["bias"]}
    return {"w1": s["w1"], "bias": s["bias"], "m": s["m"]}


def run_all(tasks):
    """Runs the named callables of `tasks` on threads at once; their results by name."""
    results, errors = {}, []

    def run(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # reported below
            errors.append((name, e))

    threads = [threading.Thread(target=run, args=item) for item in tasks.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a participant hung"
    assert not errors, errors
    return results


@pytest.mark.parametrize("pack_bytes", [0, 4096], ids=["unpacked", "packed"])
@pytest.mark.parametrize("direct", [False, True], ids=["assembled", "direct"])
def test_ranks_publish_parts_and_receivers_follow(tmp_path, direct, pack_bytes):
    rng = np.random.default_rng(1)
    state = {"w0": rng.integers(0, 1 << 16, (8, 3), dtype=np.uint16),
             "w1": rng.integers(0, 1 << 16, (8, 3), dtype=np.uint16),
             "bias": rng.integers(0, 1 << 16, 6, dtype=np.uint16),
             "m": rng.normal(0, 0.02, (4, 6)).astype(np.float32)}
    base = tmp_path / "baseline.safetensors"
    refit.save(base, canonical(state), dtypes="BF16")
    members = ["r0", "r1"]
    for m in members:
        refit.copy_checkpoint(base, tmp_path / f"{m}.safetensors")
    store = str(tmp_path / "store")
    key = b"k" * 32
    layout_file = tmp_path / "layout.json"
    layout_file.write_text(json.dumps(LAYOUT))

    # A two-phase receiver of host tensors votes beside the checkpoints.
    voters = members + ["h0"]
    if direct:
        # No baseline: receivers apply the ranks' chunks (rank 0's column
        # block of w is a strided region); the checkpoint gives the first
        # version's tensor table only.
        coordinator = refit.Coordinator(store, members=voters, ranks=[0, 1], table=base,
                                        key=key, vote_timeout=30, parts_timeout=30)
    else:
        coordinator = refit.Coordinator(store, baseline=base, members=voters, ranks=[0, 1],
                                        key=key, vote_timeout=30, parts_timeout=30)
    assert coordinator.direct == direct
    # Rank 0 starts from the canonical checkpoint, rank 1 from its own tensors.
    ranks = [refit.Publisher(store, layout=layout_file, rank=0, baseline=base, key=key,
                             decision_timeout=30, pack_bytes=pack_bytes),
             refit.Publisher(store, layout=LAYOUT, rank=1, initial=local(state, 1), key=key,
                             decision_timeout=30, pack_bytes=pack_bytes)]
    receivers = [refit.Receiver(store, member=m, checkpoint_dir=tmp_path / f"{m}.safetensors",
                                key=key, decision_timeout=30) for m in members]
    held = {n: a.copy() for n, a in canonical(state).items()}
    receivers.append(refit.Receiver(store, member="h0", tensors=held, dtypes="BF16",
                                    two_phase=True, key=key, decision_timeout=30))

    for version in (1, 2):
        state["w0"] = state["w0"].copy()
        state["w0"][rng.integers(0, 8), rng.integers(0, 3)] ^= 1
        state["w1"] = state["w1"].copy()
        state["w1"][rng.integers(0, 8), :] ^= 3
        state["m"] = state["m"] * np.float32(1.01)
        tasks = {"coordinator": lambda: coordinator.publish(version)}
        tasks.update({f"rank{r}": (lambda r=r: ranks[r].publish(version, local(state, r)))
                      for r in (0, 1)})
        tasks.update({m: (lambda rc=rc: rc.sync(version)) for m, rc in zip(voters, receivers)})
        results = run_all(tasks)
        step = results["h0"].steps[-1]
        # The two-phase receiver computed the tensors' hashes after a direct
        # version itself, before voting.
        assert (step.after_hash_seconds > 0) == direct and step.seal_seconds > 0
        report, parts = results["coordinator"]
        if direct:
            assert report["committed"], report["reason"]
            assert coordinator.parts_stored(version) == [0, 1]
        else:
            assert report.committed
        assert parts["chunks"] > 0
        # Packed: each rank's part is fewer objects than chunks.
        objects = sum(len(os.listdir(os.path.join(store, "parts", d, r, "chunk")))
                      for d in os.listdir(os.path.join(store, "parts"))
                      if int(d) == version
                      for r in os.listdir(os.path.join(store, "parts", d)))
        assert (objects < parts["chunks"]) == bool(pack_bytes)
        for r in (0, 1):
            assert results[f"rank{r}"]["committed"] is True
        assert results["rank1"]["changed_residual"] > 0
        # A checkpoint receiver's step says where its time went.
        step = [s for s in results["r0"].steps if s.version == version][-1]
        assert set(step.stages) == {"base_check", "fetch", "chunk_wait", "apply_wait",
                                    "apply_cpu", "check", "flush", "vote", "decision_wait",
                                    "activate"}
        assert all(v >= 0 for v in step.stages.values()) and step.stages["vote"] > 0
        want = canonical(state)
        for m in members:
            got = refit.load(tmp_path / f"{m}.safetensors")
            for name, arr in want.items():
                np.testing.assert_array_equal(np.asarray(got[name]).view(np.uint16).reshape(arr.shape), arr)
        for name, arr in want.items():
            np.testing.assert_array_equal(held[name].view(np.uint16).reshape(arr.shape), arr)


def test_rank_publisher_refuses_unknown_rank_and_missing_baseline(tmp_path):
    with pytest.raises(refit.InvalidArgumentError, match="no rank 5"):
        refit.Publisher(str(tmp_path / "store"), layout=LAYOUT, rank=5, initial={})
    with pytest.raises(refit.InvalidArgumentError, match="baseline= "):
        refit.Publisher(str(tmp_path / "store"), layout=LAYOUT, rank=0)


def test_direct_coordinator_refuses_assembling_options(tmp_path):
    with pytest.raises(refit.InvalidArgumentError, match="staging="):
        refit.Coordinator(str(tmp_path / "store"), members=["r0"], ranks=[0],
                          staging=tmp_path / "s")


def test_rank_publisher_baseline_memory_is_checked(tmp_path):
    rng = np.random.default_rng(3)
    state = {"w1": rng.integers(0, 1 << 16, (8, 3), dtype=np.uint16),
             "bias": rng.integers(0, 1 << 16, 6, dtype=np.uint16),
             "m": rng.normal(0, 0.02, (4, 6)).astype(np.float32)}
    store = str(tmp_path / "store")
    with pytest.raises(refit.InvalidArgumentError, match="baseline_memory must be"):
        refit.Publisher(store, layout=LAYOUT, rank=1, initial=state, baseline_memory="pinned")
    # The GPU rank encoder takes CUDA tensors of one device.
    with pytest.raises(refit.InvalidArgumentError, match="one CUDA device"):
        refit.Publisher(store, layout=LAYOUT, rank=1, initial=state, baseline_memory="device")
    assert not refit.Publisher(store, layout=LAYOUT, rank=1, initial=state).on_device


SPLIT_FP8_LAYOUT = {
    "format": "refit-layout", "version": 1,
    "canonical": [
        {"name": "q", "dtype": "F8_E4M3", "shape": [4, 8], "scale": "q_scale",
         "scale_kind": "per_tensor"},
        {"name": "q_scale", "dtype": "F32", "shape": []},
    ],
    "ranks": [
        {"rank": r, "tensors": [
            {"name": "q", "dtype": "F32", "shape": [2, 8],
             "pieces": [piece("q", 2, 8, [0, 8, 1], [16 * r, 8, 1])]}]}
        for r in (0, 1)
    ],
}


def e4m3_value(codes):
    c = codes.astype(np.int64)
    e, m = (c >> 3) & 15, (c & 7).astype(np.float64)
    v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    return np.where(c & 0x80, -v, v)


def test_split_per_tensor_scale_takes_the_global_amax(tmp_path):
    # q's FP32 masters are split by rows over two ranks: its per-tensor
    # scale is the amax of both halves, which each rank is given.
    masters = [np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32)]
    base = tmp_path / "base.safetensors"
    # All zeros: codes 0 and scale 1, the reference cast of step 0.
    refit.save(base, {"q": np.zeros((4, 8), np.uint8), "q_scale": np.ones((), np.float32)},
               dtypes={"q": "F8_E4M3"})
    refit.copy_checkpoint(base, tmp_path / "r0.safetensors")
    store = str(tmp_path / "store")
    key = b"k" * 32
    with pytest.raises(refit.InvalidArgumentError, match="must pass the tensor's global amax"):
        refit.Publisher(store, layout=SPLIT_FP8_LAYOUT, rank=0, initial={"q": masters[0]}, key=key)
    ranks = [refit.Publisher(store, layout=SPLIT_FP8_LAYOUT, rank=r, initial={"q": masters[r]},
                             initial_amax={"q": 0.0}, key=key, decision_timeout=30)
             for r in (0, 1)]
    coordinator = refit.Coordinator(store, members=["r0"], ranks=[0, 1], table=base, key=key,
                                    vote_timeout=30, parts_timeout=30)
    receiver = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                              key=key, decision_timeout=30)

    rng = np.random.default_rng(4)
    masters = [rng.normal(0, 0.02, (2, 8)).astype(np.float32) for _ in (0, 1)]
    masters[1][1, 3] = 0.5  # rank 1 holds the amax
    amax = {"q": float(max(np.abs(m).max() for m in masters))}
    with pytest.raises(refit.InvalidArgumentError, match="'q' is split across ranks"):
        ranks[0].publish(1, {"q": masters[0]})
    tasks = {"coordinator": lambda: coordinator.publish(1), "receiver": lambda: receiver.sync(1)}
    tasks.update({f"rank{r}": (lambda r=r: ranks[r].publish(1, {"q": masters[r]}, amax=amax))
                  for r in (0, 1)})
    results = run_all(tasks)
    report, _ = results["coordinator"]
    assert report["committed"], report["reason"]
    got = refit.load(tmp_path / "r0.safetensors")
    scale = np.float32(amax["q"]) / np.float32(448)
    assert np.asarray(got["q_scale"]).view(np.float32).reshape(()) == scale
    q = np.asarray(got["q"]).view(np.uint8).reshape(4, 8)
    want = np.concatenate(masters) / scale
    np.testing.assert_allclose(e4m3_value(q), want, rtol=1 / 16, atol=2.0 ** -10)
    assert e4m3_value(q).max() == 448  # the amax element, on rank 1
