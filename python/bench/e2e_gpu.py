"""End to end on one GPU: a trainer publishes the BF16 weights of a real
transformers Qwen2 model after each optimizer step; a receiver process
holding its own copy of the model in GPU memory follows them.

    PYTHONPATH=<package> python3 python/bench/e2e_gpu.py --size 1.5b --versions 8 \\
        --json out.json

Trainer (this process): the model from a Qwen2 config (random init, no
download) with FP32 master weights on the GPU, AdamW at lr 1e-6 and a
REINFORCE-style loss on random tokens; after each step the BF16 weights are
cast from the masters and published through a directory store with
``refit.Publisher`` (``--trainer device``: the baseline in device memory,
encoded on the GPU; ``--trainer file``: a checkpoint baseline, the host
path). Receiver (a child process): ``refit.Receiver(tensors=...)`` over its
own BF16 model in GPU memory, syncing each version.

Per version: the trainer's stall (BF16 weights ready -> publish_async
returned, i.e. training may continue), publish() until the commit, the
receiver's sync() time (its weights change during it), and end to end
(weights ready -> receiver active). In the same run: the full save + load
of the BF16 checkpoint (safetensors), a full device-to-device copy of the
weights, and with --host-versions N the host path's publish() (a checkpoint
baseline) for N versions. Bit-exactness: the receiver's final weights are
compared with the trainer's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import refit

SIZES = {
    # Qwen2-1.5B and Qwen2.5-3B shapes.
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2),
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
               num_attention_heads=16, num_key_value_heads=2),
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}


def build(size, dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=151936, tie_word_embeddings=True, **SIZES[size])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    return model


def sync_now():
    torch.cuda.synchronize()
    return time.perf_counter()


def profiled(fn, path):
    """Runs fn under the PyTorch profiler (CUPTI sees refit's kernels too)
    and writes a Chrome trace to `path`."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    return out


class Serving:
    """Stands in for an engine generating while a version is prepared:
    back-to-back BF16 matrix products on the receiver's GPU (its clocks up,
    as a serving engine's are) until stop(), which waits for them."""

    def __init__(self):
        import threading
        self._halt = threading.Event()
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        self._thread = threading.Thread(target=self._run, args=(a,), daemon=True)
        self._thread.start()

    def _run(self, a):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not self._halt.is_set():
                for _ in range(8):
                    a = (a @ a).clamp_(-1, 1)
                stream.synchronize()

    def stop(self):
        self._halt.set()
        self._thread.join()
        torch.cuda.synchronize()


def receiver_main(args):
    from safetensors.torch import load_file
    state = load_file(os.path.join(args.work, "initial.safetensors"), device="cuda")
    gpu = args.receiver == "gpu"
    rcv = refit.Receiver(args.store, member="r0", tensors=state, two_phase=gpu,
                         poll_interval=0.002)
    log = open(os.path.join(args.work, "receiver.jsonl"), "a")
    for v in range(1, args.versions + 1):
        t = time.perf_counter()
        if gpu:
            # The engine serves while the version is prepared, then pauses.
            serving = Serving() if args.serving else None
            while not rcv.prepare(v, timeout=300):
                pass
            if serving:
                serving.stop()
            prepared = time.perf_counter()
            if args.profile and v == args.versions:
                rep = profiled(rcv.activate, args.profile)
            else:
                rep = rcv.activate()
        else:
            rep = rcv.sync(v, timeout=300)
            prepared = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        log.write(json.dumps({"version": v, "active_at": time.time(),
                              "sync_s": done - t, "prepare_s": prepared - t,
                              "pause_wall_s": done - prepared,
                              "copy_s": rcv.last_copy_seconds,
                              "steps": [{"seconds": s.seconds, "tail": s.tail_seconds,
                                         "before_manifest": s.chunks_before_manifest,
                                         "chunks": s.chunks_applied,
                                         "pause_s": s.pause_seconds,
                                         "pause_kernel_ms": s.pause_kernel_ms,
                                         "pause_verify_ms": s.pause_verify_ms,
                                         "folded": s.versions_folded,
                                         "staged_host": s.staged_host_bytes,
                                         "staged_device": s.staged_device_bytes}
                                        for s in rep.steps],
                              "active": rep.active_version}) + "\n")
        log.flush()
    from safetensors.torch import save_file
    save_file(state, os.path.join(args.work, "receiver_final.safetensors"))
    rcv.close()


def wait_for_receiver(work, version, child):
    """Returns once the receiver has logged `version` active."""
    path = os.path.join(work, "receiver.jsonl")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"the receiver exited ({child.returncode}) before "
                               f"version {version} was active")
        if os.path.exists(path):
            with open(path) as f:
                if sum(1 for _ in f) >= version:
                    return
        time.sleep(0.001)
    raise TimeoutError(f"the receiver did not activate version {version} in 300 s")


