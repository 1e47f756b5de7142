"""
PoPE attention: the public API, a plain PyTorch reference, and a fused Triton
flash-attention kernel (forward and backward) behind the same API.

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

pope_attention runs the Triton kernel (CUDA, or the CPU under TRITON_INTERPRET=1
set before this module is imported) and raises PopeKernelUnsupported for input
it does not take; kernel_unsupported_reason(q, k, v, delta) says beforehand.
pope_attention_reference runs anywhere.

How the kernel works (numbers behind each choice: notes/kernel.md):
  * The key side goes through a fused elementwise pre-pass that writes the
    2D-long Cartesian keys kc = [mu cos, mu sin] in the input dtype (phases in
    float32). The attention loop is then a plain flash attention with a QK dot
    of depth 2D (two dots of depth D) and a PV dot of depth D: no softplus or
    sin/cos inside the loop, where they would be recomputed for every
    (query block, key block) pair.
  * Whatever a program holds for its whole life (the query block of the
    forward and of the dq kernel, the key block of the dk/dv kernel) is made
    Cartesian in registers from the raw input instead, and that program maps
    its 2D-long gradient back to dq, dk and its share of ddelta itself.
  * The backward is FlashAttention-2's: a pre-pass for rowsum(dO*O) (fused with
    the Cartesian queries), a dk/dv kernel that loops over query blocks and a
    dq kernel that loops over key blocks. No atomics anywhere: ddelta is summed
    per key block in the kernel and over blocks and the batch by torch, so the
    same inputs give bitwise the same gradients.
  * Causal blocks above the diagonal (with q_offset) are skipped; only blocks
    that straddle it, or the end of the sequence, pay for a mask.
  * Under torch.compile the op is a torch.library custom op with a fake and an
    autograd formula, so a model that calls it stays one graph; in eager mode
    the same forward/backward run as a torch.autograd.Function, which costs
    less host time per call.

Usage:
    python pope_kernel.py --bench     # benchmark table on a CUDA GPU
    python pope_kernel.py --check     # forward + 4 grads vs float64 on the GPU
    python pope_kernel.py --bench --variants   # + time split by stage
    python pope_kernel.py --aot       # no GPU: compile for sm_90, registers/spills/shared memory
    TRITON_INTERPRET=1 python -m pytest tests/test_kernel.py   # CPU tests
"""

import contextlib
import math
import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
    _TRITON_IMPORT_ERROR = None
except ImportError as e:  # the reference still works; the kernel reports why not
    _TRITON_IMPORT_ERROR = e

    class _NoTriton:
        """Stands in for triton and triton.language so that the kernel
        definitions below still import; nothing here ever launches."""

        def __getattr__(self, name):
            return _NoTriton()

        def __call__(self, *args, **kwargs):
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]
            return self

    triton = tl = libdevice = _NoTriton()

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


# -----------------------------------------------------------------------------
# Triton kernels

# Read once, like triton.jit itself reads it when the kernels below are
# decorated: setting TRITON_INTERPRET later changes neither.
_INTERPRET = _TRITON_IMPORT_ERROR is None and os.environ.get("TRITON_INTERPRET", "0") == "1"
_INTERPRETED = tl.constexpr(_INTERPRET)


@triton.jit
def _dot(a, b, acc, DOT_PREC: tl.constexpr):
    # Triton 3.6's interpreter multiplies bf16 tiles as raw uint16 bits: there
    # every dot takes float32 operands (exact for bf16/fp16 values, as on tensor cores)
    if _INTERPRETED:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    return acc


def _interpreter_int(x):
    # Triton 3.6's interpreter keeps scalars as 1-element arrays, which numpy
    # >= 2.4 no longer turns into a range() bound: the loops below convert
    # their bounds with this under the interpreter (compiled code never calls it)
    return int(x.handle.data.reshape(-1)[0]) if hasattr(x, "handle") else int(x)


if hasattr(triton, "constexpr_function"):  # lets compiled kernels name it
    _interpreter_int = triton.constexpr_function(_interpreter_int)


@triton.jit
def _cast(x, dtype):
    # Triton 3.6's interpreter truncates float32 -> bf16 (the GPU rounds to
    # nearest even), which doubles bf16 errors in the CPU tests: round first,
    # with integer ops, so that its truncation is exact
    if _INTERPRETED:
        if dtype == tl.bfloat16:
            b = x.to(tl.float32).to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            x = b.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _softplus(x):
    # log(1 + e) loses e's digits once e = exp(-|x|) is tiny, and there mu is
    # tiny too; a short series keeps mu's relative accuracy for very negative x
    e = tl.exp(-tl.abs(x))
    log1p_e = tl.where(e < 0.01, e * (1.0 - e * (0.5 - e * (0.33333333 - 0.25 * e))), tl.log(1.0 + e))
    return tl.maximum(x, 0.0) + log1p_e


@triton.jit
def _cos_sin(phase):
    # Phases reach position * theta_0 = T radians, but the GPU's fast sin/cos
    # are accurate only near [-pi, pi]: reduce first, 2*pi split in two parts
    # (Cody-Waite) so that k*2*pi costs no digits for k up to millions.
    # After that the hardware's sin.approx/cos.approx (abs. error ~5e-7) do;
    # libdevice's sinf/cosf would add a Payne-Hanek path with a local-memory array.
    k = tl.floor(phase * 0.15915494309189535 + 0.5)
    r = tl.fma(k, -6.2831854820251465, phase)
    r = tl.fma(k, 1.7484556000744883e-07, r)
    if _INTERPRETED:
        c = tl.cos(r)
        s = tl.sin(r)
    else:
        c = libdevice.fast_cosf(r)
        s = libdevice.fast_sinf(r)
    return c, s


@triton.jit
def _cartesian_tile(x, pos, theta, delta, IS_MU: tl.constexpr):
    """mu*cos and mu*sin (float32) of a (rows, D) float32 tile; pos (rows,) float32."""
    mu = x if IS_MU else _softplus(x)
    c, s = _cos_sin(pos[:, None] * theta[None, :] + delta[None, :])
    return mu * c, mu * s


@triton.jit
def _cartesian_grad(x, pos, theta, delta, gc, gs, IS_MU: tl.constexpr):
    """Back from the gradient (gc, gs) w.r.t. [mu cos, mu sin] to the gradient
    w.r.t. x (raw, or mu with IS_MU) and w.r.t. the phase. Called after the
    main loop, recomputing mu, cos and sin rather than keeping those three
    tiles live in registers through it."""
    mu = x if IS_MU else _softplus(x)
    c, s = _cos_sin(pos[:, None] * theta[None, :] + delta[None, :])
    dmu = gc * c + gs * s
    dx = dmu if IS_MU else dmu * tl.sigmoid(x)
    return dx, mu * (gs * c - gc * s)


