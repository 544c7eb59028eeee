"""The layers under PyTorch's autocast on the CPU (`torch.autocast("cpu",
dtype=torch.bfloat16)`, and float16 for every layer but the ∞-former's): they run forward
and backward, track float32, and keep their memory in float32."""

import pytest
import torch

import lethe

LAYERS = {
    "xl": lambda: lethe.TransformerXL(64, 4, span=64, block=32),
    "expire": lambda: lethe.ExpireSpan(64, 4, max_span=128, block=32),
    "adaptive": lambda: lethe.AdaptiveSpan(64, 4, max_span=64, block=32),
    "compressive": lambda: lethe.Compressive(64, 4, span=32, slots=16, rate=2, block=32),
    "infinity": lambda: lethe.InfinityFormer(64, 4, span=32, basis=16, block=32),
}


CASES = [(kind, torch.bfloat16) for kind in LAYERS] + [(kind, torch.float16) for kind in LAYERS if kind != "infinity"]


@pytest.mark.parametrize("kind,dtype", CASES)
def test_autocast_tracks_float32(kind, dtype):
    torch.manual_seed(0)
    layer = LAYERS[kind]().train()
    g = torch.Generator().manual_seed(1)
    state32 = state16 = None
    for _ in range(4):  # the memories fill: compressed, absorbed
        x = torch.randn(2, 32, 64, generator=g)
        y32, state32 = layer(x, state32)
        with torch.autocast("cpu", dtype=dtype):
            y16, state16 = layer(x, state16)
    assert y16.dtype == dtype
    gap = ((y16.float() - y32).abs().max() / y32.abs().max()).item()
    assert gap < 0.05, f"{kind}: {dtype} output {gap:.3f} away from float32's (relative)"
    for name, t in state16.tensors:
        assert not t.is_floating_point() or t.dtype == torch.float32, f"{kind}: memory `{name}` in {t.dtype}"
    # Gradients of the next block: the lower precision's step points where float32's does.
    x, w = torch.randn(2, 32, 64, generator=g), torch.randn(y32.shape, generator=g)
    layer.zero_grad()
    y32, _ = layer(x, state32)
    ((y32 * w).sum() + layer.aux_loss).backward()
    want = torch.cat([p.grad.flatten() for p in layer.parameters()])
    layer.zero_grad()
    with torch.autocast("cpu", dtype=dtype):
        y16, _ = layer(x, state16)
        loss = (y16.float() * w).sum() + layer.aux_loss.float()
    loss.backward()
    got = torch.cat([p.grad.flatten() for p in layer.parameters()])
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=0).item()
    assert cosine > 0.99, f"{kind}: {dtype} gradient at cosine {cosine:.4f} of float32's"
