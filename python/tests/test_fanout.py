"""Fan-out through a process group (refit.FanoutReceiver): three engine
processes in a gloo group, of which only the first reads the store; the
others get the objects over the group, and their votes reach the store
through it. Needs PyTorch with torch.distributed (gloo)."""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import refit

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("this PyTorch has no gloo backend", allow_module_level=True)

ROLES = pathlib.Path(__file__).with_name("roles.py")
DEADLINE_S = 180


def digest_of(path):
    ck = refit.load(path)
    d = hashlib.sha256()
    for name in sorted(ck):
        d.update(name.encode())
        d.update(np.asarray(ck[name]).tobytes())
    return d.hexdigest()


def test_one_member_reads_the_store_and_the_group_follows(qwen, tmp_path):
    store = str(tmp_path / "store")
    shutil.copy(qwen / "step0.safetensors", tmp_path / "baseline.safetensors")
    os.chmod(tmp_path / "baseline.safetensors", 0o644)
    world = 3
    members = [f"r{i}" for i in range(world)]
    pub = refit.Publisher(store, baseline=tmp_path / "baseline.safetensors", members=members,
                          vote_timeout=120)
    procs = []
    try:
        for rank in range(world):
            procs.append(subprocess.Popen(
                [sys.executable, str(ROLES), "fanout", store, str(qwen), str(rank), str(world),
                 str(tmp_path / "pg"), "3"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for v in (1, 2, 3):
            target = refit.load(qwen / f"step{v}.safetensors")
            report = pub.publish(v, {n: np.array(a) for n, a in target.items()})
            assert report.committed, report.reason
            assert not report.dropped
        out = []
        for rank, p in enumerate(procs):
            stdout, stderr = p.communicate(timeout=DEADLINE_S)
            assert p.returncode == 0, f"member {rank} failed:\n{stderr}"
            out.append([json.loads(line) for line in stdout.splitlines()])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for v in (1, 2, 3):
        want = digest_of(qwen / f"step{v}.safetensors")
        for rank in range(world):
            line = out[rank][v - 1]
            assert line["version"] == v
            assert line["sha256"] == want, (rank, v)
    assert [o[-1]["leader"] for o in out] == [True, False, False]
    # The members received the chunks over the group; the leader stored
    # their votes.
    assert all(o[-1]["bytes_broadcast"] > 0 for o in out[1:])
    assert out[0][-1]["objects_forwarded"] >= 2 * 3
    for m in members[1:]:
        assert any(k.startswith(f"v/{'0' * 19}1/vote/{m}") for k in
                   (k for k, _ in refit._native.Store(store).list("v/")))


def test_needs_an_initialized_process_group(tmp_path):
    if torch.distributed.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(refit.InvalidArgumentError, match="init_process_group"):
        refit.FanoutReceiver(str(tmp_path / "s"), member="r0", tensors={})