def train_step(model, opt, batch):
    ids = torch.randint(0, model.config.vocab_size, (batch, 128), device="cuda")
    logits = model(input_ids=ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    adv = torch.randn(batch, 1, device="cuda")
    loss = -(adv * logp).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1.5b", choices=sorted(SIZES))
    ap.add_argument("--versions", type=int, default=8)
    ap.add_argument("--trainer", default="device", choices=["device", "pinned", "file"])
    ap.add_argument("--receiver", default="gpu", choices=["gpu", "host"],
                    help="gpu: two-phase, applied on the GPU; host: the host-copy path")
    ap.add_argument("--host-versions", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--upload-threads", type=int, default=4)
    ap.add_argument("--serial", action="store_true",
                    help="the trainer starts its next step only once the receiver is "
                         "active (the receiver's pause then has the GPU to itself)")
    ap.add_argument("--serving", action="store_true",
                    help="the receiver runs matrix products while it prepares, as "
                         "an engine that serves until its pause")
    ap.add_argument("--durable", action="store_true",
                    help="the publisher writes its baseline to a durable file after each "
                         "commit, in the background")
    ap.add_argument("--profile", default="",
                    help="write a Chrome trace of the last version's activate() here")
    ap.add_argument("--conditional", action="store_true",
                    help="with --trainer file: versions may carry conditional XOR chunks "
                         "(kind 5), which the GPU receiver decodes against its base before "
                         "the pause")
    ap.add_argument("--json", default="")
    ap.add_argument("--role", default="trainer")
    ap.add_argument("--work", default="")
    ap.add_argument("--store", default="")
    args = ap.parse_args()
    if args.role == "receiver":
        return receiver_main(args)
    if args.conditional and args.trainer != "file":
        ap.error("--conditional needs --trainer file (the GPU encoder does not write kind 5)")

    from safetensors.torch import load_file, save_file
    work = args.work or tempfile.mkdtemp(prefix="refit-e2e-")
    store = os.path.join(work, "store")
    master = build(args.size, torch.float32)
    opt = torch.optim.AdamW(master.parameters(), lr=1e-6)
    names = [n for n, _ in master.named_parameters()]
    bf16 = {n: p.detach().to(torch.bfloat16) for n, p in master.named_parameters()}
    total = sum(t.numel() * 2 for t in bf16.values())
    out = {"size": args.size, "params": total // 2, "bytes": total, "trainer": args.trainer,
           "receiver": args.receiver, "serial": args.serial, "serving": args.serving,
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}

    # Baselines: the full save + load of the checkpoint, a full D2D copy.
    init_path = os.path.join(work, "initial.safetensors")
    t = sync_now()
    save_file(bf16, init_path)
    out["full_save_s"] = time.perf_counter() - t
    t = sync_now()
    loaded = load_file(init_path, device="cuda")
    out["full_load_s"] = sync_now() - t
    copies = []
    for _ in range(5):
        t = sync_now()
        for n in names:
            loaded[n].copy_(bf16[n])
        copies.append(sync_now() - t)
    out["d2d_copy_ms"] = statistics.median(copies) * 1000
    del loaded

    t = time.perf_counter()
    if args.trainer == "file":
        pub = refit.Publisher(store, baseline=os.path.join(work, "baseline.safetensors"),
                              members=["r0"], initial=bf16, vote_timeout=60,
                              conditional=args.conditional)
    else:
        durable = os.path.join(work, "durable.safetensors") if args.durable else None
        pub = refit.Publisher(store, members=["r0"], initial=bf16, vote_timeout=60,
                              baseline_memory=args.trainer,
                              upload_threads=args.upload_threads, durable_baseline=durable)
    out["open_publisher_s"] = time.perf_counter() - t

    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, __file__, "--role", "receiver", "--work", work,
                              "--store", store, "--versions", str(args.versions),
                              "--receiver", args.receiver, "--profile", args.profile]
                             + (["--serving"] if args.serving else []), env=env)
    rows = []
    for v in range(1, args.versions + 1):
        train_step(master, opt, args.batch)
        with torch.no_grad():
            for n, p in master.named_parameters():
                bf16[n].copy_(p)
        t0 = sync_now()
        wall0 = time.time()
        fut = pub.publish_async(v, bf16)
        stall = time.perf_counter() - t0
        report = fut.result(timeout=600)
        done = time.perf_counter() - t0
        rows.append({"version": v, "stall_ms": stall * 1000, "publish_s": done,
                     "committed": report.committed, "changed_percent": report.changed_percent,
                     "bytes_uploaded": report.bytes_uploaded, "wall0": wall0,
                     "encode_upload_s": report.encode_upload_seconds,
                     "commit_s": report.commit_seconds})
        print(f"v{v}: stall {stall * 1000:.1f} ms, publish {done:.3f} s, "
              f"changed {report.changed_percent:.2f}%", flush=True)
        if args.serial:
            wait_for_receiver(work, v, child)
    child.wait(timeout=600)
    recv = {}
    with open(os.path.join(work, "receiver.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            recv[r["version"]] = r
    for r in rows:
        rr = recv[r["version"]]
        r["receiver_sync_s"] = rr["sync_s"]
        r["receiver_copy_s"] = rr["copy_s"]
        r["receiver_prepare_s"] = rr["prepare_s"]
        r["pause_ms"] = sum(s["pause_s"] for s in rr["steps"]) * 1000
        r["pause_wall_ms"] = rr["pause_wall_s"] * 1000
        r["receiver_steps"] = rr["steps"]
        r["e2e_s"] = rr["active_at"] - r["wall0"]
    final = load_file(os.path.join(work, "receiver_final.safetensors"), device="cuda")
    out["bit_exact"] = all(torch.equal(final[n], bf16[n]) for n in names)
    out["versions"] = rows
    t = time.perf_counter()
    pub.close()
    if args.durable and args.trainer != "file":
        # The file holds the last version, whole.
        out["durable_close_s"] = time.perf_counter() - t
        out["durable"] = pub.durable
        on_disk = load_file(os.path.join(work, "durable.safetensors"), device="cuda")
        out["durable_exact"] = all(torch.equal(on_disk[n], bf16[n]) for n in names)
        del on_disk

    if args.host_versions:
        # Today's host path in the same run: a checkpoint baseline, host copies.
        hstore = os.path.join(work, "hstore")
        hpub = refit.Publisher(hstore, baseline=os.path.join(work, "hbase.safetensors"),
                               members=["h0"], initial={n: t.cpu() for n, t in bf16.items()},
                               vote_timeout=60)
        mine = {n: t.clone() for n, t in bf16.items()}
        hr = refit.Receiver(hstore, member="h0", tensors=mine, two_phase=False)
        host_rows = []
        import concurrent.futures
        for v in range(1, args.host_versions + 1):
            train_step(master, opt, args.batch)
            with torch.no_grad():
                for n, p in master.named_parameters():
                    bf16[n].copy_(p)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                f = pool.submit(hr.sync, v, timeout=600)
                t = sync_now()
                rep = hpub.publish(v, bf16)
                pub_s = time.perf_counter() - t
                f.result(timeout=600)
                e2e = sync_now() - t
            host_rows.append({"version": v, "publish_s": pub_s, "e2e_s": e2e,
                              "committed": rep.committed})
        out["host_path"] = host_rows
        hr.close()
        hpub.close()

    med = lambda k: statistics.median(r[k] for r in rows[1:] or rows)  # noqa: E731
    print(f"{args.size} ({total / 1e9:.2f} GB BF16), trainer {args.trainer}: "
          f"stall {med('stall_ms'):.1f} ms, publish {med('publish_s') * 1000:.0f} ms, "
          f"receiver sync {med('receiver_sync_s') * 1000:.0f} ms "
          f"(copies to the device {med('receiver_copy_s') * 1000:.0f} ms, "
          f"pause {med('pause_ms'):.1f} ms, activate wall {med('pause_wall_ms'):.1f} ms), "
          f"encode+upload {med('encode_upload_s') * 1000:.0f} ms, "
          f"e2e {med('e2e_s') * 1000:.0f} ms; open {out['open_publisher_s']:.2f} s; "
          f"full save {out['full_save_s']:.2f} s + load {out['full_load_s']:.2f} s; "
          f"D2D copy {out['d2d_copy_ms']:.1f} ms; bit-exact {out['bit_exact']}")
    if "durable" in out:
        print(f"durable file: {out['durable']}, close waited {out['durable_close_s']:.2f} s, "
              f"equal to the last version: {out['durable_exact']}")
    if args.host_versions:
        print("host path publish s:", [round(r["publish_s"], 3) for r in out["host_path"]],
              "e2e s:", [round(r["e2e_s"], 3) for r in out["host_path"]])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
