"""A PyTorch training loop that publishes its weights to refit after every step.

    python examples/train_publish.py --store /shared/refit-store \
        --baseline /tmp/refit-baseline --members r0,r1 --steps 10 [--model DIR]

With --model, a Hugging Face checkpoint directory is trained (transformers
needed); otherwise a small stand-in model with Hugging Face-style names.
The optimizer keeps FP32 master weights; every step publishes their BF16
cast (what the inference engines serve) with publish_async, so the next
step trains while the changed chunks are encoded and uploaded and the
receivers vote. Start the receivers (receive_hf.py, receive_http.py) with
checkpoints of version 0: the weights this script starts from. It writes
them to --export once, for that.
"""

import argparse

import torch

import refit


def build_model(path):
    if path:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.embed_tokens = torch.nn.Embedding(4096, 192)
    model.layers = torch.nn.ModuleList(
        torch.nn.ModuleDict({"up_proj": torch.nn.Linear(192, 512, bias=False),
                             "down_proj": torch.nn.Linear(512, 192, bias=False)})
        for _ in range(4))
    model.lm_head = torch.nn.Linear(192, 4096, bias=False)

    def forward(tokens):
        h = model.embed_tokens(tokens)
        for layer in model.layers:
            h = h + layer["down_proj"](torch.relu(layer["up_proj"](h)))
        return model.lm_head(h)

    model.forward = forward
    return model


def serving_weights(model):
    """The BF16 weights the engines serve, in Hugging Face names (fresh tensors)."""
    return {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--baseline", required=True, help="the publisher's own checkpoint file")
    ap.add_argument("--members", default="r0")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--model", help="a Hugging Face checkpoint directory")
    ap.add_argument("--export", help="also write version 0 here (receivers start from it)")
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(args.model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    weights = serving_weights(model)
    if args.export:
        refit.save(args.export, weights)
    pub = refit.Publisher(args.store, baseline=args.baseline, members=args.members.split(","),
                          initial=weights, vote_timeout=120)
    version = pub.committed_version
    pending = None
    for _ in range(args.steps):
        tokens = torch.randint(0, 4096, (8, 64), device=device)
        logits = model(tokens)
        logits = getattr(logits, "logits", logits)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if pending is not None:  # at most one version in flight
            r = pending.result()
            print(f"version {r.version}: committed={r.committed} changed={r.changed_percent:.2f}% "
                  f"uploaded={r.bytes_uploaded} B of {r.full_bytes} in {r.seconds:.2f}s")
        version += 1
        # The cast made fresh tensors, so nothing needs copying: copy=False.
        pending = pub.publish_async(version, serving_weights(model), copy=False)
    if pending is not None:
        r = pending.result()
        print(f"version {r.version}: committed={r.committed} changed={r.changed_percent:.2f}%")
    pub.close()


if __name__ == "__main__":
    main()
