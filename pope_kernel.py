"""
PoPE attention as one fused Triton kernel (forward and backward), and a decoding kernel.

Per head, the score of model.py's PyTorch path (the PoPE paper's, arXiv 2509.10534):
    a_ts = sm_scale * sum_c softplus(q)[t,c] softplus(k)[s,c] cos((s-t) theta_c + delta_c),
a dot of the 2D-long Cartesian [mu cos(phase), mu sin(phase)], theta and delta as model.py makes
them (pope_frequencies, pope_delta). model.py's porting note names the @triton.jit helpers that
must follow a change of PoPE (tests/test_kernel.py holds them to it).

Entry points: pope_attention, kernel_unsupported_reason; for model.KVCache's one-token steps
decode_attention, decode_unsupported_reason, decode_launch. Query row i sits at position q_offset+i,
key row j at j. Supported: CUDA (compute capability 8.0+), or the CPU with TRITON_INTERPRET=1 set
before import; bf16, fp16, fp32; head dim 32, 64 or 128.

How it works (each choice's measurements: results/kernel.md): a pre-pass writes the Cartesian keys
in the input dtype (phases in float32): the loop is a plain flash attention, a QK dot of depth 2D, a
PV dot of depth D. The forward makes its query block Cartesian in registers. The backward is
FlashAttention-2's: pre-passes (Cartesian queries with rowsum(dO*O), Cartesian keys), then a dk/dv
and a dq kernel loading them, each mapping its gradient back to dq, dk and ddelta in its epilogue.
No atomics: ddelta is summed per key block, then by torch in a fixed order: bitwise deterministic.
Sections follow Triton's fused-attention tutorial (kernels, the custom ops with their autograd
formula, launches, entry points); the CPU interpreter's shims come last.
"""

import contextlib
import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# read once, as triton.jit does when decorating the kernels: setting it later changes neither
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


# -----------------------------------------------------------------------------
# PoPE's math (model.py's pope_magnitude, pope_cos_sin and pope_cartesian, in float32)

@triton.jit
def _softplus(x):
    """mu = softplus(x) = max(x, 0) + log1p(e), e = exp(-|x|) in (0, 1]. log1p: log(u), u = 1 + e
    rounded, less the rounding's excess (u - 1) - e over u (log(1 + e) alone loses e's low bits);
    for tiny e (very negative x, tiny mu) u is 1 and this gives e."""
    e = tl.exp(-tl.abs(x))
    u = 1.0 + e
    return tl.maximum(x, 0.0) + (tl.log(u) - ((u - 1.0) - e) / u)


@triton.jit
def _cos_sin(phase):
    """cos and sin of a float32 phase, which reaches T radians; the GPU's fast sin/cos are
    accurate only near [-pi, pi]: reduce by 2*pi in two parts (Cody-Waite), exact for k up to
    millions, then sin.approx/cos.approx. libdevice's sinf/cosf would add a Payne-Hanek path
    with a local-memory array."""
    k = tl.floor(phase * 0.15915494309189535 + 0.5)
    r = _fma(k, -6.2831854820251465, phase)
    r = _fma(k, 1.7484556000744883e-07, r)
    return _fast_cos_sin(r)


@triton.jit
def _cartesian_tile(x, pos, theta, delta):
    """mu*cos and mu*sin (float32) of a (rows, D) float32 tile; pos (rows,) float32."""
    mu = _softplus(x)
    c, s = _cos_sin(pos[:, None] * theta[None, :] + delta[None, :])
    return mu * c, mu * s


@triton.jit
def _cartesian_grad(x, pos, theta, delta, gc, gs):
    """From the gradient (gc, gs) w.r.t. [mu cos, mu sin] to those w.r.t. x and the phase. After the
    main loop, recomputing mu, cos and sin rather than keeping three tiles live in registers."""
    mu = _softplus(x)
    c, s = _cos_sin(pos[:, None] * theta[None, :] + delta[None, :])
    return (gc * c + gs * s) * tl.sigmoid(x), mu * (gs * c - gc * s)


@triton.jit
def _relative_key(mu, rel, theta, delta):
    """mu_k cos(rel theta + delta), float32: the decoding kernel's PoPE key at rel = s - t from the
    query, the query's phase folded in (the score: a dot with mu_q). rel None: s = t, phase
    delta."""
    phase = delta
    if rel is not None:
        phase = rel * theta + delta
    c, _ = _cos_sin(phase)
    return mu * c


# -----------------------------------------------------------------------------
# Forward: the Cartesian pre-pass, the forward kernel and its launch configs

@triton.jit
def _cartesian_kernel(
    X, XC, THETA, DELTA, O, DO, DI,
    sxb, sxh, sxt, sxd,
    sob, soh, sot, sod,
    sdob, sdoh, sdot, sdod,
    H, T, pos0,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, HAS_DELTA: tl.constexpr, WITH_DI: tl.constexpr,
):
    """XC[b, h, t] = [mu cos(phase), mu sin(phase)] (B, H, T, 2D) in XC's dtype. WITH_DI also writes
    DI[b, h, t] = rowsum(dO * O), the backward's other per-row pre-pass, in the same program."""
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
def _query_rows(H, TQ, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """The forward's and dq's prologue: the BLOCK_M query rows, and (batch, head), this program
    owns."""
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)  # (the grid's order: see _grid)
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    h = bh % H
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < TQ
    return bh, b, h, m0, offs_m, offs_d, rows