@triton.jit
def _cartesian_kernel(X, XC, THETA, DELTA, O, DO, DI,
                      sxb, sxh, sxt, sxd, sob, soh, sot, sod, sdob, sdoh, sdot, sdod,
                      H, T, pos0,
                      HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
                      HAS_DELTA: tl.constexpr, IS_MU: tl.constexpr, WITH_DI: tl.constexpr):
    """XC[b, h, t] = [mu cos(phase), mu sin(phase)] (B, H, T, 2D) in XC's dtype.
    WITH_DI also writes DI[b, h, t] = rowsum(dO * O), the backward's other
    per-query-row pre-pass, from the same program."""
    pid_t = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_t < T
    x = tl.load(X + b * sxb + h * sxh + offs_t[:, None] * sxt + offs_d[None, :] * sxd,
                mask=rows[:, None], other=0.0).to(tl.float32)
    theta = tl.load(THETA + offs_d)
    if HAS_DELTA:
        delta = tl.load(DELTA + h * HEAD_DIM + offs_d)
    else:
        delta = tl.zeros([HEAD_DIM], dtype=tl.float32)
    xc, xs = _cartesian_tile(x, (pos0 + offs_t).to(tl.float32), theta, delta, IS_MU)
    out = XC + bh * T * 2 * HEAD_DIM + offs_t[:, None] * (2 * HEAD_DIM) + offs_d[None, :]
    tl.store(out, _cast(xc, XC.dtype.element_ty), mask=rows[:, None])
    tl.store(out + HEAD_DIM, _cast(xs, XC.dtype.element_ty), mask=rows[:, None])
    if WITH_DI:
        o = tl.load(O + b * sob + h * soh + offs_t[:, None] * sot + offs_d[None, :] * sod,
                    mask=rows[:, None], other=0.0).to(tl.float32)
        do = tl.load(DO + b * sdob + h * sdoh + offs_t[:, None] * sdot + offs_d[None, :] * sdod,
                     mask=rows[:, None], other=0.0).to(tl.float32)
        tl.store(DI + bh * T + offs_t, tl.sum(o * do, axis=1), mask=rows)


@triton.jit
def _query_block(Q, THETA, sqb, sqh, sqt, sqd, H, TQ, q_offset,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """The prologue of the forward and the dq kernel: which BLOCK_M query rows of
    which (batch, head) this program owns, and those rows made Cartesian (queries
    have no delta) in registers, in Q's dtype. The block lives for the whole
    program, so it is never written out."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < TQ
    qpos = q_offset + offs_m
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                mask=rows[:, None], other=0.0)
    theta = tl.load(THETA + offs_d)
    qc, qs = _cartesian_tile(q.to(tl.float32), qpos.to(tl.float32), theta,
                             tl.zeros([HEAD_DIM], dtype=tl.float32), False)
    return bh, b, h, m0, offs_m, offs_d, rows, qpos, theta, _cast(qc, q.dtype), _cast(qs, q.dtype)


@triton.jit
def _fwd_inner(acc, l_i, m_i, qc, qs, qpos, KC, K, V, sks, skd, svs, svd, theta, delta,
               lo, hi, TK, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
               CAUSAL: tl.constexpr, K_IS_MU: tl.constexpr, K_FROM_RAW: tl.constexpr,
               DOT_PREC: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    if _INTERPRETED:  # (the interpreter turns every assigned value into a tensor again)
        lo_hi = (_interpreter_int(lo), _interpreter_int(hi))
    else:
        lo_hi = (lo, hi)
    for start_n in range(lo_hi[0], lo_hi[1], BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kmask = offs_n < TK
        if K_FROM_RAW:  # the in-loop variant, kept to measure against (notes/kernel.md)
            k = tl.load(K + offs_n[:, None] * sks + offs_d[None, :] * skd, mask=kmask[:, None], other=0.0)
            kc32, ks32 = _cartesian_tile(k.to(tl.float32), offs_n.to(tl.float32), theta, delta, K_IS_MU)
            kc = _cast(kc32, qc.dtype)
            ks = _cast(ks32, qc.dtype)
        else:
            kptr = KC + offs_n[:, None] * (2 * HEAD_DIM) + offs_d[None, :]
            if MASK:
                kc = tl.load(kptr, mask=kmask[:, None], other=0.0)
                ks = tl.load(kptr + HEAD_DIM, mask=kmask[:, None], other=0.0)
            else:
                kc = tl.load(kptr)
                ks = tl.load(kptr + HEAD_DIM)
        s = _dot(qc, tl.trans(kc), tl.zeros([qc.shape[0], BLOCK_N], dtype=tl.float32), DOT_PREC)
        s = _dot(qs, tl.trans(ks), s, DOT_PREC)
        if MASK:
            ok = kmask[None, :]
            if CAUSAL:
                ok = ok & (offs_n[None, :] <= qpos[:, None])
            s = tl.where(ok, s * qk_scale, float("-inf"))
        else:
            s = s * qk_scale
        # every row sees key 0, which is in the first block visited: m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        vptr = V + offs_n[:, None] * svs + offs_d[None, :] * svd
        if MASK:
            v = tl.load(vptr, mask=kmask[:, None], other=0.0)
        else:
            v = tl.load(vptr)
        acc = _dot(_cast(p, v.dtype), v, acc, DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _pope_fwd(Q, K, KC, V, O, LSE, THETA, DELTA,
              sqb, sqh, sqt, sqd, skb, skh, skt, skd, svb, svh, svt, svd, sob, soh, sot, sod,
              qk_scale, H, TQ, TK, q_offset, Q_BUCKET, K_BUCKET,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, K_IS_MU: tl.constexpr, K_FROM_RAW: tl.constexpr,
              DOT_PREC: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch, head), all keys they see.
    Writes O and the row's log2-sum-exp (for the backward). qk_scale holds
    sm_scale*log2(e) so that the softmax runs on exp2."""
    bh, b, h, m0, offs_m, offs_d, rows, qpos, theta, qc, qs = _query_block(
        Q, THETA, sqb, sqh, sqt, sqd, H, TQ, q_offset, HEAD_DIM, BLOCK_M)
    delta = tl.load(DELTA + h * HEAD_DIM + offs_d)

    K = K + b * skb + h * skh
    KC = KC + bh * TK * 2 * HEAD_DIM
    V = V + b * svb + h * svh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # key blocks that every row of this block sees in full run without a mask;
    # the ones straddling the diagonal or the end of the keys run with one;
    # the ones above the diagonal not at all
    if CAUSAL:
        hi_full = tl.minimum(q_offset + m0 + 1, TK) // BLOCK_N * BLOCK_N
        hi = tl.minimum(q_offset + m0 + BLOCK_M, TK)
    else:
        hi_full = TK // BLOCK_N * BLOCK_N
        hi = TK
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qc, qs, qpos, KC, K, V, skt, skd, svt, svd, theta, delta,
                               0, hi_full, TK, qk_scale, HEAD_DIM, BLOCK_N, False, CAUSAL, K_IS_MU,
                               K_FROM_RAW, DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qc, qs, qpos, KC, K, V, skt, skd, svt, svd, theta, delta,
                               hi_full, hi, TK, qk_scale, HEAD_DIM, BLOCK_N, True, CAUSAL, K_IS_MU,
                               K_FROM_RAW, DOT_PREC)
    acc = acc / l_i[:, None]
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :] * sod,
             _cast(acc, O.dtype.element_ty), mask=rows[:, None])
    tl.store(LSE + bh * TQ + offs_m, m_i + tl.math.log2(l_i), mask=rows)


