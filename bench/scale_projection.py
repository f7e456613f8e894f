#!/usr/bin/env python3
"""The projection of docs/scale.md: one refit version of a large model,
from measured component rates.

Every input is a flag whose default is the measurement docs/scale.md cites
(and docs/benchmarks.md records with its command); change them to project
another machine, model or link. Prints, per change rate, the payload, the
encode time per trainer rank, the metadata every receiver reads, the upload,
the download per receiver, the apply, and the end to end (pipelined:
receivers apply chunks while the ranks upload; serial: every stage after the
other), next to full-weight broadcast over the same link.

  python3 bench/scale_projection.py                       # Kimi-K2 BF16, defaults
  python3 bench/scale_projection.py --ranks 256 --link-gbit 100
"""
import argparse
import math


def binary_entropy(p):
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    # The model: Kimi-K2 in BF16 (refit layout generate, docs/scale.md).
    ap.add_argument("--params", type=float, default=1.0264e12,
                    help="canonical elements (Kimi-K2: 1,026.4 G)")
    ap.add_argument("--width", type=int, default=2, help="bytes per element (BF16: 2)")
    ap.add_argument("--tensors", type=int, default=69_975, help="canonical tensors (Kimi-K2 BF16: 69,975)")
    ap.add_argument("--chunks", type=int, default=0,
                    help="chunks of a version (0: one per 8 MiB of each rank's owned bytes "
                         "plus one per tensor)")
    ap.add_argument("--rates", default="0.01,0.03", help="fractions of elements changed")
    # Trainer side.
    ap.add_argument("--ranks", type=int, default=1024, help="trainer ranks owning the model")
    ap.add_argument("--encode-gbs", default="0.01:648,0.03:458",
                    help="detect + encode GB/s of owned checkpoint per rank, per rate "
                         "(H200 EncodeOnDevice, docs/benchmarks.md 'GPU (H200)')")
    ap.add_argument("--rank-uplink-gbit", type=float, default=25.0,
                    help="each rank's upload link to the store, Gbit/s")
    # Payload: bytes per changed element = (H(r) / r + value bits) / 8.
    ap.add_argument("--value-bits", type=float, default=3.5,
                    help="entropy of a changed element's XOR value, bits (fixture steps)")
    ap.add_argument("--payload-over-bound", type=float, default=1.02,
                    help="payload / order-0 bound (fixtures: 1.001-1.05)")
    # Metadata (refit_many_tensors_bench: bytes not payload, per chunk and tensor).
    ap.add_argument("--meta-per-chunk", type=float, default=120.0,
                    help="bytes per chunk that are not payload: framing, envelope, manifest "
                         "entry, part-list entry")
    ap.add_argument("--meta-per-tensor", type=float, default=160.0,
                    help="bytes per tensor in the announcement and the manifest tables")
    # Store and receivers.
    ap.add_argument("--store-gbit", type=float, default=3.35,
                    help="store throughput each receiver gets, Gbit/s")
    ap.add_argument("--receivers", type=int, default=64, help="receivers (inference replicas)")
    ap.add_argument("--store-ingest-gbit", type=float, default=400.0,
                    help="the store's total ingest, Gbit/s")
    ap.add_argument("--gpus-per-receiver", type=int, default=16)
    ap.add_argument("--apply-gbs", default="0.01:4140,0.03:2180",
                    help="GB of model per second one GPU applies in place, per rate "
                         "(H200 receiver pause: 32 GiB in 8.3 / 15.8 ms)")
    ap.add_argument("--per-tensor-us", type=float, default=59.0,
                    help="publish + receive cost per tensor beyond its bytes, microseconds "
                         "(refit_many_tensors_bench with chunk packs)")
    ap.add_argument("--get-ms", type=float, default=0.0,
                    help="latency of one object read, milliseconds: a receiver reads a "
                         "version's chunk objects one after the other")
    ap.add_argument("--tail-s", type=float, default=1.0,
                    help="vote, decision and activation after the last chunk, seconds")
    a = ap.parse_args()

    def per_rate(spec):
        return {float(k): float(v) for k, v in (x.split(":") for x in spec.split(","))}

    enc = per_rate(a.encode_gbs)
    app = per_rate(a.apply_gbs)
    model_bytes = a.params * a.width
    owned = model_bytes / a.ranks
    chunks = a.chunks or int(a.ranks * math.ceil(owned / (8 << 20)) + a.tensors)
    meta = chunks * a.meta_per_chunk + 2 * a.tensors * a.meta_per_tensor
    link = a.store_gbit * 1e9 / 8
    print(f"model {model_bytes / 1e12:.2f} TB ({a.params / 1e9:.0f} G elements x {a.width} B), "
          f"{a.tensors:,} tensors, {chunks:,} chunks; {a.ranks} ranks own "
          f"{owned / 1e9:.2f} GB each; {a.receivers} receivers of "
          f"{a.gpus_per_receiver} GPUs at {a.store_gbit} Gbit/s each")
    print(f"metadata per version (announcement + manifest + framing): {meta / 1e6:.1f} MB")
    full = model_bytes / link
    print(f"full weights at {a.store_gbit} Gbit/s per receiver: {full:,.0f} s")
    print("| change | payload GB | B / changed | encode / rank s | upload s | "
          "download / receiver s | apply s | per-tensor s | end to end (pipelined) s | "
          "serial s | full / refit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in [float(x) for x in a.rates.split(",")]:
        per_changed = (binary_entropy(r) / r + a.value_bits) / 8 * a.payload_over_bound
        payload = a.params * r * per_changed
        t_enc = owned / (enc[r] * 1e9)
        t_up = max(payload / a.ranks / (a.rank_uplink_gbit * 1e9 / 8),
                   payload / (a.store_ingest_gbit * 1e9 / 8))
        t_down = (payload + meta) / link + chunks * a.get_ms * 1e-3
        t_apply = model_bytes / a.gpus_per_receiver / (app[r] * 1e9)
        t_tensor = a.tensors * a.per_tensor_us * 1e-6
        pipelined = t_enc + max(t_up, t_down, t_tensor) + t_apply + a.tail_s
        serial = t_enc + t_up + t_down + t_tensor + t_apply + a.tail_s
        print(f"| {r:.0%} | {payload / 1e9:.1f} | {per_changed:.2f} | {t_enc:.3f} | "
              f"{t_up:.2f} | {t_down:.1f} | {t_apply:.3f} | {t_tensor:.1f} | "
              f"{pipelined:.1f} | {serial:.1f} | {full / pipelined:.0f}x |")


if __name__ == "__main__":
    main()