@triton.jit
def _key_bounds(q_offset, m0, TK,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Keys of query rows [m0, m0 + BLOCK_M): [0, hi_full), seen by every row, run unmasked;
    [hi_full, hi), straddling the diagonal or the keys' end, masked; those above it not at all."""
    if CAUSAL:
        hi_full = tl.minimum(q_offset + m0 + 1, TK) // BLOCK_N * BLOCK_N
        hi = tl.minimum(q_offset + m0 + BLOCK_M, TK)
    else:
        hi_full = TK // BLOCK_N * BLOCK_N
        hi = TK
    return hi_full, hi


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, qc, qs, qpos,
    KC, V, svs, svd,
    lo, hi, TK, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """The forward's online softmax over the key blocks [lo, hi), masked where MASK."""
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
        # scale in the row max (max(s) * c = max(s * c), c > 0, rounding included) and in the
        # exponent, one fma a score: a float32 op fewer than scaling s first. Every row sees
        # key 0, in the first block visited: m_new is finite
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


# Launch configs: (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel and head dim (32 uses 64's).
# Each list: the fastest of H200 sweeps timed in a forward+backward (POPE_AUTOTUNE=0's and
# forward-only calls'), then runners-up close at every shape (results/kernel.md, "Launch configs").
_AUTOTUNE = not _INTERPRET and os.environ.get("POPE_AUTOTUNE", "1") != "0"
_BLOCKS = {
    "fwd": {
        64: [(128, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 128, 4, 2),
             (128, 128, 8, 3)],
        128: [(128, 64, 8, 3)],  # (one config leads at every shape)
    },
}
_DECODE_FWD = (16, 64, 4, 3)  # query chunks of <= 16 rows (a few tokens against a long cache)


def _autotuned(kernel, kind, **kw):
    """triton.autotune over every head dim's configs, pruned to the launch's (no attributes of
    ours on a Config: cache_results keeps a shape's winner on disk, rebuilt from its __dict__)."""
    every = sorted({b for D in _BLOCKS[kind] for b in _BLOCKS[kind][D]})
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
               for bm, bn, w, s in every]

    def prune(configs, named_args, **kwargs):
        want = _BLOCKS[kind][max(kwargs["HEAD_DIM"], 64)]
        return [c for c in configs
                if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in want]

    tune = triton.autotune(configs,
                           key=["Q_BUCKET", "K_BUCKET", "HEAD_DIM", "CAUSAL"],
                           cache_results=True,
                           prune_configs_by={"early_config_prune": prune},
                           **kw)
    return tune(kernel)


@triton.jit
def _pope_fwd(
    Q, KC, V, O, LSE, THETA,
    sqb, sqh, sqt, sqd,
    svb, svh, svt, svd,
    sob, soh, sot, sod,
    qk_scale, H, TQ, TK, q_offset, Q_BUCKET, K_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """One program: BLOCK_M query rows of one (batch, head), all keys they see -> O and the rows'
    log2-sum-exp (for the backward). qk_scale = sm_scale*log2(e): softmax on exp2. The query
    block, made Cartesian (no delta) in Q's dtype, lives through the program."""
    bh, b, h, m0, offs_m, offs_d, rows = _query_rows(H, TQ, HEAD_DIM, BLOCK_M)
    qpos = q_offset + offs_m
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                mask=rows[:, None], other=0.0)
    theta = tl.load(THETA + offs_d)
    qc, qs = _cartesian_tile(q.to(tl.float32), qpos.to(tl.float32), theta,
                             tl.zeros([HEAD_DIM], dtype=tl.float32))
    hi_full, hi = _key_bounds(q_offset, m0, TK, BLOCK_M, BLOCK_N, CAUSAL)
    qc = _cast(qc, q.dtype)
    qs = _cast(qs, q.dtype)
    KC = KC + bh * TK * 2 * HEAD_DIM
    V = V + b * svb + h * svh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qc, qs, qpos,
                               KC, V, svt, svd,
                               0, hi_full, TK, qk_scale,
                               HEAD_DIM, BLOCK_N, False, CAUSAL, DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qc, qs, qpos,
                               KC, V, svt, svd,
                               hi_full, hi, TK, qk_scale,
                               HEAD_DIM, BLOCK_N, True, CAUSAL, DOT_PREC)
    acc = acc / l_i[:, None]
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :] * sod,
             _cast(acc, O.dtype.element_ty), mask=rows[:, None])
    tl.store(LSE + bh * TQ + offs_m, m_i + tl.math.log2(l_i), mask=rows)


_pope_fwd_tuned = _autotuned(_pope_fwd, "fwd")


# -----------------------------------------------------------------------------
# Backward: the dk/dv kernel and the dq kernel, each with its launch configs

