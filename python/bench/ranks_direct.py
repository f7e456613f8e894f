"""Versions from many trainer ranks: the direct path against the assembling
coordinator, in the same run (docs/benchmarks.md, "Versions from many ranks").

Rank processes (one per rank of a TP x PP layout that `refit layout generate`
writes) publish `--versions` versions of a synthetic BF16 model, each with `--rate`
of its elements changed by one-ulp XORs, to a directory store; two
checkpoint receivers apply them. Each version of each path is timed from
the last rank's part being stored to every receiver having the version
active, against the slowest rank's detect + encode + upload; the coordinator's peak resident memory
(VmHWM of its own process, after imports, after opening, after the
version), the disk it uses, and where the last receiver to activate spent
its step (StepResult.stages) are reported. `--receivers memory` runs two
in-memory receivers (host NumPy tensors loaded from the base) instead, and
`--receivers gpu` two receivers of CUDA tensors (PyTorch) on one GPU.

Every tensor of the synthetic model, and its changed positions, come from
a generator seeded by the tensor's index, so a rank process makes only the
canonical tensors its pieces read, one at a time, at a cost proportional to
its share of the model (several GiB models are practical).

  PYTHONPATH=build/release/python python3 python/bench/ranks_direct.py \\
      --refit build/release/tools/refit/refit [--hidden 1024 --layers 8] \\
      [--receivers checkpoint|memory|gpu]
"""

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import tempfile
import time

import numpy as np

import refit

KEY = b"b" * 32


def canonical_tensor(layout, index, seed):
    """Canonical tensor `index` of the synthetic model: BF16 bit patterns of
    small normal values (exponents 0x3c..0x3f). Each tensor has a generator of
    its own, so a process makes only the tensors it needs."""
    c = layout["canonical"][index]
    rng = np.random.default_rng([seed, index])
    n = int(np.prod(c["shape"]))
    return rng.integers(0x3C00, 0x3F80, n, dtype=np.uint16).reshape(c["shape"])


def canonical_model(layout, seed):
    return {c["name"]: canonical_tensor(layout, i, seed)
            for i, c in enumerate(layout["canonical"])}


def step_tensor(a, rate, seed, index):
    """`a` with about `rate` of its elements changed by a one-ulp XOR.

    The changed positions are a Bernoulli(rate) process drawn as geometric
    gaps, so the cost is the changed elements', not the tensor's: the same
    positions in every process for the same (seed, index)."""
    rng = np.random.default_rng([seed, index, 1])
    flat = a.reshape(-1).copy()
    n = flat.size
    if rate <= 0 or n == 0:
        return flat.reshape(a.shape)
    pos = -1
    batch = max(1024, int(min(n, 1 << 22) * rate * 1.1))
    while True:
        idx = pos + np.cumsum(rng.geometric(rate, size=batch))
        inside = idx[idx < n]
        flat[inside] ^= 1
        if inside.size < idx.size:
            break
        pos = int(idx[-1])
    return flat.reshape(a.shape)


def canonical_at(layout, index, rate, version):
    """Canonical tensor `index` at `version`: the base stepped `version` times
    (step v draws its positions from seed v + 1)."""
    a = canonical_tensor(layout, index, 1)
    for v in range(1, version + 1):
        a = step_tensor(a, rate, v + 1, index)
    return a


def local_tensors(layout, rank, rate, version):
    """The rank's local tensors of `version`, scattered from the canonical
    ones by the pieces, one canonical tensor at a time."""
    r = next(x for x in layout["ranks"] if x["rank"] == rank)
    out = {t["name"]: np.zeros(int(np.prod(t["shape"])), dtype=np.uint16)
           for t in r["tensors"]}
    by_canonical = {}
    for t in r["tensors"]:
        for p in t["pieces"]:
            by_canonical.setdefault(p["canonical"], []).append((t["name"], p))
    item = np.dtype(np.uint16).itemsize
    for i, c in enumerate(layout["canonical"]):
        if c["name"] not in by_canonical:
            continue
        canon = canonical_at(layout, i, rate, version).reshape(-1)
        for name, p in by_canonical[c["name"]]:
            lo, lr, lc = p["local"]
            co, cr, cc = p["canon"]
            shape = (p["rows"], p["cols"])
            dst = np.lib.stride_tricks.as_strided(
                out[name][lo:], shape, (lr * item, lc * item), writeable=True)
            dst[...] = np.lib.stride_tricks.as_strided(
                canon[co:], shape, (cr * item, cc * item), writeable=False)
        del canon
    return {t["name"]: out[t["name"]].reshape(t["shape"]) for t in r["tensors"]}