@triton.jit
def _dkdv_inner(dkc, dks, dv, kc, ks, v, offs_n, QC, DO, sdot, sdod, LSE, DI,
                lo, hi, TQ, q_offset, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr,
                DOT_PREC: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    if _INTERPRETED:  # (the interpreter turns every assigned value into a tensor again)
        lo_hi = (_interpreter_int(lo), _interpreter_int(hi))
    else:
        lo_hi = (lo, hi)
    for start_m in range(lo_hi[0], lo_hi[1], BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < TQ
        # query rows past TQ load as zeros with lse = Di = 0: their p is 1 but
        # dO and Di are 0, so they add nothing to dk, dv and ddelta
        qptr = QC + offs_m[None, :] * (2 * HEAD_DIM) + offs_d[:, None]
        qcT = tl.load(qptr, mask=rows[None, :], other=0.0)
        qsT = tl.load(qptr + HEAD_DIM, mask=rows[None, :], other=0.0)
        lse = tl.load(LSE + offs_m, mask=rows, other=0.0)
        sT = _dot(kc, qcT, tl.zeros([kc.shape[0], BLOCK_M], dtype=tl.float32), DOT_PREC)
        sT = _dot(ks, qsT, sT, DOT_PREC)
        pT = tl.math.exp2(sT * qk_scale - lse[None, :])
        if MASK:
            pT = tl.where(offs_n[:, None] <= q_offset + offs_m[None, :], pT, 0.0)
        do = tl.load(DO + offs_m[:, None] * sdot + offs_d[None, :] * sdod, mask=rows[:, None], other=0.0)
        dv = _dot(_cast(pT, do.dtype), do, dv, DOT_PREC)
        di = tl.load(DI + offs_m, mask=rows, other=0.0)
        dpT = _dot(v, tl.trans(do), tl.zeros([kc.shape[0], BLOCK_M], dtype=tl.float32), DOT_PREC)
        dsT = _cast(pT * (dpT - di[None, :]), do.dtype)
        dkc = _dot(dsT, tl.trans(qcT), dkc, DOT_PREC)
        dks = _dot(dsT, tl.trans(qsT), dks, DOT_PREC)
    return dkc, dks, dv


@triton.jit
def _pope_bwd_dkdv(K, V, QC, DO, LSE, DI, DK, DV, DDP, THETA, DELTA,
                   skb, skh, skt, skd, svb, svh, svt, svd, sdob, sdoh, sdot, sdod,
                   sdkb, sdkh, sdkt, sdkd, sdvb, sdvh, sdvt, sdvd,
                   sm_scale, qk_scale, H, TQ, TK, q_offset, NBLK_DDP, Q_BUCKET, K_BUCKET,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, K_IS_MU: tl.constexpr, DOT_PREC: tl.constexpr):
    """One program: BLOCK_N key rows of one (batch, head), every query block
    that sees them. Writes dk, dv and this block's row of ddelta partials
    DDP[b, pid_n, h, :] (summed over blocks and batch by the caller)."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    cols = offs_n < TK
    k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :] * skd,
                mask=cols[:, None], other=0.0)
    v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svt + offs_d[None, :] * svd,
                mask=cols[:, None], other=0.0)
    theta = tl.load(THETA + offs_d)
    delta = tl.load(DELTA + h * HEAD_DIM + offs_d)
    kc32, ks32 = _cartesian_tile(k.to(tl.float32), offs_n.to(tl.float32), theta, delta, K_IS_MU)
    kc = _cast(kc32, k.dtype)
    ks = _cast(ks32, k.dtype)

    QC = QC + bh * TQ * 2 * HEAD_DIM
    DO = DO + b * sdob + h * sdoh
    LSE = LSE + bh * TQ
    DI = DI + bh * TQ
    dkc = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dks = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        # rows before lo see none of these keys; rows from full_lo on see all
        lo = tl.maximum(n0 - q_offset, 0) // BLOCK_M * BLOCK_M
        full_lo = tl.maximum(n0 + BLOCK_N - 1 - q_offset, 0)
        full_lo = tl.maximum((full_lo + BLOCK_M - 1) // BLOCK_M * BLOCK_M, lo)
    else:
        lo = 0
        full_lo = 0
    dkc, dks, dv = _dkdv_inner(dkc, dks, dv, kc, ks, v, offs_n, QC, DO, sdot, sdod, LSE, DI,
                               lo, tl.minimum(full_lo, TQ), TQ, q_offset, qk_scale,
                               HEAD_DIM, BLOCK_M, True, DOT_PREC)
    dkc, dks, dv = _dkdv_inner(dkc, dks, dv, kc, ks, v, offs_n, QC, DO, sdot, sdod, LSE, DI,
                               full_lo, TQ, TQ, q_offset, qk_scale,
                               HEAD_DIM, BLOCK_M, False, DOT_PREC)
    # dv first, so that its registers are free for the rest
    tl.store(DV + b * sdvb + h * sdvh + offs_n[:, None] * sdvt + offs_d[None, :] * sdvd,
             _cast(dv, DV.dtype.element_ty), mask=cols[:, None])
    # back from the Cartesian key [mu c, mu s] to k and the phase (= delta's);
    # pointer tiles too are rebuilt here: kept from the prologue they cost registers
    k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :] * skd,
                mask=cols[:, None], other=0.0).to(tl.float32)
    dk, dphase = _cartesian_grad(k, offs_n.to(tl.float32), theta, delta, dkc * sm_scale, dks * sm_scale, K_IS_MU)
    tl.store(DK + b * sdkb + h * sdkh + offs_n[:, None] * sdkt + offs_d[None, :] * sdkd,
             _cast(dk, DK.dtype.element_ty), mask=cols[:, None])
    dphase = tl.where(cols[:, None], dphase, 0.0)
    tl.store(DDP + ((b * NBLK_DDP + pid_n) * H + h) * HEAD_DIM + offs_d, tl.sum(dphase, 0))


@triton.jit
def _dq_inner(dqc, dqs, qc, qs, do, lse, di, qpos, KC, V, svt, svd,
              lo, hi, TK, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
              CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    if _INTERPRETED:  # (the interpreter turns every assigned value into a tensor again)
        lo_hi = (_interpreter_int(lo), _interpreter_int(hi))
    else:
        lo_hi = (lo, hi)
    for start_n in range(lo_hi[0], lo_hi[1], BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kmask = offs_n < TK
        kptr = KC + offs_n[None, :] * (2 * HEAD_DIM) + offs_d[:, None]
        vptr = V + offs_n[None, :] * svt + offs_d[:, None] * svd
        if MASK:
            kcT = tl.load(kptr, mask=kmask[None, :], other=0.0)
            ksT = tl.load(kptr + HEAD_DIM, mask=kmask[None, :], other=0.0)
            vT = tl.load(vptr, mask=kmask[None, :], other=0.0)
        else:
            kcT = tl.load(kptr)
            ksT = tl.load(kptr + HEAD_DIM)
            vT = tl.load(vptr)
        s = _dot(qc, kcT, tl.zeros([qc.shape[0], BLOCK_N], dtype=tl.float32), DOT_PREC)
        s = _dot(qs, ksT, s, DOT_PREC)
        p = tl.math.exp2(s * qk_scale - lse[:, None])
        if MASK:
            ok = kmask[None, :]
            if CAUSAL:
                ok = ok & (offs_n[None, :] <= qpos[:, None])
            p = tl.where(ok, p, 0.0)
        dp = _dot(do, vT, tl.zeros([qc.shape[0], BLOCK_N], dtype=tl.float32), DOT_PREC)
        ds = _cast(p * (dp - di[:, None]), qc.dtype)
        dqc = _dot(ds, tl.trans(kcT), dqc, DOT_PREC)
        dqs = _dot(ds, tl.trans(ksT), dqs, DOT_PREC)
    return dqc, dqs


@triton.jit
def _pope_bwd_dq(Q, KC, V, DO, LSE, DI, DQ, THETA,
                 sqb, sqh, sqt, sqd, svb, svh, svt, svd, sdob, sdoh, sdot, sdod,
                 sdqb, sdqh, sdqt, sdqd,
                 sm_scale, qk_scale, H, TQ, TK, q_offset, Q_BUCKET, K_BUCKET,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch, head), every key block
    they see. Writes dq."""
    bh, b, h, m0, offs_m, offs_d, rows, qpos, theta, qc, qs = _query_block(
        Q, THETA, sqb, sqh, sqt, sqd, H, TQ, q_offset, HEAD_DIM, BLOCK_M)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdot + offs_d[None, :] * sdod,
                 mask=rows[:, None], other=0.0)
    lse = tl.load(LSE + bh * TQ + offs_m, mask=rows, other=0.0)
    di = tl.load(DI + bh * TQ + offs_m, mask=rows, other=0.0)

    KC = KC + bh * TK * 2 * HEAD_DIM
    V = V + b * svb + h * svh
    dqc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dqs = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        hi_full = tl.minimum(q_offset + m0 + 1, TK) // BLOCK_N * BLOCK_N
        hi = tl.minimum(q_offset + m0 + BLOCK_M, TK)
    else:
        hi_full = TK // BLOCK_N * BLOCK_N
        hi = TK
    dqc, dqs = _dq_inner(dqc, dqs, qc, qs, do, lse, di, qpos, KC, V, svt, svd, 0, hi_full, TK, qk_scale,
                         HEAD_DIM, BLOCK_N, False, CAUSAL, DOT_PREC)
    dqc, dqs = _dq_inner(dqc, dqs, qc, qs, do, lse, di, qpos, KC, V, svt, svd, hi_full, hi, TK, qk_scale,
                         HEAD_DIM, BLOCK_N, True, CAUSAL, DOT_PREC)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                mask=rows[:, None], other=0.0).to(tl.float32)
    dq, _ = _cartesian_grad(q, qpos.to(tl.float32), theta, tl.zeros([HEAD_DIM], dtype=tl.float32),
                            dqc * sm_scale, dqs * sm_scale, False)
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :] * sdqd,
             _cast(dq, DQ.dtype.element_ty), mask=rows[:, None])


