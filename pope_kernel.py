"""
PoPE attention: the public API, a plain PyTorch reference, and (in the kernel
section further down) a fused Triton flash-attention kernel.

PoPE (Gopalakrishnan et al., arXiv 2509.10534) per head of dim D, on the raw
q/k projections:
    mu_q = softplus(q), mu_k = softplus(k)                     (content only)
    theta_c = base^(-c/D), c = 0..D-1                          (D frequencies)
    phase_q(t) = t*theta_c,  phase_k(s) = s*theta_c + delta_c  (position only)
    a_ts = sm_scale * sum_c mu_q[t,c] mu_k[s,c] cos((s-t) theta_c + delta_c)
delta has shape (H, D) and is clamped to [-2pi, 0] here. The score is the real
dot product of the 2D-long Cartesian vectors [mu cos(phase), mu sin(phase)].

API (q: (B,H,Tq,D), k and v: (B,H,Tk,D)):
    pope_attention(q, k, v, delta, *, causal=True, sm_scale=None,
                   base=10000.0, q_offset=0, k_is_mu=False)
    pope_attention_reference(...same...)
Query row i sits at position q_offset+i, key row j at position j; with causal,
key j is visible to query i iff j <= q_offset+i. sm_scale defaults to 1/sqrt(D).
k_is_mu=True says k already holds mu_k = softplus(k), which is what the KV cache
of model.py stores (D numbers per position, as many bytes as a RoPE cache).

Usage:
    python pope_kernel.py --bench     # benchmark table on a CUDA GPU
"""

import math

import torch
import torch.nn.functional as F

TWO_PI = 2.0 * math.pi


# -----------------------------------------------------------------------------
# plain PyTorch reference

def pope_frequencies(D, base=10000.0, device=None, dtype=torch.float32):
    """theta_c = base^(-c/D) for c = 0..D-1 (RoPE would have D/2 of them)."""
    return base ** (-torch.arange(D, device=device, dtype=torch.float64) / D).to(dtype)


def sdpa_with_offset(q, k, v, *, causal=True, scale=None, q_offset=0):
    """scaled_dot_product_attention where query row i sits at position q_offset+i.

    SDPA's own is_causal aligns the mask top-left, which is wrong once Tq != Tk,
    so any offset case gets an explicit boolean mask."""
    Tq, Tk = q.size(-2), k.size(-2)
    if not causal or q_offset >= Tk - 1 and Tq == 1:  # decoding sees every key
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    if q_offset == 0 and Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    qpos = torch.arange(Tq, device=q.device) + q_offset
    kpos = torch.arange(Tk, device=q.device)
    mask = kpos[None, :] <= qpos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def pope_cartesian(x, positions, delta=None, base=10000.0, is_mu=False):
    """[mu cos(phase), mu sin(phase)], shape (..., T, 2D), phases in float32 or better.

    x: (B, H, T, D) raw projection (or mu already, with is_mu); positions: (T,);
    delta: (H, D) or None (queries carry no delta)."""
    D = x.size(-1)
    cdtype = torch.promote_types(x.dtype, torch.float32)
    theta = pope_frequencies(D, base, x.device, cdtype)
    phase = positions.to(cdtype)[:, None] * theta[None, :]  # (T, D)
    if delta is not None:
        phase = phase + delta.to(cdtype)[:, None, :]  # (H, T, D)
    mu = x.to(cdtype) if is_mu else F.softplus(x.to(cdtype))
    return torch.cat([mu * torch.cos(phase), mu * torch.sin(phase)], dim=-1)


def pope_attention_reference(q, k, v, delta, *, causal=True, sm_scale=None,
                             base=10000.0, q_offset=0, k_is_mu=False):
    """PoPE attention in plain PyTorch: Cartesian 2D-long q/k, then SDPA.

    Never builds a (Tq, Tk, D) tensor. Differentiable in q, k, v and delta.
    Phases are computed in float32 (float64 for float64 inputs); the 2D vectors
    are cast back to v's dtype so SDPA runs its fused kernels under bf16."""
    _check_shapes(q, k, v, delta, q_offset)
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    delta = torch.clamp(delta, -TWO_PI, 0.0)
    qpos = torch.arange(q_offset, q_offset + Tq, device=q.device)
    kpos = torch.arange(Tk, device=q.device)
    qc = pope_cartesian(q, qpos, None, base).to(v.dtype)
    kc = pope_cartesian(k, kpos, delta, base, is_mu=k_is_mu).to(v.dtype)
    return sdpa_with_offset(qc, kc, v, causal=causal, scale=sm_scale, q_offset=q_offset)


def _check_shapes(q, k, v, delta, q_offset):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, T, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, Tq, D = q.shape
    if k.shape[:2] != (B, H) or k.size(-1) != D or v.shape != k.shape:
        raise ValueError(f"k and v must be (B={B}, H={H}, Tk, D={D}); got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if delta.shape != (H, D):
        raise ValueError(f"delta must be (H={H}, D={D}); got {tuple(delta.shape)}")
    if q_offset < 0 or Tq > k.size(2):
        raise ValueError(f"need q_offset >= 0 and Tq <= Tk; got q_offset={q_offset}, Tq={Tq}, Tk={k.size(2)}")


def pope_attention(q, k, v, delta, *, causal=True, sm_scale=None, base=10000.0,
                   q_offset=0, k_is_mu=False):
    """PoPE attention. Dispatches to the fused Triton kernel where it is
    available, else to the reference."""
    return pope_attention_reference(q, k, v, delta, causal=causal, sm_scale=sm_scale,
                                    base=base, q_offset=q_offset, k_is_mu=k_is_mu)


class PopeKernelUnsupported(ValueError):
    """Raised by pope_attention for input the Triton kernel does not support."""


def kernel_unsupported_reason(q, k, v, delta):
    """None if the Triton kernel can run on these inputs, else why not (a sentence
    that names what is supported). model.py's attn_impl="auto" uses this to fall
    back to the reference with one warning."""
    return "the fused Triton kernel is not built yet"
