"""Prototype PoPE attention backward in Gluon (Triton 3.6, sm_90): deterministic (no atomics), two kernels as
pope_kernel.py's plain-Triton backward (a dK/dV kernel looping over query blocks per key block, a dQ kernel
looping over key blocks per query block, each recomputing S and P), in four variants:

  simple  : one partition of 8 warps (2 warpgroups x 64 rows of a 128-row resident tile: Kc, V in dk/dv; Qc,
            dO in dq). The streamed tiles (64 rows: Qc, dO in dk/dv; Kc, V in dq) come through a TMA ring (3
            slots; 4 with overlap) under mbarriers, refilled by all warps (the compiler puts a CTA-wide barrier
            around each TMA issue, which ties the warpgroups together). Async wgmma within a step: both
            score-like products (S and dP) are issued before the exponentials, dV's before dS is made.
  overlap : as simple, plus FA3's overlap across steps: block j-1's dKc (dQc) wgmma is queued behind block
            j's S and dP, so the tensor cores have work while P(j) is made.
  ws      : warp-specialised: 1 producer warp issues every TMA load; two consumer warpgroups (64 resident rows
            each) run simple's step and release ring slots through mbarriers (count 2) instead of barriers.
  ws_ov   : ws with overlap's step.
Grids are (B*H, T/128), batch*head fastest, heaviest programs first (dk/dv: key block 0; dq: the last query
block). Only the two streamed blocks that cross the diagonal are masked.

After the pre-pass (see gluon_fwd.py): Qc, Kc (B, H, T, 2D) bf16 contiguous; V, dO (B, H, T, D) bf16 views of
(B, T, H, D) memory; LSE (B, H, T) float32 in log2 units (scores scaled by sm_scale * log2 e, sm_scale =
1/sqrt(D)); Di = rowsum(dO * O) (B, H, T) float32. Outputs: dQc, dKc (B, H, T, 2D) float32 (sm_scale applied;
the chain rule back to q, k, delta stays in pope_kernel.py), dV (B, H, T, D) bf16 laid out as V. T % 128 == 0.
Every wgmma operand is used as it lies: S^T = Kc Qc^T and dP^T = V dO^T take the streamed tile's K-major
permute as B; dV += P^T dO and dKc += dS^T Qc take P^T, dS^T from registers as A and the streamed tile as an
MN-major B; in dq, dQc += dS Kc likewise. No shared-memory transpose is needed.

  python results/kernel/gluon_bwd.py [VARIANT ...]     # H200: check vs float64, determinism, time vs SDPA
  python results/kernel/gluon_bwd.py --compile-only    # no GPU needed: compile each kernel for sm_90
  python results/kernel/gluon_bwd.py --check-reference # CPU: float64 reference vs float32 autograd
The GPU run prints a provenance header, then per shape and variant the max-abs / relative errors of dqc, dkc,
dv against float64, whether a second run is bitwise equal, µs (do_bench median of the bare launches: dk/dv +
dq, each also alone) and TFLOP/s, then SDPA's cuDNN and flash backwards at d=128 for q, k and v. Python
errors are caught per variant; a device fault or a hang is not (it poisons or stalls the process): run each
variant alone under `timeout`, e.g. `timeout 300 python results/kernel/gluon_bwd.py ws`.
--compile-only prints per kernel: shared memory, registers / spills (cuobjdump) and PTX counts of TMA loads
(cp.async.bulk.tensor), async wgmmas, wgmma waits and atomics.
Shared with gluon_fwd.py (imported from it): make_inputs, the forward's float64 reference, the K/V ring helpers.
"""
import argparse
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_fwd import LOG2E, _issue_kv, _layout, _mma_layout, _ring, make_inputs  # noqa: E402
from gluon_fwd import reference as fwd_reference  # noqa: E402

