"""Prototype FA3-style PoPE attention forward in Gluon (Triton 3.6, sm_90), four variants:

  simple   : TMA K/V ring + mbarriers, synchronous wgmma, 8 warps (2 warpgroups x 64 rows), no overlap.
  overlap  : as simple, plus FA3's intra-warpgroup overlap: block j's QK wgmma and block j-1's PV wgmma are
             in flight while the softmax of block j waits only for the QK one (warpgroup_mma_wait(1)).
  ws       : warp-specialised: 1 producer warp issues every TMA load; two consumer warpgroups (64 query rows
             each, the overlap loop) release K/V slots through mbarriers instead of CTA-wide barriers.
  ws_pp    : ws plus FA3's ping-pong: the two consumers take turns issuing their wgmmas (an mbarrier pair),
             so that one warpgroup's softmax runs while the other's matmuls occupy the tensor cores.

After the pre-pass PoPE's forward is causal flash attention with QK depth 2D and PV depth D:
Qc, Kc (B, H, T, 2D) bf16 contiguous; V, O (B, H, T, D) bf16 views of (B, T, H, D) memory; LSE (B, H, T)
float32 = m + log2(l) with scores scaled by sm_scale * log2(e), sm_scale = 1/sqrt(D). Needs T % 128 == 0.

  python results/kernel/gluon_fwd.py [VARIANT ...]    # H200: check each variant vs float64, time vs SDPA
  python results/kernel/gluon_fwd.py --compile-only   # no GPU needed: compile each variant for sm_90
  python results/kernel/gluon_fwd.py --check-reference  # CPU: float64 reference vs naive float32
The GPU run prints per shape and variant the max-abs / relative errors of o and lse, then µs and TFLOP/s
(do_bench median of the bare launch), then SDPA's cuDNN and flash forwards at d=128 for q, k and v.
"""
import argparse
import math
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

BLOCK = 128  # query rows per program = keys per block (so the diagonal is exactly the last key block)
LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------------------
# Shared pieces. ring = (k_smem, v_smem, k_bar, v_bar): a STAGES-deep K/V ring with one "ready" barrier per
# slot for K and one for V (the QK wgmma need not wait for V); src = (k_desc, v_desc, k_row0, v_row0, v_col).

