"""Trainer ranks publishing from device memory: the GPU rank encoder against
the CPU one (CUDA shards copied to the host), in the same run
(docs/benchmarks.md, "Trainer ranks on the GPU").

A Qwen2-shaped model (BF16, random small normal values) is split by the
layout `refit layout generate --tp T` writes for its config (fused QKV and
gate/up, row-parallel o/down: strided regions); each rank holds its local
shards in GPU memory. Per version, `--rate` of the elements change by a low
mantissa bit flip; the ranks (threads of this process) publish their parts
to a directory store, a direct Coordinator decides, and one receiver
applies: `--receiver device` (the default) a two-phase receiver holding the
canonical model in GPU memory (prepare: fetch, check, stage and compute the
tensors' hashes after the version on the device; activate: the pause, every
strided region applied in place), `--receiver host` an in-memory receiver
in host memory. Reported per path: the trainer's stall (until `publish_async`
returns: the local tensors copied), each rank's part time (detect + encode
+ upload, the rank's report `seconds`), the whole publish (part +
decision), the receiver's prepare and pause (device receiver), and the
version's end to end (first rank starts -> receiver active). Every version
is checked bit-exact at the receiver.

  PYTHONPATH=build/gpuhost/python python3 python/bench/ranks_gpu.py \\
      --refit build/gpuhost/tools/refit/refit --size 1.5b --tp 2
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np
import torch

import refit

SIZES = {  # hidden, intermediate, layers, heads, kv heads, vocab
    "tiny": (512, 1536, 4, 8, 2, 8192),
    "1.5b": (1536, 8960, 28, 12, 2, 151936),
    "3b": (2048, 11008, 36, 16, 2, 151936),
}


def write_config(path, size):
    h, inter, layers, heads, kv, vocab = SIZES[size]
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": h,
           "intermediate_size": inter, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    with open(path, "w") as f:
        json.dump(cfg, f)


def canonical_model(layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for c in layout["canonical"]:
        n = int(np.prod(c["shape"]))
        bits = torch.randint(0x3C00, 0x3F80, (n,), generator=g, device="cuda", dtype=torch.int32)
        out[c["name"]] = bits.to(torch.int16).view(torch.bfloat16).reshape(c["shape"])
    return out


def step(model, rate, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, t in model.items():
        bits = t.view(torch.int16).clone()
        mask = torch.rand(bits.shape, generator=g, device="cuda") < rate
        bits ^= mask.to(torch.int16)
        out[name] = bits.view(torch.bfloat16)
    return out


def local_tensors(layout, rank, model):
    """The rank's local tensors, scattered from the canonical ones by the pieces."""
    r = next(x for x in layout["ranks"] if x["rank"] == rank)
    out = {}
    for t in r["tensors"]:
        local = torch.zeros(int(np.prod(t["shape"])), dtype=torch.int16, device="cuda")
        for p in t["pieces"]:
            canon = model[p["canonical"]].view(torch.int16).reshape(-1)
            lo, lr, lc = p["local"]
            co, cr, cc = p["canon"]
            src = canon.as_strided((p["rows"], p["cols"]), (cr, cc), co)
            local.as_strided((p["rows"], p["cols"]), (lr, lc), lo).copy_(src)
        out[t["name"]] = local.view(torch.bfloat16).reshape(t["shape"])
    return out


def host(model):
    return {n: t.view(torch.int16).cpu().numpy().view(np.uint16) for n, t in model.items()}


class DeviceFollower:
    """A two-phase receiver over CUDA tensors: prepare, then the pause."""

    def __init__(self, store, canon0):
        self.held = {n: t.clone() for n, t in canon0.items()}
        self.rcv = refit.Receiver(store, member="r", tensors=self.held, poll_interval=0.002)

    def sync(self, v, timeout):
        t = time.perf_counter()
        while not self.rcv.prepare(v, timeout=timeout):
            pass
        prepared = time.perf_counter()
        rep = self.rcv.activate()
        torch.cuda.synchronize()
        return {"prepare_s": prepared - t, "pause_s": sum(s.pause_seconds for s in rep.steps),
                "pause_kernel_ms": sum(s.pause_kernel_ms for s in rep.steps),
                "staged_device_bytes": max(s.staged_device_bytes for s in rep.steps),
                "seal_s": sum(s.seal_seconds for s in rep.steps),
                "after_hash_s": sum(s.after_hash_seconds for s in rep.steps)}

    def check(self, canon):
        for n, t in canon.items():
            assert torch.equal(self.held[n].view(torch.int16), t.view(torch.int16)), n


class HostFollower:
    def __init__(self, store, canon0):
        self.mine = host(canon0)
        self.rcv = refit.Receiver(store, member="r", tensors=self.mine,
                                  dtypes={n: "BF16" for n in self.mine}, decision_timeout=600)

    def sync(self, v, timeout):
        self.rcv.sync(v, timeout=timeout)
        return {}

    def check(self, canon):
        for n, a in host(canon).items():
            assert np.array_equal(self.mine[n].reshape(a.shape), a), n


