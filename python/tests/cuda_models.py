"""Models in GPU memory for the CUDA tests (imported after their
``pytest.importorskip("torch")``): random BF16 and F32 tensors, optimizer-like
steps that flip low mantissa bits, and host copies for comparisons."""

import numpy as np
import torch

# Sizes off the 64 KiB segment and 8 MiB chunk grid, a zero-size and an F32.
SHAPES = {"a.embed": (3000, 700), "b.norm": (700,), "c.empty": (0, 4),
          "d.mlp": (4099, 1023), "e.f32": (513, 129)}
DTYPES = {n: ("F32" if n.endswith("f32") else "BF16") for n in SHAPES}


def initial_model(seed, shapes=SHAPES):
    """Random bits; names ending in f32 are F32 tensors, the others BF16."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    model = {}
    for name, shape in shapes.items():
        bits = torch.randint(-2**15, 2**15, shape, generator=g, device="cuda", dtype=torch.int32)
        if name.endswith("f32"):
            model[name] = (bits.to(torch.float32) / 7.0).contiguous()
        else:
            model[name] = bits.to(torch.int16).view(torch.bfloat16)
    return model


def step(model, seed, rate=0.02):
    """Flips low mantissa bits of `rate` of the elements, as an optimizer step does."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, t in model.items():
        ints = {2: torch.int16, 4: torch.int32}[t.element_size()]
        bits = t.view(ints).clone()
        if bits.numel():
            mask = torch.rand(bits.shape, generator=g, device="cuda") < rate
            flips = torch.randint(1, 8, bits.shape, generator=g, device="cuda").to(ints)
            bits ^= torch.where(mask, flips, torch.zeros_like(flips))
        out[name] = bits.view(t.dtype)
    return out


def host(model):
    """Host copies: NumPy arrays (BF16 as uint16 bit patterns)."""
    return {n: t.cpu().numpy() if t.dtype != torch.bfloat16 else t.view(torch.int16).cpu()
            .numpy().view(np.uint16) for n, t in model.items()}