# -----------------------------------------------------------------------------
# launch configuration: autotuned on the GPU, small and fixed under the interpreter

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim (32 uses 64's). Each
# list holds configs that compiled for sm_90 without spilling, or with the
# fewest spills (ptxas -v, notes/kernel.md), plus the H200's autotuning winners
# (D=64: fwd 64x64/4 at T<=4k and 128x128/8 at 16k, dk/dv 32x64/4, dq 64x32/4
# at 1k and 128x64/8 above); the first is the one POPE_AUTOTUNE=0 uses.
_BLOCKS = {
    "fwd": {64: [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 128, 8, 4), (128, 64, 8, 4)],
            128: [(128, 32, 8, 3), (128, 64, 8, 2), (64, 32, 4, 3)]},
    "dkdv": {64: [(32, 128, 8, 3), (32, 64, 4, 3), (16, 128, 8, 3), (32, 64, 4, 2), (64, 64, 8, 3),
                  (32, 128, 8, 2)],
             128: [(16, 64, 8, 3), (32, 64, 8, 3), (16, 32, 4, 3)]},
    "dq": {64: [(128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 32, 8, 4)],
           128: [(64, 32, 8, 3), (64, 16, 4, 3), (128, 16, 8, 3)]},
}
# decoding (a handful of query rows against a long cache) is not worth a
# tuning pass for every cache length: one config with a short query block
_DECODE_FWD = (16, 64, 4, 3)
_DECODE_MAX_TQ = 16
_INTERP_BLOCK = 16
_DDP_MIN_BLOCK_N = 16  # smallest dk/dv key block: rows of the ddelta partials buffer
_PREP_BLOCK_T = 64
_AUTOTUNE = not _INTERPRET and os.environ.get("POPE_AUTOTUNE", "1") != "0"
_POISON = False  # tests set this: every buffer the kernels must fill starts as NaN
_KEYS = ["Q_BUCKET", "K_BUCKET", "HEAD_DIM", "CAUSAL"]


def _blocks(kind, D):
    return _BLOCKS[kind][max(D, 64)]


def _autotuned(kernel, kind, keys, **kw):
    configs = []
    for D in _BLOCKS[kind]:
        for bm, bn, w, s in _BLOCKS[kind][D]:
            cfg = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            cfg.head_dim = D
            configs.append(cfg)

    def prune(configs, named_args, **kwargs):
        return [c for c in configs if c.head_dim == max(kwargs["HEAD_DIM"], 64)]

    return triton.autotune(configs, key=_KEYS + keys, prune_configs_by={"early_config_prune": prune}, **kw)(kernel)


_pope_fwd_tuned = _autotuned(_pope_fwd, "fwd", ["K_IS_MU", "K_FROM_RAW"])
# the autotuner's trial runs may leave partials in rows the chosen block size
# does not write: zero them again before the real run
_pope_bwd_dkdv_tuned = _autotuned(_pope_bwd_dkdv, "dkdv", ["K_IS_MU"], reset_to_zero=["DDP"])
_pope_bwd_dq_tuned = _autotuned(_pope_bwd_dq, "dq", [])


def _launch(kernel, tuned, blocks, grid, args, kwargs):
    """Run `tuned` (autotuned) if blocks is None, else `kernel` with blocks (or,
    under the interpreter, its small fixed blocks); grid is a function of the
    config dict, as in Triton."""
    if _INTERPRET:
        meta, extra = {"BLOCK_M": _INTERP_BLOCK, "BLOCK_N": _INTERP_BLOCK}, {}
    elif blocks is None and _AUTOTUNE:
        tuned[grid](*args, **kwargs)
        return
    else:
        bm, bn, w, s = blocks
        meta, extra = {"BLOCK_M": bm, "BLOCK_N": bn}, {"num_warps": w, "num_stages": s}
    kernel[grid(meta)](*args, **kwargs, **meta, **extra)


def _bucket(n):
    return 1 << max(n - 1, 0).bit_length()


def _empty(shape, like, dtype=None):
    out = torch.empty(shape, device=like.device, dtype=dtype or like.dtype)
    return out.fill_(float("nan")) if _POISON else out


_THETA_HOST = {}


