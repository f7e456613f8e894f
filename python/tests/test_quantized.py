"""Quantized serving formats end to end, against reference quantizers written
here in NumPy from the published conventions (docs/trainer.md, "Quantized
formats"), independently of refit's C++ conversions and of the C++ test
references:

- FP8 E4M3 with 128 x 128 block scales, stored as FP32 `weight_scale_inv`
  (DeepSeek-V3), blocks at the edges zero-padded;
- NVFP4 as ModelOpt writes it (E2M1 codes two a byte, even column in the low
  nibble, an E4M3 scale per 16 elements, an FP32 global scale), in FP32
  arithmetic in ModelOpt's order;
- MXFP4 as gpt-oss stores experts (E2M1 codes, an E8M0 scale per 32
  elements).

Two trainer ranks hold FP32 masters and publish versions directly to a
checkpoint receiver and a host-tensor receiver; after every version both
hold exactly what the reference quantizers make of the masters.
"""

import json

import numpy as np

import refit

from test_ranks import run_all

E4M3_MAX_CODE = 0x7E  # 448; 0x7F is NaN in E4M3FN
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def e4m3_values():
    c = np.arange(E4M3_MAX_CODE + 1)
    e, m = c >> 3, (c & 7).astype(np.float64)
    return np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))


def nearest_code(x, magnitudes):
    """Round to the nearest of `magnitudes` (ascending, code = index), ties to
    the even code, saturating at the largest; the sign goes to the bit above
    the magnitude's (so -0 keeps its sign)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    hi = np.clip(np.searchsorted(magnitudes, a), 1, len(magnitudes) - 1)
    lo = hi - 1
    d_lo, d_hi = a - magnitudes[lo], magnitudes[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(a >= magnitudes[-1], len(magnitudes) - 1, code)
    sign = 0x80 if len(magnitudes) > 8 else 0x8
    return (code | np.where(np.signbit(x), sign, 0)).astype(np.uint8)


E4M3 = e4m3_values()


def e4m3(x):
    return nearest_code(x, E4M3)


def e4m3_value(codes):
    v = E4M3[codes & 0x7F]
    return np.where(codes & 0x80, -v, v)


def e2m1(x):
    return nearest_code(x, E2M1)


def pack_nibbles(codes):
    """Two codes a byte along the last axis, the even element in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def fp8_block(w, block=128):
    """DeepSeek-V3: weight_scale_inv = amax / 448 per zero-padded block (1 for
    an all-zero block), weight = e4m3(x / weight_scale_inv), in FP32."""
    w = w.astype(np.float32)
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    scale = np.ones((br, bc), np.float32)
    q = np.zeros(w.shape, np.uint8)
    for i in range(br):
        for j in range(bc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            amax = np.float32(np.abs(blk).max())
            s = np.float32(1) if amax == 0 else amax / np.float32(448)
            scale[i, j] = s
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = e4m3(blk / s)
    return q, scale


def nvfp4(w):
    """ModelOpt NVFP4: weight_scale_2 = amax / (6 * 448); per 16 elements
    weight_scale = e4m3((block amax / 6) / weight_scale_2) (e4m3(1) for an
    all-zero block); code = e2m1(x / (weight_scale * weight_scale_2)), all in
    FP32."""
    w = w.astype(np.float32)
    g = np.float32(np.abs(w).max()) / np.float32(6 * 448)
    blocks = w.reshape(w.shape[0], -1, 16)
    amax = np.abs(blocks).max(axis=2)
    per_block = (amax / np.float32(6)).astype(np.float32)
    s = e4m3(np.where(amax == 0, np.float32(1), (per_block / g).astype(np.float32)))
    div = (e4m3_value(s).astype(np.float32) * g).astype(np.float32)
    codes = e2m1((blocks / div[:, :, None]).astype(np.float32))
    return pack_nibbles(codes.reshape(w.shape)), s, np.float32(g)


def mxfp4(w):
    """OCP MX v1.0: per 32 elements the E8M0 scale
    clamp(floor(log2(amax)) - 2, -127, 127) + 127 (0 for an all-zero block);
    code = e2m1(x / 2^(scale - 127))."""
    blocks = w.astype(np.float64).reshape(*w.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        shared = np.where(amax == 0, -127, np.floor(np.log2(amax)) - 2)
    shared = np.clip(shared, -127, 127).astype(np.int64)
    codes = e2m1(blocks / np.exp2(shared)[..., None])
    packed = pack_nibbles(codes).reshape(*w.shape[:-1], -1, 16)
    return packed, (shared + 127).astype(np.uint8)


def piece(canon, rows, cols, local, canon_map):
    return {"canonical": canon, "rows": rows, "cols": cols, "local": local, "canon": canon_map}


# w8: FP8 blocks, 200 x 160 (edge blocks padded); rank 0 holds rows 0..127
# (whole block rows), rank 1 the rest. nv: NVFP4 [32, 64] on rank 0. mx:
# MXFP4 experts [2, 8, 64] on rank 1.
LAYOUT = {
    "format": "refit-layout", "version": 1,
    "canonical": [
        {"name": "w8", "dtype": "F8_E4M3", "shape": [200, 160],
         "scale": "w8_scale_inv", "scale_kind": "per_block", "block": [128, 128]},
        {"name": "w8_scale_inv", "dtype": "F32", "shape": [2, 2]},
        {"name": "nv", "dtype": "U8", "shape": [32, 32], "scale": "nv_scale",
         "scale_kind": "nvfp4"},
        {"name": "nv_scale", "dtype": "F8_E4M3", "shape": [32, 4]},
        {"name": "nv_scale_2", "dtype": "F32", "shape": []},
        {"name": "mx_blocks", "dtype": "U8", "shape": [2, 8, 2, 16], "scale": "mx_scales",
         "scale_kind": "mxfp4"},
        {"name": "mx_scales", "dtype": "U8", "shape": [2, 8, 2]},
    ],
    "ranks": [
        {"rank": 0, "tensors": [
            {"name": "w8_top", "dtype": "F32", "shape": [128, 160],
             "pieces": [piece("w8", 128, 160, [0, 160, 1], [0, 160, 1])]},
            {"name": "nv", "dtype": "F32", "shape": [32, 64],
             "pieces": [piece("nv", 32, 64, [0, 64, 1], [0, 64, 1])]}]},
        {"rank": 1, "tensors": [
            {"name": "w8_bottom", "dtype": "F32", "shape": [72, 160],
             "pieces": [piece("w8", 72, 160, [0, 160, 1], [128 * 160, 160, 1])]},
            {"name": "mx", "dtype": "F32", "shape": [16, 64],
             "pieces": [piece("mx_blocks", 16, 64, [0, 64, 1], [0, 64, 1])]}]},
    ],
}


def local(m, rank):
    if rank == 0:
        return {"w8_top": m["w8"][:128], "nv": m["nv"]}
    return {"w8_bottom": m["w8"][128:], "mx": m["mx"].reshape(16, 64)}


def reference(m):
    q, s = fp8_block(m["w8"])
    nv, nv_s, nv_g = nvfp4(m["nv"])
    mx, mx_s = mxfp4(m["mx"])
    return {"w8": q, "w8_scale_inv": s, "nv": nv, "nv_scale": nv_s,
            "nv_scale_2": np.array(nv_g, np.float32), "mx_blocks": mx, "mx_scales": mx_s}


DTYPES = {"w8": "F8_E4M3", "nv_scale": "F8_E4M3"}


def test_reference_quantizers_on_known_values():
    # E4M3: 448 is the largest, ties go to the even code, the sign is kept.
    assert e4m3(np.array([448.0, 500.0]))[1] == 0x7E
    np.testing.assert_array_equal(e4m3(np.array([1.0, 1.0625, 1.1875, -0.0])),
                                  [0x38, 0x38, 0x3A, 0x80])
    # E2M1: 2.5 is a tie between 2 (code 4) and 3 (code 5): even wins; 5 ties
    # 4 (code 6) and 6 (code 7); beyond 6 saturates.
    np.testing.assert_array_equal(e2m1(np.array([2.5, 5.0, 7.0, -0.25, 0.75])),
                                  [4, 6, 7, 8, 2])
    # MXFP4: amax 6 -> floor(log2 6) - 2 = 0 -> scale 127, codes unscaled.
    x = np.zeros(32, np.float32)
    x[0], x[1] = 6.0, -1.5
    packed, scales = mxfp4(x)
    assert scales[0] == 127 and packed[0, 0] == 0x7 | (0xB << 4)
    # NVFP4: a block whose amax is the tensor's gets scale e4m3(448).
    w = np.zeros((1, 16), np.float32)
    w[0, 0] = 3.0
    packed, s, g = nvfp4(w)
    assert s[0, 0] == 0x7E and g == np.float32(3.0) / np.float32(2688)
    assert packed[0, 0] & 0xF == 7  # 3.0 / (448 * g) = 6


def test_quantized_versions_match_numpy_references(tmp_path):
    rng = np.random.default_rng(7)
    masters = {"w8": rng.normal(0, 0.02, (200, 160)).astype(np.float32),
               "nv": rng.normal(0, 0.02, (32, 64)).astype(np.float32),
               "mx": rng.normal(0, 0.02, (2, 8, 64)).astype(np.float32)}
    # All-zero blocks: an FP8 block, an NVFP4 group and an MXFP4 block.
    masters["w8"][128:, 128:] = 0
    masters["nv"][3, 16:32] = 0
    masters["mx"][1, 2, :32] = 0
    base = tmp_path / "base.safetensors"
    refit.save(base, reference(masters), dtypes=DTYPES)
    refit.copy_checkpoint(base, tmp_path / "r0.safetensors")
    store = str(tmp_path / "store")
    key = b"q" * 32
    layout_file = tmp_path / "layout.json"
    layout_file.write_text(json.dumps(LAYOUT))
    ranks = [refit.Publisher(store, layout=layout_file, rank=r,
                             initial={k: v.copy() for k, v in local(masters, r).items()},
                             key=key, decision_timeout=30) for r in (0, 1)]
    coordinator = refit.Coordinator(store, members=["r0", "h0"], ranks=[0, 1], table=base,
                                    key=key, vote_timeout=30, parts_timeout=30)
    receiver = refit.Receiver(store, member="r0", checkpoint_dir=tmp_path / "r0.safetensors",
                              key=key, decision_timeout=30)
    held = {n: np.array(a) for n, a in refit.load(base).items()}
    host = refit.Receiver(store, member="h0", tensors=held,
                          dtypes={n: LAYOUT_DTYPE[n] for n in held}, key=key,
                          decision_timeout=30)

    for version in range(1, 5):
        # An optimizer-like step on a random tenth of the elements, and in
        # version 3 one element grown 8x (its block's scale changes).
        for m in masters.values():
            flat = m.reshape(-1)
            idx = rng.choice(flat.size, flat.size // 10, replace=False)
            flat[idx] += rng.normal(0, 2e-4, idx.size).astype(np.float32)
        if version == 3:
            masters["w8"][5, 7] *= 8
            masters["nv"][9, 40] *= 8
            masters["mx"][0, 4, 50] *= 8
        tasks = {"coordinator": lambda: coordinator.publish(version),
                 "r0": lambda: receiver.sync(version), "h0": lambda: host.sync(version)}
        tasks.update({f"rank{r}": (lambda r=r: ranks[r].publish(version, local(masters, r)))
                      for r in (0, 1)})
        results = run_all(tasks)
        report, parts = results["coordinator"]
        assert report["committed"], report["reason"]
        assert parts["chunks"] > 0
        want = reference(masters)
        got = refit.load(tmp_path / "r0.safetensors")
        for name, arr in want.items():
            np.testing.assert_array_equal(
                np.asarray(got[name]).view(arr.dtype).reshape(arr.shape), arr, err_msg=name)
            np.testing.assert_array_equal(
                held[name].view(arr.dtype).reshape(arr.shape), arr, err_msg=name)


LAYOUT_DTYPE = {c["name"]: c["dtype"] for c in LAYOUT["canonical"]}
