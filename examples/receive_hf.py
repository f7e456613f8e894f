"""An inference worker that keeps a Hugging Face transformers model current.

    python examples/receive_hf.py --store /shared/refit-store --member r0 \
        --checkpoint /models/r0 [--config-from /models/base]

The receiver patches --checkpoint (a Hugging Face checkpoint directory at
version 0) in place, votes, and on commit loads only the tensors the version
changed into the live model through the model's own load_state_dict (the
checkpoint's tensor names are the model's state_dict keys). Without
transformers installed (or without config.json) it falls back to a dict of
torch tensors, which shows the same path.
"""

import argparse
import os
import time

import torch

import refit


def load_model(checkpoint):
    if os.path.exists(os.path.join(checkpoint, "config.json")):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.bfloat16)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--member", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--until", type=int, default=0, help="stop at this version (0: never)")
    ap.add_argument("--poll", type=float, default=0.5)
    args = ap.parse_args()

    model = load_model(args.checkpoint)
    rcv = refit.Receiver(args.store, member=args.member, checkpoint_dir=args.checkpoint)
    print(f"{args.member}: at version {rcv.active_version}")
    while not args.until or rcv.active_version < args.until:
        report = rcv.sync()
        if not report.committed_versions:
            time.sleep(args.poll)  # a rollout would run here
            continue
        changed = rcv.changed_tensors(framework="torch")
        if model is not None:
            n = refit.adapters.load_state_dict(model, changed)
        else:
            n = sum(1 for _ in changed)
        print(f"{args.member}: version {report.active_version}, loaded {n} changed tensors")


if __name__ == "__main__":
    main()