def _theta(D, base, device):
    # rounded from float64 exactly as pope_frequencies does, so that phase =
    # pos*theta is the same float32 number as in the reference
    if device.type != "cuda":
        return pope_frequencies(D, base, device, torch.float32)
    key = (D, float(base))
    host = _THETA_HOST.get(key)
    if host is None:
        host = _THETA_HOST[key] = pope_frequencies(D, base, "cpu", torch.float32).pin_memory()
    # A D-float copy per call from pinned memory, not a cached device tensor: under
    # torch.compile(mode="reduce-overhead") the first calls run inside a CUDA graph
    # tree's memory pool, where a tensor kept alive by a cache breaks the pool's
    # bookkeeping; an async copy from pinned memory is also capturable in a graph.
    return host.to(device, non_blocking=True)


def _on_device(x):
    # Triton launches on the current CUDA device, whatever the tensors' device
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _dot_precision(dtype):
    # a float32 caller asked for float32: no silent tf32
    return "ieee" if dtype == torch.float32 else "tf32"


def _cartesian(x, theta, delta, pos0, is_mu, o=None, do=None):
    """The pre-pass: (B, H, T, 2D) Cartesian x in x's dtype; with o and do also
    rowsum(dO*O) as (B, H, T) float32."""
    B, H, T, D = x.shape
    xc = _empty((B, H, T, 2 * D), x)
    with_di = o is not None
    di = _empty((B, H, T), x, torch.float32) if with_di else xc
    o_, do_ = (o, do) if with_di else (x, x)
    grid = (triton.cdiv(T, _PREP_BLOCK_T), B * H)
    _cartesian_kernel[grid](x, xc, theta, delta if delta is not None else theta, o_, do_, di,
                            *x.stride(), *o_.stride(), *do_.stride(), H, T, pos0,
                            HEAD_DIM=D, BLOCK_T=_PREP_BLOCK_T, HAS_DELTA=delta is not None,
                            IS_MU=is_mu, WITH_DI=with_di, num_warps=4)
    return (xc, di) if with_di else xc


def _fwd(q, k, v, delta, causal, sm_scale, base, q_offset, k_is_mu, k_from_raw=False, blocks=None):
    with _on_device(q):
        return _fwd_on_device(q, k, v, delta, causal, sm_scale, base, q_offset, k_is_mu, k_from_raw, blocks)


def _fwd_on_device(q, k, v, delta, causal, sm_scale, base, q_offset, k_is_mu, k_from_raw, blocks):
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    theta = _theta(D, base, q.device)
    out = _empty((B, H, Tq, D), q)
    lse = _empty((B, H, Tq), q, torch.float32)
    kc = k if k_from_raw else _cartesian(k, theta, delta, 0, k_is_mu)
    grid = lambda meta: (triton.cdiv(Tq, meta["BLOCK_M"]), B * H)
    args = (q, k, kc, v, out, lse, theta, delta, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            sm_scale * 1.4426950408889634, H, Tq, Tk, q_offset, _bucket(Tq), _bucket(Tk))
    kwargs = dict(HEAD_DIM=D, CAUSAL=causal, K_IS_MU=k_is_mu, K_FROM_RAW=k_from_raw,
                  DOT_PREC=_dot_precision(q.dtype))
    if blocks is None and (Tq <= _DECODE_MAX_TQ or not _AUTOTUNE):
        blocks = _DECODE_FWD if Tq <= _DECODE_MAX_TQ else _blocks("fwd", D)[0]
    _launch(_pope_fwd, _pope_fwd_tuned, blocks, grid, args, kwargs)
    return out, lse


def _bwd(do, q, k, v, delta, out, lse, causal, sm_scale, base, q_offset, k_is_mu, stages=None):
    """dq, dk, dv and ddelta (w.r.t. the clamped float32 delta). `stages`, for
    timing only, names the launches to run."""
    with _on_device(q):
        return _bwd_on_device(do, q, k, v, delta, out, lse, causal, sm_scale, base, q_offset, k_is_mu, stages)


def _bwd_on_device(do, q, k, v, delta, out, lse, causal, sm_scale, base, q_offset, k_is_mu, stages):
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    run = lambda name: stages is None or name in stages
    theta = _theta(D, base, q.device)
    qk_scale = sm_scale * 1.4426950408889634
    prec = _dot_precision(q.dtype)
    buckets = (_bucket(Tq), _bucket(Tk))
    fixed = lambda kind: None if _AUTOTUNE else _blocks(kind, D)[0]
    # The 2D-long queries live only through the dk/dv kernel and the keys only
    # through the dq kernel: at most one of them is allocated at a time.
    dk = _empty((B, H, Tk, D), k)
    dv = _empty((B, H, Tk, D), v)
    nblk = triton.cdiv(Tk, _DDP_MIN_BLOCK_N)
    # rows past the chosen block count stay zero: the sum below is over all rows
    ddp = torch.zeros((B, nblk, H, D), device=q.device, dtype=torch.float32)
    qc, di = _cartesian(q, theta, None, q_offset, False, o=out, do=do) if run("prep_q") else (None, None)
    if run("dkdv"):
        grid = lambda meta: (triton.cdiv(Tk, meta["BLOCK_N"]), B * H)
        _launch(_pope_bwd_dkdv, _pope_bwd_dkdv_tuned, fixed("dkdv"), grid,
                (k, v, qc, do, lse, di, dk, dv, ddp, theta, delta, *k.stride(), *v.stride(), *do.stride(),
                 *dk.stride(), *dv.stride(), sm_scale, qk_scale, H, Tq, Tk, q_offset, nblk, *buckets),
                dict(HEAD_DIM=D, CAUSAL=causal, K_IS_MU=k_is_mu, DOT_PREC=prec))
    del qc  # (no other reference may keep it: that would hold both 2D-long copies at once)
    kc = _cartesian(k, theta, delta, 0, k_is_mu) if run("prep_k") else None
    dq = _empty((B, H, Tq, D), q)
    if run("dq"):
        grid = lambda meta: (triton.cdiv(Tq, meta["BLOCK_M"]), B * H)
        args = (q, kc, v, do, lse, di, dq, theta, *q.stride(), *v.stride(), *do.stride(), *dq.stride(),
                sm_scale, qk_scale, H, Tq, Tk, q_offset, *buckets)
        _launch(_pope_bwd_dq, _pope_bwd_dq_tuned, fixed("dq"), grid, args,
                dict(HEAD_DIM=D, CAUSAL=causal, DOT_PREC=prec))
    # a fixed-order reduction (no atomics): bitwise the same every run
    ddelta = ddp.sum(dim=(0, 1))
    return dq, dk, dv, ddelta


# -----------------------------------------------------------------------------
# autograd: a torch.library custom op for torch.compile (opaque, no graph
# break, a fake for shape propagation) and an autograd.Function for eager mode

# one namespace per module name, so a second copy of this file loaded under
# another name (tests/test_kernel.py loads one under the interpreter) does not
# collide with the first
_NS = __name__.replace(".", "_")


