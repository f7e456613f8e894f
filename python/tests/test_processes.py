"""A publisher and two receivers in separate processes, through a directory store."""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

import refit

ROLES = pathlib.Path(__file__).with_name("roles.py")
DEADLINE_S = 120


def test_publisher_and_two_receiver_processes(qwen, tmp_path):
    store = str(tmp_path / "store")
    shutil.copy(qwen / "step0.safetensors", tmp_path / "baseline.safetensors")
    os.chmod(tmp_path / "baseline.safetensors", 0o644)
    members = ["r0", "r1"]
    for m in members:
        (tmp_path / m).mkdir()
        shutil.copy(qwen / "step0.safetensors", tmp_path / m / "model.safetensors")
        os.chmod(tmp_path / m / "model.safetensors", 0o644)
    procs = {}
    try:
        for m in members:
            procs[m] = subprocess.Popen(
                [sys.executable, str(ROLES), "receive", store, m, str(tmp_path / m), "3"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs["pub"] = subprocess.Popen(
            [sys.executable, str(ROLES), "publish", store, str(tmp_path / "baseline.safetensors"),
             str(qwen), ",".join(members), "3"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out = {}
        for name, p in procs.items():
            stdout, stderr = p.communicate(timeout=DEADLINE_S)
            assert p.returncode == 0, f"{name} failed:\n{stderr}"
            out[name] = [json.loads(line) for line in stdout.splitlines()]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)

    assert [r["version"] for r in out["pub"]] == [1, 2, 3]
    assert all(r["committed"] for r in out["pub"])
    for v in (1, 2, 3):
        before = refit.load(qwen / f"step{v - 1}.safetensors")
        after = refit.load(qwen / f"step{v}.safetensors")
        changed = [n for n in after if not np.array_equal(before[n], after[n])]
        digest = hashlib.sha256()
        for n in changed:
            digest.update(n.encode())
            digest.update(after[n].tobytes())
        for m in members:
            line = out[m][v - 1]
            assert line["version"] == v and line["committed"] == [v]
            assert sorted(line["changed"]) == sorted(changed)
            assert line["sha256"] == digest.hexdigest(), (m, v)
    final = refit.load(qwen / "step3.safetensors")
    for m in members:
        got = refit.load(tmp_path / m)
        for n in final:
            assert np.array_equal(got[n], final[n]), (m, n)
