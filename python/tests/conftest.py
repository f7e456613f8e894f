"""Shared fixtures: the qwen2-tiny checkpoints and small synthetic models."""

import http.server
import json
import os
import pathlib
import threading

import numpy as np
import pytest

import refit


def fixtures_dir() -> pathlib.Path:
    env = os.environ.get("REFIT_FIXTURES_DIR")
    base = pathlib.Path(env) if env else pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
    return base / "qwen2-tiny"


@pytest.fixture(scope="session")
def qwen():
    d = fixtures_dir()
    if not (d / "step0.safetensors").exists():
        pytest.skip(f"fixture checkpoints not found in {d} (set REFIT_FIXTURES_DIR)")
    return d


def synthetic_model(seed: int = 0, rows: int = 64):
    """A few tensors of several dtypes, as named NumPy arrays (BF16 as uint16 bits)."""
    rng = np.random.default_rng(seed)
    return {
        "model.embed.weight": rng.integers(0, 1 << 16, size=(rows, 32), dtype=np.uint16),
        "model.layers.0.mlp.weight": rng.standard_normal((rows, 16)).astype(np.float32),
        "model.layers.0.norm.weight": rng.integers(0, 1 << 16, size=(32,), dtype=np.uint16),
        "model.layers.0.q.weight": rng.integers(0, 256, size=(rows, 8), dtype=np.uint8),
    }


SYNTH_DTYPES = {
    "model.embed.weight": "BF16",
    "model.layers.0.mlp.weight": "F32",
    "model.layers.0.norm.weight": "BF16",
    "model.layers.0.q.weight": "F8_E4M3",
}


def perturb(model, step: int, rate: float = 0.02):
    """A copy of `model` with about `rate` of each tensor's elements changed in their low bits."""
    rng = np.random.default_rng(1000 + step)
    out = {}
    for name, a in model.items():
        b = a.copy()
        flat = b.reshape(-1).view(np.dtype(f"u{a.itemsize}"))
        n = max(1, int(flat.size * rate))
        idx = rng.choice(flat.size, size=n, replace=False)
        flat[idx] ^= flat.dtype.type(1 + step % 3)
        out[name] = b
    return out


class Engine(http.server.ThreadingHTTPServer):
    """Records reload calls; on each, reads the checkpoint it is told to load."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.calls = []
        self.answer = {"success": True, "message": "Succeeded to update model weights."}
        self.status = 200

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/update_weights_from_disk"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        loaded = None
        if "model_path" in body:
            ck = refit.load(body["model_path"])
            loaded = {n: np.array(ck[n]) for n in ck}
        self.server.calls.append((self.path, body, loaded))
        data = json.dumps(self.server.answer).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def engine():
    server = Engine()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)