@torch.library.custom_op(f"{_NS}::fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor, causal: bool,
            sm_scale: float, base: float, q_offset: int, k_is_mu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd(q, k, v, delta, causal, sm_scale, base, q_offset, k_is_mu)


@_fwd_op.register_fake
def _(q, k, v, delta, causal, sm_scale, base, q_offset, k_is_mu):
    B, H, Tq, D = q.shape
    return q.new_empty((B, H, Tq, D)), q.new_empty((B, H, Tq), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor,
            out: torch.Tensor, lse: torch.Tensor, causal: bool, sm_scale: float, base: float,
            q_offset: int, k_is_mu: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd(do, q, k, v, delta, out, lse, causal, sm_scale, base, q_offset, k_is_mu)


@_bwd_op.register_fake
def _(do, q, k, v, delta, out, lse, causal, sm_scale, base, q_offset, k_is_mu):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), delta.new_empty(delta.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, delta, causal, sm_scale, base, q_offset, k_is_mu = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, delta, out, lse)
    ctx.args = (causal, sm_scale, base, q_offset, k_is_mu)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, delta, out, lse = ctx.saved_tensors
    dq, dk, dv, ddelta = _bwd_op(dout, q, k, v, delta, out, lse, *ctx.args)
    return dq, dk, dv, ddelta, None, None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _PopeAttention(torch.autograd.Function):
    """The same forward and backward for eager mode: the custom op's Python
    dispatch costs about 0.15-0.25 ms of host time per forward+backward more
    than this (measured with empty kernels, notes/kernel.md), which shows at
    T = 1k where the GPU work itself is a fraction of a millisecond."""

    @staticmethod
    def forward(ctx, q, k, v, delta, causal, sm_scale, base, q_offset, k_is_mu):
        out, lse = _fwd(q, k, v, delta, causal, sm_scale, base, q_offset, k_is_mu)
        ctx.save_for_backward(q, k, v, delta, out, lse)
        ctx.args = (causal, sm_scale, base, q_offset, k_is_mu)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, delta, out, lse = ctx.saved_tensors
        dq, dk, dv, ddelta = _bwd(dout, q, k, v, delta, out, lse, *ctx.args)
        return dq, dk, dv, ddelta, None, None, None, None, None


# -----------------------------------------------------------------------------
# public entry points

class PopeKernelUnsupported(ValueError):
    """Raised by pope_attention for input the Triton kernel does not support."""


_SUPPORTED = ("the PoPE Triton kernel takes CUDA tensors (or CPU tensors under TRITON_INTERPRET=1) "
              "of one dtype among bfloat16, float16 and float32, with head dim 32, 64 or 128")
_CAPABILITY = {}


def kernel_unsupported_reason(q, k, v, delta):
    """None if the Triton kernel can run on these inputs, else why not (a sentence
    that names what is supported). model.py's attn_impl="auto" uses this to fall
    back to the reference with one warning."""
    if _TRITON_IMPORT_ERROR is not None:
        return f"Triton is not importable ({_TRITON_IMPORT_ERROR}); {_SUPPORTED}"
    try:
        _check_shapes(q, k, v, delta, 0)
    except ValueError as e:
        return f"{e}; {_SUPPORTED}"
    dev = q.device
    if any(t.device != dev for t in (k, v, delta)):
        return f"q, k, v and delta are on different devices; {_SUPPORTED}"
    if dev.type == "cpu" and not _INTERPRET:
        return f"got CPU tensors without TRITON_INTERPRET=1 set before importing pope_kernel; {_SUPPORTED}"
    if dev.type not in ("cpu", "cuda"):
        return f"got {dev.type} tensors; {_SUPPORTED}"
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"got q, k, v in {q.dtype}, {k.dtype}, {v.dtype}; {_SUPPORTED}"
    if not delta.dtype.is_floating_point:
        return f"delta must be floating point, got {delta.dtype}"
    if q.size(-1) not in (32, 64, 128):
        return f"got head dim {q.size(-1)}; {_SUPPORTED}"
    if q.size(2) == 0 or k.size(2) == 0 or q.size(0) * q.size(1) == 0:
        return f"got an empty input {tuple(q.shape)}, {tuple(k.shape)}; {_SUPPORTED}"
    if dev.type == "cuda" and not _INTERPRET and torch.version.hip is None and not torch.compiler.is_compiling():
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        if idx not in _CAPABILITY:
            _CAPABILITY[idx] = torch.cuda.get_device_capability(idx)
        if _CAPABILITY[idx] < (8, 0):
            return (f"the GPU has compute capability {_CAPABILITY[idx]}, the kernel needs 8.0 or newer "
                    f"(Ampere, Ada, Hopper); {_SUPPORTED}")
    return None


def pope_attention(q, k, v, delta, *, causal=True, sm_scale=None, base=10000.0,
                   q_offset=0, k_is_mu=False):
    """PoPE attention through the fused Triton kernel (same contract as
    pope_attention_reference). Raises PopeKernelUnsupported, a ValueError,
    for input the kernel does not take; kernel_unsupported_reason says why
    without raising."""
    _check_shapes(q, k, v, delta, q_offset)
    reason = kernel_unsupported_reason(q, k, v, delta)
    if reason is not None:
        raise PopeKernelUnsupported(reason)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.size(-1))
    # clamped outside the op so that autograd zeroes ddelta outside [-2pi, 0]
    # exactly like the reference's torch.clamp
    delta = torch.clamp(delta, -TWO_PI, 0.0).float().contiguous()
    args = (bool(causal), float(sm_scale), float(base), int(q_offset), bool(k_is_mu))
    if torch.compiler.is_compiling():  # one opaque node: no graph break
        return _fwd_op(q, k, v, delta, *args)[0]
    return _PopeAttention.apply(q, k, v, delta, *args)


# -----------------------------------------------------------------------------
# benchmark and GPU checks: python pope_kernel.py --bench [--check] [--variants]

def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _inputs(B, H, Tq, Tk, D, dtype, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g) for T in (Tq, Tk, Tk))
    delta = torch.rand(H, D, device=device, generator=g) * -7.0 + 0.5  # partly outside [-2pi, 0]
    do = torch.randn(B, H, Tq, D, device=device, dtype=dtype, generator=g)
    return q, k, v, delta, do


def _grads(fn, q, k, v, delta, do, dtype=None, **kw):
    xs = [x.detach().to(dtype or x.dtype).requires_grad_(True) for x in (q, k, v)]
    xs.append(delta.detach().clone().to(torch.float64 if dtype == torch.float64 else delta.dtype).requires_grad_(True))
    out = fn(*xs, **kw)
    return [out.detach()] + list(torch.autograd.grad(out, xs, do.to(out.dtype)))


