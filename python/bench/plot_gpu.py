"""Draws docs/gpu_product_path.png from the JSON of e2e_gpu.py (one file per
model size) and pause_gpu.py (Debian's python3-matplotlib):

    python3 python/bench/plot_gpu.py --e2e e2e_15b.json e2e_3b.json \\
        --pause pause_32.json --floors 7.87,15.66 --out docs/gpu_product_path.png

Left: per model size, the trainer's stall, the receiver's pause and the end
to end time (medians over the versions after the first), next to the
baselines measured in the same runs (full save + load, the host path's end
to end, a device-to-device copy). Right: the 32 GiB pause against the change
rate, next to its floor (refit_gpu_bench's scatter floor, given with
--floors per rate, plus one range-hash pass over the model).
"""

import argparse
import json
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def median(rows, key):
    rows = rows[1:] or rows
    return statistics.median(r[key] for r in rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--e2e", nargs="+", required=True)
    ap.add_argument("--pause", default="")
    ap.add_argument("--floors", default="", help="scatter floor ms per rate, in order")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = [json.load(open(p)) for p in args.e2e]
    fig, axes = plt.subplots(1, 2 if args.pause else 1, figsize=(12 if args.pause else 7, 4.5))
    ax = axes[0] if args.pause else axes
    labels = [f"{r['params'] / 1e9:.2f} B params\n({r['bytes'] / 1e9:.1f} GB BF16)" for r in runs]
    series = {
        "trainer stall": [median(r["versions"], "stall_ms") for r in runs],
        "receiver pause": [median(r["versions"], "pause_ms") for r in runs],
        "end to end": [median(r["versions"], "e2e_s") * 1000 for r in runs],
        "full save + load": [(r["full_save_s"] + r["full_load_s"]) * 1000 for r in runs],
        "D2D copy of the model": [r["d2d_copy_ms"] for r in runs],
    }
    if all(r.get("host_path") for r in runs):  # e2e_gpu.py --host-versions N
        series["host path end to end"] = [
            statistics.median(h["e2e_s"] for h in r["host_path"]) * 1000 for r in runs]
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - len(series) / 2 + 0.5) * width for j in range(len(runs))]
        ax.bar(xs, values, width, label=name)
    ax.set_yscale("log")
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("ms (log scale)")
    ax.set_title("transformers Qwen2, ~2% change per step, one H200")
    ax.legend(fontsize=7, loc="upper left")
    if args.pause:
        p = json.load(open(args.pause))
        rates = [r["rate"] * 100 for r in p["rates"]]
        pauses = [median(r["versions"], "pause_ms") for r in p["rates"]]
        kernels = [median(r["versions"], "kernel_ms") for r in p["rates"]]
        ax2 = axes[1]
        ax2.plot(rates, pauses, "o-", label="receiver pause")
        ax2.plot(rates, kernels, "s--", label="its kernels (GPU span)")
        if args.floors:
            floors = [float(x) + p["hash_ms"] for x in args.floors.split(",")]
            ax2.plot(rates, floors, "^:", label="scatter floor + one hash pass")
            ax2.plot(rates, [1.2 * f for f in floors], "v:", label="1.2x that")
        ax2.axhline(p["d2d_copy_ms"], color="gray", lw=0.8, label="D2D copy of the model")
        ax2.set_xlabel("elements changed (%)")
        ax2.set_ylabel("ms")
        ax2.set_title(f"pause at {p['gib']} GiB (synthetic BF16)")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)


if __name__ == "__main__":
    main()