# (constexpr globals: the kernels read them; the host reads .value)
BLOCK = gl.constexpr(128)  # resident rows per program: keys in dk/dv, queries in dq
STEP = gl.constexpr(64)  # streamed rows per ring slot: query blocks in dk/dv, key blocks in dq (S, dP: 32 regs)
NDIAG = gl.constexpr(BLOCK.value // STEP.value)  # streamed blocks crossing the diagonal: first (dk/dv), last (dq)
WG0, WG1 = gl.constexpr(0), gl.constexpr(1)
WS_CONSUMER_REGS = gl.constexpr(240)  # as the forward: 2 x 240 + 24 (producer) = 3 warpgroups x 168
WS_MAXNREG = 168


@gluon.jit
def _release(j, n, src, ring, empty_bar, STAGES: gl.constexpr, WS: gl.constexpr):
    """Slot j % STAGES is no longer read by this warpgroup: tell the producer warp (WS) or, once both warpgroups
    are past it (CTA barrier), refill it with block j + STAGES ourselves."""
    if WS:
        mbarrier.arrive(empty_bar.index(j % STAGES), count=1)
    else:
        gl.thread_barrier()
        _issue_kv(src, ring, j + STAGES, n, STAGES)


# ----------------------------------------------------------------------------------------------------------
# dK / dV: resident Kc, V rows (keys n0 + offs_n); streamed query blocks j of STEP rows from m_first on.
# ctx = (LSE, DI, bh * T, m_first, qk_scale)

@gluon.jit
def _dkdv_step(j, n, dk, dv, dst_prev, k_smem, v_smem, ring, src, empty_bar, ctx, offs_n, s0, STAGES: gl.constexpr,
               MASK: gl.constexpr, WS: gl.constexpr, OV: gl.constexpr, PREV: gl.constexpr, pt_layout: gl.constexpr,
               dst_layout: gl.constexpr):
    """Query block j: S^T, dP^T, P^T, dS^T, dV += P^T dO and dKc += dS^T Qc; returns dS^T(j). Without OV, dKc
    takes block j here and slot j is released at the end. With OV (FA3's overlap), dKc += dS^T(j-1) Qc(j-1)
    (PREV: dst_prev) is queued behind this block's S^T and dP^T, so that it runs on the tensor cores while
    P^T(j) is made; slot j-1 is released at the end, and block j's dKc waits for step j+1."""
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
    # the A operands' registers stay alive (deps) until their wgmmas retire
    if OV:
        if PREV:
            dv, dk, ptb, dst_prev = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, ptb, dst_prev))
            _release(j - 1, n, src, ring, empty_bar, STAGES, WS)
        else:
            dv, ptb = warpgroup_mma_wait(0, deps=(dv_tok, ptb))
    else:
        dk_tok = warpgroup_mma(dstb, q_smem.index(s), dk, is_async=True)
        dv, dk, ptb, dstb = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, ptb, dstb))
        _release(j, n, src, ring, empty_bar, STAGES, WS)
    return dk, dv, dstb