@triton.jit
def _halves(x):
    """(R, 2D) -> its two (R, D) halves."""
    return tl.split(tl.permute(tl.reshape(x, (x.shape[0], 2, x.shape[1] // 2)), (0, 2, 1)))


@triton.jit
def _dkdv_inner(
    dk2, dv, k2, v, offs_n,
    QC, DO, sdot, sdod, LSE, DI,
    lo, hi, TQ, q_offset, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """dk/dv's loop over the query blocks [lo, hi) seeing the key block, masked where MASK."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_d2 = tl.arange(0, 2 * HEAD_DIM)
    lo_hi = _loop_bounds(lo, hi)
    for start_m in range(lo_hi[0], lo_hi[1], BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < TQ
        # rows past TQ load as zeros, lse = Di = 0: p is 1 but dO = Di = 0: nothing added to dk,
        # dv, ddelta
        q2 = tl.load(QC + offs_m[:, None] * (2 * HEAD_DIM) + offs_d2[None, :],
                     mask=rows[:, None], other=0.0)
        lse = tl.load(LSE + offs_m, mask=rows, other=0.0)
        sT = _dot(k2, tl.trans(q2), tl.zeros([k2.shape[0], BLOCK_M], dtype=tl.float32), DOT_PREC)
        pT = tl.math.exp2(sT * qk_scale - lse[None, :])
        if MASK:
            pT = tl.where(offs_n[:, None] <= q_offset + offs_m[None, :], pT, 0.0)
        do = tl.load(DO + offs_m[:, None] * sdot + offs_d[None, :] * sdod,
                     mask=rows[:, None], other=0.0)
        dv = _dot(_cast(pT, do.dtype), do, dv, DOT_PREC)
        di = tl.load(DI + offs_m, mask=rows, other=0.0)
        dpT = _dot(v, tl.trans(do), tl.zeros([k2.shape[0], BLOCK_M], dtype=tl.float32), DOT_PREC)
        dsT = _cast(pT * (dpT - di[None, :]), do.dtype)
        dk2 = _dot(dsT, q2, dk2, DOT_PREC)
    return dk2, dv


_BLOCKS["dkdv"] = {
    64: [(64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 8, 3), (32, 64, 4, 3)],
    128: [(64, 64, 8, 3), (32, 128, 8, 3)],
}


@triton.jit
def _pope_bwd_dkdv(
    K, V, QC, DO, LSE, DI, DK, DV, DDELTA_PARTS, KC, THETA, DELTA,
    skb, skh, skt, skd,
    svb, svh, svt, svd,
    sdob, sdoh, sdot, sdod,
    sdkb, sdkh, sdkt, sdkd,
    sdvb, sdvh, sdvt, sdvd,
    sm_scale, qk_scale, H, TQ, TK, q_offset, Q_BUCKET, K_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """One program: BLOCK_N key rows of one (batch, head), every query block that sees them. Writes
    dk, dv and this block's ddelta partials DDELTA_PARTS[pid_n, b * H + h, :] (the caller sums over
    blocks and batch). Keys come Cartesian from the pre-pass: KC (B, H, TK, 2D)."""
    pid_n = tl.program_id(1)  # (the grid's order: see _grid)
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    h = bh % H
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    cols = offs_n < TK
    v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svt + offs_d[None, :] * svd,
                mask=cols[:, None], other=0.0)
    # one (BLOCK_N, 2D) key tile [mu cos | mu sin] and dk accumulator, not one per half: the same
    # products in wider dots; loaded, not made here (no key transform in registers through the
    # loop: results/kernel.md); split again after the loop for the chain rule
    offs_d2 = tl.arange(0, 2 * HEAD_DIM)
    k2 = tl.load(KC + bh * TK * 2 * HEAD_DIM + offs_n[:, None] * (2 * HEAD_DIM) + offs_d2[None, :],
                 mask=cols[:, None], other=0.0)
    QC = QC + bh * TQ * 2 * HEAD_DIM
    DO = DO + b * sdob + h * sdoh
    LSE = LSE + bh * TQ
    DI = DI + bh * TQ
    dk2 = tl.zeros([BLOCK_N, 2 * HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    # causal: rows before lo see none of these keys; rows from full_lo on see all
    if CAUSAL:
        lo = tl.maximum(n0 - q_offset, 0) // BLOCK_M * BLOCK_M
        full_lo = tl.maximum(n0 + BLOCK_N - 1 - q_offset, 0)
        full_lo = tl.maximum((full_lo + BLOCK_M - 1) // BLOCK_M * BLOCK_M, lo)
    else:
        lo = 0
        full_lo = 0
    dk2, dv = _dkdv_inner(dk2, dv, k2, v, offs_n,
                          QC, DO, sdot, sdod, LSE, DI,
                          lo, tl.minimum(full_lo, TQ), TQ, q_offset, qk_scale,
                          HEAD_DIM, BLOCK_M, True, DOT_PREC)
    dk2, dv = _dkdv_inner(dk2, dv, k2, v, offs_n,
                          QC, DO, sdot, sdod, LSE, DI,
                          full_lo, TQ, TQ, q_offset, qk_scale,
                          HEAD_DIM, BLOCK_M, False, DOT_PREC)
    dkc, dks = _halves(dk2)
    # dv first, freeing its registers for the rest
    tl.store(DV + b * sdvb + h * sdvh + offs_n[:, None] * sdvt + offs_d[None, :] * sdvd,
             _cast(dv, DV.dtype.element_ty), mask=cols[:, None])
    # back from the Cartesian key [mu c, mu s] to k and the phase (= delta's); k, theta, delta load
    # here, not in the prologue: live through the loop, they made it spill
    k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :] * skd,
                mask=cols[:, None], other=0.0).to(tl.float32)
    theta = tl.load(THETA + offs_d)
    delta = tl.load(DELTA + h * HEAD_DIM + offs_d)
    dk, dphase = _cartesian_grad(k, offs_n.to(tl.float32), theta, delta,
                                 dkc * sm_scale, dks * sm_scale)
    tl.store(DK + b * sdkb + h * sdkh + offs_n[:, None] * sdkt + offs_d[None, :] * sdkd,
             _cast(dk, DK.dtype.element_ty), mask=cols[:, None])
    dphase = tl.where(cols[:, None], dphase, 0.0)
    parts = DDELTA_PARTS + (pid_n * tl.num_programs(0) + bh) * HEAD_DIM
    tl.store(parts + offs_d, tl.sum(dphase, 0))


# (reset_to_zero: each trial run sums its partials from zero)
_pope_bwd_dkdv_tuned = _autotuned(_pope_bwd_dkdv, "dkdv", reset_to_zero=["DDELTA_PARTS"])


@triton.jit
def _dq_inner(
    dqc, dqs, qc, qs, do, lse, di, qpos,
    KC, V, svt, svd,
    lo, hi, TK, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """dq's loop over the key blocks [lo, hi) the query block sees, masked where MASK."""
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


# dq's one config a head dim, not autotuned: at D=64 the autotuner, timing dq alone with a cold L2,
# picked a slower one (results/kernel.md, "Launch configs")
_BLOCKS["dq"] = {64: [(64, 64, 4, 3)], 128: [(128, 32, 8, 3)]}


@triton.jit
def _pope_bwd_dq(
    Q, QC, KC, V, DO, LSE, DI, DQ, THETA,
    sqb, sqh, sqt, sqd,
    svb, svh, svt, svd,
    sdob, sdoh, sdot, sdod,
    sdqb, sdqh, sdqt, sdqd,
    sm_scale, qk_scale, H, TQ, TK, q_offset, Q_BUCKET, K_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """One program: BLOCK_M query rows of one (batch, head), every key block they see. Writes dq."""
    bh, b, h, m0, offs_m, offs_d, rows = _query_rows(H, TQ, HEAD_DIM, BLOCK_M)
    qpos = q_offset + offs_m
    theta = tl.load(THETA + offs_d)
    hi_full, hi = _key_bounds(q_offset, m0, TK, BLOCK_M, BLOCK_N, CAUSAL)
    # the pre-pass's Cartesian queries (loaded, not made here: see _bwd)
    qrow = QC + bh * TQ * 2 * HEAD_DIM + offs_m[:, None] * (2 * HEAD_DIM) + offs_d[None, :]
    qc = tl.load(qrow, mask=rows[:, None], other=0.0)
    qs = tl.load(qrow + HEAD_DIM, mask=rows[:, None], other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdot + offs_d[None, :] * sdod,
                 mask=rows[:, None], other=0.0)
    lse = tl.load(LSE + bh * TQ + offs_m, mask=rows, other=0.0)
    di = tl.load(DI + bh * TQ + offs_m, mask=rows, other=0.0)
    KC = KC + bh * TK * 2 * HEAD_DIM
    V = V + b * svb + h * svh
    dqc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dqs = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dqc, dqs = _dq_inner(dqc, dqs, qc, qs, do, lse, di, qpos,
                         KC, V, svt, svd,
                         0, hi_full, TK, qk_scale,
                         HEAD_DIM, BLOCK_N, False, CAUSAL, DOT_PREC)
    dqc, dqs = _dq_inner(dqc, dqs, qc, qs, do, lse, di, qpos,
                         KC, V, svt, svd,
                         hi_full, hi, TK, qk_scale,
                         HEAD_DIM, BLOCK_N, True, CAUSAL, DOT_PREC)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                mask=rows[:, None], other=0.0).to(tl.float32)
    dq, _ = _cartesian_grad(q, qpos.to(tl.float32), theta, tl.zeros([HEAD_DIM], dtype=tl.float32),
                            dqc * sm_scale, dqs * sm_scale)
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :] * sdqd,
             _cast(dq, DQ.dtype.element_ty), mask=rows[:, None])


# -----------------------------------------------------------------------------
# Decoding kernel: one query per (batch, head) on a static KV cache (model.KVCache's one-token
# step), softmax over ready keys (any power-of-two width) or PoPE's magnitudes mu_k alone (D numbers
# a key, as RoPE's; the kernel makes each slot's phase: results/kernel.md, "Decoding"). Split as in
# flash-decoding, a pair's keys 0..pos in `splits` chunks merged by the last to finish
# (_decode_split_kernel): one launch a layer. pos is read on the device: a CUDA graph replays the
# step at every position.
# The program holding slot pos writes the new key and value there, attending to them from
# registers (no other program reads it).

_DECODE_PROGRAMS = 512  # split programs to aim for: ~4 per SM of an H100/H200 (132 SMs)
# elements of one key tile (BLOCK_N keys x key width), 4 warps: 64 float32 registers a thread. One
# fixed config (not autotuned): the step is bound by cache reads.
_DECODE_TILE = 8192
# MODE: q and k come ready, or raw, to be turned as PoPE's (to magnitudes) or RoPE's (rotated)
_READY = tl.constexpr(0)
_POPE = tl.constexpr(1)
_ROPE = tl.constexpr(2)


@triton.jit
def _decode_turn(X, sxd, pos, FREQ, MODE: tl.constexpr, DIM: tl.constexpr):
    """The DIM-long float32 query or key of X (one row, stride sxd) at pos. _POPE: mu = softplus(X)
    (phases per slot: _relative_key); _ROPE: X rotated as model.apply_rope (rotate-half) by
    pos * inv_freq_i; _READY: X."""
    offs = tl.arange(0, DIM)
    if MODE == _POPE:
        x = _softplus(tl.load(X + offs * sxd).to(tl.float32))
    elif MODE == _ROPE:  # x[i] + 1j x[i + D/2] times e^(1j pos inv_freq_i)
        half: tl.constexpr = DIM // 2
        cos, sin = _cos_sin(pos.to(tl.float32) * tl.load(FREQ + offs % half))
        x = tl.load(X + offs * sxd).to(tl.float32)
        y = tl.load(X + ((offs + half) % DIM) * sxd).to(tl.float32)
        x = x * cos + tl.where(offs < half, -y, y) * sin
    else:
        x = tl.load(X + offs * sxd).to(tl.float32)
    return x


@triton.jit
def _decode_split_kernel(
    Q, KN, VN, KC, VC, POS, PART, COUNT, O, FREQ, DELTA,
    sqb, sqh, sqd,
    sknb, sknh, sknd,
    svnb, svnh, svnd,
    skb, skh, skt, skd,
    svb, svh, svt, svd,
    sob, soh, sod,
    sdh,
    H, N, SPLITS, qk_scale,
    KEY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
    FINAL: tl.constexpr, SPLITS_POW2: tl.constexpr,
):
    """Program (split, bh): chunk `split` of pair bh's keys 0..pos -> PART[bh, split] = (acc, max,
    sum), max and sum of exp2(scores - max) in log2 units (qk_scale = sm_scale * log2(e)); the
    pair's last program to finish (COUNT[bh] counts them, zero between launches) merges them into
    O[b, h, 0]. MODE: _decode_turn's (FREQ; for _POPE, DELTA (H, HEAD_DIM), row stride sdh).
    FINAL (SPLITS = 1): O[b, h, 0] = acc / sum, no partial, no count."""
    split = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    pos = tl.load(POS)
    per = tl.cdiv(tl.cdiv(pos + 1, BLOCK_N), SPLITS) * BLOCK_N  # keys per chunk, whole blocks
    lo = split * per
    hi = tl.minimum(lo + per, pos + 1)
    offs_d = tl.arange(0, HEAD_DIM)
    # chunks past pos do nothing (nor count); pos >= N: nothing at all
    if (lo < hi) & (pos < N):
        offs_k = tl.arange(0, KEY_DIM)
        q = _decode_turn(Q + b * sqb + h * sqh, sqd, pos, FREQ, MODE, KEY_DIM) * qk_scale
        if MODE == _POPE:
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
            k = tl.load(KC + offs[:, None] * skt + offs_k[None, :] * skd,
                        mask=ok[:, None], other=0.0)
            k = k.to(tl.float32)
            if MODE == _POPE:
                rel = (offs - pos).to(tl.float32)
                k = _relative_key(k, rel[:, None], theta[None, :], dlt[None, :])
            s = tl.where(ok, tl.sum(k * q[None, :], 1), float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 0))
            p = tl.math.exp2(s - m_new)
            alpha = tl.math.exp2(m - m_new)
            v = tl.load(VC + offs[:, None] * svt + offs_d[None, :] * svd,
                        mask=ok[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
            l = l * alpha + tl.sum(p, 0)
            m = m_new
        # the chunk of slot pos: the new key and value, rounded to the cache's dtype
        if hi == pos + 1:
            kn = _decode_turn(KN + b * sknb + h * sknh, sknd, pos, FREQ, MODE, KEY_DIM)
            kn = _cast(kn, KC.dtype.element_ty)
            vn = tl.load(VN + b * svnb + h * svnh + offs_d * svnd).to(tl.float32)
            vn = _cast(vn, VC.dtype.element_ty)
            tl.store(KC + pos * skt + offs_k * skd, kn)
            tl.store(VC + pos * svt + offs_d * svd, vn)
            kn = kn.to(tl.float32)
            if MODE == _POPE:
                kn = _relative_key(kn, None, theta, dlt)
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
            # every thread's partial stored before the count (the barrier), released with it; its
            # old value says if this is the last chunk that ran (ran: chunks holding a key)
            tl.debug_barrier()
            done = tl.atomic_add(COUNT + bh, 1, sem="acq_rel", scope="gpu")
            ran = tl.cdiv(pos + 1, per)
            # the last merges all (visible: the acquire), zeroes the count. .cg loads: from L2,
            # where the other programs' stores are
            if done == ran - 1:
                tl.store(COUNT + bh, 0)
                offs_s = tl.arange(0, SPLITS_POW2)
                ok = offs_s < ran
                mp = tl.load(part + offs_s * (HEAD_DIM + 2) + HEAD_DIM,
                             mask=ok, other=float("-inf"), cache_modifier=".cg")
                lp = tl.load(part + offs_s * (HEAD_DIM + 2) + HEAD_DIM + 1,
                             mask=ok, other=0.0, cache_modifier=".cg")
                ap = tl.load(part + offs_s[:, None] * (HEAD_DIM + 2) + offs_d[None, :],
                             mask=ok[:, None], other=0.0, cache_modifier=".cg")
                # chunk 0 always ran: the max is finite; the others weigh 0
                w = tl.math.exp2(mp - tl.max(mp, 0))
                out = tl.sum(w[:, None] * ap, 0) / tl.sum(w * lp, 0)
                tl.store(O + b * sob + h * soh + offs_d * sod, _cast(out, O.dtype.element_ty))
    # past the cache: a NaN output, nothing written
    if (pos >= N) & (split == 0):
        nan = tl.full([HEAD_DIM], float("nan"), O.dtype.element_ty)
        tl.store(O + b * sob + h * soh + offs_d * sod, nan)


# -----------------------------------------------------------------------------
# Custom ops (torch.library): forward and backward, eager and under torch.compile (one opaque node
# there: no graph break; the fakes give the shapes), and the decoding step's under torch.compile.
# The forward's autograd formula calls the backward op.

@torch.library.custom_op("pope_kernel::fwd", mutates_args=())
def _fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor, theta: torch.Tensor,
    causal: bool, sm_scale: float, q_offset: int, tune: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd(q, k, v, delta, theta, causal, sm_scale, q_offset, tune)


@_fwd_op.register_fake
def _(q, k, v, delta, theta, causal, sm_scale, q_offset, tune):
    return _bthd(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("pope_kernel::bwd", mutates_args=())
def _bwd_op(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor,
    theta: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    causal: bool, sm_scale: float, q_offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset)


@_bwd_op.register_fake
def _(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset):
    return _bthd(q), _bthd(k), _bthd(v), delta.new_empty(delta.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, delta, theta, causal, sm_scale, q_offset, _ = inputs
    ctx.save_for_backward(q, k, v, delta, theta, *output)
    ctx.args = (causal, sm_scale, q_offset)
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # (lse's gradient, never used, is not made)


def _backward(ctx, dout, dlse):
    """dq, dk, dv, ddelta; theta and the plain arguments get none."""
    return *_bwd_op(dout, *ctx.saved_tensors, *ctx.args), None, None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("pope_kernel::decode", mutates_args=("k_cache", "v_cache", "counts"))
def _decode_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    pos: torch.Tensor, freq: Optional[torch.Tensor], delta: Optional[torch.Tensor],
    sm_scale: float, qk_mode: int, splits: int, block_n: int, counts: Optional[torch.Tensor],
) -> torch.Tensor:
    return _decode(q, k, v, k_cache, v_cache, pos, freq, delta, sm_scale, qk_mode, splits, block_n,
                   counts)


@_decode_op.register_fake
def _(q, k, v, k_cache, v_cache, pos, freq, delta, sm_scale, qk_mode, splits, block_n, counts):
    return v_cache.new_empty((*k_cache.shape[:2], 1, v_cache.size(-1)))


# -----------------------------------------------------------------------------
# Launch helpers: configs autotuned on the GPU, small and fixed under the interpreter

_LOG2E = 1.4426950408889634


def _launch(kernel, tuned, blocks, grid, args, kwargs):
    """kernel[grid](...) with blocks = (BLOCK_M, BLOCK_N, warps, stages) or, blocks None and
    autotuning on, `tuned`'s pick; 16x16 blocks under the interpreter. Returns BLOCK_N."""
    if blocks is None and _AUTOTUNE:
        tuned[grid](*args, **kwargs)
        return tuned.best_config.kwargs["BLOCK_N"]
    if _INTERPRET:
        meta = dict(BLOCK_M=16, BLOCK_N=16)
    else:
        meta = dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), blocks))
    kernel[grid](*args, **kwargs, **meta)
    return meta["BLOCK_N"]


def _grid(pairs, T, block):
    """The attention kernels' grid: (batch, head) pairs on axis 0, blocks of T on axis 1. The GPU
    starts programs in grid order, axis 0 fastest; each kernel numbers its blocks heaviest first
    under the causal mask (the forward's and dq's last query blocks, dk/dv's first key blocks),
    light ones filling the tail (results/kernel.md, "Heavy-first grids")."""
    return lambda meta: (pairs, triton.cdiv(T, meta[block]))


def _empty(shape, like, dtype=None):
    """torch.empty as `like` (the CPU tests fill it with NaN: every element must be written)."""
    return torch.empty(shape, device=like.device, dtype=dtype or like.dtype)


def _bthd(x):
    """Empty, shaped as the (B, H, T, D) x, laid out (B, T, H, D) as SDPA's outputs: the model's
    y.transpose(1, 2) is then contiguous."""
    return _empty(x.transpose(1, 2).shape, x).transpose(1, 2)


def _on_device(x):
    """Triton launches on the current CUDA device, whatever the tensors' device: make it x's."""
    if x.is_cuda:
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def _training_constexprs(q, causal):
    """The training kernels' constexprs (float32 dots in IEEE, not tf32)."""
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    return dict(HEAD_DIM=q.size(-1), CAUSAL=causal, DOT_PREC=prec)


def _cartesian(x, theta, delta, pos0, o=None, do=None):
    """The pre-pass: (B, H, T, 2D) Cartesian x in x's dtype; given o and do, also rowsum(dO*O)
    (B, H, T)."""
    B, H, T, D = x.shape
    xc = _empty((B, H, T, 2 * D), x)
    with_di = o is not None
    has_delta = delta is not None
    # x, xc and theta stand in for pointers the kernel leaves unread
    if with_di:
        di = _empty((B, H, T), x, torch.float32)
    else:
        di = xc
        o = x
        do = x
    if not has_delta:
        delta = theta
    _cartesian_kernel[(triton.cdiv(T, 64), B * H)](
        x, xc, theta, delta, o, do, di,
        *x.stride(),
        *o.stride(),
        *do.stride(),
        H, T, pos0,
        HEAD_DIM=D,
        BLOCK_T=64,
        HAS_DELTA=has_delta,
        WITH_DI=with_di,
        num_warps=4,
    )
    if with_di:
        return xc, di
    return xc


def _fwd(q, k, v, delta, theta, causal, sm_scale, q_offset, tune):
    """The forward: out and lse, each row's log2-sum-exp (float32) for the backward."""
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    # short query chunks (decoding) and calls without gradients (inference, eval) run a fixed
    # config: tuning each new (Tq, Tk) bucket would cost seconds
    if Tq <= 16:
        blocks = _DECODE_FWD
    elif _AUTOTUNE and tune:
        blocks = None
    else:
        blocks = _BLOCKS["fwd"][max(D, 64)][0]
    with _on_device(q):
        out = _bthd(q)
        lse = _empty((B, H, Tq), q, torch.float32)
        kc = _cartesian(k, theta, delta, 0)
        args = (q, kc, v, out, lse, theta,
                *q.stride(),
                *v.stride(),
                *out.stride(),
                sm_scale * _LOG2E, H, Tq, Tk, q_offset,
                triton.next_power_of_2(Tq), triton.next_power_of_2(Tk))
        _launch(_pope_fwd, _pope_fwd_tuned, blocks, _grid(B * H, Tq, "BLOCK_M"), args,
                _training_constexprs(q, causal))
    return out, lse


def _bwd(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset):
    """dq, dk, dv and ddelta (float32)."""
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    consts = (sm_scale, sm_scale * _LOG2E, H, Tq, Tk, q_offset,
              triton.next_power_of_2(Tq), triton.next_power_of_2(Tk))
    kwargs = _training_constexprs(q, causal)
    dkdv_blocks = None
    if not _AUTOTUNE:
        dkdv_blocks = _BLOCKS["dkdv"][max(D, 64)][0]
    with _on_device(q):
        # pre-passes: the 2D-long queries (with rowsum(dO*O)) and keys both kernels load
        dk = _bthd(k)
        dv = _bthd(v)
        # ddelta partials: a launch writes the first cdiv(Tk, BLOCK_N) rows, blocks outermost: one
        # contiguous (blocks * B, H * D) matrix, summed over rows. 16: the smallest BLOCK_N
        ddelta_parts = _empty((triton.cdiv(Tk, 16), B * H, D), q, torch.float32)
        qc, di = _cartesian(q, theta, None, q_offset, o=out, do=do)
        kc = _cartesian(k, theta, delta, 0)
        dkdv_args = (k, v, qc, do, lse, di, dk, dv, ddelta_parts, kc, theta, delta,
                     *k.stride(),
                     *v.stride(),
                     *do.stride(),
                     *dk.stride(),
                     *dv.stride(),
                     *consts)
        block_n = _launch(_pope_bwd_dkdv, _pope_bwd_dkdv_tuned, dkdv_blocks,
                          _grid(B * H, Tk, "BLOCK_N"), dkdv_args, kwargs)
        dq = _bthd(q)
        dq_args = (q, qc, kc, v, do, lse, di, dq, theta,
                   *q.stride(),
                   *v.stride(),
                   *do.stride(),
                   *dq.stride(),
                   *consts)
        _launch(_pope_bwd_dq, None, _BLOCKS["dq"][max(D, 64)][0], _grid(B * H, Tq, "BLOCK_M"),
                dq_args, kwargs)
    # a fixed-order reduction (no atomics): bitwise the same every run
    ddelta = ddelta_parts[:triton.cdiv(Tk, block_n)].view(-1, H * D).sum(0).view(H, D)
    return dq, dk, dv, ddelta


def _decode(q, k, v, k_cache, v_cache, pos, freq, delta, sm_scale, qk_mode, splits, block_n,
            counts):
    """The decoding kernel's one launch: `splits` programs a (batch, head)."""
    B, H, N, Dk = k_cache.shape
    D = v_cache.size(-1)
    # the caches and pos stand in for pointers the kernel leaves unread
    if freq is None:
        freq = k_cache
    if delta is None:
        delta = k_cache
    if counts is None:
        counts = pos
    with _on_device(k_cache):
        out = _empty((B, H, 1, D), v_cache)
        # one chunk: its program writes the output, no partials, no count
        part = out
        if splits > 1:
            part = _empty((B * H, splits, D + 2), v_cache, torch.float32)
        _decode_split_kernel[(splits, B * H)](
            q, k, v, k_cache, v_cache, pos, part, counts, out, freq, delta,
            q.stride(0), q.stride(1), q.stride(3),
            k.stride(0), k.stride(1), k.stride(3),
            v.stride(0), v.stride(1), v.stride(3),
            *k_cache.stride(),
            *v_cache.stride(),
            out.stride(0), out.stride(1), out.stride(3),
            delta.stride(0),
            H, N, splits, sm_scale * _LOG2E,
            KEY_DIM=Dk,
            HEAD_DIM=D,
            BLOCK_N=block_n,
            MODE=qk_mode,
            FINAL=splits == 1,
            SPLITS_POW2=triton.next_power_of_2(splits),
            num_warps=4,
        )
    return out


# -----------------------------------------------------------------------------
# Entry points

class PopeKernelUnsupported(ValueError):
    """Raised by pope_attention for input the kernel does not take."""


_SUPPORTED = ("the PoPE Triton kernel takes CUDA tensors (CPU ones under TRITON_INTERPRET=1) of "
              "one dtype, bfloat16, float16 or float32, head dim 32, 64 or 128")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
HEAD_DIMS = (32, 64, 128)


def _capability(dev):
    """A CUDA device's compute capability; (99, 0) where there is none to ask."""
    if (dev.type != "cuda" or _INTERPRET or torch.version.hip is not None
            or torch.compiler.is_compiling()):
        return (99, 0)
    return torch.cuda.get_device_capability(dev)


def kernel_unsupported_reason(q, k, v, delta, theta=None, q_offset=0):
    """None if pope_attention takes these inputs, else why not: the kernel's one support check,
    asked by pope_attention too (and by model.py, to choose its path)."""
    if (q.dim() != 4 or k.dim() != 4 or k.shape[:2] != q.shape[:2] or k.size(-1) != q.size(-1)
            or v.shape != k.shape):
        return (f"q must be (B, H, Tq, D), k and v (B, H, Tk, D); got q {tuple(q.shape)}, "
                f"k {tuple(k.shape)}, v {tuple(v.shape)}; {_SUPPORTED}")
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    if delta.shape != (H, D):
        return f"delta must be (H={H}, D={D}); got {tuple(delta.shape)}; {_SUPPORTED}"
    if q_offset < 0 or Tq > Tk:
        return (f"need q_offset >= 0 and Tq <= Tk; got q_offset={q_offset}, Tq={Tq}, Tk={Tk}; "
                f"{_SUPPORTED}")
    if theta is not None and theta.shape != (D,):
        return f"theta must be (D={D},); got {tuple(theta.shape)}"
    dev = q.device
    devices = ("cuda", "cpu") if _INTERPRET else ("cuda",)
    if {k.device, v.device, delta.device} != {dev} or dev.type not in devices:
        return f"got tensors on {dev}, {k.device}, {v.device}, {delta.device}; {_SUPPORTED}"
    dtypes_ok = k.dtype == v.dtype == q.dtype and delta.dtype.is_floating_point
    if q.dtype not in _DTYPES or not dtypes_ok:
        return f"got q, k, v, delta in {q.dtype}, {k.dtype}, {v.dtype}, {delta.dtype}; {_SUPPORTED}"
    if D not in HEAD_DIMS or q.numel() == 0 or k.numel() == 0:
        return f"got q {tuple(q.shape)}, k {tuple(k.shape)} (head dim {D}); {_SUPPORTED}"
    if _capability(dev) < (8, 0):
        return (f"the GPU has compute capability {_capability(dev)}, the kernel needs 8.0+; "
                f"{_SUPPORTED}")
    return None


def pope_attention(q, k, v, delta, theta, *, causal=True, sm_scale=None, q_offset=0,
                   checked=False):
    """PoPE attention through the fused Triton kernel: model.pope_attention_torch's contract, with
    theta = model.pope_frequencies(D) given instead of its base (delta and theta used as given).
    Raises PopeKernelUnsupported, a ValueError, for input the kernel does not take, unless checked:
    the caller had None from kernel_unsupported_reason (model.py's 'auto')."""
    if not checked:
        reason = kernel_unsupported_reason(q, k, v, delta, theta, q_offset)
        if reason is not None:
            raise PopeKernelUnsupported(
                f"{reason} (model.py's attn_impl='auto' or 'torch' runs its PyTorch path)")
    # the kernels read delta and theta as contiguous float32 (model.py hands them so: a no-op
    # then); cast outside the op, so autograd maps ddelta back
    delta = delta.to(torch.float32).contiguous()
    theta = theta.to(q.device, torch.float32).contiguous()
    tune = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, delta))
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.size(-1))
    return _fwd_op(q, k, v, delta, theta, bool(causal), float(sm_scale), int(q_offset), tune)[0]


