"""PoPE attention's three training kernels in Gluon (Triton 3.6, sm_90), drop-in for pope_kernel.py's
_pope_fwd, _pope_bwd_dkdv and _pope_bwd_dq: the same inputs and outputs, raw q and k made Cartesian in
registers (pope_kernel's _softplus / _cos_sin / _cartesian_tile / _cartesian_grad, re-written for Gluon: the
same float32 operations, sin/cos by libdevice's fast_sinf / fast_cosf after the same Cody-Waite reduction).

  fwd : gluon_fwd.py's `ws` (1 producer warp issuing every TMA load, 2 consumer warpgroups of 64 query rows,
        FA3's intra-warpgroup overlap). The producer TMA-loads the raw q rows; each consumer makes them
        Cartesian (float32, cast to bf16) and stores [mu cos | mu sin] into the shared Q tile the wgmma reads.
  dkdv: gluon_bwd.py's `ws_ov` dK/dV kernel on the raw keys: each consumer makes its 64 key rows Cartesian with
        delta, TMA-stores them to KC (the dq kernel's keys; from its epilogue), and applies the chain rule there: dk
        (k's dtype, laid out as k) and one row of ddelta partials per (b*h, 64-key block), no atomics.
  dq  : gluon_bwd.py's `ws_ov` dQ kernel on the raw queries, chain rule to dq in the epilogue.
The host side keeps pope_kernel's pre-passes: `_cartesian(k, theta, delta, 0)` (the forward's keys) and
`_cartesian(q, theta, None, 0, o=out, do=do)` (the backward's queries and rowsum(dO*O)).

Entry points (layouts as pope_kernel: q, k, v, do (B, H, T, D) bf16 views of (B, T, H, D) memory, or any
layout whose (B*T, H*D) view exists, e.g. model.py's qkv split; other layouts are copied; out, dq, dk, dv made
by pope_kernel._bthd; lse (B, H, T) float32 in log2 units; theta (D,), delta (H, D) float32 contiguous):
  fwd(q, kc, v, theta, sm_scale) -> (out, lse)            the _pope_fwd launch (kc from the key pre-pass)
  bwd(do, q, k, v, delta, theta, out, lse, sm_scale) -> (dq, dk, dv, ddelta)   all of pope_kernel._bwd
  pope_fwd / pope_bwd: pope_kernel._fwd / _bwd's signatures, for `pope_kernel._fwd = gluon_pope.pope_fwd`.
Supported: CUDA sm_90, bf16, D = 64, causal, q_offset = 0, Tq = Tk, T % 128 == 0 (asserted; pope_kernel also
takes fp16/fp32, D = 32/128, non-causal, offsets, ragged T). ddelta's partials: (B*H, T/64, D), one row per (b*h,
64-key block) (pope_kernel: (blocks, B*H, D) per BLOCK_N keys); torch sums them in one fixed order: the
backward is bitwise deterministic.

  PYTHONPATH=. python results/kernel/gluon_pope.py                 # H200: errors vs pope_kernel and float64,
                                                                    # bitwise rerun, timings vs pope_kernel
  PYTHONPATH=. python results/kernel/gluon_pope.py --compile-only  # no GPU: compile for sm_90, resources, PTX
Gluon 3.6 notes (gluon_fwd.py / gluon_bwd.py, in git at 01bbd51, have more): constexprs inside a tuple held in
a variable reach warp_specialize partitions as runtime values, so every partition's argument tuple is written
out in full.
"""
import argparse
import math
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.extra import libdevice
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