def run_path(memory, work, layout, base, canon0, nranks, rate, versions, receiver):
    store = os.path.join(work, "store-" + memory)
    coord = refit.Coordinator(store, members=["r"], ranks=list(range(nranks)), table=base,
                              vote_timeout=600, parts_timeout=600)
    ranks = [refit.Publisher(store, layout=layout, rank=r, initial=local_tensors(layout, r, canon0),
                             baseline_memory=memory, decision_timeout=600)
             for r in range(nranks)]
    assert all(p.on_device == (memory == "device") for p in ranks)
    rcv = (DeviceFollower if receiver == "device" else HostFollower)(store, canon0)
    pool = concurrent.futures.ThreadPoolExecutor(nranks + 2)
    canon = canon0
    rows = []
    for v in range(1, versions + 1):
        canon = step(canon, rate, 1000 + v)
        local = [local_tensors(layout, r, canon) for r in range(nranks)]
        torch.cuda.synchronize()
        t0 = time.time()
        fc = pool.submit(coord.publish, v)
        fr = pool.submit(rcv.sync, v, timeout=600)

        def publish(r):
            # The trainer's stall: until publish_async returns (the local
            # tensors copied, on the device with a device baseline).
            t = time.perf_counter()
            future = ranks[r].publish_async(v, local[r])
            stall = time.perf_counter() - t
            rep = future.result()
            return rep, time.perf_counter() - t, stall
        parts = [pool.submit(publish, r) for r in range(nranks)]
        results = [p.result() for p in parts]
        report, _ = fc.result()
        got = fr.result()
        e2e = time.time() - t0
        assert report["committed"], report["reason"]
        rcv.check(canon)
        rows.append({"version": v, **got, "part_s": max(r["seconds"] for r, _, _ in results),
                     "stall_s": max(st for _, _, st in results),
                     "publish_s": max(w for _, w, _ in results), "e2e_s": e2e,
                     "chunks": sum(r["chunks"] for r, _, _ in results),
                     "changed": sum(r["changed_direct"] for r, _, _ in results)})
    pool.shutdown()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--refit", required=True, help="the refit binary (for the layout)")
    ap.add_argument("--size", choices=sorted(SIZES), default="1.5b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.02)
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--receiver", choices=["device", "host"], default="device")
    ap.add_argument("--json", help="write the results here")
    ns = ap.parse_args()
    work = tempfile.mkdtemp(prefix="refit-ranks-gpu-")
    try:
        write_config(os.path.join(work, "config.json"), ns.size)
        layout_path = os.path.join(work, "layout.json")
        subprocess.run([ns.refit, "layout", "generate", "--config",
                        os.path.join(work, "config.json"), "--tp", str(ns.tp), "-o",
                        layout_path], check=True, stdout=subprocess.DEVNULL)
        with open(layout_path) as f:
            layout = json.load(f)
        canon0 = canonical_model(layout, 1)
        params = sum(t.numel() for t in canon0.values())
        base = os.path.join(work, "base.safetensors")
        refit.save(base, host(canon0), dtypes="BF16")
        out = {"size": ns.size, "params": params, "tp": ns.tp, "rate": ns.rate,
               "receiver": ns.receiver}
        for memory in ("device", "file"):
            out[memory] = run_path(memory, work, layout, base, canon0, ns.tp, ns.rate,
                                   ns.versions, ns.receiver)
        print(f"{ns.size}: {params / 1e9:.2f} B params, TP {ns.tp}, {ns.rate:.0%} change, "
              f"{ns.receiver} receiver")
        print("path    version  stall (ms)  rank part (s)  rank publish (s)  end to end (s)  chunks"
              "  prepare (s)  seal (s)  after-hash (s)  pause (ms)  kernels (ms)  staged (MiB)")
        for memory, name in (("device", "GPU"), ("file", "CPU")):
            for r in out[memory]:
                extra = (f"  {r['prepare_s']:11.3f}  {r['seal_s']:8.3f}  {r['after_hash_s']:14.3f}"
                         f"  {r['pause_s'] * 1e3:10.1f}"
                         f"  {r['pause_kernel_ms']:6.1f}  {r['staged_device_bytes'] / 2**20:7.0f}"
                         if "pause_s" in r else "")
                print(f"{name:7} {r['version']:7}  {r['stall_s'] * 1e3:10.1f}  {r['part_s']:13.3f}"
                      f"  {r['publish_s']:16.3f}"
                      f"  {r['e2e_s']:14.3f}  {r['chunks']:6}{extra}")
        steady = {m: float(np.median([r["part_s"] for r in out[m][1:]] or [out[m][0]["part_s"]]))
                  for m in ("device", "file")}
        print(f"median rank part after the first version: GPU {steady['device']*1e3:.1f} ms, "
              f"CPU {steady['file']*1e3:.1f} ms ({steady['file']/steady['device']:.1f}x)")
        if ns.json:
            with open(ns.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