def decode_unsupported_reason(k_cache, v_cache):
    """None if decode_attention takes caches like these, else why not."""
    supported = ("the decoding kernel takes CUDA caches (or CPU ones under TRITON_INTERPRET=1), "
                 "(B, H, N, Dk) keys and (B, H, N, D) values in bfloat16, float16 or float32, "
                 "D and Dk powers of two, 16 <= D <= 256, Dk <= 512, on a GPU of compute "
                 "capability 8.0+")
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
        return f"got caches {tuple(k_cache.shape)} and {tuple(v_cache.shape)}; {supported}"
    dev = k_cache.device
    D = v_cache.size(-1)
    Dk = k_cache.size(-1)
    devices = ("cuda", "cpu") if _INTERPRET else ("cuda",)
    if v_cache.device != dev or dev.type not in devices:
        return f"got {dev.type} / {v_cache.device.type} tensors; {supported}"
    if k_cache.dtype not in _DTYPES or v_cache.dtype != k_cache.dtype:
        return f"got {k_cache.dtype} / {v_cache.dtype}; {supported}"
    if not (D & (D - 1) == 0 and Dk & (Dk - 1) == 0 and 16 <= D <= 256 and 0 < Dk <= 512):
        return f"got D={D}, Dk={Dk}; {supported}"
    if _capability(dev) < (8, 0):
        return f"the GPU has compute capability {_capability(dev)}; {supported}"
    return None


