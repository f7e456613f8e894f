"""refit's Python API end to end with NumPy only (no PyTorch needed).

    PYTHONPATH=build/dev/python /usr/bin/python3 examples/quickstart.py [WORKDIR]

1. files: diff two versions of a model held in memory, inspect the delta,
   apply it in place to a third copy;
2. sync: a publisher and two receivers (threads here; separate processes or
   hosts in real use) share a directory store; each version is applied,
   voted on and committed, and the receivers report what changed.
"""

import concurrent.futures
import sys
import tempfile

import numpy as np

import refit


def make_model(rng):
    # BF16 weights held as their bit patterns (uint16), plus an FP32 norm.
    return {
        "model.embed_tokens.weight": rng.integers(0, 1 << 16, (512, 64), dtype=np.uint16),
        "model.layers.0.mlp.up_proj.weight": rng.integers(0, 1 << 16, (128, 64), dtype=np.uint16),
        "model.norm.weight": rng.standard_normal(64).astype(np.float32),
    }


def train_step(model, rng, rate=0.02):
    """Flips a few low bits, like an RL step at a small learning rate."""
    for name, a in model.items():
        bits = a.reshape(-1).view(np.dtype(f"u{a.itemsize}"))
        idx = rng.choice(bits.size, max(1, int(bits.size * rate)), replace=False)
        bits[idx] ^= 1


def main(work):
    rng = np.random.default_rng(0)
    dtypes = {"model.embed_tokens.weight": "BF16", "model.layers.0.mlp.up_proj.weight": "BF16",
              "model.norm.weight": "F32"}
    model = make_model(rng)
    v0 = {n: a.copy() for n, a in model.items()}

    # 1. Files.
    train_step(model, rng)
    report = refit.diff({n: refit.as_dtype(a, dtypes[n]) for n, a in v0.items()}, model,
                        f"{work}/v1.delta")
    print(f"diff: {report.changed_percent:.2f}% changed, {report.file_bytes} delta bytes "
          f"for {report.full_bytes} bytes of weights")
    info = refit.inspect(f"{work}/v1.delta")
    print(f"inspect: version {info.version} from {info.base_version}, kinds {info.kinds}")
    replica = {n: a.copy() for n, a in v0.items()}
    refit.apply(f"{work}/v1.delta", replica)  # writes into replica's arrays
    assert all(np.array_equal(replica[n], model[n]) for n in model)
    print("apply: replica equals version 1")

    # 2. Sync through a directory store.
    store = f"{work}/store"
    pub = refit.Publisher(store, baseline=f"{work}/baseline.safetensors", members=["r0", "r1"],
                          initial=v0, dtypes=dtypes)
    receivers = []
    for member in ("r0", "r1"):
        refit.save(f"{work}/{member}.safetensors", v0, dtypes=dtypes)
        receivers.append(refit.Receiver(store, member=member,
                                        checkpoint_dir=f"{work}/{member}.safetensors"))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for step in (1, 2, 3):
            if step > 1:
                train_step(model, rng)
            future = pub.publish_async(step, model)  # copies, so training may go on
            reports = list(pool.map(lambda r: r.sync(step, timeout=60), receivers))
            pub_report = future.result(timeout=60)
            print(f"version {step}: committed={pub_report.committed} "
                  f"changed={pub_report.changed_percent:.2f}% "
                  f"uploaded={pub_report.bytes_uploaded} B, receivers changed "
                  f"{reports[0].changed_tensors}")
    for r in receivers:
        got = dict(r.tensors())
        assert all(np.array_equal(got[n], model[n]) for n in model)
    pub.close()
    print("every receiver holds version 3 bit for bit")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
