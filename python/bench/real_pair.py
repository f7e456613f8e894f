"""Payload against the order-0 bound on a real ~100 M parameter pair.

    python3 python/bench/real_pair.py --refit <build>/tools/refit/refit [--json out.json]

Makes step pairs the way the qwen2-tiny fixtures were made
(../shared/fixtures/README.md), at about 30x their size: a Qwen2-architecture
causal LM from a config (random init, no download; 93 M parameters by
default), pre-trained on a synthetic next-token task (random tokens, then
the same tokens again) with AdamW at lr 1e-3,
then REINFORCE steps with a fresh AdamW at lr 1e-6 on FP32 master weights:
the model samples completions of random prompts, each completion is
rewarded by how many of its tokens follow the task's rule, and the loss is
-(reward - mean reward) x the completion's log-probability (the reward: the
fraction of the completion's tokens with an even id). After each RL
step the masters are cast to BF16 (round to nearest even) and saved with
safetensors.

For each consecutive pair it runs `refit diff` with and without
`--conditional` and `refit inspect` on the plain delta, and reports the
change rate, the order-0 bound, both payloads and their ratios to the
bound. The checkpoints live in a temporary folder and are deleted.
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

import torch


def build(args):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=512,
                      tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).float()
    return model


class Task:
    """Pre-training: sequences of random tokens repeated (the second copy is
    predictable from the first). RL: a completion is rewarded by the
    fraction of its tokens with an even id, which a sampling policy meets
    about half the time, so rewards vary and every step has a gradient."""

    def __init__(self, vocab):
        self.vocab = vocab

    def sequences(self, batch, length):
        half = torch.randint(0, self.vocab, (batch, length // 2), device="cuda")
        return torch.cat([half, half], 1)

    def reward(self, seq, start):
        return (seq[:, start:] % 2 == 0).float().mean(1)


def pretrain(model, task, args):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.pretrain_steps):
        ids = task.sequences(args.batch, 128)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step + 1 == args.pretrain_steps:
            print(f"  pretrain step {step}: loss {loss.item():.3f}", flush=True)


def rl_step(model, opt, task, args):
    prompts = task.sequences(args.batch, 16)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        seq = model.generate(prompts, max_new_tokens=args.new_tokens, do_sample=True,
                             top_k=0, pad_token_id=0)
    reward = task.reward(seq, prompts.shape[1])
    adv = (reward - reward.mean())[:, None]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=seq).logits[:, prompts.shape[1] - 1:-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, seq[:, prompts.shape[1]:, None]).squeeze(-1)
    loss = -(adv * logp.sum(1, keepdim=True)).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return reward.mean().item()


def save_bf16(model, path, step):
    from safetensors.torch import save_file
    tensors = {n: p.detach().to(torch.bfloat16).contiguous().cpu()
               for n, p in model.named_parameters()}
    save_file(tensors, path, metadata={"step": str(step)})


def refit_json(refit, *argv):
    out = subprocess.run([refit, *argv, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--refit", required=True, help="the refit CLI")
    ap.add_argument("--hidden", type=int, default=640)
    ap.add_argument("--intermediate", type=int, default=1728)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=10)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--pretrain-steps", type=int, default=150)
    ap.add_argument("--rl-steps", type=int, default=3)
    ap.add_argument("--rl-lr", type=float, default=1e-6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    t0 = time.time()
    model = build(args)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f} M parameters", flush=True)
    task = Task(args.vocab)
    pretrain(model, task, args)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        steps = [os.path.join(work, f"step{i}.safetensors") for i in range(args.rl_steps + 1)]
        save_bf16(model, steps[0], 0)
        opt = torch.optim.AdamW(model.parameters(), lr=args.rl_lr)
        for i in range(1, args.rl_steps + 1):
            r = rl_step(model, opt, task, args)
            save_bf16(model, steps[i], i)
            print(f"  RL step {i}: mean reward {r:.3f}", flush=True)
        for i in range(args.rl_steps):
            plain = os.path.join(work, "plain.rfd")
            cond = os.path.join(work, "cond.rfd")
            d = refit_json(args.refit, "diff", steps[i], steps[i + 1], "-o", plain)
            c = refit_json(args.refit, "diff", steps[i], steps[i + 1], "-o", cond,
                           "--conditional")
            ins = refit_json(args.refit, "inspect", plain)
            bound = ins["bound_bytes"]
            if d["changed_elements"] == 0 or bound <= 0:
                raise SystemExit(f"step{i}->{i + 1}: no element changed (the RL step had no "
                                 "gradient); nothing to measure")
            rows.append(dict(pair=f"step{i}->{i + 1}", changed=d["changed_elements"],
                             rate=d["change_rate"], bound_bytes=bound,
                             plain_bytes=d["payload_bytes"], conditional_bytes=c["payload_bytes"],
                             plain_vs_bound=d["payload_bytes"] / bound,
                             conditional_vs_bound=c["payload_bytes"] / bound,
                             conditional_chunks=c["chunks_by_kind"].get("conditional-xor", 0),
                             chunks=c["chunks"]))
    print(f"\n{params / 1e6:.1f} M parameters, {args.layers} layers, hidden {args.hidden}, "
          f"vocab {args.vocab}; {args.pretrain_steps} pre-training steps, RL lr {args.rl_lr}; "
          f"{time.time() - t0:.0f} s\n")
    print("| pair | changed | rate | order-0 bound B | today's kinds B (x bound) |"
          " with kind 5 B (x bound) | kind-5 chunks |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['pair']} | {r['changed']:,} | {100 * r['rate']:.2f}% | {r['bound_bytes']:,.0f} |"
              f" {r['plain_bytes']:,} (x{r['plain_vs_bound']:.3f}) |"
              f" {r['conditional_bytes']:,} (x{r['conditional_vs_bound']:.3f}) |"
              f" {r['conditional_chunks']} of {r['chunks']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(params=params, args=vars(args), pairs=rows), f, indent=1)


if __name__ == "__main__":
    main()