def rank_main(args, store, parts, rank, base, queue):
    with open(args["layout"]) as f:
        layout = json.load(f)
    pub = refit.Publisher(store, layout=args["layout"], rank=rank, baseline=base, key=KEY,
                          parts=parts, decision_timeout=600)
    # The rank's part (detect + encode + upload), then the decision, timed apart
    # (the public publish() returns after both).
    from refit._tensors import named_items, prepare
    rows = []
    for v in range(1, args["versions"] + 1):
        local = local_tensors(layout, rank, args["rate"], v)
        p = prepare(named_items(local), writable=False, expected=pub._dtypes)
        t0 = time.time()
        report = pub._native.publish(v, p.triples)
        stored = time.time()
        committed = pub._native.await_decision(600)
        rows.append((t0, stored, report["seconds"], committed))
        del p, local
    queue.put(("rank", rank, rows))


def receiver_main(store, member, ckpt, kind, versions, queue):
    if kind == "checkpoint":
        rcv = refit.Receiver(store, member=member, checkpoint_dir=ckpt, key=KEY,
                             decision_timeout=600)
    elif kind == "gpu":
        # CUDA tensors copied from the base, applied on the GPU (a two-phase
        # receiver: the version staged in device memory, then the pause).
        import torch
        base = refit.load(ckpt)
        tensors = {name: torch.from_numpy(np.array(base[name]).view(np.int16))
                   .view(torch.bfloat16).cuda() for name in base}
        del base
        rcv = refit.Receiver(store, member=member, tensors=tensors, key=KEY,
                             decision_timeout=600, staging_bytes=2 << 30)
    else:
        # Host tensors in this process's memory, copied from the base.
        base = refit.load(ckpt)
        tensors = {name: np.array(base[name]) for name in base}
        del base
        rcv = refit.Receiver(store, member=member, tensors=tensors, dtypes="BF16", key=KEY,
                             decision_timeout=600)
    rows = []
    for v in range(1, versions + 1):
        report = rcv.sync(v, timeout=600)
        done = time.time()
        steps = [s for s in report.steps if s.version == v and s.outcome == "committed"]
        stages = dict(steps[-1].stages) if steps else {}
        if steps and kind == "gpu":
            # A two-phase step has fields of its own besides some stages.
            s = steps[-1]
            stages = {k: x for k, x in stages.items()
                      if k in ("base_check", "fetch", "chunk_wait", "apply_cpu", "vote",
                               "decision_wait")}
            stages.update({"read_early": getattr(s, "chunks_read_early", -1),
                           "tail": s.tail_seconds, "seal": s.seal_seconds,
                           "after_hash": s.after_hash_seconds, "pause": s.pause_seconds})
        rows.append((done, stages))
    queue.put(("receiver", member, rows))
    rcv.close()


def maxrss():
    # VmHWM: the peak of this process's own address space. (getrusage's
    # ru_maxrss survives execve, so a spawned process would report the
    # high-water mark of the parent it was forked from.)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def coordinator_main(store, members, ranks, base, baseline, versions, queue):
    # Peak resident memory after the interpreter and modules loaded, after
    # opening (a direct coordinator reads the first version's tensor table
    # from `table`, through a few small read buffers), and after the version.
    rss = [maxrss()]
    timing = []  # direct: (manifest, vote) seconds per version
    if baseline is None:
        c = refit.Coordinator(store, members=members, ranks=ranks, table=base, key=KEY,
                              vote_timeout=600, parts_timeout=600)
        rss.append(maxrss())
        committed = True
        for v in range(1, versions + 1):
            report, parts = c.publish(v)
            committed = committed and report["committed"]
            timing.append((report["manifest_seconds"], report["vote_seconds"]))
    else:
        c = refit.Coordinator(store + "-protocol", members=members, ranks=ranks, parts=store,
                              baseline=baseline, key=KEY, vote_timeout=600, parts_timeout=600)
        rss.append(maxrss())
        committed = True
        for v in range(1, versions + 1):
            report, parts = c.publish(v)
            committed = committed and report.committed
    rss.append(maxrss())
    queue.put(("coordinator", time.time(), committed, parts["chunks"], rss, timing))


