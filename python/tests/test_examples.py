"""The examples run as documented (those that need only NumPy)."""

import pathlib
import subprocess
import sys

import numpy as np

import refit
from conftest import SYNTH_DTYPES, perturb, synthetic_model

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_quickstart(tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "every receiver holds version 3 bit for bit" in out.stdout


def test_receive_http_example(engine, tmp_path):
    model = synthetic_model(seed=2)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=["e0"],
                          initial=model, dtypes=SYNTH_DTYPES, vote_timeout=60)
    (tmp_path / "engine").mkdir()
    refit.save(tmp_path / "engine" / "model.safetensors", model, dtypes=SYNTH_DTYPES)
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "receive_http.py"), "--store", store, "--member", "e0",
         "--checkpoint", str(tmp_path / "engine"), "--url", engine.url, "--until", "2",
         "--poll", "0.05", "--payload", '{"model_path": "{checkpoint}", "tag": "v{version}"}'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for step in (1, 2):
            model = perturb(model, step)
            assert pub.publish(step, model).committed
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, stderr
    # One reload per sync that committed something: v1 then v2, or just v2
    # when both versions landed within one sync.
    assert [c[1]["tag"] for c in engine.calls] in (["v1", "v2"], ["v2"])
    assert engine.calls[-1][1]["model_path"] == str(tmp_path / "engine")
    for n in model:
        assert np.array_equal(engine.calls[-1][2][n], model[n])
    assert "version 2" in stdout
    pub.close()
