"""The chunked loss (models/loss.py) against F.cross_entropy on explicit logits, and the models' fused path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from angpt.models import build_model, registry
from angpt.models.loss import linear_cross_entropy


def reference(x, w, t, scale=None):
    logits = x @ w.t()
    if scale is not None:
        logits = logits * scale
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), t, ignore_index=-100)


def leaves(n=37, d=8, v=11, scale="vector"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, d, generator=g, dtype=torch.float64, requires_grad=True)
    s = {"none": None, "scalar": torch.tensor(1.7, dtype=torch.float64), "vector": torch.rand(v, dtype=torch.float64)}
    s = s[scale]
    if s is not None:
        s = (s + 0.5).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[::5] = -100  # ignored rows
    return x, w, s, t


@pytest.mark.parametrize("scale", ["none", "scalar", "vector"])
@pytest.mark.parametrize("chunk", [1, 8, 37, 100])  # 8 does not divide 37
def test_loss_and_gradients_equal_cross_entropy(scale, chunk):
    x, w, s, t = leaves(scale=scale)
    got = linear_cross_entropy(x, w, t, s, chunk=chunk)
    want = reference(x, w, t, s)
    args = [a for a in (x, w, s) if a is not None]
    g_got = torch.autograd.grad(got * 3.0, args)  # an upstream gradient other than 1 reaches every input
    g_want = torch.autograd.grad(want * 3.0, args)
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-12, atol=0)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)


def test_without_gradients_and_all_ignored():
    x, w, s, t = leaves()
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(x, w, t, s, chunk=8), reference(x, w, t, s))
    assert torch.isnan(linear_cross_entropy(x, w, torch.full_like(t, -100), s))  # as F.cross_entropy: 0/0


def model_loss_and_grads(model, x, y, fused, dtype):
    model.zero_grad(set_to_none=True)
    model.fused_loss = fused
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        logits, loss = model(x, y)
    assert (logits is None) == fused
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", sorted(registry.ARCHS))
def test_every_architecture_fused_equals_unfused(arch):
    """fp32: the fused loss and every parameter gradient equal the logits path's to float rounding; bf16 autocast:
    the same matmul dtype, so within bf16 rounding of the logits (1e-2 relative on the loss, and the gradients'
    norm within 5%)."""
    torch.manual_seed(0)
    model = build_model(arch, "tiny")
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    y = torch.randint(0, model.config.vocab_size, (2, 16))
    for dtype, rtol in (("fp32", 1e-5), ("bf16", 1e-2)):
        loss_a, grads_a = model_loss_and_grads(model, x, y, False, dtype)
        loss_b, grads_b = model_loss_and_grads(model, x, y, True, dtype)
        torch.testing.assert_close(loss_b, loss_a, rtol=rtol, atol=0)
        assert grads_a.keys() == grads_b.keys()
        for n in grads_a:
            if dtype == "fp32":
                torch.testing.assert_close(grads_b[n], grads_a[n], rtol=1e-4, atol=1e-6, msg=n)
            else:
                na, nb = grads_a[n].norm(), grads_b[n].norm()
                assert abs(nb - na) <= 0.05 * na + 1e-6, (n, na, nb)
