"""Publisher and receiver through an s3:// store (moto_server, started here on
127.0.0.1; skipped when moto_server is not on PATH, as the C++ S3 tests are)."""

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import refit
from conftest import SYNTH_DTYPES, perturb, synthetic_model


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def moto(tmp_path, monkeypatch):
    exe = shutil.which("moto_server")
    if exe is None:
        pytest.skip("moto_server is not on PATH (pip install 'moto[server]')")
    port = free_port()
    log = open(tmp_path / "moto.log", "w")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:  # moto accepts an unsigned bucket creation
                urllib.request.urlopen(urllib.request.Request(f"{endpoint}/refit-py",
                                                              method="PUT"), timeout=2)
                break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start: " +
                                       (tmp_path / "moto.log").read_text()[-2000:])
                time.sleep(0.1)
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_REGION": "us-east-1"}.items():
            monkeypatch.setenv(k, v)
        yield endpoint
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def test_publish_and_receive_through_s3(moto, tmp_path):
    store = f"s3://refit-py/run1?endpoint={moto}"
    model = synthetic_model(seed=9)
    pub = refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=["r0"],
                          initial=model, dtypes=SYNTH_DTYPES, vote_timeout=30)
    mine = {n: a.copy() for n, a in model.items()}
    rcv = refit.Receiver(store, member="r0", tensors=mine, dtypes=SYNTH_DTYPES,
                         state_dir=tmp_path / "r0")
    for step in (1, 2):
        model = perturb(model, step)
        future = pub.publish_async(step, model)
        assert rcv.sync(step, timeout=60).active_version == step
        assert future.result(timeout=60).committed
        for n in model:
            assert np.array_equal(mine[n], model[n]), n
    pub.close()
    rcv.close()
