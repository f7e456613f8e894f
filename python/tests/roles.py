"""Publisher and receiver processes for test_processes.py.

python roles.py publish STORE BASELINE FIXTURES MEMBERS VERSIONS
python roles.py receive STORE MEMBER CHECKPOINT_DIR VERSIONS
python roles.py fanout STORE FIXTURES RANK WORLD INIT_FILE VERSIONS
Each prints one JSON object per version on stdout.
"""

import hashlib
import json
import sys

import numpy as np

import refit


def publish(store, baseline, fixtures, members, versions):
    pub = refit.Publisher(store, baseline=baseline, members=members.split(","), vote_timeout=60)
    for v in range(1, int(versions) + 1):
        target = refit.load(f"{fixtures}/step{v}.safetensors")
        report = pub.publish(v, {n: np.array(a) for n, a in target.items()})
        print(json.dumps({"version": v, "committed": report.committed,
                          "changed_percent": report.changed_percent,
                          "bytes": report.bytes_uploaded}), flush=True)


def receive(store, member, checkpoint_dir, versions):
    rcv = refit.Receiver(store, member=member, checkpoint_dir=checkpoint_dir)
    for v in range(1, int(versions) + 1):
        report = rcv.sync(v, timeout=60)
        digest = hashlib.sha256()
        for name, tensor in rcv.changed_tensors():
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(tensor).tobytes())
        print(json.dumps({"version": report.active_version,
                          "committed": report.committed_versions,
                          "changed": report.changed_tensors,
                          "sha256": digest.hexdigest()}), flush=True)


def fanout(store, fixtures, rank, world, init_file, versions):
    """Member `rank` of a gloo group of `world` engines holding the model in
    host memory; only rank 0 reads the store (refit.FanoutReceiver)."""
    import os

    import torch.distributed as dist

    # The group's traffic stays on the loopback interface.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=int(rank),
                            world_size=int(world))
    base = refit.load(f"{fixtures}/step0.safetensors")
    mine = {n: np.array(a) for n, a in base.items()}
    dtypes = dict(base.dtypes)
    with refit.FanoutReceiver(store, member=f"r{rank}", tensors=mine, dtypes=dtypes) as rcv:
        for v in range(1, int(versions) + 1):
            report = rcv.sync(v, timeout=60)
            digest = hashlib.sha256()
            for name in sorted(mine):
                digest.update(name.encode())
                digest.update(mine[name].tobytes())
            print(json.dumps({"version": report.active_version, "leader": rcv.is_leader,
                              "sha256": digest.hexdigest(), **rcv.stats}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    {"publish": publish, "receive": receive, "fanout": fanout}[sys.argv[1]](*sys.argv[2:])