def disk_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def run_path(direct, work, layout_path, base, nranks, rate, receivers, versions):
    store = os.path.join(work, "store-direct" if direct else "store-parts")
    members = ["r0", "r1"]
    ckpts = []
    for m in members:
        if receivers in ("memory", "gpu"):
            ckpts.append(base)  # each loads its tensors from the base
            continue
        ck = os.path.join(work, f"{m}-{'direct' if direct else 'parts'}.safetensors")
        shutil.copyfile(base, ck)
        ckpts.append(ck)
    coord_dir = os.path.join(work, "coord-" + ("direct" if direct else "parts"))
    os.makedirs(coord_dir)
    baseline = None
    if not direct:
        baseline = os.path.join(coord_dir, "baseline.safetensors")
        shutil.copyfile(base, baseline)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    receiver_store = store if direct else store + "-protocol"
    procs = [ctx.Process(target=coordinator_main,
                         args=(store, members, list(range(nranks)), base, baseline, versions,
                               q))]
    procs += [ctx.Process(target=receiver_main,
                          args=(receiver_store, m, ck, receivers, versions, q))
              for m, ck in zip(members, ckpts)]
    args = {"layout": layout_path, "rate": rate, "versions": versions}
    # Direct: parts go to the protocol store itself. Assembled: to `store`,
    # the parts store, while decisions are read from the protocol store.
    procs += [ctx.Process(target=rank_main,
                          args=(args, receiver_store, None if direct else store, r, base, q))
              for r in range(nranks)]
    for p in procs:
        p.start()
    results = [q.get(timeout=1200) for _ in procs]
    for p in procs:
        p.join()
    ranks = [r[2] for r in results if r[0] == "rank"]
    receivers = [r[2] for r in results if r[0] == "receiver"]
    coord = next(r for r in results if r[0] == "coordinator")
    rows = []
    for v in range(versions):
        last_part = max(r[v][1] for r in ranks)
        slowest = max(r[v][2] for r in ranks)
        last = max((r[v] for r in receivers), key=lambda x: x[0])
        rows.append({
            "version": v + 1,
            "committed": all(r[v][3] for r in ranks),
            "slowest_rank_part_s": round(slowest, 4),
            "last_part_to_all_active_s": round(last[0] - last_part, 4),
            "ratio": round((last[0] - last_part) / slowest, 2),
            # The direct coordinator's checks of the part lists, announcement
            # and manifest, then its wait for every vote.
            "coordinator_manifest_vote_s": [round(x, 4) for x in coord[5][v]] if coord[5]
            else None,
            # Where the last receiver to activate spent its step (seconds; its
            # apply_cpu sums the apply workers' time, overlapping the rest).
            "last_receiver_stages_s": {k: round(x, 4) for k, x in last[1].items()},
        })
    return {
        "path": "direct" if direct else "assembled",
        "committed": coord[2] and all(r["committed"] for r in rows),
        "chunks_last_version": coord[3],
        # Peak RSS (MiB) after imports, after opening, after the versions.
        "coordinator_maxrss_mib": [round(x / 2**20, 1) for x in coord[4]],
        "coordinator_disk_mib": disk_bytes(coord_dir) / 2**20,
        "versions": rows,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--refit", required=True, help="the refit binary (for the layout)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.03)
    ap.add_argument("--versions", type=int, default=3,
                    help="versions published one after another; from the second on, "
                         "receivers reuse the digests they kept (the steady state)")
    ap.add_argument("--receivers", choices=("checkpoint", "memory", "gpu"), default="checkpoint",
                    help="two checkpoint receivers (files), two in-memory receivers "
                         "(host NumPy tensors loaded from the base) or two GPU receivers "
                         "(CUDA tensors on the first GPU)")
    ap.add_argument("--paths", default="direct,assembled",
                    help="which paths to run, in order: direct, assembled or both")
    ns = ap.parse_args()
    paths = [p.strip() for p in ns.paths.split(",") if p.strip()]
    if not paths or any(p not in ("direct", "assembled") for p in paths):
        ap.error("--paths takes direct, assembled or both, comma-separated")
    work = tempfile.mkdtemp(prefix="refit-ranks-bench-")
    try:
        config = {"model_type": "qwen2", "hidden_size": ns.hidden,
                  "intermediate_size": ns.hidden * 11 // 4, "num_hidden_layers": ns.layers,
                  "num_attention_heads": ns.hidden // 64, "num_key_value_heads": ns.hidden // 128,
                  "head_dim": 64, "vocab_size": 32000, "attention_bias": True,
                  "tie_word_embeddings": False}
        cfg = os.path.join(work, "config.json")
        with open(cfg, "w") as f:
            json.dump(config, f)
        layout_path = os.path.join(work, "layout.json")
        subprocess.run([ns.refit, "layout", "generate", "--config", cfg, "--tp", str(ns.tp),
                        "--pp", str(ns.pp), "-o", layout_path], check=True,
                       stdout=subprocess.DEVNULL)
        with open(layout_path) as f:
            layout = json.load(f)
        base = os.path.join(work, "base.safetensors")
        t0 = time.time()
        model = canonical_model(layout, 1)
        refit.save(base, model, dtypes="BF16")
        del model
        size = os.path.getsize(base)
        nranks = len(layout["ranks"])
        print(f"model {size / 2**20:.0f} MiB (made in {time.time() - t0:.1f} s), "
              f"{nranks} rank processes (TP{ns.tp} x PP{ns.pp}), {ns.rate:.0%} changed, "
              f"2 {ns.receivers} receivers, directory store")
        for path in paths:
            r = run_path(path == "direct", work, layout_path, base, nranks, ns.rate, ns.receivers,
                         ns.versions)
            r["receivers"] = ns.receivers
            print(json.dumps(r))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
