"""The training loss without the full logits: mean cross-entropy of logits = scale * (x W^T), chunk by chunk.

Materialising the logits costs, per token, V values in the compute dtype, an fp32 copy for the loss, log-softmax's
fp32 output and in backward a zero-filled fp32 gradient: at V = 50,304 and 16K tokens a micro-batch that is
several GB (on a CPU at the `demo` preset it neither costs nor saves measurable time: benchmarks/RESULTS.md,
issue 9). Here each
chunk of rows computes its logits, its loss and, when a gradient is wanted, the gradient at once (softmax minus
one-hot, Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models", arXiv 2411.09009, and
Liger-Kernel's fused linear cross-entropy): dx, dW and d(scale) are kept and `backward` only multiplies them by the
incoming gradient. Peak extra memory is one chunk's logits.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # targets not counted, as F.cross_entropy's default
CHUNK_BYTES = {"cuda": 512 << 20, "cpu": 8 << 20}  # one chunk's fp32 logits: large for GPU matmuls, cache-sized on CPU


def chunk_rows(n_rows: int, vocab: int, device: torch.device) -> int:
    """Rows per chunk: the chunk's fp32 logits within CHUNK_BYTES for the device type."""
    budget = CHUNK_BYTES.get(device.type, CHUNK_BYTES["cuda"])
    return max(1, min(n_rows, budget // (4 * vocab)))


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype F.linear would multiply in here: autocast's when it is on for x's device, else x's own."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def chunked_loss(x, weight, scale, targets, ignore_index: int, chunk: int, want: tuple[bool, bool, bool]):
    """(loss, dx, dW, d_scale) of the mean cross-entropy over the rows of x [N, d]; the gradients (of the loss
    itself) only where `want` says, else None. The matmuls run in the dtype F.linear would use here."""
    dt = compute_dtype(x)
    want_dx, want_dw, want_ds = want
    grads = any(want)
    with torch.autocast(x.device.type, enabled=False):
        xc, wc = x.to(dt), weight.to(dt)  # the casts autocast makes for F.linear, once rather than per chunk
        acc = torch.promote_types(dt, torch.float32)  # the loss's dtype: fp32, or fp64 for fp64 inputs
        s = scale.to(acc) if scale is not None else None
        valid = targets != ignore_index
        count = valid.sum()
        per_row = 1.0 / count.clamp_min(1).to(acc)  # each valid row's weight in the mean
        loss = torch.zeros((), device=x.device, dtype=acc)
        dx = torch.empty_like(x) if want_dx else None
        dw = torch.zeros(weight.shape, device=x.device, dtype=acc) if want_dw else None
        ds = torch.zeros_like(s) if want_ds else None
        for i in range(0, x.shape[0], chunk):
            raw = (xc[i : i + chunk] @ wc.t()).to(acc)
            z = raw * s if s is not None else raw
            t = targets[i : i + chunk].clamp_min(0).unsqueeze(1)  # ignored rows: any class, masked below
            ok = valid[i : i + chunk]
            lse = torch.logsumexp(z, dim=1)
            loss += ((lse - z.gather(1, t).squeeze(1)) * ok).sum()
            if not grads:
                continue
            g = torch.exp(z - lse.unsqueeze(1))  # softmax
            g.scatter_add_(1, t, torch.full(t.shape, -1.0, device=g.device, dtype=acc))  # minus the one-hot target
            g *= (ok * per_row).unsqueeze(1)
            if ds is not None:
                ds += (g * raw).sum(0) if ds.ndim else (g * raw).sum()
            if s is not None:
                g *= s
            g = g.to(dt)
            if dx is not None:
                dx[i : i + chunk] = g @ wc
            if dw is not None:
                dw += (g.t() @ xc[i : i + chunk]).to(acc)
        loss = loss / count  # 0/0 = nan when every target is ignored, as F.cross_entropy
    return loss, dx, dw, ds


class LinearCrossEntropy(torch.autograd.Function):
    """loss = mean over non-ignored rows of CE(scale * (x W^T), target), gradients computed in the forward."""

    @staticmethod
    def forward(ctx, x, weight, scale, targets, ignore_index: int, chunk: int):
        loss, dx, dw, ds = chunked_loss(x, weight, scale, targets, ignore_index, chunk, ctx.needs_input_grad[:3])
        ctx.save_for_backward(dx, dw, ds)
        ctx.dtypes = (weight.dtype, scale.dtype if scale is not None else None)
        return loss

    @staticmethod
    def backward(ctx, grad):
        dx, dw, ds = ctx.saved_tensors
        w_dtype, s_dtype = ctx.dtypes
        return (
            dx * grad.to(dx.dtype) if dx is not None else None,
            (dw * grad).to(w_dtype) if dw is not None else None,
            (ds * grad).to(s_dtype) if ds is not None else None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    scale: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
    chunk: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of logits = scale * (x W^T) against `targets` without the full logits.

    x [..., d], weight [V, d], targets [...] (ignore_index: not counted), scale None, a 0-d tensor or [V] (applied
    to the fp32 logits); `chunk` rows at a time (default: chunk_rows). Equal to
    `F.cross_entropy((scale * F.linear(x, weight)).float(), targets)` up to rounding, gradients included.
    """
    x2, t = x.reshape(-1, x.shape[-1]), targets.reshape(-1)
    rows = chunk or chunk_rows(x2.shape[0], weight.shape[0], x.device)
    inputs = (x2, weight, scale)
    if torch.is_grad_enabled() and any(v is not None and v.requires_grad for v in inputs):
        return LinearCrossEntropy.apply(x2, weight, scale, t, ignore_index, rows)
    return chunked_loss(x2, weight, scale, t, ignore_index, rows, (False, False, False))[0]  # eval: no gradients