LOG2E = 1.4426950408889634
# (constexpr globals: the kernels read them; the host reads .value)
BLOCK = gl.constexpr(128)  # rows per program: queries (fwd, dq) or keys (dk/dv); also the forward's key blocks
HALF = gl.constexpr(64)  # rows per consumer warpgroup
STEP = gl.constexpr(64)  # the backward's streamed rows per ring slot (query blocks in dk/dv, key blocks in dq)
NDIAG = gl.constexpr(BLOCK.value // STEP.value)  # backward streamed blocks crossing the diagonal
WG0, WG1 = gl.constexpr(0), gl.constexpr(1)
CONSUMER_REGS = gl.constexpr(240)  # 3 warpgroups on 64K registers: 2 x 240 + 24 (producer warp) = 3 x 168
MAXNREG = 168
FWD_STAGES, BWD_STAGES = 3, 4  # K/V ring slots (fwd); Qc/dO or Kc/V ring slots (bwd: overlap holds one more)


@gluon.constexpr_function
def _mma_layout(warps, n):
    """wgmma accumulator layout: warps stacked along the rows (row reductions stay inside a warp)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, n, 16])


# ----------------------------------------------------------------------------------------------------------
# PoPE's math: pope_kernel.py's helpers (GPU paths), operation for operation

@gluon.jit
def _softplus(x):
    # log1p(exp(-|x|)) as pope_kernel._softplus: log(u), u = 1 + e rounded, corrected by ((u - 1) - e) / u
    e = gl.exp(-gl.abs(x))
    u = 1.0 + e
    return gl.maximum(x, 0.0) + (gl.log(u) - ((u - 1.0) - e) / u)


@gluon.jit
def _cos_sin(phase):
    # pope_kernel._cos_sin: Cody-Waite reduction by 2*pi (two parts, fma), then sin.approx / cos.approx
    k = gl.floor(phase * 0.15915494309189535 + 0.5)
    r = gl.fma(k, -6.2831854820251465, phase)
    r = gl.fma(k, 1.7484556000744883e-07, r)
    return libdevice.fast_cosf(r), libdevice.fast_sinf(r)


@gluon.jit
def _phases(r0, THETA, DELTA, R: gl.constexpr, D: gl.constexpr, L: gl.constexpr, HAS_DELTA: gl.constexpr):
    """cos, sin ((R, D) float32, layout L) of the phases pos * theta + delta of rows at positions r0.. (queries:
    delta = 0, added as pope_kernel adds its zeros)."""
    pos = (r0 + gl.arange(0, R, layout=gl.SliceLayout(1, L))).to(gl.float32)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, L))
    theta = gl.load(THETA + offs_d)
    if HAS_DELTA:
        delta = gl.load(DELTA + offs_d)
    else:
        delta = gl.zeros([D], gl.float32, layout=gl.SliceLayout(0, L))
    return _cos_sin(gl.expand_dims(pos, 1) * gl.expand_dims(theta, 0) + gl.expand_dims(delta, 0))


@gluon.jit
def _to_cartesian(raw_smem, dst_smem, r0, THETA, DELTA, HAS_DELTA: gl.constexpr):
    """dst_smem (R, 2D) bf16 = [mu cos | mu sin] of the raw (R, D) bf16 tile in raw_smem (_cartesian_tile, then
    the cast), ready for wgmma: stores, proxy fence, then a barrier of this warpgroup."""
    R: gl.constexpr = raw_smem.shape[0]
    D: gl.constexpr = raw_smem.shape[1]
    # 8 contiguous columns a thread (16-byte shared loads and stores). Not the epilogue's mma layout: with that
    # one, the compiler keeps the prologue's shared addresses for the epilogue's reload alive through the loop
    L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    x = raw_smem.load(L).to(gl.float32)
    mu = _softplus(x)
    c, s = _phases(r0, THETA, DELTA, R, D, L, HAS_DELTA)
    xc, xs = (mu * c).to(gl.bfloat16), (mu * s).to(gl.bfloat16)
    # (R, D) x 2 -> (R, 2D) = [xc | xs] (the join's new dimension is a register one: no data moves)
    dst_smem.store(gl.reshape(gl.permute(gl.join(xc, xs), (0, 2, 1)), [R, 2 * D]))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _from_cartesian(g, raw_smem, r0, THETA, DELTA, scale, HAS_DELTA: gl.constexpr):
    """pope_kernel._cartesian_grad: g (R, 2D) float32, the unscaled gradient w.r.t. [mu cos | mu sin], times
    scale -> (gradient w.r.t. the raw rows in raw_smem, gradient w.r.t. their phases), (R, D) float32. mu, cos
    and sin are recomputed here rather than kept through the loop (as pope_kernel does)."""
    R: gl.constexpr = raw_smem.shape[0]
    D: gl.constexpr = raw_smem.shape[1]
    L: gl.constexpr = _mma_layout(4, D)
    gc, gs = gl.split(gl.permute(gl.reshape(g, [R, 2, D]), (0, 2, 1)))
    gc = gl.convert_layout(gc, L) * scale  # (the halves of the 2D-wide mma layout are the D-wide one)
    gs = gl.convert_layout(gs, L) * scale
    c, s = _phases(r0, THETA, DELTA, R, D, L, HAS_DELTA)
    # the two sums first, so that gc, gs, cos and sin die before mu and the sigmoid are made (in pope_kernel's
    # order the epilogue's peak spilled registers)
    d_mu = gc * c + gs * s
    d_ph = gs * c - gc * s
    x = raw_smem.load(L).to(gl.float32)
    return d_mu * (1.0 / (1.0 + gl.exp(-x))), _softplus(x) * d_ph  # (1 / (1 + exp(-x)): tl.sigmoid)


@gluon.jit
def _store_tile(x, smem, desc, row, col):
    """x -> smem -> TMA store at [row, col] (the caller waits with tma.store_wait)."""
    smem.store(x.to(desc.dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(desc, [row, col], smem)


# ----------------------------------------------------------------------------------------------------------
# Shared pieces: a STAGES-deep TMA ring of two tiles per slot, each with its own "ready" barrier;
# ring = (a_smem, b_smem, a_bar, b_bar), src = (a_desc, b_desc, a_row0, b_row0, b_col)

@gluon.jit
def _ring(a_desc, b_desc, STAGES: gl.constexpr):
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    a_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    b_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(a_bar.index(i), count=1)
        mbarrier.init(b_bar.index(i), count=1)
    return a_smem, b_smem, a_bar, b_bar


@gluon.jit
def _barriers(STAGES: gl.constexpr):
    """One barrier per warpgroup for its resident tiles; STAGES "empty" barriers (both consumers release)."""
    res_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(res_bar.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(empty_bar.index(i), count=2)
    return res_bar, empty_bar


@gluon.jit
def _issue(src, ring, j, STAGES: gl.constexpr):
    """TMA loads of streamed block j into slot j % STAGES."""
    a_desc, b_desc, a_row0, b_row0, b_col = src
    a_smem, b_smem, a_bar, b_bar = ring
    BN: gl.constexpr = a_desc.block_type.shape[0]
    s = j % STAGES
    mbarrier.expect(a_bar.index(s), a_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [a_row0 + j * BN, 0], a_bar.index(s), a_smem.index(s))
    mbarrier.expect(b_bar.index(s), b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(b_desc, [b_row0 + j * BN, b_col], b_bar.index(s), b_smem.index(s))


@gluon.jit
def _producer(a_desc, b_desc, a_smem, b_smem, res_bar, row0, col, src, ring, empty_bar, n, STAGES: gl.constexpr):
    """The producer warp: each consumer's resident raw tiles (a: raw q or k, b: V or dO or nothing), both of the
    (B*T, H*D) view at rows row0 + WG * HALF, column col; then the n streamed blocks, each once both consumers
    released its slot (a fresh barrier passes phase 1 at once)."""
    for wg in gl.static_range(2):
        if b_desc is None:
            mbarrier.expect(res_bar.index(wg), a_desc.block_type.nbytes)
        else:
            mbarrier.expect(res_bar.index(wg), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(b_desc, [row0 + wg * HALF, col], res_bar.index(wg), b_smem.index(wg))
        tma.async_copy_global_to_shared(a_desc, [row0 + wg * HALF, col], res_bar.index(wg), a_smem.index(wg))
    for j in range(n):
        mbarrier.wait(empty_bar.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
        _issue(src, ring, j, STAGES)


# ----------------------------------------------------------------------------------------------------------
# Forward (gluon_fwd.py's ws): grid (B*H, T/BLOCK), batch*head fastest, heaviest (last) query blocks first

@gluon.jit
def _fwd_program(T, H):
    bh = gl.program_id(0)
    pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
    return bh, bh // H, bh % H, pid_m * BLOCK, pid_m + 1  # (.., first query row, key blocks of BLOCK)


@gluon.jit
def _softmax(s, m_i, l_i, offs_m, n0, qk_scale, MASK: gl.constexpr):
    """Online softmax of one score block (float32, unscaled); the scale goes into the row max and into the
    exponent. Only the diagonal block is masked; every row sees key 0, so m stays finite."""
    if MASK:
        offs_n = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        s = gl.where(gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _rescale(acc, alpha, o_layout: gl.constexpr):
    return acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)


@gluon.jit
def _fwd_step(j, p, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, ring, empty_bar, STAGES: gl.constexpr,
              MASK: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    """FA3's overlap: QK(j) and PV(j-1) (p = P(j-1)) in flight, softmax(j) waits for QK(j) only."""
    k_smem, v_smem, k_bar, v_bar = ring
    s, prev = j % STAGES, (j - 1) % STAGES
    mbarrier.wait(k_bar.index(s), (j // STAGES) & 1)
    mbarrier.wait(v_bar.index(prev), ((j - 1) // STAGES) & 1)
    s_tok = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), s0, use_acc=False, is_async=True)
    acc_tok = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
    sc = warpgroup_mma_wait(1, deps=(s_tok, ))  # wgmma groups retire in order: QK(j) is done
    p_new, m_i, l_i, alpha = _softmax(sc, m_i, l_i, offs_m, j * sc.shape[1], qk_scale, MASK)
    acc, p = warpgroup_mma_wait(0, deps=(acc_tok, p))  # (p's registers are read by the PV wgmma until here)
    acc = _rescale(acc, alpha, o_layout)
    mbarrier.arrive(empty_bar.index(prev), count=1)  # slot j-1 released by this warpgroup
    return gl.convert_layout(p_new.to(gl.bfloat16), p_layout), acc, m_i, l_i


@gluon.jit
def _fwd_consumer(WG: gl.constexpr, io_smem, q_smem, q_bar, ring, empty_bar, o_desc, LSE, THETA, qk_scale, T, H,
                  STAGES: gl.constexpr):
    BN: gl.constexpr = ring[0].shape[1]
    D: gl.constexpr = o_desc.block_type.shape[1]
    s_layout: gl.constexpr = _mma_layout(4, BN)
    o_layout: gl.constexpr = _mma_layout(4, D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    bh, b, h, m0, n = _fwd_program(T, H)
    r0 = m0 + WG * HALF
    rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    offs_m = r0 + gl.arange(0, HALF, layout=rows)
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=rows)
    l_i = gl.zeros([HALF], gl.float32, layout=rows)
    acc = gl.zeros([HALF, D], gl.float32, layout=o_layout)
    s0 = gl.zeros([HALF, BN], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar.index(WG), 0)
    _to_cartesian(io_smem.index(WG), q_smem.index(WG), r0, THETA, THETA, False)  # queries: no delta
    k_smem, v_smem, k_bar, v_bar = ring
    # key block 0 alone, masked (exact for any block; the diagonal when n == 1)
    mbarrier.wait(k_bar.index(0), 0)
    sc = warpgroup_mma(q_smem.index(WG), k_smem.index(0).permute((1, 0)), s0, use_acc=False)
    p, m_i, l_i, alpha = _softmax(sc, m_i, l_i, offs_m, 0, qk_scale, True)
    p = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    for j in range(1, n - 1):  # below the diagonal: no mask
        p, acc, m_i, l_i = _fwd_step(j, p, acc, m_i, l_i, offs_m, qk_scale, q_smem.index(WG), s0, ring, empty_bar,
                                     STAGES, False, o_layout, p_layout)
    if n > 1:  # the diagonal block
        p, acc, m_i, l_i = _fwd_step(n - 1, p, acc, m_i, l_i, offs_m, qk_scale, q_smem.index(WG), s0, ring,
                                     empty_bar, STAGES, True, o_layout, p_layout)
    last = (n - 1) % STAGES
    mbarrier.wait(v_bar.index(last), ((n - 1) // STAGES) & 1)
    acc = warpgroup_mma(p, v_smem.index(last), acc)
    # O = acc / l through the raw-q tile (same shape and layout; read in the prologue) and a TMA store into the
    # (B, T, H, D) memory; LSE = m + log2(l)
    acc = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    _store_tile(acc, io_smem.index(WG), o_desc, b * T + r0, h * D)
    gl.store(LSE + bh * T + offs_m, m_i + gl.log2(l_i))
    tma.store_wait(0)


@gluon.jit
def _fwd_kernel(q_desc, k_desc, v_desc, o_desc, LSE, THETA, qk_scale, T, H, STAGES: gl.constexpr,
                num_warps: gl.constexpr):
    """q_desc, o_desc: HALF x D tiles of the (B*T, H*D) raw q, out; k_desc: BLOCK x 2D of Kc (B*H*T, 2D);
    v_desc: BLOCK x D of V (B*T, H*D)."""
    gl.static_assert(num_warps == 4)  # the default partition is consumer warpgroup 0
    D: gl.constexpr = v_desc.block_type.shape[1]
    bh, b, h, m0, n = _fwd_program(T, H)
    io_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, 2 * D], gl.bfloat16)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, HALF, 2 * D], q_layout)
    q_bar, empty_bar = _barriers(STAGES)
    ring = _ring(k_desc, v_desc, STAGES)
    # Kc rows of this head in the (B*H*T, 2D) view; V rows in the (B*T, H*D) view at column h*D
    src = (k_desc, v_desc, bh * T, b * T, h * D)
    gl.warp_specialize([(_fwd_consumer, (WG0, io_smem, q_smem, q_bar, ring, empty_bar, o_desc, LSE, THETA, qk_scale,
                                         T, H, STAGES)),
                        (_fwd_consumer, (WG1, io_smem, q_smem, q_bar, ring, empty_bar, o_desc, LSE, THETA, qk_scale,
                                         T, H, STAGES)),
                        (_producer, (q_desc, None, io_smem, None, q_bar, b * T + m0, h * D, src, ring, empty_bar, n,
                                     STAGES))], [4, 1], [CONSUMER_REGS, 24])


# ----------------------------------------------------------------------------------------------------------
# dK / dV (gluon_bwd.py's ws_ov): grid (B*H, T/BLOCK), key block 0 (seen by every query) first. Resident:
# 64 key rows and their V per warpgroup; streamed: query blocks of STEP rows (Qc, dO) from the block's first key.
# ctx = (LSE, DI, bh * T, first query row, qk_scale)

@gluon.jit
def _dkdv_program(T, H):
    bh = gl.program_id(0)
    n0 = gl.program_id(1) * BLOCK
    return bh, bh // H, bh % H, n0, (T - n0) // STEP  # queries n0.. see these keys: (T - n0) / STEP blocks


@gluon.jit
def _dkdv_step(j, dk, dv, dst_prev, k_smem, v_smem, ring, empty_bar, ctx, offs_n, s0, STAGES: gl.constexpr,
               MASK: gl.constexpr, PREV: gl.constexpr, pt_layout: gl.constexpr, dst_layout: gl.constexpr):
    """Query block j: S^T, dP^T, P^T, dS^T, dV += P^T dO; dKc += dS^T(j-1) Qc(j-1) (PREV) is queued behind this
    block's S^T and dP^T, so it runs while P^T(j) is made; slot j-1 is released at the end. Returns dS^T(j)."""
    q_smem, do_smem, q_bar, do_bar = ring
    LSE, DI, row0, m_first, qk_scale = ctx
    NP: gl.constexpr = 1 if PREV else 0  # wgmma groups retire in order: how many were issued after dP^T
    s, ph = j % STAGES, (j // STAGES) & 1
    offs_m = m_first + j * STEP + gl.arange(0, STEP, layout=gl.SliceLayout(0, s0.type.layout))
    lse = gl.expand_dims(gl.load(LSE + row0 + offs_m), 0)  # issued before the waits: latency under the wgmmas
    di = gl.expand_dims(gl.load(DI + row0 + offs_m), 0)
    mbarrier.wait(q_bar.index(s), ph)
    st_tok = warpgroup_mma(k_smem, q_smem.index(s).permute((1, 0)), s0, use_acc=False, is_async=True)
    mbarrier.wait(do_bar.index(s), ph)
    dpt_tok = warpgroup_mma(v_smem, do_smem.index(s).permute((1, 0)), s0, use_acc=False, is_async=True)
    if PREV:
        dk_tok = warpgroup_mma(dst_prev, q_smem.index((j - 1) % STAGES), dk, is_async=True)
    st = warpgroup_mma_wait(1 + NP, deps=(st_tok, ))  # S^T done; dP^T (and dKc(j-1)) may still run
    pt = gl.exp2(st * qk_scale - lse)
    if MASK:  # key s visible to query t iff s <= t
        pt = gl.where(gl.expand_dims(offs_n, 1) <= gl.expand_dims(offs_m, 0), pt, 0.0)
    ptb = gl.convert_layout(pt.to(gl.bfloat16), pt_layout)
    dv_tok = warpgroup_mma(ptb, do_smem.index(s), dv, is_async=True)  # runs while dS^T is made
    dpt = warpgroup_mma_wait(1 + NP, deps=(dpt_tok, ))
    dstb = gl.convert_layout((pt * (dpt - di)).to(gl.bfloat16), dst_layout)
    if PREV:  # (the A operands' registers stay alive, as deps, until their wgmmas retire)
        dv, dk, ptb, dst_prev = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, ptb, dst_prev))
        mbarrier.arrive(empty_bar.index((j - 1) % STAGES), count=1)
    else:
        dv, ptb = warpgroup_mma_wait(0, deps=(dv_tok, ptb))
    return dk, dv, dstb


