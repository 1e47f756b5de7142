"""
PoPE attention as one fused Triton flash-attention kernel, forward and backward.

It computes exactly what model.py's PyTorch path computes (the PoPE paper's
score, arXiv 2509.10534), per head of dim D:
    a_ts = sm_scale * sum_c softplus(q)[t,c] softplus(k)[s,c] cos((s-t) theta_c + delta_c),
i.e. a dot product of the 2D-long Cartesian vectors [mu cos(phase), mu sin(phase)].
theta and delta come in as model.py's PoPE section makes them (pope_frequencies,
pope_delta); the kernel's copy of the rest of that math is the few @triton.jit
helpers _softplus, _cos_sin, _cartesian_tile and _cartesian_grad below; a PoPE
variant changes those and model.py together (tests/test_kernel.py compares them).

API (q: (B,H,Tq,D), k and v: (B,H,Tk,D), delta: (H,D), theta: (D,), used as given):
    pope_attention(q, k, v, delta, theta, *, causal=True, sm_scale=None, q_offset=0)
    kernel_unsupported_reason(q, k, v, delta) -> None or why not
Query row i sits at position q_offset+i, key row j at position j; with causal,
key j is visible to query i iff j <= q_offset+i. sm_scale defaults to
1/sqrt(D). Supported: CUDA (compute capability 8.0+), or the CPU under TRITON_INTERPRET=1 set before this module is imported; bf16,
fp16 or fp32; head dim 32, 64 or 128. Anything else raises PopeKernelUnsupported.

For model.KVCache's one-token steps, attention of one query per (batch, head)
over a static cache (ready keys of any power-of-two width, or PoPE's magnitudes
mu_k alone, whose phases the kernel makes), the new key and value written at a
position read on the device; q and k come in ready, or raw with what turns them
(PoPE: theta and the layer's bounded delta; RoPE: the layer's inv_freq):
    decode_attention(q, k, v, k_cache, v_cache, pos, sm_scale, *, theta=None, delta=None, inv_freq=None)
    decode_unsupported_reason(k_cache, v_cache) -> None or why not
    decode_launch(k_cache) -> dict(splits=, block_n=): the launch it picks
(section "decoding" at the end of this file).

How it works (measurements behind each choice: results/kernel.md):
  * Keys go through a fused elementwise pre-pass that writes the 2D-long
    Cartesian keys kc = [mu cos, mu sin] in the input dtype (phases in
    float32). The attention loop is then a plain flash attention with a QK dot
    of depth 2D (two dots of depth D) and a PV dot of depth D: no softplus or
    sin/cos inside the loop, where they would be recomputed for every
    (query block, key block) pair.
  * What a program holds for its whole life (the query block of the forward
    and of the dq kernel, the key block of the dk/dv kernel) is made Cartesian
    in registers from the raw input instead, and that program maps its
    2D-long gradient back to dq, dk and its share of ddelta itself.
  * The backward is FlashAttention-2's: a pre-pass for rowsum(dO*O) (fused with
    the Cartesian queries), a dk/dv kernel that loops over query blocks (and
    writes the Cartesian keys it makes, for the next kernel) and a dq kernel
    that loops over key blocks. No atomics: ddelta is summed per key block in
    the kernel and over blocks and the batch by torch, so the same inputs give
    bitwise the same gradients.
  * Causal blocks above the diagonal (with q_offset) are skipped; only blocks
    that straddle it, or the end of the sequence, pay for a mask. The grids
    start the blocks with the most work first (_heavy_first).
  * Traced by torch.compile, one torch.library custom op with a fake and an
    autograd formula, so a model that calls it compiles into one graph; run
    eagerly, the same forward and backward as a plain autograd.Function, which
    skips the dispatcher's per-call host time. Every launch after the first of
    its kind goes to the compiled kernel's launcher directly (_run).

Benchmarks, GPU checks and the sm_90 compile report: python bench.py --help.
CPU tests: python -m pytest tests/test_kernel.py (runs under TRITON_INTERPRET=1).
"""

import contextlib
import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.language.extra import libdevice
from triton.runtime import driver


def check_shapes(q, k, v, delta, q_offset):
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
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
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
    return int(x.handle.data.reshape(-1)[0]) if hasattr(x, "handle") else int(x)


if hasattr(triton, "constexpr_function"):  # lets compiled kernels name it
    _interpreter_int = triton.constexpr_function(_interpreter_int)


@triton.jit
def _loop_bounds(lo, hi):
    # Triton 3.6's interpreter keeps scalars as 1-element arrays, which numpy >= 2.4
    # no longer takes as a range() bound, and turns every value assigned to a name
    # back into one: the inner loops take (lo, hi) from here, as a tuple, and
    # convert under the interpreter only
    if _INTERPRETED:
        bounds = (_interpreter_int(lo), _interpreter_int(hi))
    else:
        bounds = (lo, hi)
    return bounds


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
    # log1p(e), e = exp(-|x|) in (0, 1]: log(u) with u = 1 + e rounded, corrected by what the rounding
    # added, (u - 1) - e, over u. log(1 + e) alone is off by up to ~65 float32 ulps near x = -4.3, and
    # for tiny e (very negative x, where mu is tiny too) u is 1 and the correction gives e itself.
    e = tl.exp(-tl.abs(x))
    u = 1.0 + e
    return tl.maximum(x, 0.0) + (tl.log(u) - ((u - 1.0) - e) / u)


@triton.jit
def _cos_sin(phase):
    # Phases reach position * theta_0 = T radians, but the GPU's fast sin/cos
    # are accurate only near [-pi, pi]: reduce first, 2*pi split in two parts
    # (Cody-Waite) so that k*2*pi costs no digits for k up to millions.
    # After that the hardware's sin.approx/cos.approx (abs. error ~5e-7) do;
    # libdevice's sinf/cosf would add a Payne-Hanek path with a local-memory array.
    k = tl.floor(phase * 0.15915494309189535 + 0.5)
    if _INTERPRETED:  # Triton 3.6's interpreter rounds an fma's product to float32 first (a phase of 8000
        # would lose ~1e-4 rad): the same two steps in float64, the first exact as the GPU's fma is
        r = (phase.to(tl.float64) - k.to(tl.float64) * 6.2831854820251465).to(tl.float32)
        r = (r.to(tl.float64) + k.to(tl.float64) * 1.7484556000744883e-07).to(tl.float32)
    else:
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
def _cartesian_tile(x, pos, theta, delta):
    """mu*cos and mu*sin (float32) of a (rows, D) float32 tile; pos (rows,) float32."""
    mu = _softplus(x)
    c, s = _cos_sin(pos[:, None] * theta[None, :] + delta[None, :])
    return mu * c, mu * s


@triton.jit
def _cartesian_grad(x, pos, theta, delta, gc, gs):
    """Back from the gradient (gc, gs) w.r.t. [mu cos, mu sin] to the gradient
    w.r.t. x and w.r.t. the phase. Called after the main loop, recomputing mu,
    cos and sin rather than keeping those three tiles live in registers through it."""
    mu = _softplus(x)
    c, s = _cos_sin(pos[:, None] * theta[None, :] + delta[None, :])
    return (gc * c + gs * s) * tl.sigmoid(x), mu * (gs * c - gc * s)