def _check(cases=None, device="cuda"):
    """Forward and the four gradients against a float64 reference on the GPU,
    with untuned (first) configs, poisoned outputs and a determinism check."""
    global _AUTOTUNE, _POISON
    saved = _AUTOTUNE, _POISON
    _AUTOTUNE, _POISON = False, True
    bound = {torch.float32: (1e-5, 1e-5), torch.float16: (3e-3, 5e-3), torch.bfloat16: (1e-2, 2e-2)}
    cases = cases or [  # B, H, Tq, Tk, D, dtype, causal, q_offset, k_is_mu
        (2, 3, 300, 300, 64, torch.bfloat16, True, 0, False),
        (2, 3, 300, 300, 64, torch.float16, True, 0, False),
        (2, 3, 300, 300, 64, torch.float32, True, 0, False),
        (1, 2, 257, 257, 32, torch.bfloat16, True, 0, False),
        (1, 2, 257, 257, 128, torch.bfloat16, True, 0, False),
        (2, 2, 200, 333, 64, torch.bfloat16, False, 0, False),
        (2, 2, 100, 357, 64, torch.bfloat16, True, 257, False),
        (2, 2, 1, 1000, 64, torch.bfloat16, True, 999, True),
        (2, 2, 1, 1000, 128, torch.bfloat16, True, 999, True),
    ]
    ok = True
    for B, H, Tq, Tk, D, dtype, causal, off, kmu in cases:
        q, k, v, delta, do = _inputs(B, H, Tq, Tk, D, dtype, device, seed=Tq * Tk + D)
        if kmu:
            k = F.softplus(k.float()).to(dtype)
        kw = dict(causal=causal, q_offset=off, k_is_mu=kmu)
        ref = _grads(pope_attention_reference, q, k, v, delta, do, torch.float64, **kw)
        got = _grads(pope_attention, q, k, v, delta, do, **kw)
        again = _grads(pope_attention, q, k, v, delta, do, **kw)
        naive = _grads(pope_attention_reference, q, k, v, delta, do, **kw)
        errs = [_rel(a, b) for a, b in zip(got, ref)]
        errs_naive = [_rel(a, b) for a, b in zip(naive, ref)]
        same = all(torch.equal(a, b) for a, b in zip(got, again))
        good = same and all(e == e and e < bound[dtype][i > 0] for i, e in enumerate(errs))
        ok &= good
        print(f"check {'ok ' if good else 'BAD'} B={B} H={H} Tq={Tq} Tk={Tk} D={D} {str(dtype)[6:]:8s} "
              f"causal={causal:d} off={off} k_is_mu={kmu:d}  rel err out/dq/dk/dv/ddelta "
              + " ".join(f"{e:.1e}" for e in errs) + "  (naive path: " + " ".join(f"{e:.1e}" for e in errs_naive)
              + f")  bitwise-deterministic={same}", flush=True)
    _AUTOTUNE, _POISON = saved
    return ok


def _time(fn, grad_to_none=None):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def _graph_time(step, leaves):
    """Median time of one CUDA graph replay of step(), which must be warm
    (autotuned, compiled); .grad buffers come from the graph's pool."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for x in leaves:
                x.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for x in leaves:
        x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return _time(graph.replay)


def _peak_mb(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _bench(shapes, variants=False):
    dtype = torch.bfloat16
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"causal, bf16, median of do_bench (CUDA events, L2 flushed)")
    print("# fwd+bwd twice: eager (Python, autograd and launch overhead included) and as one CUDA graph replay")
    print(f"{'path':28s} {'B,H,T,D':16s} {'fwd ms':>8s} {'TFLOP/s':>8s} {'fwd+bwd ms':>11s} {'TFLOP/s':>8s} "
          f"{'graph ms':>9s} {'TFLOP/s':>8s} {'peak MB':>8s}")
    rows = []
    for B, H, T, D in shapes:
        q, k, v, delta, do = _inputs(B, H, T, T, D, dtype, seed=T)
        q128, k128, v128, _, do128 = _inputs(B, H, T, T, 2 * D, dtype, seed=T + 1)
        inv = 1.0 / 10000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D)
        ang = torch.arange(T, device="cuda", dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        # correctness line: the kernel (autotuned configs) and the naive bf16
        # path against the reference on float32 inputs (SDPA's float32 kernels)
        ref = _grads(pope_attention_reference, q, k, v, delta, do, torch.float32)
        got = _grads(pope_attention, q, k, v, delta, do)
        naive = _grads(pope_attention_reference, q, k, v, delta, do)
        print(f"{'  check vs fp32 reference':28s} {f'{B},{H},{T},{D}':16s} kernel out/dq/dk/dv/ddelta "
              + " ".join(f"{_rel(a, b):.1e}" for a, b in zip(got, ref))
              + "   naive bf16 " + " ".join(f"{_rel(a, b):.1e}" for a, b in zip(naive, ref)), flush=True)
        del ref, got, naive
        leaves = [x.requires_grad_(True) for x in (q, k, v, delta, q128, k128, v128)]
        paths = {
            "pope triton kernel": (lambda: pope_attention(q, k, v, delta), 2 * D, D, do),
            "pope naive (cart.+SDPA)": (lambda: pope_attention_reference(q, k, v, delta), 2 * D, D, do),
            "rope+SDPA D=64": (lambda: F.scaled_dot_product_attention(_rope(q, cos, sin), _rope(k, cos, sin), v,
                                                                      is_causal=True), D, D, do),
            "SDPA D=128": (lambda: F.scaled_dot_product_attention(q128, k128, v128, is_causal=True), 2 * D, 2 * D, do128),
        }
        for name, (f, dqk, dv_, g) in paths.items():
            # causal: half of the T x T scores; backward = QK^T again, dV, dP, dQ, dK
            fl_f = B * H * T * T * (dqk + dv_)
            fl_b = B * H * T * T * (3 * dqk + 2 * dv_)
            with torch.no_grad():
                t_f = _time(f)
            t_fb = _time(lambda: f().backward(g), grad_to_none=leaves)
            for x in leaves:
                x.grad = None
            mem = _peak_mb(lambda: f().backward(g))
            try:
                t_g = _graph_time(lambda: f().backward(g), leaves)
            except Exception as e:  # noqa: BLE001  (a path that cannot be captured still gets its eager row)
                print(f"    (CUDA graph capture failed for {name}: {e!r:.200})")
                t_g = float("nan")
            for x in leaves:
                x.grad = None
            rows.append((name, (B, H, T, D), t_f, t_fb, t_g, mem))
            print(f"{name:28s} {f'{B},{H},{T},{D}':16s} {t_f:8.3f} {fl_f / t_f * 1e-9:8.1f} {t_fb:11.3f} "
                  f"{(fl_f + fl_b) / t_fb * 1e-9:8.1f} {t_g:9.3f} {(fl_f + fl_b) / t_g * 1e-9:8.1f} {mem:8.0f}",
                  flush=True)
        if variants:
            _variants(q, k, v, delta, do)
        paths = leaves = q = k = v = q128 = k128 = v128 = None  # free this shape's tensors
        torch.cuda.empty_cache()
    return rows


def _variants(q, k, v, delta, do):
    """Where the time goes: forward with the in-loop Cartesian keys against the
    pre-pass, and the backward with one stage left out at a time."""
    D = q.size(-1)
    sm = 1.0 / math.sqrt(D)
    dc = torch.clamp(delta.detach(), -TWO_PI, 0.0).float().contiguous()
    q, k, v = q.detach(), k.detach(), v.detach()
    args = (dc, True, sm, 10000.0, 0, False)
    out, lse = _fwd(q, k, v, *args)
    bargs = (do, q, k, v, dc, out, lse, True, sm, 10000.0, 0, False)
    fns = {
        "fwd (k pre-pass + attention)": lambda: _fwd(q, k, v, *args),
        "fwd, Cartesian k in the loop": lambda: _fwd(q, k, v, *args, k_from_raw=True),
        "fwd, k pre-pass alone": lambda: _cartesian(k, _theta(D, 10000.0, q.device), dc, 0, False),
        "bwd (all)": lambda: _bwd(*bargs),
        "bwd without dq kernel": lambda: _bwd(*bargs, stages={"prep_q", "dkdv", "prep_k"}),
        "bwd without dk/dv kernel": lambda: _bwd(*bargs, stages={"prep_q", "prep_k", "dq"}),
        "bwd pre-passes only": lambda: _bwd(*bargs, stages={"prep_q", "prep_k"}),
    }
    t = {name: _time(fn) for name, fn in fns.items()}
    g = {}
    for name, fn in fns.items():
        try:
            g[name] = _graph_time(fn, [])
        except Exception:  # noqa: BLE001
            g[name] = float("nan")
    for name, ms in t.items():
        print(f"    variant {name:34s} {ms:8.3f} ms eager, {g[name]:8.3f} ms as a CUDA graph", flush=True)
    for kern in (_pope_fwd_tuned, _pope_bwd_dkdv_tuned, _pope_bwd_dq_tuned):
        best = {key[:2] + key[4:5]: "{BLOCK_M}x{BLOCK_N}".format(**cfg.kwargs) + f" w{cfg.num_warps} s{cfg.num_stages}"
                for key, cfg in kern.cache.items()}
        print(f"    tuned {kern.base_fn.__name__} (Tq, Tk bucket[, K_IS_MU/K_FROM_RAW]): {best}", flush=True)


# sm_90's largest shared memory per block (227 KB, opt-in): a config above it cannot launch on an H200
_HOPPER_SMEM = 232448


def _aot_compile(kernel, args, kwargs, target):
    """Compile a @triton.jit kernel for `target` exactly as launching it with these
    arguments would (same signature, constexprs and 16-byte alignment attributes),
    without a GPU: Triton's own binder specialises the arguments, then ptxas runs."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(target)
    kwargs = dict(kwargs, debug=False)
    bound, spec, opts = create_function_from_signature(kernel.signature, kernel.params, backend)(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, opts)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def _resources(compiled):
    """Registers, stack (spills) and local memory of a compiled kernel, read from its cubin."""
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    fields = dict(w.split(":", 1) for w in out.split() if w.split(":", 1)[0] in ("REG", "STACK", "LOCAL"))
    return {k.lower(): int(v) for k, v in fields.items()}