@gluon.jit
def _dkdv_consumer(WG: gl.constexpr, kr_smem, k_smem, v_smem, res_bar, ring, empty_bar, kc_desc, dk_desc, dv_desc,
                   DDP, LSE, DI, THETA, DELTA, sm_scale, qk_scale, T, H, STAGES: gl.constexpr):
    bh, b, h, n0, n = _dkdv_program(T, H)
    D: gl.constexpr = v_smem.shape[2]
    D2: gl.constexpr = k_smem.shape[2]
    r0 = n0 + WG * HALF
    kr_smem, k_smem, v_smem = kr_smem.index(WG), k_smem.index(WG), v_smem.index(WG)
    s_layout: gl.constexpr = _mma_layout(4, STEP)
    dv_layout: gl.constexpr = _mma_layout(4, D)
    dk_layout: gl.constexpr = _mma_layout(4, D2)
    pt_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv_layout, k_width=2)
    dst_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk_layout, k_width=2)
    mbarrier.wait(res_bar.index(WG), 0)
    # the Cartesian keys (with delta), in shared memory for the wgmmas (and for KC: see the epilogue)
    _to_cartesian(kr_smem, k_smem, r0, THETA, DELTA + h * D, True)
    ctx = (LSE, DI, bh * T, n0, qk_scale)
    offs_n = r0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    s0 = gl.zeros([HALF, STEP], gl.float32, layout=s_layout)
    dk = gl.zeros([HALF, D2], gl.float32, layout=dk_layout)
    dv = gl.zeros([HALF, D], gl.float32, layout=dv_layout)
    dst = gl.zeros([HALF, STEP], gl.bfloat16, layout=dst_layout)
    gl.static_assert(NDIAG == 2)  # query blocks 0 and 1 cross the diagonal: masked
    dk, dv, dst = _dkdv_step(0, dk, dv, dst, k_smem, v_smem, ring, empty_bar, ctx, offs_n, s0, STAGES, True, False,
                             pt_layout, dst_layout)
    dk, dv, dst = _dkdv_step(1, dk, dv, dst, k_smem, v_smem, ring, empty_bar, ctx, offs_n, s0, STAGES, True, True,
                             pt_layout, dst_layout)
    for j in range(NDIAG, n):
        dk, dv, dst = _dkdv_step(j, dk, dv, dst, k_smem, v_smem, ring, empty_bar, ctx, offs_n, s0, STAGES, False,
                                 True, pt_layout, dst_layout)
    dk = warpgroup_mma(dst, ring[0].index((n - 1) % STAGES), dk)  # the last block's dKc
    # (b, h) again from bh * T, which the loop keeps: kept through the loop themselves they spill (registers)
    bh = ctx[2] // T
    b = bh // H
    h = bh - b * H
    # KC for the dq kernel, from the Cartesian tile (unchanged since the prologue)
    tma.async_copy_shared_to_global(kc_desc, [ctx[2] + r0, 0], k_smem)
    # dV first (through V's own tile: this warpgroup's wgmmas on it have retired), freeing its registers
    _store_tile(dv, v_smem, dv_desc, b * T + r0, h * D)
    # the chain rule back to raw k and the phase (= delta's gradient); dk through the raw-k tile once every
    # thread has read it; one row of ddelta partials per (b*h, 64-key block), summed by the host
    dkr, dphase = _from_cartesian(dk, kr_smem, r0, THETA, DELTA + h * D, sm_scale, True)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, dv_layout))
    gl.store(DDP + ((ctx[2] + r0) // HALF) * D + offs_d, gl.sum(dphase, 0))
    gl.thread_barrier()
    _store_tile(dkr, kr_smem, dk_desc, b * T + r0, h * D)
    tma.store_wait(0)  # (KC, dV and dk)


@gluon.jit
def _dkdv_kernel(k_desc, v_desc, q_desc, do_desc, kc_desc, dk_desc, dv_desc, DDP, LSE, DI, THETA, DELTA, sm_scale,
                 qk_scale, T, H, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """k_desc, v_desc, do_desc, dk_desc, dv_desc: 64 x D tiles of the (B*T, H*D) raw k, V, dO, dk, dV; q_desc,
    kc_desc: 64 x 2D of Qc (pre-pass) and KC (written here), (B*H*T, 2D). DDP (B*H, T/64, D) float32."""
    gl.static_assert(num_warps == 4)
    D: gl.constexpr = v_desc.block_type.shape[1]
    bh, b, h, n0, n = _dkdv_program(T, H)
    kr_smem = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    k_smem = gl.allocate_shared_memory(kc_desc.dtype, [2] + kc_desc.block_type.shape, kc_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    res_bar, empty_bar = _barriers(STAGES)
    ring = _ring(q_desc, do_desc, STAGES)
    # Qc rows in the (B*H*T, 2D) view, dO rows in the (B*T, H*D) view at column h*D; query block j: n0 + j*STEP
    src = (q_desc, do_desc, bh * T + n0, b * T + n0, h * D)
    gl.warp_specialize([(_dkdv_consumer, (WG0, kr_smem, k_smem, v_smem, res_bar, ring, empty_bar, kc_desc, dk_desc,
                                          dv_desc, DDP, LSE, DI, THETA, DELTA, sm_scale, qk_scale, T, H, STAGES)),
                        (_dkdv_consumer, (WG1, kr_smem, k_smem, v_smem, res_bar, ring, empty_bar, kc_desc, dk_desc,
                                          dv_desc, DDP, LSE, DI, THETA, DELTA, sm_scale, qk_scale, T, H, STAGES)),
                        (_producer, (k_desc, v_desc, kr_smem, v_smem, res_bar, b * T + n0, h * D, src, ring,
                                     empty_bar, n, STAGES))], [4, 1], [CONSUMER_REGS, 24])


# ----------------------------------------------------------------------------------------------------------
# dQ (gluon_bwd.py's ws_ov): grid (B*H, T/BLOCK), the last (heaviest) query blocks first. Resident: 64 query
# rows (raw q -> Qc) and their dO per warpgroup; streamed: key blocks of STEP rows (Kc from dk/dv, V) from 0.

@gluon.jit
def _dq_program(T, H):
    bh = gl.program_id(0)
    m0 = (gl.num_programs(1) - 1 - gl.program_id(1)) * BLOCK
    return bh, bh // H, bh % H, m0, (m0 + BLOCK) // STEP  # key blocks 0 .. m0 + BLOCK - 1


@gluon.jit
def _dq_step(j, dq, ds_prev, q_smem, do_smem, ring, empty_bar, qk_scale, offs_m, lse, di, s0,
             STAGES: gl.constexpr, MASK: gl.constexpr, PREV: gl.constexpr, ds_layout: gl.constexpr):
    """Key block j: S, dP, P, dS; dQc += dS(j-1) Kc(j-1) (PREV) runs behind this block's S and dP, and slot j-1
    is released at the end. Returns dS(j)."""
    k_smem, v_smem, k_bar, v_bar = ring
    NP: gl.constexpr = 1 if PREV else 0
    s, ph = j % STAGES, (j // STAGES) & 1
    mbarrier.wait(k_bar.index(s), ph)
    s_tok = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), s0, use_acc=False, is_async=True)
    mbarrier.wait(v_bar.index(s), ph)
    dp_tok = warpgroup_mma(do_smem, v_smem.index(s).permute((1, 0)), s0, use_acc=False, is_async=True)
    if PREV:
        dq_tok = warpgroup_mma(ds_prev, k_smem.index((j - 1) % STAGES), dq, is_async=True)
    sc = warpgroup_mma_wait(1 + NP, deps=(s_tok, ))  # S done; dP (and dQc(j-1)) may still run
    p = gl.exp2(sc * qk_scale - lse)
    if MASK:
        offs_n = j * STEP + gl.arange(0, STEP, layout=gl.SliceLayout(0, s0.type.layout))
        p = gl.where(gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1), p, 0.0)
    dp = warpgroup_mma_wait(NP, deps=(dp_tok, ))
    dsb = gl.convert_layout((p * (dp - di)).to(gl.bfloat16), ds_layout)
    if PREV:
        dq, ds_prev = warpgroup_mma_wait(0, deps=(dq_tok, ds_prev))
        mbarrier.arrive(empty_bar.index((j - 1) % STAGES), count=1)
    return dq, dsb


@gluon.jit
def _dq_consumer(WG: gl.constexpr, qr_smem, q_smem, do_smem, res_bar, ring, empty_bar, dq_desc, LSE, DI, THETA,
                 sm_scale, qk_scale, T, H, STAGES: gl.constexpr):
    bh, b, h, m0, n = _dq_program(T, H)
    D: gl.constexpr = do_smem.shape[2]
    D2: gl.constexpr = q_smem.shape[2]
    r0 = m0 + WG * HALF
    qr_smem, q_smem, do_smem = qr_smem.index(WG), q_smem.index(WG), do_smem.index(WG)
    s_layout: gl.constexpr = _mma_layout(4, STEP)
    dq_layout: gl.constexpr = _mma_layout(4, D2)
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    offs_m = r0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    lse = gl.expand_dims(gl.load(LSE + bh * T + offs_m), 1)
    di = gl.expand_dims(gl.load(DI + bh * T + offs_m), 1)
    s0 = gl.zeros([HALF, STEP], gl.float32, layout=s_layout)
    dq = gl.zeros([HALF, D2], gl.float32, layout=dq_layout)
    ds = gl.zeros([HALF, STEP], gl.bfloat16, layout=ds_layout)
    mbarrier.wait(res_bar.index(WG), 0)
    _to_cartesian(qr_smem, q_smem, r0, THETA, THETA, False)  # queries: no delta
    # both warpgroups take all n key blocks (warpgroup 0's last is entirely masked: P = 0, adds nothing);
    # key block 0 alone (no previous block), masked: exact for any block, a diagonal one when n == NDIAG
    dq, ds = _dq_step(0, dq, ds, q_smem, do_smem, ring, empty_bar, qk_scale, offs_m, lse, di, s0, STAGES, True,
                      False, ds_layout)
    for j in range(1, n - NDIAG):
        dq, ds = _dq_step(j, dq, ds, q_smem, do_smem, ring, empty_bar, qk_scale, offs_m, lse, di, s0, STAGES, False,
                          True, ds_layout)
    for j in range(gl.maximum(n - NDIAG, 1), n):  # the key blocks that cross the diagonal
        dq, ds = _dq_step(j, dq, ds, q_smem, do_smem, ring, empty_bar, qk_scale, offs_m, lse, di, s0, STAGES, True,
                          True, ds_layout)
    dq = warpgroup_mma(ds, ring[0].index((n - 1) % STAGES), dq)
    # the chain rule back to raw q (its phase gradient is not needed: queries have no delta); dq through the
    # raw-q tile once every thread has read it
    dqr, _ = _from_cartesian(dq, qr_smem, r0, THETA, THETA, sm_scale, False)
    gl.thread_barrier()
    _store_tile(dqr, qr_smem, dq_desc, b * T + r0, h * D)
    tma.store_wait(0)


@gluon.jit
def _dq_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, LSE, DI, THETA, sm_scale, qk_scale, T, H,
               STAGES: gl.constexpr, num_warps: gl.constexpr):
    """q_desc, do_desc, v_desc, dq_desc: 64 x D tiles of the (B*T, H*D) raw q, dO, V, dq; k_desc: 64 x 2D of KC
    (B*H*T, 2D), written by the dk/dv kernel."""
    gl.static_assert(num_warps == 4)
    D: gl.constexpr = v_desc.block_type.shape[1]
    bh, b, h, m0, n = _dq_program(T, H)
    qr_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    q_smem = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    res_bar, empty_bar = _barriers(STAGES)
    ring = _ring(k_desc, v_desc, STAGES)
    src = (k_desc, v_desc, bh * T, b * T, h * D)
    gl.warp_specialize([(_dq_consumer, (WG0, qr_smem, q_smem, do_smem, res_bar, ring, empty_bar, dq_desc, LSE, DI,
                                        THETA, sm_scale, qk_scale, T, H, STAGES)),
                        (_dq_consumer, (WG1, qr_smem, q_smem, do_smem, res_bar, ring, empty_bar, dq_desc, LSE, DI,
                                        THETA, sm_scale, qk_scale, T, H, STAGES)),
                        (_producer, (q_desc, do_desc, qr_smem, do_smem, res_bar, b * T + m0, h * D, src, ring,
                                     empty_bar, n, STAGES))], [4, 1], [CONSUMER_REGS, 24])


# ----------------------------------------------------------------------------------------------------------
# Host side

def _rows(x, output=False):
    """The (B*T, H*D) 2D view of a (B, H, T, D) tensor whose (B, T, H, D) form has that view (model.py's qkv
    split and pope_kernel._bthd's outputs do), else (inputs only) of a contiguous copy."""
    B, H, T, D = x.shape
    y = x.transpose(1, 2)
    ok = y.stride(3) == 1 and y.stride(2) == D and y.stride(0) == T * y.stride(1) and y.stride(1) % 8 == 0
    ok = ok and y.data_ptr() % 16 == 0
    assert ok or not output, "outputs must be laid out as pope_kernel._bthd makes them"
    return (y if ok else y.contiguous()).reshape(B * T, H * D)


def _desc(x2, rows, cols):
    return TensorDescriptor.from_tensor(x2, [rows, cols], gl.NVMMASharedLayout.get_default_for([rows, cols],
                                                                                                gl.bfloat16))


def _check(q, theta):
    B, H, T, D = q.shape
    assert q.dtype == torch.bfloat16 and D == 64 and T % BLOCK.value == 0, "bf16, D = 64, T % 128 == 0 only"
    assert theta.dtype == torch.float32 and theta.is_contiguous()
    return B, H, T, D


def _fwd_args(q, kc, v, out, lse, theta, sm_scale):
    B, H, T, D = q.shape
    return (_desc(_rows(q), HALF.value, D), _desc(kc.reshape(B * H * T, 2 * D), BLOCK.value, 2 * D),
            _desc(_rows(v), BLOCK.value, D), _desc(_rows(out, True), HALF.value, D), lse, theta, sm_scale * LOG2E, T, H)


def _dkdv_args(k, v, qc, do, kc, dk, dv, ddp, lse, di, theta, delta, sm_scale):
    B, H, T, D = k.shape
    c = lambda x: _desc(x.reshape(B * H * T, 2 * D), STEP.value, 2 * D)  # noqa: E731 (HALF == STEP rows)
    r = lambda x, output=False: _desc(_rows(x, output), STEP.value, D)  # noqa: E731
    return (r(k), r(v), c(qc), r(do), c(kc), r(dk, True), r(dv, True), ddp, lse, di, theta, delta, sm_scale,
            sm_scale * LOG2E, T, H)


def _dq_args(q, do, kc, v, dq, lse, di, theta, sm_scale):
    B, H, T, D = q.shape
    r = lambda x, output=False: _desc(_rows(x, output), STEP.value, D)  # noqa: E731
    return (r(q), r(do), _desc(kc.reshape(B * H * T, 2 * D), STEP.value, 2 * D), r(v), r(dq, True), lse, di, theta,
            sm_scale, sm_scale * LOG2E, T, H)


_OPTS = dict(num_warps=4, maxnreg=MAXNREG)


def fwd(q, kc, v, theta, sm_scale):
    """pope_kernel._pope_fwd's launch (causal, q_offset 0): out (B, H, T, D) laid out (B, T, H, D), lse (B, H,
    T) float32 (log2 units), from raw q, the key pre-pass's kc (B, H, T, 2D) and v."""
    import pope_kernel
    B, H, T, D = _check(q, theta)
    assert kc.shape == (B, H, T, 2 * D) and kc.is_contiguous() and kc.dtype == v.dtype == q.dtype
    out, lse = pope_kernel._bthd(q), torch.empty(B, H, T, device=q.device, dtype=torch.float32)
    with pope_kernel._on_device(q):
        _fwd_kernel[(B * H, T // BLOCK.value)](*_fwd_args(q, kc, v, out, lse, theta, sm_scale), STAGES=FWD_STAGES,
                                                **_OPTS)
    return out, lse


def bwd(do, q, k, v, delta, theta, out, lse, sm_scale):
    """pope_kernel._bwd (causal, q_offset 0): dq, dk, dv (as q, k, v, laid out (B, T, H, D)) and ddelta (H, D)
    float32. The query pre-pass (Qc and rowsum(dO*O)) is pope_kernel's; dk/dv writes KC for dq."""
    import pope_kernel
    B, H, T, D = _check(q, theta)
    assert k.shape == v.shape == do.shape == q.shape and k.dtype == v.dtype == do.dtype == q.dtype
    assert delta.shape == (H, D) and delta.dtype == torch.float32 and delta.is_contiguous()
    assert lse.shape == (B, H, T) and lse.dtype == torch.float32 and lse.is_contiguous()
    grid = (B * H, T // BLOCK.value)
    with pope_kernel._on_device(q):
        dk, dv = pope_kernel._bthd(k), pope_kernel._bthd(v)
        ddp = torch.empty(B * H, T // HALF.value, D, device=q.device, dtype=torch.float32)  # every row written
        qc, di = pope_kernel._cartesian(q, theta, None, 0, o=out, do=do)
        kc = torch.empty(B, H, T, 2 * D, device=q.device, dtype=k.dtype)
        _dkdv_kernel[grid](*_dkdv_args(k, v, qc, do, kc, dk, dv, ddp, lse, di, theta, delta, sm_scale),
                           STAGES=BWD_STAGES, **_OPTS)
        del qc  # (freed before dq is allocated, as pope_kernel._bwd)
        dq = pope_kernel._bthd(q)
        _dq_kernel[grid](*_dq_args(q, do, kc, v, dq, lse, di, theta, sm_scale), STAGES=BWD_STAGES, **_OPTS)
    # a fixed-order reduction over (batch, 64-key block): bitwise the same every run
    return dq, dk, dv, ddp.view(B, H, T // HALF.value, D).sum((0, 2))


def takes(q, k, causal, q_offset):
    """The calls these kernels serve (pope_kernel's own serve every other): CUDA, bf16, D = 64, causal, no
    query offset, Tq = Tk, T a multiple of BLOCK."""
    return (q.is_cuda and q.dtype == k.dtype == torch.bfloat16 and q.size(-1) == 64 and causal and q_offset == 0
            and q.shape == k.shape and q.size(2) % BLOCK.value == 0)


def pope_fwd(q, k, v, delta, theta, causal, sm_scale, q_offset, tune):
    """pope_kernel._fwd's signature: the key pre-pass, then fwd."""
    import pope_kernel
    assert takes(q, k, causal, q_offset), "see takes()"
    with pope_kernel._on_device(q):
        kc = pope_kernel._cartesian(k, theta, delta, 0)
    return fwd(q, kc, v, theta, sm_scale)


def pope_bwd(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset):
    """pope_kernel._bwd's signature."""
    assert takes(q, k, causal, q_offset), "see takes()"
    return bwd(do, q, k, v, delta, theta, out, lse, sm_scale)


# ----------------------------------------------------------------------------------------------------------
# Checks

KERNELS = {  # name: (kernel, arguments from (q, k, v, do, kc, qc, out, dq, dk, dv, ddp, lse, di, theta, delta))
    "fwd": (_fwd_kernel, lambda t: _fwd_args(t["q"], t["kc"], t["v"], t["out"], t["lse"], t["theta"], 0.125),
            FWD_STAGES),
    "dkdv": (_dkdv_kernel, lambda t: _dkdv_args(t["k"], t["v"], t["qc"], t["do"], t["kc"], t["dk"], t["dv"], t["ddp"],
                                                t["lse"], t["di"], t["theta"], t["delta"], 0.125), BWD_STAGES),
    "dq": (_dq_kernel, lambda t: _dq_args(t["q"], t["do"], t["kc"], t["v"], t["dq"], t["lse"], t["di"], t["theta"],
                                          0.125), BWD_STAGES),
}


def compile_only(names):
    """Compile each kernel for sm_90 without a GPU (descriptors over CPU tensors give the signature); print shared
    memory, registers / spills (cuobjdump) and PTX counts. GLUON_POPE_DUMP=dir writes the ttgir and PTX."""
    import re
    import subprocess
    import tempfile
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type
    B, H, T, D = 1, 3, 256, 64  # (H = 3: a row tile is D of H*D wide)
    bthd = lambda: torch.empty(B, T, H, D, dtype=torch.bfloat16).transpose(1, 2)  # noqa: E731
    t = dict(q=bthd(), k=bthd(), v=bthd(), do=bthd(), out=bthd(), dq=bthd(), dk=bthd(), dv=bthd(),
             kc=torch.empty(B, H, T, 2 * D, dtype=torch.bfloat16), qc=torch.empty(B, H, T, 2 * D, dtype=torch.bfloat16),
             ddp=torch.empty(B * H, T // 64, D), lse=torch.empty(B, H, T), di=torch.empty(B, H, T),
             theta=torch.empty(D), delta=torch.empty(H, D))
    ok = True
    for name in names:
        kernel, make_args, stages = KERNELS[name]
        try:
            args = make_args(t)
            sig = {k: mangle_type(a) for k, a in zip(kernel.arg_names, args)}
            cst = dict(STAGES=stages, num_warps=_OPTS["num_warps"])
            sig.update({k: "constexpr" for k in cst})
            attrs = {(kernel.arg_names.index(k), ): [["tt.divisibility", 16]]
                     for k in kernel.arg_names if k in ("DDP", "LSE", "DI", "THETA", "DELTA", "T")}
            ck = triton.compile(GluonASTSource(kernel, sig, cst, attrs), target=GPUTarget("cuda", 90, 32),
                                options=_OPTS)
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(ck.asm["cubin"])
                f.flush()
                out = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                                     capture_output=True, text=True).stdout
            usage = " ".join(re.findall(r"(REG:\d+|STACK:\d+|LOCAL:\d+)", out))
            ptx = ck.asm["ptx"]
            cnt = {k: len(re.findall(p, ptx)) for k, p in (
                ("tma-loads", r"cp\.async\.bulk\.tensor\.\dd\.shared"),
                ("tma-stores", r"cp\.async\.bulk\.tensor\.\dd\.global"), ("wgmma", r"wgmma\.mma_async"),
                ("wgmma-waits", r"wgmma\.wait_group"), ("atomics", r"\b(atom|red)\."),
                ("cos.approx", r"cos\.approx"), ("sin.approx", r"sin\.approx"), ("setmaxnreg", r"setmaxnreg"),
                ("local", r"\.local"))}
            print(f"{name:5s} OK   shared={ck.metadata.shared} B  {usage}  "
                  + " ".join(f"{k}={c}" for k, c in cnt.items()))
            if os.environ.get("GLUON_POPE_DUMP"):
                for ext in ("ttgir", "ptx"):
                    with open(os.path.join(os.environ["GLUON_POPE_DUMP"], f"{name}.{ext}"), "w") as f:
                        f.write(ck.asm[ext])
        except Exception as e:  # noqa: BLE001
            ok = False
            print(f"{name:5s} FAIL {type(e).__name__}: {str(e)[-2500:]}\n  cause: {e.__cause__!r}")
    return ok


def reference64(q, k, v, delta, do):
    """float64 through model.pope_attention_torch with autograd, a head at a time (memory): out, lse (log2
    units, from model.py's Cartesian q and k), dq, dk, dv, ddelta. theta is model.py's float64 one: the kernels
    round it to float32 (as model.py's kernel path does), which at 16k moves phases by ~1e-3 rad."""
    import model
    B, H, T, D = q.shape
    theta = model.pope_frequencies(D, device=q.device, dtype=torch.float64)
    pos = torch.arange(T, device=q.device)
    res = [[] for _ in range(6)]
    for h in range(H):
        qh, kh, vh = (x[:, h:h + 1].double().requires_grad_() for x in (q, k, v))
        dh = delta[h:h + 1].double().requires_grad_()
        o = model.pope_attention_torch(qh, kh, vh, dh, causal=True)
        o.backward(do[:, h:h + 1].double())
        with torch.no_grad():
            qc = model.pope_cartesian(qh, model.pope_cos_sin(pos, theta))
            kc = model.pope_cartesian(kh, model.pope_cos_sin(pos, theta, dh))
            sc = (qc @ kc.transpose(-1, -2)) * D**-0.5
            sc.masked_fill_(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            lse = torch.logsumexp(sc, -1) * LOG2E
            del qc, kc, sc
        for r, x in zip(res, (o.detach(), lse, qh.grad, kh.grad, vh.grad, dh.grad)):
            r.append(x)
        del o
    return [torch.cat(r, 0 if i == 5 else 1) for i, r in enumerate(res)]


def _swapped(fn):
    """fn() with pope_kernel's host functions replaced by this file's (the one-for-one swap: the custom ops
    look _fwd / _bwd up in pope_kernel's globals at each call)."""
    import pope_kernel
    saved = pope_kernel._fwd, pope_kernel._bwd
    pope_kernel._fwd, pope_kernel._bwd = pope_fwd, pope_bwd
    try:
        return fn()
    finally:
        pope_kernel._fwd, pope_kernel._bwd = saved


def main():
    import bench  # (its header: commit, dirty flag, GPU, versions, date, command)
    import model
    import pope_kernel
    bench.header()
    print("# (Python errors are caught per part; a device fault poisons the context for every later part, and a "
          "hang is not caught: run under `timeout`)")
    D = 64
    sm_scale = D**-0.5
    names = ("out", "lse", "dq", "dk", "dv", "ddelta")
    for B, H, T in [(8, 12, 1024), (2, 12, 4096), (1, 12, 16384)]:
        g = torch.Generator().manual_seed(T)
        # model.py's layouts: q, k, v (B, H, T, D) views of the qkv projection (B, T, 3, H, D); dO of (B, T, H, D)
        qkv = torch.randn(B, T, 3, H, D, generator=g).to(torch.bfloat16).cuda()
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        do = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)
        delta = (-2 * math.pi * torch.rand(H, D, generator=g)).cuda()  # model.pope_delta's range
        theta = model.pope_frequencies(D, device="cuda")
        print(f"\n(B, H, T, D) = ({B}, {H}, {T}, {D})")
        got = {}
        for name, f_fwd, f_bwd in (("gluon", pope_fwd, pope_bwd), ("triton", pope_kernel._fwd, pope_kernel._bwd)):
            try:
                out, lse = f_fwd(q, k, v, delta, theta, True, sm_scale, 0, True)
                grads = f_bwd(do, q, k, v, delta, theta, out, lse, True, sm_scale, 0)
                out2, lse2 = f_fwd(q, k, v, delta, theta, True, sm_scale, 0, True)
                grads2 = f_bwd(do, q, k, v, delta, theta, out2, lse2, True, sm_scale, 0)
                same = [torch.equal(a, b) for a, b in zip((out, lse, *grads), (out2, lse2, *grads2))]
                torch.cuda.synchronize()
                got[name] = (out, lse, *grads)
                print(f"  {name:6s} bitwise rerun: " + " ".join(f"{n}={'yes' if s else 'NO'}"
                                                             for n, s in zip(names, same)))
            except Exception as e:  # noqa: BLE001
                print(f"  {name:6s} FAILED {type(e).__name__}: {str(e)[-1500:]}")
        try:
            got["f64"] = reference64(q, k, v, delta, do)
        except Exception as e:  # noqa: BLE001
            print(f"  float64 reference FAILED {type(e).__name__}: {str(e)[-1500:]}")
        for a, b in (("gluon", "f64"), ("triton", "f64"), ("gluon", "triton")):
            if a in got and b in got:
                errs = []
                for n, x, r in zip(names, got[a], got[b]):
                    e = (x.double() - r.double()).abs().max().item()
                    errs.append(f"{n} {e:.1e}/{e / max(r.abs().max().item(), 1e-30):.1e}")
                print(f"  {a} vs {b} (max-abs/rel): " + "  ".join(errs))
        got.pop("f64", None)
        torch.cuda.empty_cache()
        if "gluon" not in got or "triton" not in got:
            continue
        # timings: do_bench medians of the host functions (pre-passes and allocations included), fwd+bwd as a
        # training step calls them, and pope_attention's autograd forward+backward (as is, and with the swap)
        go, gt = got["gluon"], got["triton"]
        leaves = [x.detach().requires_grad_() for x in (q, k, v, delta)]  # (q, k, v keep the qkv strides)
        step = lambda: pope_kernel.pope_attention(*leaves, theta).backward(do)  # noqa: E731
        cases = [
            ("fwd", lambda: pope_fwd(q, k, v, delta, theta, True, sm_scale, 0, True),
             lambda: pope_kernel._fwd(q, k, v, delta, theta, True, sm_scale, 0, True)),
            ("bwd", lambda: pope_bwd(do, q, k, v, delta, theta, go[0], go[1], True, sm_scale, 0),
             lambda: pope_kernel._bwd(do, q, k, v, delta, theta, gt[0], gt[1], True, sm_scale, 0)),
            ("fwd+bwd", lambda: pope_bwd(do, q, k, v, delta, theta, *pope_fwd(q, k, v, delta, theta, True, sm_scale,
                                                                             0, True), True, sm_scale, 0),
             lambda: pope_kernel._bwd(do, q, k, v, delta, theta, *pope_kernel._fwd(q, k, v, delta, theta, True,
                                                                                   sm_scale, 0, True), True,
                                      sm_scale, 0)),
            ("pope_attention fwd+bwd (autograd)", lambda: _swapped(step), step),
        ]
        for label, f_g, f_t in cases:
            try:
                ms_g = triton.testing.do_bench(f_g, grad_to_none=leaves)
                ms_t = triton.testing.do_bench(f_t, grad_to_none=leaves)
                print(f"  {label:34s} gluon {ms_g * 1e3:8.1f} us   triton {ms_t * 1e3:8.1f} us   "
                      f"({ms_t / ms_g:.2f}x)")
            except Exception as e:  # noqa: BLE001
                print(f"  {label:34s} FAILED {type(e).__name__}: {str(e)[-1000:]}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("kernels", nargs="*", help=f"a subset of {list(KERNELS)} (--compile-only; default: all)")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    names = a.kernels or list(KERNELS)
    if a.compile_only:
        sys.exit(0 if compile_only(names) else 1)
    main()
