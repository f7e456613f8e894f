"""The GPU receiver's pause at scale: a synthetic BF16 model of --gib GiB in
GPU memory (256 MiB tensors of random bits), stepped by flipping low
mantissa bits of a fraction of the elements as an optimizer step does,
published from device memory and received by a two-phase receiver in the
same process (another thread) through a directory store.

    PYTHONPATH=<package> python3 python/bench/pause_gpu.py --gib 32 \\
        --rates 0.01,0.03 --json out.json

Per rate: the receiver's pause (activate: every chunk applied in place and
its range checked to "after"), its kernels' GPU span, and in the same run
the floors it is measured against: one pass of the range hash over the
model on the GPU (the after-hash check reads every chunk's range, which at
these rates is the whole model) and a device-to-device copy of the model.
The in-place scatter's floor is refit_gpu_bench's (--floor-only 1).
"""

import argparse
import concurrent.futures
import json
import statistics
import tempfile
import time

import torch

import refit
from refit import _native


def model(gib, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = gib * 4  # 256 MiB tensors
    return {f"t{i:03d}.weight": torch.randint(-2**15, 2**15, (8192, 16384), generator=g,
                                              device="cuda", dtype=torch.int32)
            .to(torch.int16).view(torch.bfloat16) for i in range(n)}


def step(weights, rate, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for t in weights.values():
        bits = t.view(torch.int16)
        mask = torch.rand(bits.shape, generator=g, device="cuda") < rate
        bits ^= (mask.to(torch.int16) * 3)


def timed(fn, reps=5):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=32)
    ap.add_argument("--rates", default="0.01,0.03")
    ap.add_argument("--versions", type=int, default=3, help="per rate")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="refit-pause-")
    trainer = model(args.gib, 1)
    engine = {n: t.clone() for n, t in trainer.items()}
    copy = {n: torch.empty_like(t) for n, t in trainer.items()}
    out = {"gib": args.gib, "gpu": torch.cuda.get_device_name(),
           "d2d_copy_ms": timed(lambda: [copy[n].copy_(t) for n, t in trainer.items()]),
           "hash_ms": timed(lambda: _native.range_hashes_cuda(
               [(n, "BF16", t.__dlpack__()) for n, t in engine.items()])),
           "rates": []}
    del copy
    store = f"{work}/store"
    pub = refit.Publisher(store, members=["r"], initial=trainer, vote_timeout=120)
    rcv = refit.Receiver(store, member="r", tensors=engine, poll_interval=0.002,
                         staging_bytes=4 << 30)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    v = 0
    for rate in (float(r) for r in args.rates.split(",")):
        rows = []
        for _ in range(args.versions):
            v += 1
            step(trainer, rate, v)
            f = pool.submit(rcv.prepare, v, timeout=300)
            report = pub.publish(v, trainer)
            assert report.committed and f.result()
            t = time.perf_counter()
            s = rcv.activate().steps[-1]
            wall = time.perf_counter() - t
            rows.append({"version": v, "changed_percent": report.changed_percent,
                         "pause_ms": s.pause_seconds * 1000, "pause_wall_ms": wall * 1000,
                         "kernel_ms": s.pause_kernel_ms, "staged_device": s.staged_device_bytes,
                         "staged_host": s.staged_host_bytes, "chunks": s.chunks_applied})
            print(f"rate {rate}: v{v} changed {report.changed_percent:.2f}% pause "
                  f"{rows[-1]['pause_ms']:.2f} ms (kernels {s.pause_kernel_ms:.2f} ms)",
                  flush=True)
        out["rates"].append({"rate": rate, "versions": rows})
    exact = all(torch.equal(engine[n].view(torch.int16), trainer[n].view(torch.int16))
                for n in trainer)
    out["bit_exact"] = exact
    print(f"{args.gib} GiB: hash pass {out['hash_ms']:.2f} ms, D2D copy "
          f"{out['d2d_copy_ms']:.2f} ms, bit-exact {exact}")
    for r in out["rates"]:
        p = statistics.median(x["pause_ms"] for x in r["versions"][1:] or r["versions"])
        print(f"rate {r['rate']}: pause median {p:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    rcv.close()
    pub.close()


if __name__ == "__main__":
    main()
