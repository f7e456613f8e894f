"""refit.apply into CUDA tensors: on the GPU (zero-copy) vs through host memory.

    PYTHONPATH=<package> python3 python/bench/cuda_apply.py --gib 2 --rate 0.01 --reps 5

A synthetic BF16 model of --gib GiB (tensors of 256 MiB, random bits) lives
in CUDA memory; the delta of a step flips the lowest bit of --rate of the
elements of every tensor (made on the host with refit.diff). Each
repetition starts from the base (a device-to-device copy, not timed) and
applies the delta:
- gpu: refit.apply(delta, cuda_tensors), the GPU receiver writing the
  tensors where they live;
- host: the same call with the GPU path switched off, i.e. what a build
  without the CUDA module does: copy every tensor to host memory, apply
  there, copy back the tensors the delta changes (here: all).
Both results are checked bit for bit against the target. Medians.
"""

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch

import refit
from refit import _native


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--rate", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    assert _native.has_cuda, "this extension was built without the CUDA module"
    per = 128 << 20  # BF16 elements per tensor (256 MiB)
    count = max(1, int(args.gib * (1 << 30) / (2 * per)))
    rng = np.random.default_rng(0)
    base, target = {}, {}
    for i in range(count):
        a = rng.integers(0, 1 << 16, size=(per // 4096, 4096), dtype=np.uint16)
        b = a.copy()
        idx = rng.choice(a.size, size=int(a.size * args.rate), replace=False)
        b.reshape(-1)[idx] ^= 1
        base[f"model.layers.{i}.w"] = a
        target[f"model.layers.{i}.w"] = b
    with tempfile.TemporaryDirectory() as work:
        delta = os.path.join(work, "d")
        t0 = time.perf_counter()
        rep = refit.diff({n: refit.as_dtype(a, "BF16") for n, a in base.items()}, target, delta)
        diff_s = time.perf_counter() - t0
        dev_base = {n: torch.from_numpy(a).view(torch.bfloat16).cuda() for n, a in base.items()}
        dev_target = {n: torch.from_numpy(a).view(torch.bfloat16).cuda() for n, a in target.items()}
        work_t = {n: torch.empty_like(t) for n, t in dev_base.items()}
        times = {"gpu": [], "host": []}
        for _ in range(args.reps):
            for mode in ("gpu", "host"):
                for n in work_t:
                    work_t[n].copy_(dev_base[n])
                torch.cuda.synchronize()
                _native.has_cuda = mode == "gpu"
                t0 = time.perf_counter()
                refit.apply(delta, work_t)
                torch.cuda.synchronize()
                times[mode].append(time.perf_counter() - t0)
                _native.has_cuda = True
                # Bits, not values: random bit patterns include NaNs.
                assert all(torch.equal(work_t[n].view(torch.int16), dev_target[n].view(torch.int16))
                           for n in work_t), mode
    total = count * per * 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {count} x 256 MiB BF16 "
          f"= {total / (1 << 30):.2f} GiB, rate {args.rate}, delta {rep.file_bytes / 1e6:.1f} MB "
          f"({rep.changed_percent:.2f}% changed; diff on the host {diff_s:.2f} s), "
          f"{args.reps} reps, medians")
    g, h = statistics.median(times["gpu"]), statistics.median(times["host"])
    print(f"apply on the GPU (in place):      {g * 1000:8.1f} ms")
    print(f"apply through host memory:        {h * 1000:8.1f} ms   ({h / g:.1f}x)")


if __name__ == "__main__":
    main()