def aot_report(cases, all_configs=True, capability=90):
    """Compile every kernel that the forward and backward of each case launch, for
    an sm_<capability> GPU, on any machine (CPU tensors stand in for the GPU ones).
    With all_configs, every autotuning config of the head dim; else the launch's
    own (the first, as with POPE_AUTOTUNE=0). Returns one dict per compile."""
    global _launch, _cartesian_kernel, _AUTOTUNE
    target = triton.backends.compiler.GPUTarget("cuda", capability, 64)
    rows, case = [], None

    def record(kernel, args, kwargs, config):
        c = _aot_compile(kernel, args, kwargs, target)
        rows.append(dict(kernel=kernel.fn.__name__, case=case, config=config, shared=c.metadata.shared,
                         wgmma="wgmma" in c.asm["ptx"], **_resources(c)))

    def launch(kernel, tuned, blocks, grid, args, kwargs):
        # blocks is None where the launch would autotune: then the configs its autotuner would try
        configs = [blocks] if blocks else [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
                                           for c in tuned.early_config_prune(tuned.configs, {}, **kwargs)]
        for bm, bn, w, st in configs:
            record(kernel, args, dict(kwargs, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st), (bm, bn, w, st))

    class _Prepass:  # stands in for _cartesian_kernel[grid](...)
        def __getitem__(self, grid):
            return lambda *args, **kwargs: record(real_prepass, args, dict(kwargs), None)

    saved = _launch, _cartesian_kernel, _AUTOTUNE
    real_prepass = saved[1]
    _launch, _cartesian_kernel, _AUTOTUNE = launch, _Prepass(), all_configs
    try:
        for B, H, Tq, Tk, D, dtype, causal, q_offset, k_is_mu in cases:
            case = f"D={D} {str(dtype)[6:]} Tq={Tq} Tk={Tk}" + (" k_is_mu" if k_is_mu else "")
            q, do = (torch.randn(B, H, Tq, D, dtype=dtype) for _ in range(2))
            k, v = (torch.randn(B, H, Tk, D, dtype=dtype) for _ in range(2))
            delta = torch.zeros(H, D)
            args = (delta, causal, D ** -0.5, 10000.0, q_offset, k_is_mu)
            out, lse = _fwd(q, k, v, *args)
            if Tq > _DECODE_MAX_TQ:
                _bwd(do, q, k, v, *args[:1], out, lse, *args[1:])
    finally:
        _launch, _cartesian_kernel, _AUTOTUNE = saved
    return rows


def _compile_check():
    """torch.compile(fullgraph=True) of a function around pope_attention:
    raises if the custom op breaks the graph."""
    q, k, v, delta, do = _inputs(2, 4, 256, 256, 64, torch.bfloat16)
    f = torch.compile(lambda q, k, v, d: pope_attention(q, k, v, d) * 2.0, fullgraph=True)
    got = _grads(f, q, k, v, delta, do)
    ref = _grads(lambda q, k, v, d: pope_attention(q, k, v, d) * 2.0, q, k, v, delta, do)
    print("torch.compile fullgraph: ok, max |diff| vs eager "
          + " ".join(f"{(a.float() - b.float()).abs().max().item():.1e}" for a, b in zip(got, ref)))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="PoPE attention kernel: GPU benchmark and checks")
    ap.add_argument("--bench", action="store_true", help="the benchmark table (median ms, TFLOP/s, peak MB)")
    ap.add_argument("--check", action="store_true", help="correctness sweep against float64 on the GPU")
    ap.add_argument("--variants", action="store_true", help="with --bench: time variants that leave a stage out")
    ap.add_argument("--compile", action="store_true", help="check torch.compile(fullgraph=True) around the op")
    ap.add_argument("--aot", action="store_true", help="no GPU needed: compile every kernel and autotuning "
                    "config for sm_90 (Hopper); print registers, spills and shared memory")
    a = ap.parse_args()
    if not (a.bench or a.check or a.compile or a.aot):
        ap.error("nothing to do: pass --bench, --check, --compile and/or --aot")
    if a.aot:
        print(f"# triton {triton.__version__}, sm_90; stack = bytes of spills; shared of {_HOPPER_SMEM} per block")
        for D in (64, 128):
            for r in aot_report([(1, 2, 256, 256, D, torch.bfloat16, True, 0, False),
                                 (1, 2, 1, 256, D, torch.bfloat16, True, 255, True)]):
                print(f"{r['kernel']:20s} {r['case']:34s} {str(r['config']):18s} regs {r['reg']:3d} "
                      f"stack {r['stack']:4d} shared {r['shared']:6d} wgmma {r['wgmma']}", flush=True)
        if not (a.bench or a.check or a.compile):
            raise SystemExit(0)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    if a.check and not _check():
        raise SystemExit("correctness check FAILED")
    if a.compile:
        _compile_check()
    if a.bench:
        _bench([(8, 12, 1024, 64), (2, 12, 4096, 64), (1, 12, 16384, 64)], variants=a.variants)