def decode_attention(q, k, v, k_cache, v_cache, pos, sm_scale, *, theta=None, delta=None,
                     inv_freq=None, splits=None, block_n=None, counts=None):
    """k_cache[:, :, pos] = k, v_cache[:, :, pos] = v, then one query per (batch, head) over
    slots 0..pos: softmax(sm_scale q k_cache[..., :pos+1]^T) v_cache[..., :pos+1], in float32.
    q, k (B, H, 1, Dk), v (B, H, 1, D), any strides; pos a one-element integer tensor on the
    caches' device (read there: CUDA-graph safe); past N: nothing written, a NaN output.
    The kernel turns raw q and k at pos: given theta (D,) and delta (H, D) (float32, bounded by
    model.pope_delta), PoPE over a cache of softplus(k); given inv_freq (D/2,), RoPE's rotation.
    splits, block_n: override decode_launch's; counts: B*H int32 zeros, the chunks' tally, left
    at zero (model.KVCache shares one)."""
    B, H, N, Dk = k_cache.shape
    D = v_cache.size(-1)
    ok = q.shape == k.shape == (B, H, 1, Dk) and v.shape == (B, H, 1, D) and pos.numel() == 1
    qk_mode = _READY.value
    if theta is not None:
        qk_mode = _POPE.value
        ok = ok and Dk == D and theta.shape == (D,) and delta is not None and delta.shape == (H, D)
    elif inv_freq is not None:
        qk_mode = _ROPE.value
        ok = ok and Dk == D and inv_freq.shape == (D // 2,)
    if not ok:
        shapes = [None if x is None else tuple(x.shape)
                  for x in (q, k, v, pos, theta, delta, inv_freq)]
        raise ValueError(f"caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)} need q, k "
                         f"(B, H, 1, Dk), v (B, H, 1, D), one pos, and D-wide keys for theta (D,) "
                         f"with delta (H, D) or inv_freq (D/2,); got q, k, v, pos, theta, delta, "
                         f"inv_freq {shapes}")
    if not (splits and block_n):
        picked = decode_launch(k_cache, block_n)
        block_n = picked["block_n"]
        if not splits:
            splits = picked["splits"]
    if splits == 1:
        counts = None
    elif counts is None:
        counts = torch.zeros(B * H, device=k_cache.device, dtype=torch.int32)
    if qk_mode == _POPE.value:
        freq = theta
    else:
        freq = inv_freq
        delta = None
    args = (q, k, v, k_cache, v_cache, pos, freq, delta, float(sm_scale), qk_mode, splits, block_n,
            counts)
    if torch.compiler.is_compiling():  # one opaque node for the compiler
        return _decode_op(*args)
    # eager and CUDA graphs launch directly: a custom op's first call imports torch._dynamo,
    # seconds of sample.py's start (results/sample/README.md)
    return _decode(*args)


def decode_launch(k_cache, block_n=None):
    """dict(splits, block_n): decode_attention's launch for caches of k_cache's shape (given
    block_n, its splits), the same at every pos: model.KVCache asks once, passes both."""
    B, H, N, Dk = k_cache.shape
    if not block_n:
        block_n = max(16, _DECODE_TILE // Dk)
    splits = min(triton.cdiv(N, block_n), triton.cdiv(_DECODE_PROGRAMS, B * H))
    return dict(splits=splits, block_n=block_n)


# -----------------------------------------------------------------------------
# Interpreter shims (TRITON_INTERPRET=1, the CPU tests): Triton 3.6's interpreter differs from the
# GPU in places; each shim takes the GPU's path when compiled. They may follow the kernels calling
# them: a @triton.jit function looks its globals up when first run, not when decorated.

_INTERPRETED = tl.constexpr(_INTERPRET)


@triton.jit
def _dot(a, b, acc, DOT_PREC: tl.constexpr):
    """The interpreter multiplies bf16 tiles as raw uint16 bits: there every dot takes
    float32 operands (exact for bf16/fp16 values, as on tensor cores)."""
    if _INTERPRETED:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    return acc


def _interpreter_int(x):
    if hasattr(x, "handle"):
        return int(x.handle.data.reshape(-1)[0])
    return int(x)


if hasattr(triton, "constexpr_function"):  # lets compiled kernels name it
    _interpreter_int = triton.constexpr_function(_interpreter_int)


@triton.jit
def _loop_bounds(lo, hi):
    """The interpreter keeps scalars as 1-element arrays, which numpy >= 2.4 refuses as range()
    bounds, and makes any value assigned to a name one again: loops take (lo, hi) from here."""
    if _INTERPRETED:
        bounds = (_interpreter_int(lo), _interpreter_int(hi))
    else:
        bounds = (lo, hi)
    return bounds


@triton.jit
def _cast(x, dtype):
    """The interpreter truncates float32 -> bf16 (the GPU rounds to nearest even), doubling
    bf16 errors in the CPU tests: round first, with integer ops, so its truncation is exact."""
    if _INTERPRETED:
        if dtype == tl.bfloat16:
            b = x.to(tl.float32).to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            x = b.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _fma(a, b, c):
    """The interpreter rounds an fma's product to float32 first (a large phase loses its
    reduction's precision): there in float64, exact as the GPU's fma is for _cos_sin's operands."""
    if _INTERPRETED:
        r = (c.to(tl.float64) + a.to(tl.float64) * b).to(tl.float32)
    else:
        r = tl.fma(a, b, c)
    return r


@triton.jit
def _fast_cos_sin(r):
    """cos and sin for |r| <= pi: the GPU's sin.approx/cos.approx; the interpreter has only
    numpy's."""
    if _INTERPRETED:
        c = tl.cos(r)
        s = tl.sin(r)
    else:
        c = libdevice.fast_cosf(r)
        s = libdevice.fast_sinf(r)
    return c, s
