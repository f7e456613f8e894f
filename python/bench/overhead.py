"""Overhead of the Python layer against the C++ CLI on the fixture workload.

    PYTHONPATH=build/release/python python3 python/bench/overhead.py \
        --cli build/release/tools/refit/refit --fixtures ../shared/fixtures/qwen2-tiny --reps 15

The workload is the fixture trajectory: diff step0->1, 1->2, 2->3, and apply
each delta to a scratch copy of its base (fsynced). Each operation runs once
through `refit diff` / `refit apply` (a process, as a script would run it)
and once through refit.diff / refit.apply (in this interpreter), interleaved,
`--reps` times; medians are reported. `native` is the time the C++ library
itself reports for the same Python call (DiffReport/ApplyReport.seconds), so
`python - native` is what the binding adds plus the C++ work outside the
library's own timer (opening and mapping files, renaming the delta into
place). `CLI-start` subtracts the CLI's process start-up (`refit --help`,
timed in the same loop). The in-memory rows run the same
work on NumPy arrays (refit.diff of a Checkpoint against arrays,
refit.apply into arrays) for comparison; they have no CLI counterpart.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

_t0 = time.perf_counter()
import refit  # noqa: E402 (timed)

import_ms = 1000 * (time.perf_counter() - _t0)
from refit._tensors import prepare  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-sync", action="store_true",
                    help="apply without msync/fsync on both sides (takes the disk out)")
    args = ap.parse_args()
    fx = args.fixtures
    rows = {}

    def add(key, value):
        rows.setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.reps):
            # Process start-up of the CLI (exec, dynamic linking, option set-up),
            # measured next to the operations so that load changes hit both.
            t, _ = timed(lambda: subprocess.run([args.cli, "--help"], check=True,
                                                stdout=subprocess.DEVNULL))
            add(("startup", "cli"), t)
            for v in (1, 2, 3):
                base, target = f"{fx}/step{v - 1}.safetensors", f"{fx}/step{v}.safetensors"
                d_cli, d_py = f"{work}/cli{v}.rfd", f"{work}/py{v}.rfd"
                t, _ = timed(lambda: subprocess.run(
                    [args.cli, "diff", base, target, "-o", d_cli, "--version", str(v),
                     "--base-version", str(v - 1), "-j", str(args.threads)],
                    check=True, stdout=subprocess.DEVNULL))
                add(("diff", "cli"), t)
                t, rep = timed(lambda: refit.diff(base, target, d_py, version=v,
                                                  base_version=v - 1, threads=args.threads))
                add(("diff", "python"), t)
                add(("diff", "native"), rep.seconds)
                assert open(d_cli, "rb").read() == open(d_py, "rb").read()

                for who in ("cli", "py"):
                    shutil.copy(base, f"{work}/{who}.safetensors")
                    os.chmod(f"{work}/{who}.safetensors", 0o644)
                t, _ = timed(lambda: subprocess.run(
                    [args.cli, "apply", d_cli, f"{work}/cli.safetensors", "-j",
                     str(args.threads)] + (["--no-sync"] if args.no_sync else []),
                    check=True, stdout=subprocess.DEVNULL))
                add(("apply", "cli"), t)
                t, rep = timed(lambda: refit.apply(d_py, f"{work}/py.safetensors",
                                                   threads=args.threads,
                                                   sync=not args.no_sync))
                add(("apply", "python"), t)
                add(("apply", "native"), rep.seconds)

                b = refit.load(base)
                arrays = {n: np.array(a) for n, a in b.items()}
                tgt = {n: np.array(a) for n, a in refit.load(target).items()}
                t, rep = timed(lambda: refit.diff(b, tgt, f"{work}/mem{v}.rfd", version=v,
                                                  base_version=v - 1, threads=args.threads))
                add(("diff in memory", "python"), t)
                add(("diff in memory", "native"), rep.seconds)
                t, rep = timed(lambda: refit.apply(d_py, arrays, threads=args.threads))
                add(("apply in memory", "python"), t)
                add(("apply in memory", "native"), rep.seconds)
                # The Python side of borrowing: dtypes and buffers of 51 arrays.
                t, _ = timed(lambda: prepare(list(arrays.items()), writable=True,
                                             expected=b.dtypes))
                add(("borrow 51", "python"), t)

    ms = {k: 1000 * statistics.median(v) for k, v in rows.items()}
    start = ms[("startup", "cli")]
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} cores, "
          f"threads {args.threads}, {args.reps} reps x 3 steps, medians in ms; "
          f"CLI start-up {start:.2f} ms; import refit {import_ms:.1f} ms (once)")
    print(f"{'operation':<16}{'CLI':>8}{'CLI-start':>10}{'Python':>8}{'native':>8}"
          f"{'Py-native':>10}{'Py/(CLI-start)':>15}")
    for op in ("diff", "apply", "diff in memory", "apply in memory"):
        cli = ms.get((op, "cli"))
        py, nat = ms[(op, "python")], ms[(op, "native")]
        net = None if cli is None else cli - start
        print(f"{op:<16}{(f'{cli:.2f}' if cli else '-'):>8}{(f'{net:.2f}' if net else '-'):>10}"
              f"{py:>8.2f}{nat:>8.2f}{py - nat:>10.3f}"
              f"{(f'{py / net:.3f}' if net else '-'):>15}")
    print(f"Python side of borrowing 51 arrays (inside the in-memory rows): "
          f"{ms[('borrow 51', 'python')]:.3f} ms")


if __name__ == "__main__":
    main()