@triton.jit
def _cartesian_kernel(X, XC, THETA, DELTA, O, DO, DI,
                      sxb, sxh, sxt, sxd, sob, soh, sot, sod, sdob, sdoh, sdot, sdod,
                      H, T, pos0,
                      HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
                      HAS_DELTA: tl.constexpr, WITH_DI: tl.constexpr):
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
    xc, xs = _cartesian_tile(x, (pos0 + offs_t).to(tl.float32), theta, delta)
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
def _query_block(Q, THETA, sqb, sqh, sqt, sqd, H, TQ, TK, q_offset,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """The prologue of the forward and the dq kernel: which BLOCK_M query rows of
    which (batch, head) this program owns, those rows made Cartesian (queries
    have no delta) in registers, in Q's dtype, and the keys they see. The block
    lives for the whole program, so it is never written out.
    Keys [0, hi_full) are seen in full by every row of the block and run without a
    mask; [hi_full, hi) straddle the diagonal or the end of the keys and run with
    one; the ones above the diagonal not at all."""
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)  # (the grid's order: see _heavy_first)
    bh = tl.program_id(0).to(tl.int64)
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
    qc, qs = _cartesian_tile(q.to(tl.float32), qpos.to(tl.float32), theta, tl.zeros([HEAD_DIM], dtype=tl.float32))
    if CAUSAL:
        hi_full = tl.minimum(q_offset + m0 + 1, TK) // BLOCK_N * BLOCK_N
        hi = tl.minimum(q_offset + m0 + BLOCK_M, TK)
    else:
        hi_full = TK // BLOCK_N * BLOCK_N
        hi = TK
    return bh, b, h, offs_m, offs_d, rows, qpos, theta, _cast(qc, q.dtype), _cast(qs, q.dtype), hi_full, hi