@gluon.jit
def _dkdv_body(n, k_smem, v_smem, ring, src, empty_bar, ctx, r0, sm_scale, DK, dv_desc, dv_row, dv_col,
               STAGES: gl.constexpr, WS: gl.constexpr, OV: gl.constexpr, W: gl.constexpr):
    """The loop over query blocks and the epilogue of R = k_smem.shape[0] resident key rows r0.. in W warps."""
    R: gl.constexpr = k_smem.shape[0]
    D2: gl.constexpr = k_smem.shape[1]
    D: gl.constexpr = v_smem.shape[1]
    s_layout: gl.constexpr = _mma_layout(W, STEP)
    dv_layout: gl.constexpr = _mma_layout(W, D)
    dk_layout: gl.constexpr = _mma_layout(W, D2)
    pt_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv_layout, k_width=2)
    dst_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk_layout, k_width=2)
    offs_n = r0 + gl.arange(0, R, layout=gl.SliceLayout(1, s_layout))
    s0 = gl.zeros([R, STEP], gl.float32, layout=s_layout)
    dk = gl.zeros([R, D2], gl.float32, layout=dk_layout)
    dv = gl.zeros([R, D], gl.float32, layout=dv_layout)
    dst = gl.zeros([R, STEP], gl.bfloat16, layout=dst_layout)
    gl.static_assert(NDIAG == 2)  # query blocks 0 and 1 cross the diagonal: masked
    dk, dv, dst = _dkdv_step(0, n, dk, dv, dst, k_smem, v_smem, ring, src, empty_bar, ctx, offs_n, s0, STAGES, True,
                             WS, OV, False, pt_layout, dst_layout)
    dk, dv, dst = _dkdv_step(1, n, dk, dv, dst, k_smem, v_smem, ring, src, empty_bar, ctx, offs_n, s0, STAGES, True,
                             WS, OV, OV, pt_layout, dst_layout)
    for j in range(NDIAG, n):
        dk, dv, dst = _dkdv_step(j, n, dk, dv, dst, k_smem, v_smem, ring, src, empty_bar, ctx, offs_n, s0, STAGES,
                                 False, WS, OV, OV, pt_layout, dst_layout)
    if OV:  # the last block's dKc (its slot needs no release: nothing is loaded after it)
        dk = warpgroup_mma(dst, ring[0].index((n - 1) % STAGES), dk)
    # dV through shared memory (V's own tile: each warpgroup's last wgmma on its rows has retired) and a TMA
    # store into the (B, T, H, D) memory; dKc (float32) straight from registers (8 rows x 32 B a warp store)
    v_smem.store(dv.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(dv_desc, [dv_row, dv_col], v_smem)
    rows = ctx[2] + r0 + gl.arange(0, R, layout=gl.SliceLayout(1, dk_layout))
    cols = gl.arange(0, D2, layout=gl.SliceLayout(0, dk_layout))
    gl.store(DK + gl.expand_dims(rows, 1) * D2 + gl.expand_dims(cols, 0), dk * sm_scale)
    tma.store_wait(0)


@gluon.jit
def _dkdv_program(T, H):
    """Grid (B*H, T/BLOCK), batch*head fastest; key block 0 (which every query sees) first: heaviest first."""
    bh = gl.program_id(0)
    n0 = gl.program_id(1) * BLOCK
    return bh, bh // H, bh % H, n0, (T - n0) // STEP  # queries n0.. see these keys: (T - n0) / STEP blocks


@gluon.jit
def _dkdv_kernel(q_desc, k_desc, v_desc, do_desc, dv_desc, DK, LSE, DI, sm_scale, qk_scale, T, H,
                 STAGES: gl.constexpr, OV: gl.constexpr, num_warps: gl.constexpr):
    bh, b, h, n0, n = _dkdv_program(T, H)
    D: gl.constexpr = v_desc.block_type.shape[1]
    k_smem = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    ring = _ring(q_desc, do_desc, STAGES)
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [bh * T + n0, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [b * T + n0, h * D], kv_bar, v_smem)
    # Qc rows in the (B*H*T, 2D) view, dO rows in the (B*T, H*D) view at column h*D; query block j is n0 + j*STEP
    src = (q_desc, do_desc, bh * T + n0, b * T + n0, h * D)
    for i in gl.static_range(STAGES):
        _issue_kv(src, ring, i, n, STAGES)
    mbarrier.wait(kv_bar, 0)
    _dkdv_body(n, k_smem, v_smem, ring, src, kv_bar, (LSE, DI, bh * T, n0, qk_scale), n0, sm_scale, DK, dv_desc,
               b * T + n0, h * D, STAGES, False, OV, num_warps)


@gluon.jit
def _dkdv_ws_consumer(WG: gl.constexpr, k_smem, v_smem, kv_bar, ring, src, empty_bar, dv_desc, DK, LSE, DI,
                      sm_scale, qk_scale, T, H, STAGES: gl.constexpr, OV: gl.constexpr):
    bh, b, h, n0, n = _dkdv_program(T, H)
    R: gl.constexpr = k_smem.shape[1]
    mbarrier.wait(kv_bar.index(WG), 0)
    _dkdv_body(n, k_smem.index(WG), v_smem.index(WG), ring, src, empty_bar, (LSE, DI, bh * T, n0, qk_scale),
               n0 + WG * R, sm_scale, DK, dv_desc, b * T + n0 + WG * R, h * v_smem.shape[2], STAGES, True, OV, 4)


@gluon.jit
def _ws_producer(res_descs, res_smem, res_bar, res_rows, src, ring, empty_bar, n, STAGES: gl.constexpr):
    """Both warpgroups' resident tiles (a, b) = res_descs at rows res_rows (+ WG * R; b at column src[4]), then
    every streamed block once both consumers have released its slot (a fresh barrier passes phase 1 at once)."""
    a_desc, b_desc = res_descs
    a_smem, b_smem = res_smem
    R: gl.constexpr = a_desc.block_type.shape[0]
    for wg in gl.static_range(2):
        mbarrier.expect(res_bar.index(wg), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [res_rows[0] + wg * R, 0], res_bar.index(wg), a_smem.index(wg))
        tma.async_copy_global_to_shared(b_desc, [res_rows[1] + wg * R, src[4]], res_bar.index(wg), b_smem.index(wg))
    for j in range(n):
        mbarrier.wait(empty_bar.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
        _issue_kv(src, ring, j, n, STAGES)


@gluon.jit
def _ws_barriers(STAGES: gl.constexpr):
    res_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(res_bar.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(empty_bar.index(i), count=2)  # one arrival per consumer warpgroup
    return res_bar, empty_bar


@gluon.jit
def _dkdv_ws_kernel(q_desc, k_desc, v_desc, do_desc, dv_desc, DK, LSE, DI, sm_scale, qk_scale, T, H,
                    STAGES: gl.constexpr, OV: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(num_warps == 4)  # the default partition is consumer warpgroup 0
    bh, b, h, n0, n = _dkdv_program(T, H)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    kv_bar, empty_bar = _ws_barriers(STAGES)
    ring = _ring(q_desc, do_desc, STAGES)
    src = (q_desc, do_desc, bh * T + n0, b * T + n0, h * v_desc.block_type.shape[1])
    # argument tuples written out: constexprs inside a tuple held in a variable reach the partitions as
    # runtime values (Gluon 3.6; as in gluon_fwd.py's `cargs`, where STAGES and PP became int32 / int1)
    gl.warp_specialize([(_dkdv_ws_consumer, (WG0, k_smem, v_smem, kv_bar, ring, src, empty_bar, dv_desc, DK, LSE, DI,
                                             sm_scale, qk_scale, T, H, STAGES, OV)),
                        (_dkdv_ws_consumer, (WG1, k_smem, v_smem, kv_bar, ring, src, empty_bar, dv_desc, DK, LSE, DI,
                                             sm_scale, qk_scale, T, H, STAGES, OV)),
                        (_ws_producer, ((k_desc, v_desc), (k_smem, v_smem), kv_bar, (bh * T + n0, b * T + n0), src,
                                        ring, empty_bar, n, STAGES))], [4, 1], [WS_CONSUMER_REGS, 24])


# ----------------------------------------------------------------------------------------------------------
# dQ: resident Qc, dO rows (queries r0 + ...); streamed key blocks j of STEP rows from 0.
# ctx = (LSE, DI, bh * T, 0, qk_scale)

@gluon.jit
def _dq_step(j, n, dq, ds_prev, q_smem, do_smem, ring, src, empty_bar, qk_scale, offs_m, lse, di, s0,
             STAGES: gl.constexpr, MASK: gl.constexpr, WS: gl.constexpr, OV: gl.constexpr, PREV: gl.constexpr,
             ds_layout: gl.constexpr):
    """Key block j: S, dP, P, dS and dQc += dS Kc; returns dS(j). OV as in _dkdv_step: dQc += dS(j-1) Kc(j-1)
    runs behind this block's S and dP, and slot j-1 is released at the end."""
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
    if OV:
        if PREV:
            dq, ds_prev = warpgroup_mma_wait(0, deps=(dq_tok, ds_prev))
            _release(j - 1, n, src, ring, empty_bar, STAGES, WS)
    else:
        dq = warpgroup_mma(dsb, k_smem.index(s), dq)
        _release(j, n, src, ring, empty_bar, STAGES, WS)
    return dq, dsb


@gluon.jit
def _dq_body(n, q_smem, do_smem, ring, src, empty_bar, LSE, DI, row0, r0, qk_scale, sm_scale, DQ,
             STAGES: gl.constexpr, WS: gl.constexpr, OV: gl.constexpr, W: gl.constexpr):
    R: gl.constexpr = q_smem.shape[0]
    D2: gl.constexpr = q_smem.shape[1]
    s_layout: gl.constexpr = _mma_layout(W, STEP)
    dq_layout: gl.constexpr = _mma_layout(W, D2)
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    offs_m = r0 + gl.arange(0, R, layout=gl.SliceLayout(1, s_layout))
    lse = gl.expand_dims(gl.load(LSE + row0 + offs_m), 1)
    di = gl.expand_dims(gl.load(DI + row0 + offs_m), 1)
    s0 = gl.zeros([R, STEP], gl.float32, layout=s_layout)
    dq = gl.zeros([R, D2], gl.float32, layout=dq_layout)
    ds = gl.zeros([R, STEP], gl.bfloat16, layout=ds_layout)
    # key block 0 alone (no previous block), masked: exact for any block, and a diagonal one when n == NDIAG
    dq, ds = _dq_step(0, n, dq, ds, q_smem, do_smem, ring, src, empty_bar, qk_scale, offs_m, lse, di, s0, STAGES,
                      True, WS, OV, False, ds_layout)
    for j in range(1, n - NDIAG):
        dq, ds = _dq_step(j, n, dq, ds, q_smem, do_smem, ring, src, empty_bar, qk_scale, offs_m, lse, di, s0, STAGES,
                          False, WS, OV, OV, ds_layout)
    for j in range(gl.maximum(n - NDIAG, 1), n):  # the key blocks that cross the diagonal
        dq, ds = _dq_step(j, n, dq, ds, q_smem, do_smem, ring, src, empty_bar, qk_scale, offs_m, lse, di, s0, STAGES,
                          True, WS, OV, OV, ds_layout)
    if OV:
        dq = warpgroup_mma(ds, ring[0].index((n - 1) % STAGES), dq)
    rows = row0 + r0 + gl.arange(0, R, layout=gl.SliceLayout(1, dq_layout))
    cols = gl.arange(0, D2, layout=gl.SliceLayout(0, dq_layout))
    gl.store(DQ + gl.expand_dims(rows, 1) * D2 + gl.expand_dims(cols, 0), dq * sm_scale)


@gluon.jit
def _dq_program(T, H):
    """Grid (B*H, T/BLOCK), batch*head fastest, query blocks reversed: the last (heaviest) start first."""
    bh = gl.program_id(0)
    m0 = (gl.num_programs(1) - 1 - gl.program_id(1)) * BLOCK
    return bh, bh // H, bh % H, m0, (m0 + BLOCK) // STEP  # key blocks 0 .. m0 + BLOCK - 1


@gluon.jit
def _dq_kernel(q_desc, k_desc, v_desc, do_desc, DQ, LSE, DI, sm_scale, qk_scale, T, H, STAGES: gl.constexpr,
               OV: gl.constexpr, num_warps: gl.constexpr):
    bh, b, h, m0, n = _dq_program(T, H)
    D: gl.constexpr = v_desc.block_type.shape[1]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, do_desc.block_type.shape, do_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    ring = _ring(k_desc, v_desc, STAGES)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh * T + m0, 0], q_bar, q_smem)
    tma.async_copy_global_to_shared(do_desc, [b * T + m0, h * D], q_bar, do_smem)
    src = (k_desc, v_desc, bh * T, b * T, h * D)
    for i in gl.static_range(STAGES):
        _issue_kv(src, ring, i, n, STAGES)
    mbarrier.wait(q_bar, 0)
    _dq_body(n, q_smem, do_smem, ring, src, q_bar, LSE, DI, bh * T, m0, qk_scale, sm_scale, DQ, STAGES, False, OV,
             num_warps)


@gluon.jit
def _dq_ws_consumer(WG: gl.constexpr, q_smem, do_smem, q_bar, ring, src, empty_bar, DQ, LSE, DI, sm_scale,
                    qk_scale, T, H, STAGES: gl.constexpr, OV: gl.constexpr):
    bh, b, h, m0, n = _dq_program(T, H)
    mbarrier.wait(q_bar.index(WG), 0)
    # both warpgroups take all n key blocks: warpgroup 0's last one is entirely masked (P = 0, adds nothing)
    _dq_body(n, q_smem.index(WG), do_smem.index(WG), ring, src, empty_bar, LSE, DI, bh * T, m0 + WG * q_smem.shape[1],
             qk_scale, sm_scale, DQ, STAGES, True, OV, 4)


@gluon.jit
def _dq_ws_kernel(q_desc, k_desc, v_desc, do_desc, DQ, LSE, DI, sm_scale, qk_scale, T, H, STAGES: gl.constexpr,
                  OV: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(num_warps == 4)
    bh, b, h, m0, n = _dq_program(T, H)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    q_bar, empty_bar = _ws_barriers(STAGES)
    ring = _ring(k_desc, v_desc, STAGES)
    src = (k_desc, v_desc, bh * T, b * T, h * v_desc.block_type.shape[1])
    gl.warp_specialize([(_dq_ws_consumer, (WG0, q_smem, do_smem, q_bar, ring, src, empty_bar, DQ, LSE, DI, sm_scale,
                                           qk_scale, T, H, STAGES, OV)),
                        (_dq_ws_consumer, (WG1, q_smem, do_smem, q_bar, ring, src, empty_bar, DQ, LSE, DI, sm_scale,
                                           qk_scale, T, H, STAGES, OV)),
                        (_ws_producer, ((q_desc, do_desc), (q_smem, do_smem), q_bar, (bh * T + m0, b * T + m0), src,
                                        ring, empty_bar, n, STAGES))], [4, 1], [WS_CONSUMER_REGS, 24])


# ----------------------------------------------------------------------------------------------------------
# Host side

# name: ((dkdv kernel, dq kernel), resident rows per tile (per warpgroup in ws), constexprs, launch options).
# The overlap steps hold a slot one step longer (block j-1's dKc / dQc): one more slot keeps the prefetch depth.
VARIANTS = {
    "simple": ((_dkdv_kernel, _dq_kernel), BLOCK.value, dict(STAGES=3, OV=False), dict(num_warps=8)),
    "overlap": ((_dkdv_kernel, _dq_kernel), BLOCK.value, dict(STAGES=4, OV=True), dict(num_warps=8)),
    "ws": ((_dkdv_ws_kernel, _dq_ws_kernel), BLOCK.value // 2, dict(STAGES=3, OV=False),
           dict(num_warps=4, maxnreg=WS_MAXNREG)),
    "ws_ov": ((_dkdv_ws_kernel, _dq_ws_kernel), BLOCK.value // 2, dict(STAGES=4, OV=True),
              dict(num_warps=4, maxnreg=WS_MAXNREG)),
}


def _args(qc, kc, v, do, dqc, dkc, dv, lse, di, sm_scale, rows):
    """(dk/dv arguments, dq arguments): 2D TMA descriptors over Qc, Kc (B*H*T, 2D) and V, dO, dV (B*T, H*D);
    resident tiles have `rows` rows, streamed ones STEP."""
    B, H, T, D2 = qc.shape
    D = v.shape[-1]
    q2, k2 = qc.reshape(B * H * T, D2), kc.reshape(B * H * T, D2)
    v2, do2, dv2 = (x.transpose(1, 2).view(B * T, H * D) for x in (v, do, dv))
    desc = lambda x, r, w: TensorDescriptor.from_tensor(x, [r, w], _layout([r, w]))  # noqa: E731
    scal, st = (sm_scale, sm_scale * LOG2E, T, H), STEP.value
    return ((desc(q2, st, D2), desc(k2, rows, D2), desc(v2, rows, D), desc(do2, st, D), desc(dv2, rows, D), dkc, lse,
             di) + scal,
            (desc(q2, rows, D2), desc(k2, st, D2), desc(v2, st, D), desc(do2, rows, D), dqc, lse, di) + scal)


def gluon_pope_bwd(qc, kc, v, do, lse, di, sm_scale, variant="ws", launcher=False):
    """(dqc, dkc) (B, H, T, 2D) float32 with sm_scale applied, dv (B, H, T, D) bf16 view of (B, T, H, D) memory.
    With launcher, also (f_dkdv, f_dq): each reruns its kernel on prebuilt arguments (timing without set-up)."""
    B, H, T, D2 = qc.shape
    D = v.shape[-1]
    assert T % BLOCK.value == 0 and D2 == 2 * D and qc.is_contiguous() and kc.is_contiguous()
    assert lse.is_contiguous() and di.is_contiguous() and lse.dtype == di.dtype == torch.float32
    v, do = (x if x.transpose(1, 2).stride() == (T * H * D, H * D, D, 1) else
             x.transpose(1, 2).contiguous().transpose(1, 2) for x in (v, do))
    dqc, dkc = torch.empty(B, H, T, D2, device=qc.device), torch.empty(B, H, T, D2, device=qc.device)
    dv = torch.empty(B, T, H, D, device=qc.device, dtype=v.dtype).transpose(1, 2)
    (k_dkdv, k_dq), rows, consts, opts = VARIANTS[variant]
    a_dkdv, a_dq = _args(qc, kc, v, do, dqc, dkc, dv, lse, di, sm_scale, rows)
    f_dkdv = lambda: k_dkdv[(B * H, T // BLOCK.value)](*a_dkdv, **consts, **opts)  # noqa: E731
    f_dq = lambda: k_dq[(B * H, T // BLOCK.value)](*a_dq, **consts, **opts)  # noqa: E731
    f_dkdv()
    f_dq()
    return (dqc, dkc, dv, (f_dkdv, f_dq)) if launcher else (dqc, dkc, dv)


def reference(qc, kc, v, do, sm_scale):
    """float64 from the formulas: (dqc, dkc, dv, lse, di); lse (log2 units) and o are the forward's float64
    reference (gluon_fwd.reference), di = rowsum(do * o). The kernels take lse, di as float32."""
    o, lse = fwd_reference(qc, kc, v, sm_scale)
    q, k, vv, g = qc.double(), kc.double(), v.double(), do.double()
    T = q.shape[2]
    di = (g * o).sum(-1)
    s = (q @ k.transpose(-1, -2)) * sm_scale
    p = torch.exp(s - lse[..., None] / LOG2E)
    p = p.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), 0.0)
    ds = p * (g @ vv.transpose(-1, -2) - di[..., None])
    return (ds @ k) * sm_scale, (ds.transpose(-1, -2) @ q) * sm_scale, p.transpose(-1, -2) @ g, lse, di


def check_reference():
    """CPU: the float64 reference against float32 autograd through softmax(qc kcᵀ sm_scale, causal) v."""
    for B, H, T, D in [(1, 1, 1, 8), (2, 3, 37, 16), (1, 2, 130, 64)]:
        qc, kc, v = make_inputs(B, H, T, D, "cpu", seed=T)
        do = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(T + 1)).to(torch.bfloat16)
        ref = reference(qc, kc, v, do, D**-0.5)
        q, k, vv = (x.float().requires_grad_() for x in (qc, kc, v))
        s = (q @ k.transpose(-1, -2)) * D**-0.5
        s = torch.where(torch.ones(T, T, dtype=torch.bool).tril(), s, torch.tensor(float("-inf")))
        (torch.softmax(s, -1) @ vv).backward(do.float())
        errs = [(r - x.grad).abs().max().item() / max(x.grad.abs().max().item(), 1e-30)
                for r, x in zip(ref, (q, k, vv))]
        print(f"reference B={B} H={H} T={T} D={D}: max-abs err / max |grad|: dqc {errs[0]:.2e} dkc {errs[1]:.2e}"
              f" dv {errs[2]:.2e}")
        assert max(errs) < 1e-4


def compile_only(names):
    """Compile every kernel of each variant for sm_90 without a GPU (descriptors over CPU tensors give the
    signature); print shared memory, registers / spills, and PTX instruction counts."""
    import re
    import subprocess
    import tempfile
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type
    B, H, T, D = 1, 3, 256, 64  # (H = 3: a V tile is D wide, not H*D)
    qc, kc, v = make_inputs(B, H, T, D, "cpu")
    do, dv = torch.empty_like(v), torch.empty_like(v)
    dqc, dkc = torch.empty(B, H, T, 2 * D), torch.empty(B, H, T, 2 * D)
    lse, di = torch.empty(B, H, T), torch.empty(B, H, T)
    for name in names:
        kernels, rows, consts, opts = VARIANTS[name]
        args2 = _args(qc, kc, v, do, dqc, dkc, dv, lse, di, 0.125, rows)
        for kname, kernel, args in zip(("dkdv", "dq"), kernels, args2):
            try:
                sig = {k: mangle_type(a) for k, a in zip(kernel.arg_names, args)}
                cst = dict(consts, num_warps=opts["num_warps"])
                sig.update({k: "constexpr" for k in cst})
                attrs = {(kernel.arg_names.index(k), ): [["tt.divisibility", 16]]
                         for k in kernel.arg_names if k in ("DK", "DQ", "LSE", "DI", "T")}
                ck = triton.compile(GluonASTSource(kernel, sig, cst, attrs), target=GPUTarget("cuda", 90, 32),
                                    options=opts)
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(ck.asm["cubin"])
                    f.flush()
                    out = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                                         capture_output=True, text=True).stdout
                usage = " ".join(re.findall(r"(REG:\d+|STACK:\d+|LOCAL:\d+)", out))
                ptx = ck.asm["ptx"]
                cnt = {k: len(re.findall(p, ptx)) for k, p in (("tma-loads", r"cp\.async\.bulk\.tensor\.\dd\.shared"),
                       ("tma-stores", r"cp\.async\.bulk\.tensor\.\dd\.global"), ("wgmma", r"wgmma\.mma_async"),
                       ("wgmma-waits", r"wgmma\.wait_group"), ("atomics", r"\b(atom|red)\."))}
                print(f"{name:6s} {kname:4s} OK   shared={ck.metadata.shared} B  {usage}  "
                      + " ".join(f"{k}={c}" for k, c in cnt.items()))
                if os.environ.get("GLUON_BWD_DUMP"):  # write ttgir / ptx for reading
                    for ext in ("ttgir", "ptx"):
                        with open(os.path.join(os.environ["GLUON_BWD_DUMP"], f"{name}_{kname}.{ext}"), "w") as f:
                            f.write(ck.asm[ext])
            except Exception as e:  # noqa: BLE001
                print(f"{name:6s} {kname:4s} FAIL {type(e).__name__}: {str(e)[-1500:]}\n  cause: {e.__cause__!r}")


def main(variants):
    import datetime, subprocess
    from torch.nn.attention import SDPBackend, sdpa_kernel
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    print(f"# commit: {os.environ.get('POPE_COMMIT') or git('rev-parse', 'HEAD') or 'unknown'}\n"
          f"# dirty: {os.environ.get('POPE_DIRTY') or git('status', '--porcelain').replace(chr(10), ' ') or 'no'}\n"
          f"# gpu: {torch.cuda.get_device_name()}\n# torch: {torch.__version__}\n# triton: {triton.__version__}\n"
          f"# date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC\n# command: python {' '.join(sys.argv)}")
    D = 64
    sm_scale = D**-0.5
    for B, H, T in [(8, 12, 1024), (2, 12, 4096), (1, 12, 16384)]:
        qc, kc, v = make_inputs(B, H, T, D, "cuda")
        g = torch.Generator(device="cpu").manual_seed(1)
        do = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16).to("cuda").transpose(1, 2)
        # causal backward FLOPs: per visible (t, s) pair, 2 * (QKᵀ 2D + dP D + dV D + dKc 2D) in dk/dv and
        # 2 * (QKᵀ 2D + dP D + dQc 2D) in dq = 22 D; B*H*T*T/2 pairs
        flops = 11 * B * H * T * T * D
        ref = [reference(qc[:, h:h + 1], kc[:, h:h + 1], v[:, h:h + 1], do[:, h:h + 1], sm_scale) for h in range(H)]
        ref = [torch.cat([r[i] for r in ref], 1) for i in range(5)]
        lse, di = ref[3].float().contiguous(), ref[4].float().contiguous()
        print(f"\n(B, H, T, D) = ({B}, {H}, {T}, {D})  [QK depth {2 * D}, PV depth {D}; {flops / 1e12:.3f} TFLOP]")
        for name in variants:
            try:
                dqc, dkc, dv, (f1, f2) = gluon_pope_bwd(qc, kc, v, do, lse, di, sm_scale, name, launcher=True)
                first = [x.clone() for x in (dqc, dkc, dv)]
                f1(), f2()
                same = all(torch.equal(a, b) for a, b in zip(first, (dqc, dkc, dv)))
                errs = []
                for lab, x, r in zip(("dqc", "dkc", "dv"), (dqc, dkc, dv), ref[:3]):
                    e = (x.double() - r).abs().max().item()
                    errs.append(f"{lab} {e:.2e}/{e / r.abs().max().item():.2e}")
                t1, t2 = triton.testing.do_bench(f1), triton.testing.do_bench(f2)
                ms = triton.testing.do_bench(lambda: (f1(), f2()))
                print(f"  {name:6s} max-abs/rel: {' '.join(errs)}  bitwise-rerun={'yes' if same else 'NO'}\n"
                      f"         {ms * 1e3:8.1f} us {flops / ms * 1e-9:6.1f} TFLOP/s  (dkdv {t1 * 1e3:.1f} + dq "
                      f"{t2 * 1e3:.1f} us)")
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (a device fault poisons the context: later ones fail too)
                print(f"  {name:6s} FAILED {type(e).__name__}: {str(e)[-1500:]}")
        del ref
        # SDPA cannot take depth-2D q, k with depth-D v on cuDNN: time its backward at d = 128 for q, k and v
        q, k, vv = (torch.randn(B, H, T, 2 * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3))
        go = torch.randn(B, H, T, 2 * D, device="cuda", dtype=torch.bfloat16)
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    o = torch.nn.functional.scaled_dot_product_attention(q, k, vv, is_causal=True)
                    ms = triton.testing.do_bench(lambda: o.backward(go, retain_graph=True), grad_to_none=[q, k, vv])
                print(f"  SDPA {backend.name} backward (q, k, v all d=128): {ms * 1e3:8.1f} us"
                      f" ({flops / ms * 1e-9:6.1f} TFLOP/s at the PoPE FLOP count)")
            except Exception as e:  # noqa: BLE001
                print(f"  SDPA {backend.name} FAILED {type(e).__name__}: {str(e)[-300:]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", help=f"a subset of {list(VARIANTS)} (default: all)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--check-reference", action="store_true")
    a = ap.parse_args()
    names = a.variants or list(VARIANTS)
    assert set(names) <= set(VARIANTS), f"unknown variant in {names}"
    if a.compile_only or a.check_reference:
        check_reference() if a.check_reference else None
        compile_only(names) if a.compile_only else None
        sys.exit(0)
    main(names)
