"""Receiver -> engine reload over HTTP (SGLang-style POST /update_weights_from_disk),
against a small local server (conftest.py, the `engine` fixture)."""

import numpy as np
import pytest

import refit
from refit.adapters import HttpReload
from conftest import SYNTH_DTYPES, perturb, synthetic_model


def make_store(tmp_path, members):
    model = synthetic_model(seed=11)
    store = str(tmp_path / "store")
    pub = refit.Publisher(store, baseline=tmp_path / "b.safetensors", members=members,
                          initial=model, dtypes=SYNTH_DTYPES, vote_timeout=30)
    (tmp_path / "engine").mkdir()
    refit.save(tmp_path / "engine" / "model.safetensors", model, dtypes=SYNTH_DTYPES)
    return model, store, pub


def test_reload_after_commit_sees_the_new_weights(engine, tmp_path):
    model, store, pub = make_store(tmp_path, ["e0"])
    hook = HttpReload(engine.url)
    rcv = refit.Receiver(store, member="e0", checkpoint_dir=tmp_path / "engine", on_commit=hook)
    assert rcv.sync().steps == [] and engine.calls == []  # nothing committed, no call
    for step in (1, 2):
        target = perturb(model, step)
        future = pub.publish_async(step, target)
        rcv.sync(step, timeout=30)
        assert future.result(timeout=30).committed
        path, body, loaded = engine.calls[-1]
        assert path == "/update_weights_from_disk"
        assert body == {"model_path": str(tmp_path / "engine")}
        for n in model:  # the checkpoint was complete when the engine was told
            assert np.array_equal(loaded[n], target[n]), n
        model = target
    assert len(engine.calls) == 2
    assert hook.last_response["success"] is True
    pub.close()


def test_custom_payload_and_failures(engine, tmp_path):
    model, store, pub = make_store(tmp_path, ["e0"])
    hook = HttpReload(engine.url, payload=lambda r: {"model_path": r.checkpoint_dir,
                                                      "load_format": "auto",
                                                      "version": r.active_version})
    rcv = refit.Receiver(store, member="e0", checkpoint_dir=tmp_path / "engine", on_commit=[hook])
    future = pub.publish_async(1, perturb(model, 1))
    rcv.sync(1, timeout=30)
    future.result(timeout=30)
    assert engine.calls[-1][1]["version"] == 1 and engine.calls[-1][1]["load_format"] == "auto"
    # The engine refuses: the version stays committed, the hook raises.
    engine.answer = {"success": False, "message": "out of memory"}
    future = pub.publish_async(2, perturb(model, 2))
    with pytest.raises(refit.TransportError, match="out of memory"):
        rcv.sync(2, timeout=30)
    assert future.result(timeout=30).committed and rcv.active_version == 2
    engine.status = 500
    with pytest.raises(refit.TransportError, match="HTTP 500"):
        hook(rcv.sync())
    with pytest.raises(refit.TransportError, match="failed"):
        HttpReload("http://127.0.0.1:9/update_weights_from_disk", timeout=5)(rcv.sync())
    with pytest.raises(refit.InvalidArgumentError):
        HttpReload("ftp://x")
    pub.close()