@triton.jit
def _fwd_inner(acc, l_i, m_i, qc, qs, qpos, KC, V, svs, svd, lo, hi, TK, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
               CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    lo_hi = _loop_bounds(lo, hi)
    for start_n in range(lo_hi[0], lo_hi[1], BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kmask = offs_n < TK
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
            s = tl.where(ok, s, float("-inf"))
        # the scale goes into the row max (max(s) * c = max(s * c), c > 0, rounding included) and
        # into the exponent as one fma per score: one float32 op fewer than scaling s first.
        # Every row sees key 0, which is in the first block visited: m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
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
def _pope_fwd(Q, KC, V, O, LSE, THETA,
              sqb, sqh, sqt, sqd, svb, svh, svt, svd, sob, soh, sot, sod,
              qk_scale, H, TQ, TK, q_offset, Q_BUCKET, K_BUCKET,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch, head), all keys they see.
    Writes O and the row's log2-sum-exp (for the backward). qk_scale holds
    sm_scale*log2(e) so that the softmax runs on exp2."""
    bh, b, h, offs_m, offs_d, rows, qpos, theta, qc, qs, hi_full, hi = _query_block(
        Q, THETA, sqb, sqh, sqt, sqd, H, TQ, TK, q_offset, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL)
    KC = KC + bh * TK * 2 * HEAD_DIM
    V = V + b * svb + h * svh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qc, qs, qpos, KC, V, svt, svd, 0, hi_full, TK, qk_scale,
                               HEAD_DIM, BLOCK_N, False, CAUSAL, DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qc, qs, qpos, KC, V, svt, svd, hi_full, hi, TK, qk_scale,
                               HEAD_DIM, BLOCK_N, True, CAUSAL, DOT_PREC)
    acc = acc / l_i[:, None]
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :] * sod,
             _cast(acc, O.dtype.element_ty), mask=rows[:, None])
    tl.store(LSE + bh * TQ + offs_m, m_i + tl.math.log2(l_i), mask=rows)


@triton.jit
def _join2(a, b):
    # (R, D), (R, D) -> (R, 2D) = [a | b], the layout of a row of the Cartesian tensors
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (a.shape[0], 2 * a.shape[1]))


@triton.jit
def _halves(x):
    # (R, 2D) -> its two (R, D) halves
    return tl.split(tl.permute(tl.reshape(x, (x.shape[0], 2, x.shape[1] // 2)), (0, 2, 1)))


@triton.jit
def _dkdv_inner(dk2, dv, k2, v, offs_n, QC, DO, sdot, sdod, LSE, DI,
                lo, hi, TQ, q_offset, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr,
                DOT_PREC: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    offs_d2 = tl.arange(0, 2 * HEAD_DIM)
    lo_hi = _loop_bounds(lo, hi)
    for start_m in range(lo_hi[0], lo_hi[1], BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < TQ
        # query rows past TQ load as zeros with lse = Di = 0: their p is 1 but
        # dO and Di are 0, so they add nothing to dk, dv and ddelta
        q2 = tl.load(QC + offs_m[:, None] * (2 * HEAD_DIM) + offs_d2[None, :], mask=rows[:, None], other=0.0)
        lse = tl.load(LSE + offs_m, mask=rows, other=0.0)
        sT = _dot(k2, tl.trans(q2), tl.zeros([k2.shape[0], BLOCK_M], dtype=tl.float32), DOT_PREC)
        pT = tl.math.exp2(sT * qk_scale - lse[None, :])
        if MASK:
            pT = tl.where(offs_n[:, None] <= q_offset + offs_m[None, :], pT, 0.0)
        do = tl.load(DO + offs_m[:, None] * sdot + offs_d[None, :] * sdod, mask=rows[:, None], other=0.0)
        dv = _dot(_cast(pT, do.dtype), do, dv, DOT_PREC)
        di = tl.load(DI + offs_m, mask=rows, other=0.0)
        dpT = _dot(v, tl.trans(do), tl.zeros([k2.shape[0], BLOCK_M], dtype=tl.float32), DOT_PREC)
        dsT = _cast(pT * (dpT - di[None, :]), do.dtype)
        dk2 = _dot(dsT, q2, dk2, DOT_PREC)
    return dk2, dv


@triton.jit
def _pope_bwd_dkdv(K, V, QC, DO, LSE, DI, DK, DV, DDP, KC, THETA, DELTA,
                   skb, skh, skt, skd, svb, svh, svt, svd, sdob, sdoh, sdot, sdod,
                   sdkb, sdkh, sdkt, sdkd, sdvb, sdvh, sdvt, sdvd,
                   sm_scale, qk_scale, H, TQ, TK, q_offset, Q_BUCKET, K_BUCKET,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    """One program: BLOCK_N key rows of one (batch, head), every query block
    that sees them. Writes dk, dv, this block's row of ddelta partials
    DDP[pid_n, b * H + h, :] (summed over blocks and batch by the caller), and the
    Cartesian keys it makes, KC (B, H, TK, 2D), for the dq kernel."""
    pid_n = tl.program_id(1)  # (the grid's order: see _heavy_first)
    bh = tl.program_id(0).to(tl.int64)
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
    kc32, ks32 = _cartesian_tile(k.to(tl.float32), offs_n.to(tl.float32), theta, delta)
    # one (BLOCK_N, 2D) key tile [mu cos | mu sin] and one (BLOCK_N, 2D) dk accumulator, not a tile and
    # an accumulator per half: the same products, in wider dots (dk/dv 1.4-3.5% faster on an H200,
    # results/kernel.md); the halves are split again for the chain rule after the loop
    k2 = _join2(_cast(kc32, k.dtype), _cast(ks32, k.dtype))
    # the dq kernel's keys: what the key pre-pass (_cartesian_kernel) would write, from the same helpers
    offs_d2 = tl.arange(0, 2 * HEAD_DIM)
    tl.store(KC + bh * TK * 2 * HEAD_DIM + offs_n[:, None] * (2 * HEAD_DIM) + offs_d2[None, :], k2, mask=cols[:, None])

    QC = QC + bh * TQ * 2 * HEAD_DIM
    DO = DO + b * sdob + h * sdoh
    LSE = LSE + bh * TQ
    DI = DI + bh * TQ
    dk2 = tl.zeros([BLOCK_N, 2 * HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        # rows before lo see none of these keys; rows from full_lo on see all
        lo = tl.maximum(n0 - q_offset, 0) // BLOCK_M * BLOCK_M
        full_lo = tl.maximum(n0 + BLOCK_N - 1 - q_offset, 0)
        full_lo = tl.maximum((full_lo + BLOCK_M - 1) // BLOCK_M * BLOCK_M, lo)
    else:
        lo = 0
        full_lo = 0
    dk2, dv = _dkdv_inner(dk2, dv, k2, v, offs_n, QC, DO, sdot, sdod, LSE, DI,
                          lo, tl.minimum(full_lo, TQ), TQ, q_offset, qk_scale,
                          HEAD_DIM, BLOCK_M, True, DOT_PREC)
    dk2, dv = _dkdv_inner(dk2, dv, k2, v, offs_n, QC, DO, sdot, sdod, LSE, DI,
                          full_lo, TQ, TQ, q_offset, qk_scale,
                          HEAD_DIM, BLOCK_M, False, DOT_PREC)
    dkc, dks = _halves(dk2)
    # dv first, so that its registers are free for the rest
    tl.store(DV + b * sdvb + h * sdvh + offs_n[:, None] * sdvt + offs_d[None, :] * sdvd,
             _cast(dv, DV.dtype.element_ty), mask=cols[:, None])
    # back from the Cartesian key [mu c, mu s] to k and the phase (= delta's);
    # pointer tiles too are rebuilt here: kept from the prologue they cost registers
    k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :] * skd,
                mask=cols[:, None], other=0.0).to(tl.float32)
    dk, dphase = _cartesian_grad(k, offs_n.to(tl.float32), theta, delta, dkc * sm_scale, dks * sm_scale)
    tl.store(DK + b * sdkb + h * sdkh + offs_n[:, None] * sdkt + offs_d[None, :] * sdkd,
             _cast(dk, DK.dtype.element_ty), mask=cols[:, None])
    dphase = tl.where(cols[:, None], dphase, 0.0)
    tl.store(DDP + (pid_n * tl.num_programs(0) + bh) * HEAD_DIM + offs_d, tl.sum(dphase, 0))


@triton.jit
def _dq_inner(dqc, dqs, qc, qs, do, lse, di, qpos, KC, V, svt, svd,
              lo, hi, TK, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
              CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    lo_hi = _loop_bounds(lo, hi)
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
    bh, b, h, offs_m, offs_d, rows, qpos, theta, qc, qs, hi_full, hi = _query_block(
        Q, THETA, sqb, sqh, sqt, sqd, H, TQ, TK, q_offset, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdot + offs_d[None, :] * sdod,
                 mask=rows[:, None], other=0.0)
    lse = tl.load(LSE + bh * TQ + offs_m, mask=rows, other=0.0)
    di = tl.load(DI + bh * TQ + offs_m, mask=rows, other=0.0)

    KC = KC + bh * TK * 2 * HEAD_DIM
    V = V + b * svb + h * svh
    dqc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dqs = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dqc, dqs = _dq_inner(dqc, dqs, qc, qs, do, lse, di, qpos, KC, V, svt, svd, 0, hi_full, TK, qk_scale,
                         HEAD_DIM, BLOCK_N, False, CAUSAL, DOT_PREC)
    dqc, dqs = _dq_inner(dqc, dqs, qc, qs, do, lse, di, qpos, KC, V, svt, svd, hi_full, hi, TK, qk_scale,
                         HEAD_DIM, BLOCK_N, True, CAUSAL, DOT_PREC)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                mask=rows[:, None], other=0.0).to(tl.float32)
    dq, _ = _cartesian_grad(q, qpos.to(tl.float32), theta, tl.zeros([HEAD_DIM], dtype=tl.float32),
                            dqc * sm_scale, dqs * sm_scale)
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :] * sdqd,
             _cast(dq, DQ.dtype.element_ty), mask=rows[:, None])


# -----------------------------------------------------------------------------
# launch configuration: autotuned on the GPU, small and fixed under the interpreter

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim (32 uses 64's); the
# first is the one POPE_AUTOTUNE=0 uses. Each list is the fastest of `bench.py
# sweep` on an H200 (126 configs timed per kernel and head dim at four shapes,
# results/kernel.md): each shape's fastest config and the runners-up that stayed
# close to it at every shape. At D=64, 64x64 tiles with 4 warps lead in all three.
# dq at D=64 runs its sweep winner alone: the autotuner, timing dq by itself with a
# cold L2, picked 128x64/8/4 at (1, 12, 16k) in 4 of 4 tunings and at (2, 12, 4k) in
# 2 of 4, which in a forward+backward (dq right after dk/dv) is 10% slower there
# (results/kernel/tunediag.txt).
_BLOCKS = {
    "fwd": {64: [(64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 128, 4, 2), (128, 64, 4, 3), (128, 128, 8, 3)],
            128: [(128, 64, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2)]},
    "dkdv": {64: [(64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 8, 3), (32, 64, 4, 3)],
             128: [(64, 64, 8, 3), (64, 64, 8, 2), (32, 64, 4, 2)]},
    "dq": {64: [(64, 64, 4, 3)],
           128: [(64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 2), (128, 32, 8, 3)]},
}
# decoding (a handful of query rows against a long cache) is not worth a
# tuning pass for every cache length: one config with a short query block
_DECODE_FWD = (16, 64, 4, 3)
_DECODE_MAX_TQ = 16
_INTERP_BLOCK = 16
_DDP_MIN_BLOCK_N = 16  # smallest dk/dv key block: rows of the ddelta partials buffer
_PREP_BLOCK_T = 64
_AUTOTUNE = not _INTERPRET and os.environ.get("POPE_AUTOTUNE", "1") != "0"
_KEYS = ["Q_BUCKET", "K_BUCKET", "HEAD_DIM", "CAUSAL"]


def _blocks(kind, D):
    return _BLOCKS[kind][max(D, 64)]


def _autotuned(kernel, kind, keys, **kw):
    # every head dim's configs, and a pruner that keeps the launch's head dim's (32 uses 64's).
    # No attributes of our own on the Configs: with cache_results Triton writes Config.__dict__
    # to disk and rebuilds each Config from it in the next process.
    blocks = sorted({b for D in _BLOCKS[kind] for b in _BLOCKS[kind][D]})
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in blocks]

    def prune(configs, named_args, **kwargs):
        want = set(_blocks(kind, kwargs["HEAD_DIM"]))
        return [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in want]

    # cache_results: a shape's winner is kept on disk (Triton's cache dir), so a new process
    # pays for tuning only at shapes it has never seen
    return triton.autotune(configs, key=_KEYS + keys, prune_configs_by={"early_config_prune": prune},
                           cache_results=True, **kw)(kernel)


_pope_fwd_tuned = _autotuned(_pope_fwd, "fwd", [])
# (the ddelta partials are summed over the rows the launch that ran wrote; the
# zeroing before each trial run stays, so that the trials time what they timed)
_pope_bwd_dkdv_tuned = _autotuned(_pope_bwd_dkdv, "dkdv", [], reset_to_zero=["DDP"])
_pope_bwd_dq_tuned = _autotuned(_pope_bwd_dq, "dq", [])


_CHOSEN = {}  # (autotuner, key) -> the launch options of the config it chose


def _launch(kernel, tuned, blocks, grid, args, kwargs, key):
    """Run `kernel` with blocks = (BLOCK_M, BLOCK_N, warps, stages), or where blocks
    is None (and autotuning is on) with the config that `tuned`, its autotuner, picks;
    under the interpreter with small fixed blocks. grid is a function of the config
    dict, as in Triton. Returns the BLOCK_N that ran.
    The autotuner keys its choice on its key arguments and every tensor argument's
    dtype; `key` holds the key arguments and the dtypes of the tensors not made
    here, which fix the rest, so the same key means the same choice. Once the
    autotuner has chosen for a key, the launch goes to `kernel` with that config
    directly: Triton's Autotuner.run rebuilds its key from all ~40 arguments at
    every call, host time that an eager training step pays three times per layer."""
    if _INTERPRET:
        meta = {"BLOCK_M": _INTERP_BLOCK, "BLOCK_N": _INTERP_BLOCK}
    elif blocks is None and _AUTOTUNE:
        meta = _CHOSEN.get((tuned, key))
        if meta is None:
            tuned[grid](*args, **kwargs)  # tunes, or takes the choice from Triton's disk cache
            meta = _CHOSEN[tuned, key] = tuned.best_config.all_kwargs()
            return meta["BLOCK_N"]
    else:
        bm, bn, w, s = blocks
        meta = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}
    _run(kernel, grid(meta), args, {**kwargs, **meta})
    return meta["BLOCK_N"]


# Direct launches. Triton's JIT launch (kernel[grid](...)) binds and specialises every argument, rebuilds
# its cache key and launch metadata at every call: 28-40 µs of host time per launch on an H200's host,
# against ~10 µs for the compiled kernel's own launcher (bench.py launch). An eager step pays that per
# launch: the 5 launches of a forward+backward, the one launch per layer of a decoding step. So the
# first launch of each specialisation goes through the JIT, which compiles (or finds) the kernel, and
# the later ones call its launcher directly. Under the interpreter, or with a Triton launch hook set (its
# profiler), every launch takes the JIT's path; bench.py check compares the two paths bitwise.
_DIRECT = not _INTERPRET
_COMPILED = {}  # _launch_key -> (Triton's compiled kernel, its constexpr arguments in parameter order)


def _launch_key(device, kernel, args, options):
    """What a compiled kernel is valid for: the device, the kernel, its constexprs and launch options,
    and per argument what Triton's JIT specialises on, or more: its type; a tensor's dtype and whether
    its address is a multiple of 16; an int or float by value (Triton keys an int on == 1, % 16 and
    its width). tests/test_kernel.py holds this against Triton's own specialisation."""
    return (device, kernel, *options.items(), *map(type, args),
            *[(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a for a in args])


def _run(kernel, grid, args, options):
    """kernel[grid](*args, **options) (args positional, options the constexprs and num_warps/num_stages)."""
    hook = knobs.runtime.launch_enter_hook
    if not _DIRECT or getattr(hook, "calls", hook):
        kernel[grid](*args, **options)
        return
    device = driver.active.get_current_device()
    key = _launch_key(device, kernel, args, options)
    hit = _COMPILED.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **options)  # binds, compiles or finds the kernel, launches
        if len(_COMPILED) >= 4096:  # (a new entry per new shape: bounded)
            _COMPILED.clear()
        _COMPILED[key] = (compiled, tuple(options[name] for name in kernel.arg_names[len(args):]))
        return
    compiled, constexprs = hit
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *constexprs)


def _heavy_first(pairs, T, block):
    """The grid of the attention kernels: (batch, head) pairs on axis 0, blocks of T on axis 1. The GPU starts
    programs in grid order, axis 0 fastest, so every pair's block of one index starts before any pair's next
    one; each kernel numbers its blocks so that those with the most work under the causal mask come first:
    the forward's and dq's last query blocks (program_id(1) reversed), dk/dv's first key blocks. The light
    ones then fill the tail: against per-pair order, forward+backward 6% faster at (8, 12, 1k, 64) and 8% at
    (2, 12, 4k, 64), the same at (16, 12, 1k, 64) and 16k (results/kernel.md, "what was tried")."""
    return pairs, _cdiv(T, block)


def _bucket(n):
    return 1 << max(n - 1, 0).bit_length()


def _cdiv(a, b):  # (triton.cdiv, a constexpr function, costs microseconds per host call)
    return -(-a // b)


def _empty(shape, like, dtype=None):
    return torch.empty(shape, device=like.device, dtype=dtype or like.dtype)


def _on_device(x):
    # Triton launches on the current CUDA device, whatever the tensors' device
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _dot_precision(dtype):
    # a float32 caller asked for float32: no silent tf32
    return "ieee" if dtype == torch.float32 else "tf32"


def _cartesian(x, theta, delta, pos0, o=None, do=None):
    """The pre-pass: (B, H, T, 2D) Cartesian x in x's dtype; with o and do also
    rowsum(dO*O) as (B, H, T) float32."""
    B, H, T, D = x.shape
    xc = _empty((B, H, T, 2 * D), x)
    with_di = o is not None
    di = _empty((B, H, T), x, torch.float32) if with_di else xc
    o_, do_ = (o, do) if with_di else (x, x)
    grid = (_cdiv(T, _PREP_BLOCK_T), B * H)
    _run(_cartesian_kernel, grid, (x, xc, theta, delta if delta is not None else theta, o_, do_, di,
                                   *x.stride(), *o_.stride(), *do_.stride(), H, T, pos0),
         dict(HEAD_DIM=D, BLOCK_T=_PREP_BLOCK_T, HAS_DELTA=delta is not None, WITH_DI=with_di, num_warps=4))
    return (xc, di) if with_di else xc


def _fwd(q, k, v, delta, theta, causal, sm_scale, q_offset, tune=True):
    with _on_device(q):
        B, H, Tq, D = q.shape
        Tk = k.size(2)
        out = _empty((B, H, Tq, D), q)
        lse = _empty((B, H, Tq), q, torch.float32)
        kc = _cartesian(k, theta, delta, 0)
        buckets = (_bucket(Tq), _bucket(Tk))
        grid = lambda meta: _heavy_first(B * H, Tq, meta["BLOCK_M"])
        args = (q, kc, v, out, lse, theta, *q.stride(), *v.stride(), *out.stride(),
                sm_scale * 1.4426950408889634, H, Tq, Tk, q_offset, *buckets)
        kwargs = dict(HEAD_DIM=D, CAUSAL=causal, DOT_PREC=_dot_precision(q.dtype))
        blocks = None  # autotuned
        # decoding, and any call without gradients (inference, eval), runs a fixed config:
        # tuning every new (Tq, Tk) bucket would cost seconds per new length
        if Tq <= _DECODE_MAX_TQ or not _AUTOTUNE or not tune:
            blocks = _DECODE_FWD if Tq <= _DECODE_MAX_TQ else _blocks("fwd", D)[0]
        key = (*buckets, D, causal, q.dtype, k.dtype, v.dtype, theta.dtype)
        _launch(_pope_fwd, _pope_fwd_tuned, blocks, grid, args, kwargs, key)
        return out, lse


def _bwd(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset):
    """dq, dk, dv and ddelta (float32)."""
    with _on_device(q):
        return _bwd_on_device(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset)


def _bwd_on_device(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset):
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    qk_scale = sm_scale * 1.4426950408889634
    prec = _dot_precision(q.dtype)
    buckets = (_bucket(Tq), _bucket(Tk))
    fixed = lambda kind: None if _AUTOTUNE else _blocks(kind, D)[0]
    # The 2D-long queries come from a pre-pass (with rowsum(dO*O)) and live through the dk/dv kernel;
    # the 2D-long keys are written by the dk/dv kernel, which makes each key block Cartesian anyway,
    # and live through the dq kernel: no key pre-pass, at the price of both copies alive at once.
    dk = _empty((B, H, Tk, D), k)
    dv = _empty((B, H, Tk, D), v)
    key = (*buckets, D, causal, q.dtype, k.dtype, v.dtype, do.dtype, delta.dtype, theta.dtype)
    nblk = _cdiv(Tk, _DDP_MIN_BLOCK_N)  # rows for the smallest key block; the launch writes the first
    ddp = _empty((nblk, B * H, D), q, torch.float32)  # cdiv(Tk, BLOCK_N) of them, blocks outermost:
    #   the rows it wrote are one contiguous (blocks * B, H * D) matrix, whose column sums are one plain reduction
    qc, di = _cartesian(q, theta, None, q_offset, o=out, do=do)
    kc = _empty((B, H, Tk, 2 * D), k)
    grid = lambda meta: _heavy_first(B * H, Tk, meta["BLOCK_N"])
    block_n = _launch(_pope_bwd_dkdv, _pope_bwd_dkdv_tuned, fixed("dkdv"), grid,
                      (k, v, qc, do, lse, di, dk, dv, ddp, kc, theta, delta, *k.stride(), *v.stride(), *do.stride(),
                       *dk.stride(), *dv.stride(), sm_scale, qk_scale, H, Tq, Tk, q_offset, *buckets),
                      dict(HEAD_DIM=D, CAUSAL=causal, DOT_PREC=prec), key)
    del qc  # (freed before dq is allocated)
    dq = _empty((B, H, Tq, D), q)
    grid = lambda meta: _heavy_first(B * H, Tq, meta["BLOCK_M"])
    args = (q, kc, v, do, lse, di, dq, theta, *q.stride(), *v.stride(), *do.stride(), *dq.stride(),
            sm_scale, qk_scale, H, Tq, Tk, q_offset, *buckets)
    _launch(_pope_bwd_dq, _pope_bwd_dq_tuned, fixed("dq"), grid, args,
            dict(HEAD_DIM=D, CAUSAL=causal, DOT_PREC=prec), key)
    # a fixed-order reduction (no atomics): bitwise the same every run
    ddelta = ddp[:_cdiv(Tk, block_n)].view(-1, H * D).sum(0).view(H, D)
    return dq, dk, dv, ddelta


# -----------------------------------------------------------------------------
# autograd: two doors to the same _fwd and _bwd. Traced by torch.compile, one
# torch.library custom op, opaque to it (no graph break; the fake gives shapes),
# with the backward as a second op. Run eagerly, a plain autograd.Function: the
# custom op's dispatcher and its Python layers cost more host time per call than
# the rest of pope_attention's Python together (measured with the launches stubbed out).

# one namespace per module name, so a second copy of this file loaded under
# another name (tests/test_kernel.py loads one under the interpreter) does not
# collide with the first
_NS = __name__.replace(".", "_")


@torch.library.custom_op(f"{_NS}::fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor, theta: torch.Tensor, causal: bool,
            sm_scale: float, q_offset: int, tune: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd(q, k, v, delta, theta, causal, sm_scale, q_offset, tune)


@_fwd_op.register_fake
def _(q, k, v, delta, theta, causal, sm_scale, q_offset, tune):
    B, H, Tq, D = q.shape
    return q.new_empty((B, H, Tq, D)), q.new_empty((B, H, Tq), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor,
            theta: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, causal: bool, sm_scale: float,
            q_offset: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset)


@_bwd_op.register_fake
def _(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), delta.new_empty(delta.shape)


def _save(ctx, inputs, out, lse):  # what both doors keep for the backward
    q, k, v, delta, theta, causal, sm_scale, q_offset, _ = inputs
    ctx.save_for_backward(q, k, v, delta, theta, out, lse)
    ctx.args = (causal, sm_scale, q_offset)


def _grads(ctx, dout, bwd):  # dq, dk, dv, ddelta from bwd (_bwd_op or _bwd); the other inputs get none
    q, k, v, delta, theta, out, lse = ctx.saved_tensors
    return (*bwd(dout, q, k, v, delta, theta, out, lse, *ctx.args), None, None, None, None, None)


def _setup_context(ctx, inputs, output):
    _save(ctx, inputs, *output)
    ctx.mark_non_differentiable(output[1])


_fwd_op.register_autograd(lambda ctx, dout, dlse: _grads(ctx, dout, _bwd_op), setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The eager door: the custom op's forward and backward without the dispatcher. It
    returns out only (lse stays inside), so autograd makes no zero gradient for lse."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = _fwd(*inputs)
        _save(ctx, inputs, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        return _grads(ctx, dout, _bwd)


# -----------------------------------------------------------------------------
# public entry points

class PopeKernelUnsupported(ValueError):
    """Raised by pope_attention for input the Triton kernel does not support."""


_SUPPORTED = ("the PoPE Triton kernel takes CUDA tensors (or CPU tensors under TRITON_INTERPRET=1) "
              "of one dtype among bfloat16, float16 and float32, with head dim 32, 64 or 128")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_CAPABILITY = {}


def kernel_unsupported_reason(q, k, v, delta):
    """None if the Triton kernel can run on these inputs, else why not (a sentence
    that names what is supported). model.py's attn_impl="auto" uses this to fall
    back to its PyTorch path with one warning."""
    try:
        check_shapes(q, k, v, delta, 0)
    except ValueError as e:
        return f"{e}; {_SUPPORTED}"
    return _unsupported(q, k, v, delta)


def _unsupported(q, k, v, delta):
    """kernel_unsupported_reason past the shapes (pope_attention has checked those)."""
    dev = q.device
    if k.device != dev or v.device != dev or delta.device != dev:
        return f"q, k, v and delta are on different devices; {_SUPPORTED}"
    if dev.type == "cpu" and not _INTERPRET:
        return f"got CPU tensors without TRITON_INTERPRET=1 set before importing pope_kernel; {_SUPPORTED}"
    if dev.type not in ("cpu", "cuda"):
        return f"got {dev.type} tensors; {_SUPPORTED}"
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"got q, k, v in {q.dtype}, {k.dtype}, {v.dtype}; {_SUPPORTED}"
    if not delta.dtype.is_floating_point:
        return f"delta must be floating point, got {delta.dtype}"
    if q.size(-1) not in (32, 64, 128):
        return f"got head dim {q.size(-1)}; {_SUPPORTED}"
    if q.size(2) == 0 or k.size(2) == 0 or q.size(0) * q.size(1) == 0:
        return f"got an empty input {tuple(q.shape)}, {tuple(k.shape)}; {_SUPPORTED}"
    if _capability(dev) < (8, 0):
        return (f"the GPU has compute capability {_capability(dev)}, the kernel needs 8.0 or newer "
                f"(Ampere, Ada, Hopper); {_SUPPORTED}")
    return None


def _capability(dev):
    """A CUDA device's compute capability, asked once; (99, 0) where there is none to ask (CPU, ROCm, tracing)."""
    if dev.type != "cuda" or _INTERPRET or torch.version.hip is not None or torch.compiler.is_compiling():
        return (99, 0)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _CAPABILITY:
        _CAPABILITY[idx] = torch.cuda.get_device_capability(idx)
    return _CAPABILITY[idx]


def pope_attention(q, k, v, delta, theta, *, causal=True, sm_scale=None, q_offset=0):
    """PoPE attention through the fused Triton kernel (the contract of
    model.pope_attention_torch, with the frequencies theta = model.pope_frequencies(D)
    given instead of their base; delta and theta are used as given). Raises
    PopeKernelUnsupported, a ValueError, for input the kernel does not take;
    kernel_unsupported_reason says why without raising."""
    check_shapes(q, k, v, delta, q_offset)
    D = q.size(-1)
    if theta.shape != (D,):
        raise ValueError(f"theta must be (D={D},); got {tuple(theta.shape)}")
    reason = _unsupported(q, k, v, delta)
    if reason is not None:
        raise PopeKernelUnsupported(reason)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    # the kernels read delta and theta as float32 (model.py hands them so: then no op runs here);
    # the cast is outside the op, so autograd maps ddelta back
    if delta.dtype != torch.float32 or not delta.is_contiguous():
        delta = delta.float().contiguous()
    if theta.dtype != torch.float32 or theta.device != q.device or not theta.is_contiguous():
        theta = theta.to(q.device, torch.float32).contiguous()
    tune = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or delta.requires_grad)
    args = (q, k, v, delta, theta, bool(causal), float(sm_scale), int(q_offset), tune)
    if torch.compiler.is_compiling():
        return _fwd_op(*args)[0]
    return _Attention.apply(*args)


# -----------------------------------------------------------------------------
# decoding: one query per (batch, head) against a static KV cache (model.KVCache's one-token step)
#
# Plain softmax attention over keys that are ready to use (PoPE's Cartesian 2D-wide keys, RoPE's
# rotated D-wide ones: any power-of-two width) or over PoPE's magnitudes (the phase of each key made
# as it is read: _POPE_MU, KVCache's layout), split over the key axis as flash-decoding does:
# at batch 1 there are only H (batch, head) pairs, too few to keep a GPU's memory system busy, so
# each pair's keys 0..pos are cut into `splits` chunks, one program each, which write a partial
# (max, sum, accumulator); the last of a pair's programs to finish (a per-pair count, atomically
# incremented, says which) merges them and writes the output, so the step is one launch per layer
# whatever the splits (a second, merging kernel would cost a launch per layer: host time when eager,
# a few microseconds of a graph's chain). The position is read from a device tensor,
# and the chunks are cut from it on the device, so a CUDA graph replays the step at every position
# without a host sync, and slots past pos are never read. The split program that holds slot pos
# also writes the new key and value there (no index_copy_ launches); it attends to the new key
# from registers and no program reads slot pos from memory, so the write cannot race a read.
# Given raw q and k, every program turns them itself (_decode_turn: PoPE's Cartesian form or magnitudes,
# RoPE's rotation at pos, with the helpers above, so there is one copy of PoPE's math in this file): a few
# hundred flops per program against the kernels per layer that model.py's PyTorch path launches
# before the attention (a stack of q and k, then PoPE's casts, softplus and product, or RoPE's cat,
# products and sum), and KVCache.start's cos and sin per step.

_DECODE_PROGRAMS = 512  # split programs to aim for: ~4 per SM of an H100/H200 (132 SMs)
_DECODE_TILE = 8192  # elements of one key tile (BLOCK_N keys x key width): 16 KB of bf16 in flight
#   per iteration, 64 float32 registers a thread at 4 warps. One fixed config (no autotuning): a
#   CUDA graph captures whatever is launched, and the step is bound by reading the cache.
_DECODE_WARPS = 4  # per split program (bench.py decode times other choices of these three)


_READY, _POPE, _ROPE, _POPE_MU = 0, 1, 2, 3  # TURN: q and k come ready, or raw to be turned as PoPE or RoPE
#   turns them; _POPE_MU: PoPE with a cache of magnitudes mu_k alone (D numbers a key, as RoPE's), whose phases
#   (s - t) theta_c + delta_c the kernel makes per slot: 2/3 of the Cartesian cache's bytes, a cos per key entry


@triton.jit
def _decode_turn(X, sxd, pos, FREQ, DELTA, TURN: tl.constexpr, KEY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The KEY_DIM-long float32 query or key from X (one row, stride sxd) at position pos. _POPE: X raw
    (HEAD_DIM wide), [mu cos(phi), mu sin(phi)] with phi = pos * theta_c (+ delta_c for a key: DELTA not
    None), as model.pope_cartesian in float32; _POPE_MU: mu = softplus(X) alone; _ROPE: X raw, rotated as
    model.apply_rope (rotate-half) by pos * inv_freq_i; _READY: X as it is."""
    offs = tl.arange(0, KEY_DIM)
    if TURN == 1:  # entries c and HEAD_DIM + c both come from raw channel c
        c = offs % HEAD_DIM
        phase = pos.to(tl.float32) * tl.load(FREQ + c)
        if DELTA is not None:
            phase = phase + tl.load(DELTA + c)
        cos, sin = _cos_sin(phase)
        x = _softplus(tl.load(X + c * sxd).to(tl.float32)) * tl.where(offs < HEAD_DIM, cos, sin)
    elif TURN == 2:  # x[i] + 1j x[i + D/2] times e^(1j pos inv_freq_i)
        half: tl.constexpr = HEAD_DIM // 2
        cos, sin = _cos_sin(pos.to(tl.float32) * tl.load(FREQ + offs % half))
        x = tl.load(X + offs * sxd).to(tl.float32)
        y = tl.load(X + ((offs + half) % HEAD_DIM) * sxd).to(tl.float32)
        x = x * cos + tl.where(offs < half, -y, y) * sin
    elif TURN == 3:
        x = _softplus(tl.load(X + offs * sxd).to(tl.float32))
    else:
        x = tl.load(X + offs * sxd).to(tl.float32)
    return x


@triton.jit
def _decode_split_kernel(Q, KN, VN, KC, VC, POS, PART, COUNT, O, FREQ, DELTA,
                         sqb, sqh, sqd, sknb, sknh, sknd, svnb, svnh, svnd,
                         skb, skh, skt, skd, svb, svh, svt, svd, sob, soh, sod, sdh,
                         H, N, SPLITS, qk_scale,
                         KEY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TURN: tl.constexpr,
                         FINAL: tl.constexpr, SPLITS_POW2: tl.constexpr):
    """Program (split, bh): chunk `split` of (batch, head) bh's keys 0..pos -> PART[bh, split] = (acc, max, sum),
    the max and sum of exp2(scores - max) in log2 units (qk_scale holds sm_scale * log2(e)); the pair's last
    program to finish (COUNT[bh], zero between launches, counts them) merges the partials into O[b, h, 0].
    TURN: _decode_turn's (FREQ and DELTA (H, HEAD_DIM), row stride sdh, are read only for the TURN that needs
    them). FINAL (one chunk, SPLITS = 1): the program writes O[b, h, 0] = acc / sum, no partial, no count."""
    split = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    pos = tl.load(POS)
    per = tl.cdiv(tl.cdiv(pos + 1, BLOCK_N), SPLITS) * BLOCK_N  # keys per chunk, whole blocks
    lo = split * per
    hi = tl.minimum(lo + per, pos + 1)
    offs_d = tl.arange(0, HEAD_DIM)
    if (lo < hi) & (pos < N):  # chunks past pos do nothing (nor count); pos >= N: nothing at all
        offs_k = tl.arange(0, KEY_DIM)
        q = _decode_turn(Q + b * sqb + h * sqh, sqd, pos, FREQ, None, TURN, KEY_DIM, HEAD_DIM) * qk_scale
        if TURN == 3:  # the score of key s: sum_c mu_q,c mu_k,sc cos((s - pos) theta_c + delta_c)
            theta = tl.load(FREQ + offs_k)
            dlt = tl.load(DELTA + h * sdh + offs_k)
        KC += b * skb + h * skh
        VC += b * svb + h * svh
        m = float("-inf")
        l = 0.0
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
        old = tl.minimum(hi, pos)  # the cached keys, [lo, old): every block holds one at least
        lo_hi = _loop_bounds(lo, old)
        for start in range(lo_hi[0], lo_hi[1], BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            ok = offs < old
            k = tl.load(KC + offs[:, None] * skt + offs_k[None, :] * skd, mask=ok[:, None], other=0.0).to(tl.float32)
            if TURN == 3:
                cos, _ = _cos_sin((offs - pos).to(tl.float32)[:, None] * theta[None, :] + dlt[None, :])
                k = k * cos
            s = tl.where(ok, tl.sum(k * q[None, :], 1), float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 0))
            p = tl.math.exp2(s - m_new)
            alpha = tl.math.exp2(m - m_new)
            v = tl.load(VC + offs[:, None] * svt + offs_d[None, :] * svd, mask=ok[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
            l = l * alpha + tl.sum(p, 0)
            m = m_new
        if hi == pos + 1:  # the chunk of slot pos: the new key and value, rounded to the cache's dtype
            kn = _decode_turn(KN + b * sknb + h * sknh, sknd, pos, FREQ, DELTA + h * sdh, TURN, KEY_DIM, HEAD_DIM)
            kn = _cast(kn, KC.dtype.element_ty)
            vn = _cast(tl.load(VN + b * svnb + h * svnh + offs_d * svnd).to(tl.float32), VC.dtype.element_ty)
            tl.store(KC + pos * skt + offs_k * skd, kn)
            tl.store(VC + pos * svt + offs_d * svd, vn)
            kn = kn.to(tl.float32)
            if TURN == 3:  # (s - pos = 0: the phase is delta_c)
                cos, _ = _cos_sin(dlt)
                kn = kn * cos
            s = tl.sum(kn * q, 0)
            m_new = tl.maximum(m, s)
            p = tl.math.exp2(s - m_new)
            alpha = tl.math.exp2(m - m_new)
            acc = acc * alpha + p * vn.to(tl.float32)
            l = l * alpha + p
            m = m_new
        if FINAL:
            tl.store(O + b * sob + h * soh + offs_d * sod, _cast(acc / l, O.dtype.element_ty))
        else:
            part = PART + bh * SPLITS * (HEAD_DIM + 2)  # this pair's partials; this chunk's below
            mine = part + split * (HEAD_DIM + 2)
            tl.store(mine + offs_d, acc)
            tl.store(mine + HEAD_DIM, m)
            tl.store(mine + HEAD_DIM + 1, l)
            # every thread's partial stored before the count (the barrier), released with it; the count's
            # old value says whether this is the last of the chunks that ran (ran = chunks holding a key)
            tl.debug_barrier()
            done = tl.atomic_add(COUNT + bh, 1, sem="acq_rel", scope="gpu")
            ran = tl.cdiv(pos + 1, per)
            if done == ran - 1:  # the last: merge all (they are visible: the acquire), zero the count
                tl.store(COUNT + bh, 0)
                offs_s = tl.arange(0, SPLITS_POW2)
                ok = offs_s < ran
                mp = tl.load(part + offs_s * (HEAD_DIM + 2) + HEAD_DIM, mask=ok, other=float("-inf"),
                             cache_modifier=".cg")  # (.cg: from L2, where the other programs' stores are)
                lp = tl.load(part + offs_s * (HEAD_DIM + 2) + HEAD_DIM + 1, mask=ok, other=0.0, cache_modifier=".cg")
                ap = tl.load(part + offs_s[:, None] * (HEAD_DIM + 2) + offs_d[None, :], mask=ok[:, None], other=0.0,
                             cache_modifier=".cg")
                w = tl.math.exp2(mp - tl.max(mp, 0))  # chunk 0 always ran: the max is finite; others weigh 0
                out = tl.sum(w[:, None] * ap, 0) / tl.sum(w * lp, 0)
                tl.store(O + b * sob + h * soh + offs_d * sod, _cast(out, O.dtype.element_ty))
    if (pos >= N) & (split == 0):  # past the cache: a NaN output, nothing written
        tl.store(O + b * sob + h * soh + offs_d * sod, tl.full([HEAD_DIM], float("nan"), O.dtype.element_ty))


def _pow2(n):
    return n > 0 and n & (n - 1) == 0


def decode_unsupported_reason(k_cache, v_cache):
    """None if decode_attention takes caches like these, else why not (one sentence)."""
    supported = ("the decoding kernel takes CUDA caches (or CPU ones under TRITON_INTERPRET=1), (B, H, N, Dk) "
                 "keys and (B, H, N, D) values of one dtype among bfloat16, float16 and float32, D and Dk "
                 "powers of two, 16 <= D <= 256, Dk <= 512")
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
        return f"got caches {tuple(k_cache.shape)} and {tuple(v_cache.shape)}; {supported}"
    dev = k_cache.device
    if v_cache.device != dev or dev.type not in ("cpu", "cuda") or dev.type == "cpu" and not _INTERPRET:
        return f"got {dev.type} / {v_cache.device.type} tensors; {supported}"
    if k_cache.dtype not in _DTYPES or v_cache.dtype != k_cache.dtype:
        return f"got {k_cache.dtype} / {v_cache.dtype}; {supported}"
    D, Dk = v_cache.size(-1), k_cache.size(-1)
    if not (_pow2(D) and _pow2(Dk) and 16 <= D <= 256 and Dk <= 512):
        return f"got D={D}, Dk={Dk}; {supported}"
    if _capability(dev) < (8, 0):  # (as pope_attention: the GPUs it was built and checked for)
        return f"the GPU has compute capability {_capability(dev)}; the decoding kernel needs 8.0 or newer"
    return None


def decode_attention(q, k, v, k_cache, v_cache, pos, sm_scale, *, theta=None, delta=None, inv_freq=None,
                     splits=None, block_n=None, counts=None):
    """One query per (batch, head) over a static cache, the new key and value written at slot pos:
    k_cache[:, :, pos] = k, v_cache[:, :, pos] = v, then softmax(sm_scale q k_cache[..., :pos+1]^T)
    v_cache[..., :pos+1], the softmax in float32. q, k (B, H, 1, Dk) and v (B, H, 1, D), any strides;
    k_cache (B, H, N, Dk) and v_cache (B, H, N, D) as decode_unsupported_reason accepts them; pos a
    one-element integer tensor on their device (read there: no host sync, CUDA-graph safe), 0 <= pos
    < N (past N nothing is written and the output is NaN). Returns (B, H, 1, D) in the cache dtype.
    Raw q and k (B, H, 1, D), turned at pos in the kernel (float32, the key then rounded to the cache
    dtype): with theta (D,) and delta (H, D), PoPE's Cartesian form (Dk = 2D: model.pope_cartesian's), or
    for D-wide caches the magnitudes mu = softplus alone, each slot's phase made in the kernel; with inv_freq
    (D/2,), RoPE's rotation (Dk = D: model.apply_rope's). theta, delta and inv_freq are
    used as given (float32, rows contiguous; bound delta with model.pope_delta first).
    splits and block_n (a power of two >= 16) override the launch's (tests: many chunks at small N; model.KVCache
    passes decode_launch's, picked once). counts: B*H int32 zeros on the caches' device, which the chunks of
    each (batch, head) count themselves in and leave at zero again (model.KVCache keeps one for all its layers,
    one step after another on one stream); without it, a call with more than one chunk makes its own."""
    B, H, N, Dk = k_cache.shape
    D = v_cache.size(-1)
    turn = (_POPE if Dk == 2 * D else _POPE_MU) if theta is not None else _ROPE if inv_freq is not None else _READY
    Dq = Dk if turn == _READY else D
    if q.shape != (B, H, 1, Dq) or k.shape != (B, H, 1, Dq) or v.shape != (B, H, 1, D) or pos.numel() != 1:
        raise ValueError(f"need q, k (B={B}, H={H}, 1, {Dq}), v (.., 1, {D}), one pos for caches "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}, pos {tuple(pos.shape)}")
    pope = turn in (_POPE, _POPE_MU)
    if pope and (Dk not in (D, 2 * D) or delta is None or delta.shape != (H, D) or theta.shape != (D,)) or \
            turn == _ROPE and (Dk != D or inv_freq.shape != (D // 2,)):
        raise ValueError(f"need theta ({D},) and delta ({H}, {D}) for 2D- or D-wide PoPE keys, or inv_freq ({D // 2},) "
                         f"for D-wide RoPE keys; got key width {Dk}, theta {_shape(theta)}, delta {_shape(delta)}, "
                         f"inv_freq {_shape(inv_freq)}")
    freq = theta if pope else inv_freq
    if not (splits and block_n):  # (model.KVCache passes both, picked once per cache)
        picked = decode_launch(k_cache, block_n)
        splits, block_n = splits or picked["splits"], picked["block_n"]
    # traced by torch.compile (generate's mode="compile"), the launch is one opaque op that writes the
    # caches; run eagerly or captured in a CUDA graph, the plain function (no dispatcher in between)
    run = _decode_op if torch.compiler.is_compiling() else _decode
    if splits > 1 and counts is None:
        counts = torch.zeros(B * H, device=k_cache.device, dtype=torch.int32)
    elif splits > 1 and (counts.shape != (B * H,) or counts.dtype != torch.int32 or counts.device != k_cache.device):
        raise ValueError(f"counts must be ({B * H},) int32 zeros on {k_cache.device}; got {tuple(counts.shape)} "
                         f"{counts.dtype} on {counts.device}")
    return run(q, k, v, k_cache, v_cache, pos, freq, delta if pope else None, float(sm_scale), turn,
               splits, block_n, counts if splits > 1 else None)


def decode_launch(k_cache, block_n=None):
    """dict(splits, block_n): the launch decode_attention picks for caches of k_cache's shape (given block_n,
    the splits it picks with it), the same at every pos: model.KVCache asks once and passes both in."""
    B, H, N, Dk = k_cache.shape
    block_n = block_n or max(16, _DECODE_TILE // Dk)
    return dict(splits=min(_cdiv(N, block_n), _cdiv(_DECODE_PROGRAMS, B * H)), block_n=block_n)


def _shape(x):
    return None if x is None else tuple(x.shape)


def _decode(q, k, v, k_cache, v_cache, pos, freq, delta, sm_scale, turn, splits, block_n, counts):
    B, H, N, Dk = k_cache.shape
    D = v_cache.size(-1)
    with _on_device(k_cache):
        out = _empty((B, H, 1, D), v_cache)
        # one chunk: its program writes the output, no partials, no count
        part = out if splits == 1 else _empty((B * H, splits, D + 2), v_cache, torch.float32)  # (graph: its pool's)
        # (ready keys: the caches stand in for the pointers the kernel does not read)
        freq = k_cache if freq is None else freq
        delta = k_cache if delta is None else delta
        counts = pos if counts is None else counts
        _run(_decode_split_kernel, (splits, B * H), (
            q, k, v, k_cache, v_cache, pos, part, counts, out, freq, delta, q.stride(0), q.stride(1), q.stride(3),
            k.stride(0), k.stride(1), k.stride(3), v.stride(0), v.stride(1), v.stride(3),
            *k_cache.stride(), *v_cache.stride(), out.stride(0), out.stride(1), out.stride(3), delta.stride(0),
            H, N, splits, sm_scale * 1.4426950408889634),
            dict(KEY_DIM=Dk, HEAD_DIM=D, BLOCK_N=block_n, TURN=turn, FINAL=splits == 1, SPLITS_POW2=_bucket(splits),
                 num_warps=_DECODE_WARPS))
    return out


@torch.library.custom_op(f"{_NS}::decode", mutates_args=("k_cache", "v_cache", "counts"))
def _decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               pos: torch.Tensor, freq: Optional[torch.Tensor], delta: Optional[torch.Tensor], sm_scale: float,
               turn: int, splits: int, block_n: int, counts: Optional[torch.Tensor]) -> torch.Tensor:
    return _decode(q, k, v, k_cache, v_cache, pos, freq, delta, sm_scale, turn, splits, block_n, counts)


@_decode_op.register_fake
def _(q, k, v, k_cache, v_cache, pos, freq, delta, sm_scale, turn, splits, block_n, counts):
    return v_cache.new_empty((*k_cache.shape[:2], 1, v_cache.size(-1)))


if __name__ == "__main__":  # (a module: run, it only says what it is)
    print(__doc__.strip() + "\n\n(pope_kernel.py is a module: model.py imports it; bench.py measures it)")