@gluon.constexpr_function
def _mma_layout(warps, n):
    """wgmma accumulator layout: warps stacked along the rows (row reductions stay inside a warp)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _program(T, H, BM: gl.constexpr):
    """(bh, b, h, first query row, number of key blocks) of this program. Grid (B*H, T/BM), batch*head
    fastest and query blocks reversed: the heaviest (last) query blocks of all heads start first."""
    bh = gl.program_id(0)
    pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
    return bh, bh // H, bh % H, pid_m * BM, pid_m + 1


@gluon.jit
def _ring(k_desc, v_desc, STAGES: gl.constexpr):
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)
    return k_smem, v_smem, k_bar, v_bar


@gluon.jit
def _issue_kv(src, ring, j, n, STAGES: gl.constexpr):
    """TMA loads of key block j into slot j % STAGES; skipped through the predicate when j >= n."""
    k_desc, v_desc, k_row0, v_row0, v_col = src
    k_smem, v_smem, k_bar, v_bar = ring
    BN: gl.constexpr = k_desc.block_type.shape[0]
    s = j % STAGES
    mbarrier.expect(k_bar.index(s), k_desc.block_type.nbytes, pred=j < n)
    tma.async_copy_global_to_shared(k_desc, [k_row0 + j * BN, 0], k_bar.index(s), k_smem.index(s), pred=j < n)
    mbarrier.expect(v_bar.index(s), v_desc.block_type.nbytes, pred=j < n)
    tma.async_copy_global_to_shared(v_desc, [v_row0 + j * BN, v_col], v_bar.index(s), v_smem.index(s), pred=j < n)


@gluon.jit
def _init_state(r0, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, s_layout: gl.constexpr,
                o_layout: gl.constexpr):
    rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    return (r0 + gl.arange(0, BM, layout=rows), gl.full([BM], float("-inf"), gl.float32, layout=rows),
            gl.zeros([BM], gl.float32, layout=rows), gl.zeros([BM, D], gl.float32, layout=o_layout),
            gl.zeros([BM, BN], gl.float32, layout=s_layout))


@gluon.jit
def _softmax(s, m_i, l_i, offs_m, n0, qk_scale, MASK: gl.constexpr):
    """Online softmax of one score block s (float32, unscaled). The scale goes into the row max and into the
    exponent (one fma per score). Only the diagonal block is masked; every row sees key 0, so m stays finite."""
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
def _epilogue(acc, l_i, m_i, offs_m, o_desc, o_smem, o_row, o_col, LSE, lse_row0, o_layout: gl.constexpr):
    """O = acc / l through shared memory and a TMA store (into the (B, T, H, D) memory); LSE = m + log2(l)."""
    acc = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    o_smem.store(acc.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [o_row, o_col], o_smem)
    gl.store(LSE + lse_row0 + offs_m, m_i + gl.log2(l_i))
    tma.store_wait(0)


# ----------------------------------------------------------------------------------------------------------
# The two key-block loops

@gluon.jit
def _simple_step(j, n, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, src, ring, STAGES: gl.constexpr,
                 MASK: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    k_smem, v_smem, k_bar, v_bar = ring
    # slot (j-1)%S was read by iteration j-1's (completed) wgmmas of both warpgroups: the CTA barrier makes
    # sure the slower one is done before the TMA overwrites it with block j+S-1
    gl.thread_barrier()
    _issue_kv(src, ring, j + STAGES - 1, n, STAGES)
    s, ph = j % STAGES, (j // STAGES) & 1
    mbarrier.wait(k_bar.index(s), ph)
    sc = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), s0, use_acc=False)
    p, m_i, l_i, alpha = _softmax(sc, m_i, l_i, offs_m, j * sc.shape[1], qk_scale, MASK)
    acc = _rescale(acc, alpha, o_layout)
    mbarrier.wait(v_bar.index(s), ph)
    acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(s), acc)
    return acc, m_i, l_i


@gluon.jit
def _overlap_step(j, n, p, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, src, ring, empty_bar, turn_bar,
                  WG: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr, WS: gl.constexpr, PP: gl.constexpr,
                  o_layout: gl.constexpr, p_layout: gl.constexpr):
    """FA3's intra-warpgroup overlap: issue QK(j) and PV(j-1) (p = P(j-1) in registers), wait for QK(j) only,
    run softmax(j) while PV(j-1) runs on the tensor cores, then wait for PV(j-1) and rescale."""
    k_smem, v_smem, k_bar, v_bar = ring
    s, prev = j % STAGES, (j - 1) % STAGES
    mbarrier.wait(k_bar.index(s), (j // STAGES) & 1)
    mbarrier.wait(v_bar.index(prev), ((j - 1) // STAGES) & 1)
    if PP:  # ping-pong: wait for the other consumer to have issued its wgmmas of this step (WG 0 starts)
        mbarrier.wait(turn_bar.index(WG), ((j - 1) & 1) ^ (1 - WG))
    s_tok = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), s0, use_acc=False, is_async=True)
    acc_tok = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
    if PP:  # the tensor cores are ours until these retire: let the other warpgroup issue next
        mbarrier.arrive(turn_bar.index(1 - WG), count=1)
    sc = warpgroup_mma_wait(1, deps=(s_tok, ))  # wgmma groups retire in order: QK(j) is done
    p_new, m_i, l_i, alpha = _softmax(sc, m_i, l_i, offs_m, j * sc.shape[1], qk_scale, MASK)
    # p goes through the wait as a dependency: the PV wgmma reads its registers until here
    acc, p = warpgroup_mma_wait(0, deps=(acc_tok, p))
    acc = _rescale(acc, alpha, o_layout)
    # slot j-1 is now free in this warpgroup: tell the producer warp (ws), or refill it with block j-1+S
    # ourselves once the other warpgroup is done with it too (CTA barrier)
    if WS:
        mbarrier.arrive(empty_bar.index(prev), count=1)
    else:
        gl.thread_barrier()
        _issue_kv(src, ring, j - 1 + STAGES, n, STAGES)
    return gl.convert_layout(p_new.to(gl.bfloat16), p_layout), acc, m_i, l_i


@gluon.jit
def _overlap_loop(n, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, src, ring, empty_bar, turn_bar, WG: gl.constexpr,
                  STAGES: gl.constexpr, WS: gl.constexpr, PP: gl.constexpr, o_layout: gl.constexpr,
                  p_layout: gl.constexpr):
    k_smem, v_smem, k_bar, v_bar = ring
    # block 0 alone, masked (exact for any block; it is the diagonal when n == 1)
    mbarrier.wait(k_bar.index(0), 0)
    sc = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s0, use_acc=False)
    p, m_i, l_i, alpha = _softmax(sc, m_i, l_i, offs_m, 0, qk_scale, True)
    p = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    for j in range(1, n - 1):  # blocks fully below the diagonal: no mask
        p, acc, m_i, l_i = _overlap_step(j, n, p, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, src, ring,
                                         empty_bar, turn_bar, WG, STAGES, False, WS, PP, o_layout, p_layout)
    if n > 1:  # the diagonal block
        p, acc, m_i, l_i = _overlap_step(n - 1, n, p, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, src, ring,
                                         empty_bar, turn_bar, WG, STAGES, True, WS, PP, o_layout, p_layout)
    last = (n - 1) % STAGES
    mbarrier.wait(v_bar.index(last), ((n - 1) // STAGES) & 1)
    return warpgroup_mma(p, v_smem.index(last), acc), m_i, l_i


# ----------------------------------------------------------------------------------------------------------
# Variants simple and overlap: one partition of 8 warps = 2 warpgroups x 64 rows, in lockstep at the TMA issues

@gluon.jit
def _fwd_kernel(q_desc, k_desc, v_desc, o_desc, LSE, qk_scale, T, H, STAGES: gl.constexpr,
                OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = v_desc.block_type.shape[1]
    gl.static_assert(BM == BN)
    s_layout: gl.constexpr = _mma_layout(num_warps, BN)
    o_layout: gl.constexpr = _mma_layout(num_warps, D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    bh, b, h, m0, n = _program(T, H, BM)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    o_smem = gl.allocate_shared_memory(o_desc.dtype, o_desc.block_type.shape, o_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    ring = _ring(k_desc, v_desc, STAGES)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh * T + m0, 0], q_bar, q_smem)
    # Kc rows of this head in the (B*H*T, 2D) view; V rows in the (B*T, H*D) view at column h*D
    src = (k_desc, v_desc, bh * T, b * T, h * D)
    # simple refills slot (j-1)%S at the start of iteration j: S-1 blocks up front; overlap refills it at the
    # end of iteration j (when block j-1's PV is done): S blocks up front
    for i in gl.static_range(STAGES - 1 + OVERLAP):
        _issue_kv(src, ring, i, n, STAGES)
    offs_m, m_i, l_i, acc, s0 = _init_state(m0, BM, BN, D, s_layout, o_layout)
    mbarrier.wait(q_bar, 0)
    if OVERLAP:
        acc, m_i, l_i = _overlap_loop(n, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, src, ring, q_bar, q_bar, 0,
                                      STAGES, False, False, o_layout, p_layout)
    else:
        for j in range(0, n - 1):
            acc, m_i, l_i = _simple_step(j, n, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, src, ring, STAGES,
                                         False, o_layout, p_layout)
        acc, m_i, l_i = _simple_step(n - 1, n, acc, m_i, l_i, offs_m, qk_scale, q_smem, s0, src, ring, STAGES,
                                     True, o_layout, p_layout)
    _epilogue(acc, l_i, m_i, offs_m, o_desc, o_smem, b * T + m0, h * D, LSE, bh * T, o_layout)


# ----------------------------------------------------------------------------------------------------------
# Variants ws / ws_pp: a producer warp + two consumer warpgroups (64 query rows each, the overlap loop)

@gluon.jit
def _ws_consumer(WG: gl.constexpr, q_desc, o_desc, q_smem, o_smem, q_bar, src, ring, empty_bar, turn_bar, LSE,
                 qk_scale, T, H, STAGES: gl.constexpr, PP: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = src[0].block_type.shape[0]
    D: gl.constexpr = o_desc.block_type.shape[1]
    s_layout: gl.constexpr = _mma_layout(4, BN)
    o_layout: gl.constexpr = _mma_layout(4, D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    bh, b, h, m0, n = _program(T, H, 2 * BM)
    r0 = m0 + WG * BM
    offs_m, m_i, l_i, acc, s0 = _init_state(r0, BM, BN, D, s_layout, o_layout)
    mbarrier.wait(q_bar.index(WG), 0)
    acc, m_i, l_i = _overlap_loop(n, acc, m_i, l_i, offs_m, qk_scale, q_smem.index(WG), s0, src, ring, empty_bar,
                                  turn_bar, WG, STAGES, True, PP, o_layout, p_layout)
    _epilogue(acc, l_i, m_i, offs_m, o_desc, o_smem.index(WG), b * T + r0, h * D, LSE, bh * T, o_layout)


@gluon.jit
def _ws_producer(q_desc, q_smem, q_bar, src, ring, empty_bar, T, H, STAGES: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    bh, b, h, m0, n = _program(T, H, 2 * BM)
    for wg in gl.static_range(2):
        mbarrier.expect(q_bar.index(wg), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bh * T + m0 + wg * BM, 0], q_bar.index(wg), q_smem.index(wg))
    for j in range(n):
        # slot j%S is free once both consumers released block j-S (a fresh barrier passes phase 1 at once)
        mbarrier.wait(empty_bar.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
        _issue_kv(src, ring, j, n, STAGES)


@gluon.jit
def _fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, LSE, qk_scale, T, H, STAGES: gl.constexpr, PP: gl.constexpr,
                   num_warps: gl.constexpr):
    gl.static_assert(num_warps == 4)  # the default partition is consumer warpgroup 0
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    o_smem = gl.allocate_shared_memory(o_desc.dtype, [2] + o_desc.block_type.shape, o_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(turn_bar.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(empty_bar.index(i), count=2)  # one arrival per consumer warpgroup
    ring = _ring(k_desc, v_desc, STAGES)
    bh, b, h, m0, n = _program(T, H, 2 * q_desc.block_type.shape[0])
    src = (k_desc, v_desc, bh * T, b * T, h * v_desc.block_type.shape[1])
    cargs = (q_desc, o_desc, q_smem, o_smem, q_bar, src, ring, empty_bar, turn_bar, LSE, qk_scale, T, H, STAGES, PP)
    gl.warp_specialize([(_ws_consumer, (WG0, ) + cargs), (_ws_consumer, (WG1, ) + cargs),
                        (_ws_producer, (q_desc, q_smem, q_bar, src, ring, empty_bar, T, H, STAGES))],
                       [4, 1], [WS_CONSUMER_REGS, 24])


WG0, WG1 = gl.constexpr(0), gl.constexpr(1)
WS_CONSUMER_REGS = gl.constexpr(240)  # 3 warpgroups on 64K registers: 2 x 240 + 24 (producer) = 3 x 168
WS_MAXNREG = 168


# ----------------------------------------------------------------------------------------------------------
# Host side

VARIANTS = {  # name: (kernel, rows per Q/O tile, constexprs, launch options)
    "simple": (_fwd_kernel, BLOCK, dict(STAGES=2, OVERLAP=False), dict(num_warps=8)),
    "overlap": (_fwd_kernel, BLOCK, dict(STAGES=3, OVERLAP=True), dict(num_warps=8)),
    "ws": (_fwd_ws_kernel, BLOCK // 2, dict(STAGES=3, PP=False), dict(num_warps=4, maxnreg=WS_MAXNREG)),
    "ws_pp": (_fwd_ws_kernel, BLOCK // 2, dict(STAGES=3, PP=True), dict(num_warps=4, maxnreg=WS_MAXNREG)),
}


def _layout(block):
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)


def _args(qc, kc, v, o, lse, sm_scale, rows):
    """Kernel arguments: 2D TMA descriptors over Qc, Kc (B*H*T, 2D) and V, O (B*T, H*D) (the latter two are
    (B, H, T, D) views of (B, T, H, D) memory: a tile is BLOCK rows of T at column h*D)."""
    B, H, T, D2 = qc.shape
    D = v.shape[-1]
    q2, k2 = qc.reshape(B * H * T, D2), kc.reshape(B * H * T, D2)
    v2, o2 = v.transpose(1, 2).view(B * T, H * D), o.transpose(1, 2).view(B * T, H * D)
    desc = lambda x, blk: TensorDescriptor.from_tensor(x, blk, _layout(blk))
    return (desc(q2, [rows, D2]), desc(k2, [BLOCK, D2]), desc(v2, [BLOCK, D]), desc(o2, [rows, D]), lse,
            sm_scale * LOG2E, T, H)


def gluon_pope_fwd(qc, kc, v, sm_scale, variant="overlap", launcher=False):
    """o (B, H, T, D) bf16 view of (B, T, H, D) memory, lse (B, H, T) float32 in log2 units. With launcher,
    (o, lse, f): f() reruns the kernel on prebuilt arguments (for timing without the host-side set-up)."""
    B, H, T, D2 = qc.shape
    D = v.shape[-1]
    assert T % BLOCK == 0 and D2 == 2 * D and qc.is_contiguous() and kc.is_contiguous()
    if v.transpose(1, 2).stride() != (T * H * D, H * D, D, 1):
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    o = torch.empty(B, T, H, D, device=qc.device, dtype=qc.dtype).transpose(1, 2)
    lse = torch.empty(B, H, T, device=qc.device, dtype=torch.float32)
    kernel, rows, consts, opts = VARIANTS[variant]
    args = _args(qc, kc, v, o, lse, sm_scale, rows)
    f = lambda: kernel[(B * H, T // BLOCK)](*args, **consts, **opts)
    f()
    return (o, lse, f) if launcher else (o, lse)


def reference(qc, kc, v, sm_scale):
    """float64: softmax(qc kcᵀ sm_scale, causal) v, and lse = log2 sum exp2(scores * log2 e) (log2 units)."""
    q, k, vv = qc.double(), kc.double(), v.double()
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) * sm_scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ vv, lse * LOG2E


def make_inputs(B, H, T, D, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mag = lambda: torch.nn.functional.softplus(torch.randn(B, H, T, D, generator=g))
    ph = lambda: torch.rand(B, H, T, D, generator=g) * 2 * math.pi
    pol = lambda r, a: torch.cat([r * torch.cos(a), r * torch.sin(a)], -1).to(torch.bfloat16).to(device)
    v = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16).to(device).transpose(1, 2)
    return pol(mag(), ph()), pol(mag(), ph()), v


# ----------------------------------------------------------------------------------------------------------
# Checks

def check_reference():
    """CPU: the float64 reference against a naive float32 softmax attention on tiny shapes."""
    for B, H, T, D in [(1, 1, 1, 8), (2, 3, 37, 16), (1, 2, 130, 64)]:
        qc, kc, v = make_inputs(B, H, T, D, "cpu", seed=T)
        o, lse = reference(qc, kc, v, D**-0.5)
        s = (qc.float() @ kc.float().transpose(-1, -2)) * D**-0.5
        s = torch.where(torch.ones(T, T, dtype=torch.bool).tril(), s, torch.tensor(float("-inf")))
        o32, lse32 = torch.softmax(s, -1) @ v.float(), torch.log2(torch.exp(s).sum(-1))
        eo, el = (o - o32).abs().max().item(), (lse - lse32).abs().max().item()
        print(f"reference B={B} H={H} T={T} D={D}: max|o-o32|={eo:.2e} max|lse-lse32|={el:.2e}")
        assert eo < 1e-4 and el < 1e-4


def compile_only(names):
    """Compile every variant for sm_90 without a GPU (descriptors over CPU tensors give the signature)."""
    import subprocess
    import tempfile
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type
    qc, kc, v = make_inputs(1, 2, 256, 64, "cpu")
    o, lse = torch.empty_like(v), torch.empty(1, 2, 256)
    for name in names:
        kernel, rows, consts, opts = VARIANTS[name]
        try:
            args = _args(qc, kc, v, o, lse, 0.125, rows)
            sig = {k: mangle_type(a) for k, a in zip(kernel.arg_names, args)}
            consts = dict(consts, num_warps=opts["num_warps"])
            sig.update({k: "constexpr" for k in consts})
            attrs = {(kernel.arg_names.index(k), ): [["tt.divisibility", 16]] for k in ("LSE", "T")}
            ck = triton.compile(GluonASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                                options=opts)
            usage = ""
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(ck.asm["cubin"])
                f.flush()
                try:
                    out = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                                         capture_output=True, text=True).stdout
                    usage = " ".join(line.strip() for line in out.splitlines() if "REG" in line)
                except Exception as e:  # noqa: BLE001
                    usage = f"(cuobjdump: {e})"
            print(f"{name:8s} OK   shared={ck.metadata.shared} B  {usage}")
        except Exception as e:  # noqa: BLE001
            print(f"{name:8s} FAIL {type(e).__name__}: {str(e)[-2000:]}")


def main(variants):
    import datetime, os, subprocess
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
        flops = B * H * T * T * (2 * D + D)  # causal: 2 * B*H*(T*T/2) * (2D + D)
        ref = [reference(qc[:, h:h + 1], kc[:, h:h + 1], v[:, h:h + 1], sm_scale) for h in range(H)]
        ro, rl = torch.cat([r[0] for r in ref], 1), torch.cat([r[1] for r in ref], 1)
        del ref
        print(f"\n(B, H, T, D) = ({B}, {H}, {T}, {D})  [QK depth {2 * D}, PV depth {D}]")
        for name in variants:
            try:
                o, lse, f = gluon_pope_fwd(qc, kc, v, sm_scale, name, launcher=True)
                eo = (o.double() - ro).abs().max().item()
                el = (lse.double() - rl).abs().max().item()
                ms = triton.testing.do_bench(f)
                print(f"  {name:8s} o: max-abs {eo:.2e} rel {eo / ro.abs().max().item():.2e}  lse: max-abs {el:.2e}"
                      f" rel {el / rl.abs().max().item():.2e}  {ms * 1e3:8.1f} us {flops / ms * 1e-9:6.1f} TFLOP/s")
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (a device fault poisons the context: later ones fail too)
                print(f"  {name:8s} FAILED {type(e).__name__}: {str(e)[-1500:]}")
        # SDPA cannot take depth-2D q, k with depth-D v on cuDNN: time it at d = 128 for q, k and v
        q, k, vv = (torch.randn(B, H, T, 2 * D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, vv, is_causal=True)
                    ms = triton.testing.do_bench(f)
                print(f"  SDPA {backend.name} (q, k, v all d=128): {ms * 1e3:8.1f} us"
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
