"""
Benchmarks and GPU checks for the PoPE kernel and the model.

Usage:
    python bench.py kernel     # PoPE kernel vs PyTorch path, RoPE+SDPA, SDPA d=64 and d=128 (fwd, fwd+bwd eager, graphed),
                               # and each path's GPU time per CUDA kernel (torch.profiler)
    python bench.py check      # kernel forward + 4 gradients vs float64 on the GPU, bitwise determinism;
                               # the decoding kernel vs float64 at context 8k; graphed greedy decoding
                               # equals eager decoding token for token;
                               # 20 train.py steps as a CUDA graph give the eager steps' losses
    python bench.py train      # 124M training step, PoPE (kernel / PyTorch path) vs RoPE, compiled
    python bench.py sample     # decoding tok/s, 124M, PoPE vs RoPE, batch 1 and 8, context 1k and 8k:
                               # eager, CUDA graph, compiled + graph
    python bench.py sample_cli # what a user sees: fresh `python sample.py` processes, default vs --compile
    python bench.py host       # host (CPU) time per eager call and a cProfile of it: PoPE kernel fwd+bwd, decoding
    python bench.py launch     # host time of one Triton launch: Triton's JIT, the compiled kernel's runner and
                               # bare launcher, pope_kernel._run (the kernels' direct launch)
    python bench.py decode     # decode_attention's launch constants (warps, programs, tile) against its time
    python bench.py sweep      # every launch config of each attention kernel, timed at the benchmark shapes
    python bench.py ab --variant F  # pope_kernel.py against a modified copy F at 4 shapes: the forward, each config;
                                    # forward+backward as a CUDA graph, GPU µs per kernel (--parts fwd,graph)
    python bench.py tune       # each attention kernel's autotuned pick in fresh tunings, and each D=64 config's
                               # cost inside a graphed forward+backward
    python bench.py aot        # no GPU needed: compile every kernel config for sm_90; registers, spills, shared memory;
                               # whether Triton specialises the forward's warps on sm_90
    options: --json PATH (sample, sample_cli, decode, sweep: the rows as JSON), --modes eager,graph,compile (sample),
             --head_dim 32|64|128 (sweep), --variant PATH and --parts fwd,graph (ab)

Every table is printed with the GPU, torch and triton versions; RESULTS.md
quotes them with their command and date. Timings are medians of
triton.testing.do_bench (CUDA events, L2 flushed) or of CUDA-event-timed steps.
"""

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import pope_kernel as pk
import model as model_lib
from model import GPT, GPTConfig, apply_rope, pope_attention_torch, pope_delta, pope_frequencies, rope_cos_sin


@functools.lru_cache
def frequencies(D, device):  # made once, as each of model.py's layers makes its theta
    return pope_frequencies(D, device=device)


def kernel_attention(q, k, v, delta, **kw):  # what model.py runs on CUDA
    return pk.pope_attention(q, k, v, pope_delta(delta), frequencies(q.size(-1), q.device), **kw)


def torch_attention(q, k, v, delta, **kw):  # model.py's PyTorch path
    return pope_attention_torch(q, k, v, pope_delta(delta), **kw)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def inputs(B, H, Tq, Tk, D, dtype, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g) for T in (Tq, Tk, Tk))
    delta = torch.rand(H, D, device=device, generator=g) * -7.0 + 0.5  # partly outside [-2pi, 0]
    do = torch.randn(B, H, Tq, D, device=device, dtype=dtype, generator=g)
    return q, k, v, delta, do


def grads(fn, q, k, v, delta, do, dtype=None, **kw):
    xs = [x.detach().to(dtype or x.dtype).requires_grad_(True) for x in (q, k, v)]
    xs.append(delta.detach().clone().to(torch.float64 if dtype == torch.float64 else delta.dtype).requires_grad_(True))
    out = fn(*xs, **kw)
    return [out.detach()] + list(torch.autograd.grad(out, xs, do.to(out.dtype)))


def header(what):
    print(f"# {what}: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}, {time.strftime('%Y-%m-%d')}", flush=True)


# -----------------------------------------------------------------------------
# kernel correctness on the GPU

def misaligned(x):
    """x's values at an address that is not a multiple of 16 bytes (Triton compiles another kernel for it)."""
    return torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)[1:].view_as(x).copy_(x)


def via_jit(f):
    """f() with every Triton launch through Triton's JIT (pope_kernel's direct launches off)."""
    saved, pk._DIRECT = pk._DIRECT, False
    try:
        return f()
    finally:
        pk._DIRECT = saved


def check():
    """Forward and the four gradients against float64, with untuned (first)
    configs, outputs that start as NaN, and a bitwise determinism check (the
    second of two calls goes through pope_kernel's direct launches, and must
    also equal a call through Triton's JIT launch, bitwise)."""
    real_empty, real_autotune = pk._empty, pk._AUTOTUNE
    pk._empty = lambda shape, like, dtype=None: real_empty(shape, like, dtype).fill_(float("nan"))
    pk._AUTOTUNE = False
    bound = {torch.float32: (1e-5, 1e-5), torch.float16: (3e-3, 5e-3), torch.bfloat16: (1e-2, 2e-2)}
    cases = [  # B, H, Tq, Tk, D, dtype, causal, q_offset
        (2, 3, 300, 300, 64, torch.bfloat16, True, 0),
        (2, 3, 300, 300, 64, torch.float16, True, 0),
        (2, 3, 300, 300, 64, torch.float32, True, 0),
        (1, 2, 257, 257, 32, torch.bfloat16, True, 0),
        (1, 2, 257, 257, 128, torch.bfloat16, True, 0),
        (2, 2, 200, 333, 64, torch.bfloat16, False, 0),
        (2, 2, 100, 357, 64, torch.bfloat16, True, 257),
        (2, 2, 1, 1000, 64, torch.bfloat16, True, 999),
        (2, 2, 1, 1000, 128, torch.bfloat16, True, 999),
        (2, 3, 300, 300, 64, torch.bfloat16, True, 0, "misaligned q, k, v, dO"),
    ]
    header("kernel check vs float64")
    ok = True
    try:
        for B, H, Tq, Tk, D, dtype, causal, off, *note in cases:
            q, k, v, delta, do = inputs(B, H, Tq, Tk, D, dtype, seed=Tq * Tk + D)
            if note:  # (the same shape as the first case, aligned, ran already: another specialisation now)
                q, k, v, do = (misaligned(x) for x in (q, k, v, do))
            kw = dict(causal=causal, q_offset=off)
            ref = grads(torch_attention, q, k, v, delta, do, torch.float64, **kw)
            got = grads(kernel_attention, q, k, v, delta, do, **kw)
            again = grads(kernel_attention, q, k, v, delta, do, **kw)
            jit = via_jit(lambda: grads(kernel_attention, q, k, v, delta, do, **kw))
            errs = [rel(a, b) for a, b in zip(got, ref)]
            same = all(torch.equal(a, b) for a, b in zip(got, again))
            direct = all(torch.equal(a, b) for a, b in zip(again, jit))
            good = same and direct and all(e == e and e < bound[dtype][i > 0] for i, e in enumerate(errs))
            ok &= good
            print(f"{'ok ' if good else 'BAD'} B={B} H={H} Tq={Tq} Tk={Tk} D={D} {str(dtype)[6:]:8s} causal={causal:d} "
                  f"off={off}  rel err out/dq/dk/dv/ddelta "
                  + " ".join(f"{e:.1e}" for e in errs) + f"  bitwise-deterministic={same} direct==JIT-launch={direct}"
                  + (f"  ({note[0]})" if note else ""), flush=True)
    finally:
        pk._empty, pk._AUTOTUNE = real_empty, real_autotune
    return ok


# -----------------------------------------------------------------------------
# kernel speed

def bench_ms(fn, grad_to_none=None):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def graph_ms(step, leaves):
    """Median time of one CUDA graph replay of step() (warm: tuned, compiled)."""
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
    return bench_ms(graph.replay)


def peak_mb(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def gpu_kernels(step, leaves, n=10):
    """[(kernel name, GPU µs per call of step)], longest first: n profiled calls after a warm one.
    Names are cut at 40 characters (cuDNN's and cuBLAS's run long)."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            for x in leaves:
                x.grad = None
            step()
        torch.cuda.synchronize()
    events = [(e.key[:40], e.self_device_time_total / n) for e in p.key_averages() if e.self_device_time_total > 0]
    return sorted(events, key=lambda e: -e[1])


def kernel(shapes=((8, 12, 1024, 64), (2, 12, 4096, 64), (1, 12, 16384, 64))):
    dtype = torch.bfloat16
    try:  # the one published PoPE kernel, a baseline where installed (requirements-optional.txt)
        from PoPE_pytorch import flash_attn_with_pope
    except ImportError:
        flash_attn_with_pope = None
    header("attention, causal, bf16, median ms")
    if flash_attn_with_pope is None:
        print("# pope-pytorch is not installed: its rows are left out (pip install pope-pytorch==0.2.1)")
    print("# fwd+bwd twice: eager (Python, autograd and launch overhead included) and as one CUDA graph replay")
    print(f"{'path':26s} {'B,H,T,D':14s} {'fwd':>7s} {'fwd+bwd':>8s} {'graph':>7s} {'TFLOP/s':>8s} {'peak MB':>8s}")
    rows = []
    for B, H, T, D in shapes:
        q, k, v, delta, do = inputs(B, H, T, T, D, dtype, seed=T)
        q2, k2, v2, _, do2 = inputs(B, H, T, T, 2 * D, dtype, seed=T + 1)
        inv, pos = model_lib.yarn_inv_freq(D, 10000.0, 1.0, T)[0].cuda(), torch.arange(T, device="cuda")

        def rope_sdpa(q, k, v):  # RoPE as model.py runs it in training: cos and sin made, then q and k turned
            rot = rope_cos_sin(inv, pos)
            return F.scaled_dot_product_attention(apply_rope(q, *rot), apply_rope(k, *rot), v, is_causal=True)

        ref = grads(torch_attention, q, k, v, delta, do, torch.float32)
        got = grads(kernel_attention, q, k, v, delta, do)
        print(f"{'  kernel vs fp32 path':26s} {f'{B},{H},{T},{D}':14s} rel err out/dq/dk/dv/ddelta "
              + " ".join(f"{rel(a, b):.1e}" for a, b in zip(got, ref)), flush=True)
        del ref, got
        leaves = [x.requires_grad_(True) for x in (q, k, v, delta, q2, k2, v2)]
        paths = {  # name: (fn, depth of the score dot, depth of PV, dO)
            "pope kernel": (lambda: kernel_attention(q, k, v, delta), 2 * D, D, do),
            "pope torch (cart.+SDPA)": (lambda: torch_attention(q, k, v, delta), 2 * D, D, do),
            f"rope+SDPA d={D}": (lambda: rope_sdpa(q, k, v), D, D, do),
            f"SDPA d={D}": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), D, D, do),
            f"SDPA d={2 * D}": (lambda: F.scaled_dot_product_attention(q2, k2, v2, is_causal=True), 2 * D, 2 * D, do2),
        }
        if flash_attn_with_pope is not None:  # its fused Triton path; its key bias is our delta, its freqs pos * theta
            freqs = pos[:, None].float() * frequencies(D, q.device)
            paths["pope-pytorch 0.2.1"] = (lambda: flash_attn_with_pope(
                q, k, v, pos_emb=(freqs, pope_delta(delta)), causal=True, fused=True), 2 * D, D, do)
        for name, (f, dqk, dv_, g) in paths.items():
            flops = B * H * T * T * (dqk + dv_) + B * H * T * T * (3 * dqk + 2 * dv_)  # causal halves 2x
            with torch.no_grad():
                t_f = bench_ms(f)
            t_fb = bench_ms(lambda: f().backward(g), grad_to_none=leaves)
            mem = peak_mb(lambda: f().backward(g))
            t_g = graph_ms(lambda: f().backward(g), leaves)
            kernels = gpu_kernels(lambda: f().backward(g), leaves)
            for x in leaves:  # (the next path starts without gradients)
                x.grad = None
            rows.append(dict(path=name, shape=(B, H, T, D), fwd=t_f, fwdbwd=t_fb, graph=t_g, peak_mb=mem,
                             kernels=kernels))
            print(f"{name:26s} {f'{B},{H},{T},{D}':14s} {t_f:7.3f} {t_fb:8.3f} {t_g:7.3f} "
                  f"{flops / t_g * 1e-9:8.1f} {mem:8.0f}", flush=True)
        for r in rows[-len(paths):]:  # where each path's GPU time goes, kernel by kernel
            print(f"  {r['path']:24s} GPU µs per fwd+bwd: "
                  + ", ".join(f"{name} {us:.1f}" for name, us in r["kernels"]), flush=True)
        paths = leaves = q = k = v = q2 = k2 = v2 = None
        torch.cuda.empty_cache()
    return rows


def host_us(f, n, leaves=(), warmup=5):
    """Microseconds per call of f on the host, n calls queued without a sync (the GPU does not hold
    the host back while its queue has room; leaves' gradients cleared after each), and per call
    with the GPU's finish."""
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
        for x in leaves:
            x.grad = None
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def host(B=8, H=12, T=1024, D=64, n=50):
    """Host (CPU) time of one eager call, where the eager rows of `kernel` are bound: n calls
    queued without a sync (the GPU does not hold the host back while its queue has room), then
    a cProfile of the PoPE kernel's forward+backward and of eager decoding (the top entries by
    own time). The seconds do not depend on what else the GPU runs, so this may run beside
    training; the numbers are per call, in microseconds."""
    import cProfile
    import pstats
    header(f"host time per eager call, B,H,T,D = {B},{H},{T},{D}, bf16, microseconds")
    q, k, v, delta, do = inputs(B, H, T, T, D, torch.bfloat16, seed=T)
    leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
    theta, wrapped = frequencies(D, q.device), pope_delta(delta).detach().requires_grad_(True)
    inv, pos = model_lib.yarn_inv_freq(D, 10000.0, 1.0, T)[0].cuda(), torch.arange(T, device="cuda")

    def rope_sdpa():
        rot = rope_cos_sin(inv, pos)
        return F.scaled_dot_product_attention(apply_rope(q, *rot), apply_rope(k, *rot), v, is_causal=True)

    fwd_bwd = lambda f: lambda: f().backward(do)  # noqa: E731
    paths = {
        "pope kernel fwd+bwd (with pope_delta, as model.py)": fwd_bwd(lambda: kernel_attention(q, k, v, delta)),
        "pope kernel fwd+bwd (delta given bound)": fwd_bwd(lambda: pk.pope_attention(q, k, v, wrapped, theta)),
        "pope kernel fwd, no grad": lambda: pk.pope_attention(q.detach(), k.detach(), v.detach(), wrapped.detach(),
                                                              theta),
        "one Triton launch (_cartesian of k)": lambda: pk._cartesian(k.detach(), theta, wrapped.detach(), 0),
        "rope + SDPA fwd+bwd": fwd_bwd(rope_sdpa),
        "torch.empty (B,H,T,2D)": lambda: torch.empty((B, H, T, 2 * D), device="cuda", dtype=q.dtype),
    }
    for name, f in paths.items():
        us, finish = host_us(f, n, leaves + [wrapped])
        print(f"{name:52s} host {us:8.1f}   with the GPU's finish {finish:8.1f}", flush=True)
    for name in ("pope kernel fwd+bwd (with pope_delta, as model.py)",):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            paths[name]()
        prof.disable()
        torch.cuda.synchronize()
        print(f"# cProfile, {n} calls of {name}: top 30 by own time")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(30)
    paths = leaves = q = k = v = None
    models = {pe: random_gpt(pe, 1024, std=0.02).cast_weights_(torch.bfloat16) for pe in ("pope", "rope")}
    prompt = torch.randint(0, 50257, (1, 900), device="cuda")  # (bf16 weights, no autocast: sample.py's default)
    for m in models.values():
        m.generate(prompt, 3)  # (compiles the decoding kernel for this shape)
    rates, saved = {(pe, direct): [] for direct in (True, False) for pe in models}, pk._DIRECT
    for _ in range(4):  # PoPE and RoPE, pope_kernel's direct launches and Triton's JIT, in turn: the host's
        for direct in (True, False):  # speed drifts (by 2x within a minute, on an H200's host), and hits all alike
            pk._DIRECT = direct
            for pe, m in models.items():
                times = {}
                m.generate(prompt, 101, times=times)
                rates[pe, direct].append(100 / times["decode"])
    pk._DIRECT = saved
    for (pe, direct), r in rates.items():
        print(f"# eager decoding, 124M {pe}, bf16 weights, batch 1, context 1024, 100 tokens, "
              f"{'direct launches' if direct else 'JIT launches   '}, 4 turns: "
              f"{' / '.join(f'{x:.0f}' for x in r)} tok/s",
              flush=True)
    model = models["pope"]
    prof = cProfile.Profile()
    prof.enable()
    model.generate(prompt, 40)
    prof.disable()
    print("# cProfile, eager decoding of 40 tokens (one prefill): top 30 by own time")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(30)
    # the GPU's side of a one-token step (a CUDA graph replays these kernels): kernels by name, count, time
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        model.generate(prompt, 11)
    print("# CUDA kernels of eager decoding: a prefill and 10 one-token steps, totals")
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    print(f"# {sum(e.count for e in p.key_averages()) / 10:.0f} kernels per step (the prefill's included)", flush=True)


def launch(n=300):
    """Host time of one Triton launch of the PoPE kernels, five ways: through pope_kernel's wrapper (allocation
    included), through Triton's JIT launch (`kernel[grid](...)`: argument binding, specialisation key, cache
    lookup), through the compiled kernel's runner (`compiled[grid](...)`, the binding skipped), through its
    bare launcher (`compiled.run(...)` with the stream and arguments prepared once) and through pope_kernel._run,
    the kernels' launch (the bare launcher after a key of the arguments); microseconds per launch, n launches
    queued, at a shape small enough that the GPU never holds the host back."""
    import triton
    from triton import knobs
    B, H, T, D = 1, 2, 128, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    theta, delta = pope_frequencies(D, device="cuda"), torch.zeros(H, D, device="cuda")
    kc = torch.empty(B, H, T, 2 * D, device="cuda", dtype=q.dtype)
    out, lse = torch.empty_like(q), torch.empty(B, H, T, device="cuda")
    launches = {
        "key pre-pass (_cartesian_kernel)": (
            pk._cartesian_kernel, (pk._cdiv(T, pk._PREP_BLOCK_T), B * H),
            (k, kc, theta, delta, k, k, kc, *k.stride(), *k.stride(), *k.stride(), H, T, 0),
            dict(HEAD_DIM=D, BLOCK_T=pk._PREP_BLOCK_T, HAS_DELTA=True, WITH_DI=False), dict(num_warps=4)),
        "forward (_pope_fwd), 64x64/4/3": (
            pk._pope_fwd, (pk._cdiv(T, 64), B * H),
            (q, kc, v, out, lse, theta, *q.stride(), *v.stride(), *out.stride(), D ** -0.5 * 1.4426950408889634,
             H, T, T, 0, pk._bucket(T), pk._bucket(T)),
            dict(HEAD_DIM=D, BLOCK_M=64, BLOCK_N=64, CAUSAL=True, DOT_PREC="tf32"), dict(num_warps=4, num_stages=3)),
    }
    us = lambda f: host_us(f, n, warmup=10)[0]  # noqa: E731
    print(f"# host µs per launch, {n} launches queued: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    print(f"{'pope_kernel._cartesian (wrapper, allocates)':48s} {us(lambda: pk._cartesian(k, theta, delta, 0)):8.1f}")
    for name, (kernel, grid, args, consts, opts) in launches.items():
        compiled = kernel[grid](*args, **consts, **opts)
        full = list(args) + [consts[a] for a in kernel.arg_names[len(args):]]  # every parameter, constexprs too
        stream = triton.runtime.driver.active.get_current_stream(torch.cuda.current_device())
        runner = compiled[(*grid, 1)]  # (a runner takes a 3-d grid)
        bare = (grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None,
                knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full)
        print(f"{name:48s} JIT {us(lambda: kernel[grid](*args, **consts, **opts)):8.1f}   "
              f"compiled runner {us(lambda: runner(*full)):8.1f}   "
              f"bare launcher {us(lambda: compiled.run(*bare)):8.1f}   "
              f"pope_kernel._run {us(lambda: pk._run(kernel, grid, args, {**consts, **opts})):8.1f}", flush=True)
    print(f"{'torch.empty (B,H,T,2D)':48s} {us(lambda: torch.empty(B, H, T, 2 * D, device='cuda')):8.1f}")
    kernel, grid, args, consts, opts = launches["key pre-pass (_cartesian_kernel)"]  # the bare launcher's output
    compiled = kernel[grid](*args, **consts, **opts)
    torch.cuda.synchronize()
    ref = kc.clone()
    kc.zero_()
    full = list(args) + [consts[a] for a in kernel.arg_names[len(args):]]
    compiled.run(grid[0], grid[1], 1, triton.runtime.driver.active.get_current_stream(torch.cuda.current_device()),
                 compiled.function, compiled.packed_metadata, None, None, None, *full)
    torch.cuda.synchronize()
    print(f"# the bare launcher's key pre-pass output equals the JIT launch's: {torch.equal(ref, kc)}")


def kernel_variant(path, name="pope_kernel_variant"):
    """Another copy of pope_kernel.py (a variant to measure), loaded as a module of its own."""
    import importlib.util
    if not os.path.isfile(path):
        raise SystemExit(f"error: no kernel variant at {path}; give the path of a copy of pope_kernel.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ab(variant, D=64):
    """The forward (its key pre-pass included) of pope_kernel.py against a variant's (kernel_variant's module),
    each of the forward's D=64 launch configs at four shapes, in one process: median ms of both and the largest
    output difference."""
    configs = list(pk._BLOCKS["fwd"][64])
    print(f"# fwd ms (pre-pass included), pope_kernel.py vs {variant.__file__}: {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}", flush=True)
    saved = pk._AUTOTUNE, pk._BLOCKS["fwd"][64]
    for mod in (pk, variant):
        mod._AUTOTUNE = False  # _fwd launches _BLOCKS["fwd"][D][0]
    try:
        for B, T in ((8, 1024), (16, 1024), (2, 4096), (1, 16384)):
            H = 12
            q, k, v, delta, do = inputs(B, H, T, T, D, torch.bfloat16, seed=T)
            args = (q, k, v, pope_delta(delta), frequencies(D, q.device), True, D ** -0.5, 0)
            for cfg in configs:
                res = []
                for mod in (pk, variant):
                    mod._BLOCKS["fwd"][64] = [cfg]
                    out = mod._fwd(*args)[0]
                    res.append((bench_ms(lambda: mod._fwd(*args)), out))
                diff = (res[0][1].float() - res[1][1].float()).abs().max().item()
                print(f"{B},{H},{T},{D} {str(cfg):18s} pope_kernel {res[0][0]:.4f}  variant {res[1][0]:.4f}  "
                      f"ratio {res[1][0] / res[0][0]:.3f}  max|diff| {diff:.1e}", flush=True)
    finally:
        pk._AUTOTUNE, pk._BLOCKS["fwd"][64] = saved


def ab_graph(variant, D=64):
    """Forward+backward (autotuned, as a model runs it) of pope_kernel.py against a variant's, replayed as a
    CUDA graph at four shapes in one process: median ms of three timings each, taken in turn, peak MB, GPU µs
    per CUDA kernel, and whether outputs and gradients are bitwise equal (expected where both autotune to
    the same configs: another dk/dv key block sums δ's gradient in another order)."""
    print(f"# fwd+bwd graph ms, pope_kernel.py vs {variant.__file__}: {torch.cuda.get_device_name()}, torch {torch.__version__}",
          flush=True)
    for B, T in ((8, 1024), (16, 1024), (2, 4096), (1, 16384)):
        H = 12
        q, k, v, delta, do = inputs(B, H, T, T, D, torch.bfloat16, seed=T)
        leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
        theta = frequencies(D, q.device)
        mods = {"pope_kernel": pk, "variant": variant}
        steps = {n: (lambda m=m: m.pope_attention(q, k, v, pope_delta(delta), theta).backward(do))
                 for n, m in mods.items()}
        ms = {n: [] for n in mods}
        for _ in range(3):
            for n, step in steps.items():
                ms[n].append(graph_ms(step, leaves))
        outs = {}
        for n, m in mods.items():
            out = m.pope_attention(q, k, v, pope_delta(delta), theta)
            outs[n] = [out] + list(torch.autograd.grad(out, leaves, do))
        same = all(torch.equal(a, b) for a, b in zip(*outs.values()))
        med = {n: sorted(t)[1] for n, t in ms.items()}
        mb = {n: peak_mb(step) for n, step in steps.items()}
        print(f"{B},{H},{T},{D}  pope_kernel {med['pope_kernel']:.4f}  variant {med['variant']:.4f}  "
              f"ratio {med['variant'] / med['pope_kernel']:.3f}  "
              f"peak MB {mb['pope_kernel']:.0f} / {mb['variant']:.0f}  "
              f"outputs and gradients bitwise equal: {same}", flush=True)
        for n, step in steps.items():
            top = gpu_kernels(step, leaves)[:5]
            print(f"    {n:11s} GPU µs: " + ", ".join(f"{e} {t:.1f}" for e, t in top), flush=True)
        for x in leaves:
            x.grad = None


def tune(shapes=((16, 1024), (2, 4096), (1, 16384)), D=64, trials=4):
    """How stable each attention kernel's autotuned pick is, and what each of its D=64 launch configs costs
    inside a forward+backward replayed as a CUDA graph (causal, bf16, 12 heads): per shape, `trials` fresh
    tunings (Triton's disk cache off) with the pick and every config's autotuning time, then every config of
    each kernel forced in turn, the other kernels as last tuned: graph ms (median of 3), that kernel's GPU µs.
    The autotuner times a kernel by itself; in the graph it runs after the others, as in training."""
    tuners = {"fwd": pk._pope_fwd_tuned, "dkdv": pk._pope_bwd_dkdv_tuned, "dq": pk._pope_bwd_dq_tuned}
    cfg = lambda c: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa: E731
    header(f"autotuned picks and forced configs, D={D}, causal, bf16")
    for B, T in shapes:
        H = 768 // D
        q, k, v, delta, do = inputs(B, H, T, T, D, torch.bfloat16, seed=T)
        leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
        theta = frequencies(D, q.device)
        step = lambda: pk.pope_attention(q, k, v, pope_delta(delta), theta).backward(do)  # noqa: E731
        for trial in range(trials):
            for t in tuners.values():
                t.cache.clear()
                t.cache_results = False
            pk._CHOSEN.clear()
            step()
            torch.cuda.synchronize()
            for kind, t in tuners.items():
                tim = sorted((cfg(c), round(x[0] * 1000, 1)) for c, x in t.configs_timings.items())
                print(f"{B},{H},{T} trial {trial} {kind:5s} picked {cfg(t.best_config)}  timings us {tim}", flush=True)
        tuned = dict(pk._CHOSEN)
        for kind, t in tuners.items():
            key = next(kk for kk in tuned if kk[0] is t)
            name = t.fn.fn.__name__
            for bm, bn, w, st in pk._BLOCKS[kind][max(D, 64)]:
                pk._CHOSEN.clear()
                pk._CHOSEN.update(tuned)
                pk._CHOSEN[key] = {**tuned[key], "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}
                ms = sorted(graph_ms(step, leaves) for _ in range(3))[1]
                us = dict(gpu_kernels(step, leaves)).get(name, float("nan"))
                print(f"{B},{H},{T} forced {kind:5s} {(bm, bn, w, st)}  graph {ms:.4f} ms  {name} {us:.1f} us", flush=True)
        pk._CHOSEN.clear()
        pk._CHOSEN.update(tuned)
        for x in leaves:
            x.grad = None


def decode_sweep(warps=(4, 8), programs=(12, 96, 512, 1024, 2048), tiles=(4096, 8192, 16384)):
    """pope_kernel.decode_attention's launch constants (_DECODE_WARPS, _DECODE_PROGRAMS, _DECODE_TILE)
    against its time: 12 calls over 12 caches (the layers of a 124M step: the caches do not fit in L2
    together) replayed as one CUDA graph, at the last slot of the cache, per call; GB/s counts the keys
    and values read. Raw q and k (turned in the kernel) over PoPE's 128-wide Cartesian keys ("pope"),
    PoPE's 64-wide magnitudes alone ("pope-mu": the phases made in the kernel) and RoPE's 64-wide keys. A budget
    of 12 programs is one chunk at batch 1 (12 heads): no partials to merge."""
    header("decode_attention launch sweep: us per call (12 caches in a CUDA graph), GB/s of cache read")
    saved = pk._DECODE_WARPS, pk._DECODE_PROGRAMS, pk._DECODE_TILE
    print(f"{'turn':7s} {'B':>2s} {'N':>5s} {'warps':>5s} {'programs':>8s} {'tile':>6s} {'splits':>6s} "
          f"{'block_n':>7s} {'us':>8s} {'GB/s':>7s}", flush=True)
    rows = []
    try:
        for turn, B, N in [(t, B, N) for t in ("pope", "pope-mu", "rope") for B, N in ((1, 1024), (1, 8192), (8, 8192))]:
            Dk = 128 if turn == "pope" else 64
            g = torch.Generator("cuda").manual_seed(N + B)
            caches = [tuple(torch.randn(B, 12, N, d, device="cuda", generator=g).bfloat16() for d in (Dk, 64))
                      for _ in range(12)]
            q, k, v = (torch.randn(B, 12, 1, 64, device="cuda", generator=g).bfloat16() for _ in range(3))
            where = torch.tensor([N - 1], device="cuda")
            kw = dict(theta=frequencies(64, "cuda"), delta=torch.zeros(12, 64, device="cuda")) if turn != "rope" \
                else dict(inv_freq=model_lib.yarn_inv_freq(64, 10000.0, 1.0, N)[0].cuda())
            gbytes = 12 * B * 12 * N * (Dk + 64) * 2 / 1e9
            for w in warps:
                for p in programs:
                    for t in tiles:
                        pk._DECODE_WARPS, pk._DECODE_PROGRAMS, pk._DECODE_TILE = w, p, t
                        launch = pk.decode_launch(caches[0][0])

                        def step():
                            for kc, vc in caches:
                                pk.decode_attention(q, k, v, kc, vc, where, 0.125, **kw, **launch)
                        ms = graph_ms(step, [])
                        rows.append(dict(turn=turn, B=B, N=N, warps=w, programs=p, tile=t, **launch,
                                         us=ms * 1e3 / 12, gb_s=gbytes / (ms * 1e-3)))
                        print(f"{turn:7s} {B:2d} {N:5d} {w:5d} {p:8d} {t:6d} {launch['splits']:6d} "
                              f"{launch['block_n']:7d} {ms * 1e3 / 12:8.1f} {gbytes / (ms * 1e-3):7.0f}", flush=True)
            best = min((r for r in rows if (r["turn"], r["B"], r["N"]) == (turn, B, N)), key=lambda r: r["us"])
            print(f"# best {turn} B={B} N={N}: warps {best['warps']}, programs {best['programs']}, tile "
                  f"{best['tile']}: {best['us']:.1f} us, {best['gb_s']:.0f} GB/s", flush=True)
            caches = None
            torch.cuda.empty_cache()
    finally:
        pk._DECODE_WARPS, pk._DECODE_PROGRAMS, pk._DECODE_TILE = saved
    return rows


# launch configs (BLOCK_M, BLOCK_N, num_warps, num_stages) that `bench.py sweep` times, per kernel
SWEEP = {
    "fwd": [(m, n, w, s) for m in (64, 128) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)],
    "dkdv": [(m, n, w, s) for m in (16, 32, 64) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3)],
    "dq": [(m, n, w, s) for m in (32, 64, 128) for n in (16, 32, 64) for w in (4, 8) for s in (2, 3, 4)],
}


def sweep(D=64, shapes=((8, 1024), (16, 1024), (2, 4096), (1, 16384))):
    """Time every config in SWEEP for each attention kernel at each shape (causal, bf16), the
    others fixed: fwd is one forward (its key pre-pass included), dkdv and dq one backward (its
    pre-passes, the other kernel at its fixed config and the ddelta sum included), so within a
    kernel's column the differences are that kernel's. shapes are (B, T) with 768 / D heads;
    (16, 1024) at D=64 is the 124M model's step.
    Every config is compiled first, on all cores at once; a config that does not fit (shared
    memory, registers) is reported as such. Returns rows of (kernel, shape, config, ms or None)."""
    from concurrent.futures import ThreadPoolExecutor
    from triton.runtime._async_compile import AsyncCompileMode  # (Triton 3.6: parallel compilation)
    fixed = {"fwd": (64, 64, 4, 3), "dkdv": (32, 64, 4, 3), "dq": (64, 32, 4, 3)} if D <= 64 else \
        {kind: pk._BLOCKS[kind][128][0] for kind in pk._BLOCKS}
    header(f"launch config sweep, D={D}, causal, bf16, median ms (fwd: forward; dkdv, dq: backward)")
    saved = pk._AUTOTUNE, pk._launch, {kind: dict(pk._BLOCKS[kind]) for kind in pk._BLOCKS}
    pk._AUTOTUNE = False  # _fwd and _bwd launch _BLOCKS[kind][D][0]

    def use(kind, config):
        pk._BLOCKS[kind][D] = [config]

    def calls(*args):  # the (kernel, args, kwargs) of every attention launch of one forward and backward
        got = []
        pk._launch = lambda kernel, tuned, blocks, grid, a, kw, key: got.append((kernel, a, kw)) or blocks[1]
        try:
            out, lse = pk._fwd(*args[1:4], *args[4:6], True, D ** -0.5, 0)
            pk._bwd(*args, out, lse, True, D ** -0.5, 0)
        finally:
            pk._launch = saved[1]
        return got

    rows = []
    try:
        for B, T in shapes:
            H = 768 // D
            q, k, v, delta, do = inputs(B, H, T, T, D, torch.bfloat16, seed=T)
            args = (do, q, k, v, pope_delta(delta), frequencies(D, q.device))
            for kind in fixed:
                use(kind, fixed[kind])
            with AsyncCompileMode(ThreadPoolExecutor(os.cpu_count()), ignore_errors=True):
                for (kernel, a, kw), kind in zip(calls(*args), ("fwd", "dkdv", "dq")):
                    for m, n, w, st in SWEEP[kind]:
                        kernel.warmup(*a, grid=(1,), **kw, BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st)
            for kind in ("fwd", "dkdv", "dq"):
                run = ((lambda: pk._fwd(q, k, v, *args[4:], True, D ** -0.5, 0)) if kind == "fwd" else
                       (lambda: pk._bwd(*args, out, lse, True, D ** -0.5, 0)))
                out, lse = pk._fwd(q, k, v, *args[4:], True, D ** -0.5, 0)
                for config in SWEEP[kind]:
                    use(kind, config)
                    try:
                        ms = bench_ms(run)
                    except Exception as e:  # (triton's OutOfResources, or a compile that failed)
                        ms, why = None, f"{type(e).__name__}: {str(e)[:60]}"
                    rows.append(dict(kernel=kind, shape=(B, H, T, D), config=config, ms=ms))
                    print(f"{kind:5s} {f'{B},{H},{T},{D}':14s} {str(config):18s} "
                          + (f"{ms:8.4f}" if ms is not None else f"   -      {why}"), flush=True)
                use(kind, fixed[kind])
                best = min((r for r in rows if r["kernel"] == kind and r["shape"] == (B, H, T, D) and r["ms"]),
                           key=lambda r: r["ms"])
                print(f"# best {kind} at {B},{H},{T},{D}: {best['config']} {best['ms']:.4f} ms", flush=True)
            q = k = v = do = args = out = lse = None
            torch.cuda.empty_cache()
    finally:
        pk._AUTOTUNE, pk._launch = saved[:2]
        for kind, blocks in saved[2].items():
            pk._BLOCKS[kind].update(blocks)
    return rows


# -----------------------------------------------------------------------------
# model: training step and decoding

def gpt124m(pos_emb, attn_impl="auto", block_size=1024):
    return GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=block_size, pos_emb=pos_emb,
                         attn_impl=attn_impl)).cuda()


def train(steps=40, warmup=15, B=16, T=1024):
    """One optimizer step of the 124M model on random tokens, as train.py runs it
    (bf16 autocast, torch.compile, fused AdamW, grad clip), median of CUDA-event
    timed steps after warm-up; then the GPU's side of 3 more steps: its kernels by
    name, the 15 that take longest (where PoPE's extra time per step goes)."""
    from torch.profiler import ProfilerActivity, profile
    header(f"124M training step, batch {B} x {T}, compiled, bf16")
    tables = []
    for pos_emb, impl in (("rope", "auto"), ("pope", "triton"), ("pope", "torch")):
        torch.manual_seed(0)
        model = gpt124m(pos_emb, impl, T)
        opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
        step_model = torch.compile(model)
        x = torch.randint(0, 50257, (B, T), device="cuda")

        def step():
            with torch.autocast("cuda", torch.bfloat16):
                _, loss = step_model(x, x)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        times = []
        for i in range(warmup + steps):
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            loss = step()
            t1.record()
            t1.synchronize()
            if i >= warmup:
                times.append(t0.elapsed_time(t1))
        ms = sorted(times)[len(times) // 2]
        print(f"{pos_emb:5s} attn_impl={impl:7s} {ms:7.2f} ms/step  {B * T / ms * 1e3:10,.0f} tok/s  "
              f"loss {loss.item():.3f}", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        tables.append((f"{pos_emb} attn_impl={impl}", p.key_averages().table(sort_by="cuda_time_total", row_limit=15)))
        model = opt = step_model = step = None  # (freed before the next model is built)
    for name, table in tables:
        print(f"# CUDA kernels of 3 steps, {name}: the 15 longest in total\n{table}", flush=True)


def random_gpt(pos_emb, block_size, std=0.1, **kw):
    """A GPT with random weights larger than GPT-2's init, so that greedy tokens
    depend on the whole context (with std 0.02 they hardly depend on more than
    the last token, and a decoding bug could go unseen)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(pos_emb=pos_emb, block_size=block_size, pope_delta_init="uniform", **kw)).cuda().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.endswith("delta"):
                p.normal_(0.0, std)
    return model


def decode_kernel_check():
    """pope_kernel.decode_attention, the one-token step's attention, at the 124M model's shapes
    (12 heads; ready keys 128 and 64 wide; PoPE's magnitudes, raw q and k), context 8192, bf16,
    against float64: slot 0, a first chunk, the middle, the last slot. True when every relative
    error is < 1e-2."""
    ok = True
    for B, Dk in ((1, 128), (8, 64)):
        g = torch.Generator("cuda").manual_seed(Dk)
        kc, vc = (torch.randn(B, 12, 8192, d, device="cuda", generator=g).bfloat16() for d in (Dk, 64))
        errs = []
        for pos in (0, 100, 5000, 8191):
            q, k, v = (torch.randn(B, 12, 1, d, device="cuda", generator=g).bfloat16() for d in (Dk, Dk, 64))
            keys, vals = torch.cat([kc[:, :, :pos], k], 2).double(), torch.cat([vc[:, :, :pos], v], 2).double()
            ref = torch.softmax(q.double() @ keys.mT * 0.125, -1) @ vals
            errs.append(rel(pk.decode_attention(q, k, v, kc, vc, torch.tensor([pos], device="cuda"), 0.125), ref))
        good = max(errs) < 1e-2 and torch.equal(kc[:, :, 8191], k[:, :, 0]) and torch.equal(vc[:, :, 8191], v[:, :, 0])
        at = torch.tensor([5000], device="cuda")  # direct launch (the same call twice) == Triton's JIT launch
        same = torch.equal(pk.decode_attention(q, k, v, kc, vc, at, 0.125), via_jit(
            lambda: pk.decode_attention(q, k, v, kc, vc, at, 0.125)))
        ok &= good and same
        print(f"{'ok ' if good and same else 'BAD'} decode_attention B={B} H=12 N=8192 Dk={Dk} D=64 bf16 vs float64 at "
              f"pos 0, 100, 5000, 8191: rel err {', '.join(f'{e:.1e}' for e in errs)}; new k, v written; "
              f"direct == JIT launch: {same}", flush=True)
    # PoPE over a cache of magnitudes (KVCache's on the kernel): raw q and k, the score from the formula in float64
    g = torch.Generator("cuda").manual_seed(7)
    theta, delta = frequencies(64, "cuda"), -6.283 * torch.rand(12, 64, device="cuda", generator=g)
    mu, vc = F.softplus(2 * torch.randn(8, 12, 8192, 64, device="cuda", generator=g)).bfloat16(), \
        torch.randn(8, 12, 8192, 64, device="cuda", generator=g).bfloat16()
    errs = []
    for pos in (0, 100, 5000, 8191):
        q, k, v = (torch.randn(8, 12, 1, 64, device="cuda", generator=g).bfloat16() for _ in range(3))
        out = pk.decode_attention(q, k, v, mu, vc, torch.tensor([pos], device="cuda"), 0.125, theta=theta, delta=delta)
        mus = mu[:, :, :pos + 1].double()  # (slot pos now holds softplus(k), written by the call)
        phase = torch.arange(-pos, 1, device="cuda").double()[:, None] * theta.double() + delta.double()[:, None]
        a = 0.125 * (F.softplus(q.double()) * mus * torch.cos(phase)).sum(-1)
        errs.append(rel(out, torch.softmax(a, -1)[:, :, None] @ vc[:, :, :pos + 1].double()))
    good = max(errs) < 1e-2
    ok &= good
    print(f"{'ok ' if good else 'BAD'} decode_attention over PoPE magnitudes, B=8 H=12 N=8192 D=64 bf16 vs float64 "
          f"at pos 0, 100, 5000, 8191: rel err {', '.join(f'{e:.1e}' for e in errs)}", flush=True)
    # the last of a pair's chunks to finish merges them all (an atomic count says which; the merge's order is
    # fixed): a race, a partial read before it is written, would show as one call's output differing from another's
    counts, at = torch.zeros(12, dtype=torch.int32, device="cuda"), torch.tensor([8191], device="cuda")
    q, k, v = (torch.randn(1, 12, 1, 64, device="cuda", generator=g).bfloat16() for _ in range(3))
    outs = [pk.decode_attention(q, k, v, mu[:1], vc[:1], at, 0.125, theta=theta, delta=delta, counts=counts)
            for _ in range(1000)]
    differ = sum(not torch.equal(o, outs[0]) for o in outs)
    good = differ == 0 and not counts.any()
    ok &= good
    print(f"{'ok ' if good else 'BAD'} decode_attention, 1000 calls, B=1 H=12 N=8192 at the last slot "
          f"({pk.decode_launch(mu[:1])['splits']} chunks a head): {differ} outputs differ from the first; "
          f"the chunks' count back at zero: {not counts.any()}", flush=True)
    return ok


def decode_check():
    """The decoding kernel against float64 (decode_kernel_check) and, turning raw q and k, against
    the PyTorch path (a cached step's logits); then greedy decoding on a CUDA graph (and compiled)
    against eager decoding, both on that kernel, under bf16 autocast and then with the weights in bf16
    (sample.py's default): the same tokens, token for token.
    Positions run past block_size (context 2x) and past the context (each token from the last
    `context` tokens). Sampling on the graph draws only real ids."""
    header("decoding: the one-token kernel; CUDA graph vs eager, greedy, bf16 autocast and bf16 weights")
    ok = decode_kernel_check()
    for pos_emb in ("pope", "rope"):
        # std 0.3: at 0.1 PoPE's greedy bf16 output fell into a 3-id loop (H200, 2026-12-01), too weak a check
        model = random_gpt(pos_emb, 128, std=0.3, n_layer=4, n_head=4, n_embd=256, vocab_size=512)
        if not model_lib.KVCache(model, 1, 256, torch.bfloat16).kernel:
            print(f"BAD {pos_emb}: the cache does not take pope_kernel's decoding kernel", flush=True)
            ok = False
        prompt = torch.randint(0, 500, (4, 200), device="cuda", generator=torch.Generator("cuda").manual_seed(0))

        def step_logits(attn_impl, dtype):  # a 200-token prefill, then one cached step at position 200 (> block_size)
            model.config.attn_impl = attn_impl  # (KVCache reads it: "torch" keeps the PyTorch path)
            cache = model_lib.KVCache(model, 4, 256, dtype)
            with torch.autocast("cuda", dtype, enabled=dtype != torch.float32):
                model(prompt, cache=cache)
                return model(prompt[:, -1:], cache=cache)[0].float()

        # float32: the kernel computes what the PyTorch path does. bf16: this random model amplifies rounding
        # (the two bf16 paths differ by 3e-2 / 0.15, PoPE / RoPE, H200 2026-12-01), so each is held against the
        # float32 logits and the kernel may be off by at most 1.25x what the PyTorch path is off (measured 0.8-0.9x)
        ref = step_logits("torch", torch.float32)
        err32 = rel(step_logits("auto", torch.float32), ref)
        err_kernel, err_torch = (rel(step_logits(impl, torch.bfloat16), ref) for impl in ("auto", "torch"))
        model.config.attn_impl = "auto"
        good = err32 < 1e-4 and err_kernel <= 1.25 * err_torch
        ok &= good
        print(f"{'ok ' if good else 'BAD'} {pos_emb}: a cached step's logits, the kernel (q and k turned in it) vs the "
              f"PyTorch path in float32: rel err {err32:.1e} (< 1e-4 required); in bf16 against those float32 logits: "
              f"kernel {err_kernel:.1e}, PyTorch path {err_torch:.1e} (kernel <= 1.25x required)", flush=True)
        for dtype, B in (("autocast", 1), ("autocast", 4), ("bfloat16", 1), ("bfloat16", 4)):
            if dtype == "bfloat16" and B == 1:
                model.cast_weights_(torch.bfloat16)  # (in place: after the autocast runs)
            prompt = torch.randint(0, 500, (B, 100), device="cuda", generator=torch.Generator("cuda").manual_seed(B))
            with torch.autocast("cuda", torch.bfloat16, enabled=dtype == "autocast"):
                runs = {mode: model.generate(prompt, 220, temperature=0.0, vocab_size=500, context=256, mode=mode)
                        for mode in ("eager", "graph") + (("compile",) if B == 4 else ())}
                sampled = model.generate(prompt, 220, temperature=0.8, top_k=50, vocab_size=500, context=256,
                                         mode="graph")
            same = torch.equal(runs["graph"], runs["eager"])
            varied = runs["eager"][:, 100:].unique().numel()
            good = same and varied >= 5 and sampled.max().item() < 500  # (>= 5 ids: not a degenerate loop)
            ok &= good
            line = (f"{'ok ' if good else 'BAD'} {pos_emb} {dtype} B={B}: graph == eager for {B} x 220 new tokens: "
                    f"{same} ({varied} distinct ids); sampled on the graph, all ids < 500: {sampled.max().item() < 500}")
            if "compile" in runs:  # compiled kernels round differently: agreement is reported, not required
                agree = (runs["compile"] == runs["eager"]).float().mean().item()
                line += f"; compiled: tokens equal to eager {agree:.1%}"
            print(line, flush=True)
        model = None
    return ok


def train_graph_check(steps=20, device="cuda", graphed=("--cuda_graph=True",), pos_embs=("pope", "rope")):
    """train.py's optimizer step as one CUDA graph (--cuda_graph=True) against its eager
    step: `steps` steps each of a small model (2 micro-batches a step, the default dtype:
    bf16 on a GPU), from one seed on one synthetic dataset; the logged losses must agree
    to 3 decimals (|difference| < 0.001). The runs are train.py processes; device and
    graphed (the graphed run's extra flags) let a CPU test run the same comparison.
    True when every pair agrees."""
    import numpy as np
    if device == "cuda":
        header(f"training: {steps} train.py steps as a CUDA graph vs eager")
    ok = True
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "toy"))
        n = 40000  # a periodic stream with noise: the loss falls from ln(64) within the steps
        seq = (np.arange(n) % 61 + np.random.default_rng(0).integers(0, 3, n)).astype(np.uint16)
        seq[:36000].tofile(os.path.join(d, "toy", "train.bin"))
        seq[36000:].tofile(os.path.join(d, "toy", "val.bin"))
        with open(os.path.join(d, "toy", "meta.json"), "w") as f:
            json.dump({"vocab_size": 64, "dtype": "uint16"}, f)

        def losses(pos_emb, name, extra):
            out = os.path.join(d, f"{pos_emb}-{name}")
            r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"),
                                f"--data_dir={d}", "--dataset=toy", f"--out_dir={out}", f"--device={device}",
                                f"--pos_emb={pos_emb}", "--n_layer=2", "--n_head=4", "--n_embd=128", "--block_size=128",
                                "--batch_size=8", "--gradient_accumulation_steps=2", f"--max_iters={steps}",
                                f"--lr_decay_iters={steps}", "--warmup_iters=2", "--learning_rate=1e-3",
                                "--eval_iters=1", "--log_interval=1", *extra], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"BAD {pos_emb}: the {name} run failed: {r.stderr.strip()[-500:]}", flush=True)
                return []
            with open(os.path.join(out, "metrics.jsonl")) as f:
                return [rec["loss"] for rec in map(json.loads, f) if "loss" in rec]

        for pos_emb in pos_embs:
            eager, graph = losses(pos_emb, "eager", ()), losses(pos_emb, "graphed", tuple(graphed))
            diff = max((abs(a - b) for a, b in zip(eager, graph)), default=float("inf"))
            good = len(eager) == len(graph) == steps and diff < 1e-3
            ok &= good
            if eager and graph:
                print(f"{'ok ' if good else 'BAD'} {pos_emb}: {len(graph)} graphed steps vs {len(eager)} eager, losses "
                      f"{eager[0]:.3f} -> {eager[-1]:.3f}, largest |difference| {diff:.1e}", flush=True)
    return ok


def sample_bench(modes=("eager", "graph", "compile"), json_path=None, dtypes=("bfloat16", "autocast")):
    """Decoding speed of the 124M model (random weights), B = 1 and 8, PoPE and RoPE,
    at context 1024 and 8192 (block_size = context), with bf16 weights (sample.py's
    default) and with float32 weights under bf16 autocast (train.py's numerics): the
    prompt fills the context but for the new tokens, so steps run at its end.
    tok/s are new tokens of all rows per second in steady state: the decode
    time of generate(times=...), prefill and capture/compilation excluded (eager
    decoding is warmed up by a 16-token call first, for Triton's compilation)."""
    header("decoding, 124M, random weights, steady-state tok/s (all rows)")
    n_new = {"eager": 64, "graph": 128, "compile": 128}
    cols = " | ".join(f"{m} tok/s" for m in modes)
    print(f"| model | weights | context | B | prefill ms | {cols} | capture s (graph / compile) | cache bytes/token |")
    print("|---|---|---:|---:|---:|" + "---:|" * len(modes) + "---:|---:|", flush=True)
    rows, t_start = [], time.perf_counter()
    for pos_emb in ("pope", "rope"):
        for T in (1024, 8192):
            model = random_gpt(pos_emb, T, std=0.02)
            cfg = model.config
            bytes_tok = cfg.n_layer * cfg.n_embd * 2 * 2  # (PoPE on the decoding kernel: magnitudes, as RoPE's keys)
            for dtype in sorted(dtypes):  # (autocast first: the bf16 cast is in place)
                if dtype == "bfloat16":
                    model.cast_weights_(torch.bfloat16)
                for B in (1, 8):
                    row = dict(model=pos_emb, weights=dtype, context=T, batch=B, cache_bytes_per_token=bytes_tok)
                    for mode in modes:
                        n = n_new[mode]
                        prompt = torch.randint(0, 50257, (B, T - n), device="cuda")
                        times = {}
                        with torch.autocast("cuda", torch.bfloat16, enabled=dtype == "autocast"):
                            if mode == "eager":  # Triton compiles the decoding kernel at its first step for a shape
                                model.generate(prompt, 16, mode=mode)  # (graph, compile: in their capture time)
                            model.generate(prompt, n, temperature=1.0, top_k=200, vocab_size=50257, mode=mode,
                                           times=times)
                        row[f"{mode}_tok_s"] = B * (n - 1) / times["decode"]
                        row[f"{mode}_capture_s"] = times["capture"]
                        row["prefill_ms"] = times["prefill"] * 1e3
                    rows.append(row)
                    caps = " / ".join(f"{row[f'{m}_capture_s']:.1f}" for m in ("graph", "compile") if m in modes)
                    print(f"| {pos_emb} | {dtype} | {T} | {B} | {row['prefill_ms']:,.0f} | "
                          + " | ".join(f"{row[f'{m}_tok_s']:,.0f}" for m in modes)
                          + f" | {caps or '-'} | {bytes_tok:,} |", flush=True)
            model = None
            torch.cuda.empty_cache()
    print(f"# {time.perf_counter() - t_start:.0f} s", flush=True)
    write_json(json_path, "sample", rows)
    return rows


def sample_cli(json_path=None):
    """What a user sees: fresh `python sample.py` processes on a 124M checkpoint
    of random weights (one character per token id, so no tokenizer is needed),
    batch 1: the default (a CUDA graph, bf16 weights) for 200 and 1000 new tokens,
    and --compile and --dtype=autocast for 1000; wall time of the whole process
    and the rates it prints."""
    header("python sample.py in a fresh process, 124M, random weights, batch 1")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for pos_emb in ("pope", "rope"):
            model = random_gpt(pos_emb, 1024, std=0.02)
            itos = [chr(0x100 + i) for i in range(50304)]  # below the surrogates (0xD800)
            ckpt = {"model": model.state_dict(), "model_args": {**vars(model.config)}, "config": {},
                    "meta": {"vocab_size": 50257, "itos": itos}}
            torch.save(ckpt, os.path.join(d, f"{pos_emb}.pt"))
            model = None
            for n, extra in ((200, []), (1000, []), (1000, ["--compile"]), (1000, ["--dtype=autocast"])):
                t0 = time.perf_counter()
                r = subprocess.run([sys.executable, "sample.py", f"--ckpt={d}/{pos_emb}.pt", f"--max_new_tokens={n}",
                                    "--num_samples=1", "--start=" + "".join(itos[:20])] + extra,
                                   capture_output=True, text=True)
                wall = time.perf_counter() - t0
                lines = {x.split(":")[0]: x for x in r.stderr.splitlines() if ":" in x}
                row = dict(model=pos_emb, max_new_tokens=n, flags=" ".join(extra) or "(default)", wall_s=wall,
                           rc=r.returncode, **{k: lines.get(k, "") for k in ("prefill", "decode", "total")})
                rows.append(row)
                print(f"{pos_emb} --max_new_tokens={n} {row['flags']}: {wall:.1f} s wall, rc {r.returncode}\n  "
                      + "\n  ".join(row[k] for k in ("prefill", "decode", "total") if row[k])
                      + ("" if r.returncode == 0 else "\n  FAILED: " + r.stderr[-500:]), flush=True)
    write_json(json_path, "sample_cli", rows)
    return rows


def write_json(path, what, rows):
    if path:
        import triton
        info = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    date=time.strftime("%Y-%m-%d"))
        out = json.load(open(path)) if os.path.exists(path) else {}
        out[what] = dict(info, rows=rows)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, path)


# -----------------------------------------------------------------------------
# sm_90 compile report (no GPU needed)

HOPPER_SMEM = 232448  # sm_90's largest shared memory per block (227 KB, opt-in)


def _aot_compile(kernel_fn, args, kwargs, target):
    """Compile a @triton.jit kernel for `target` exactly as launching it with these
    arguments would (same signature, constexprs and 16-byte alignment attributes),
    without a GPU: Triton's own binder specialises the arguments, then ptxas runs."""
    import triton
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(target)
    kwargs = dict(kwargs, debug=False)
    bound, spec, opts = create_function_from_signature(kernel_fn.signature, kernel_fn.params, backend)(*args, **kwargs)
    options, signature, constexprs, attrs = kernel_fn._pack_args(backend, kwargs, bound, spec, opts)
    return triton.compile(ASTSource(kernel_fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def _resources(compiled):
    """Registers, stack (spills) and local memory of a compiled kernel, read from its cubin."""
    import triton
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    fields = dict(w.split(":", 1) for w in out.split() if w.split(":", 1)[0] in ("REG", "STACK", "LOCAL"))
    return {k.lower(): int(v) for k, v in fields.items()}


def _aot_row(kernel_fn, args, kwargs, target, case, config):
    """One compile's report row: the kernel, case and config, its shared memory, wgmma, registers and spills."""
    c = _aot_compile(kernel_fn, args, kwargs, target)
    return dict(kernel=kernel_fn.fn.__name__, case=case, config=config, shared=c.metadata.shared,
                wgmma="wgmma" in c.asm["ptx"], **_resources(c))


def aot_report(cases, all_configs=True, capability=90):
    """Compile every kernel that the forward and backward of each case launch, for
    an sm_<capability> GPU, on any machine (CPU tensors stand in for the GPU ones).
    With all_configs, every autotuning config of the head dim; else the launch's
    own (the first, as with POPE_AUTOTUNE=0). Returns one dict per compile."""
    import triton
    target = triton.backends.compiler.GPUTarget("cuda", capability, 64)
    rows, case = [], None

    def record(kernel_fn, args, kwargs, config):
        rows.append(_aot_row(kernel_fn, args, kwargs, target, case, config))

    def launch(kernel_fn, tuned, blocks, grid, args, kwargs, key):
        # blocks is None where the launch would autotune: then every config its autotuner would try
        configs = [blocks] if blocks else [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
                                           for c in tuned.early_config_prune(tuned.configs, {}, **kwargs)]
        for bm, bn, w, st in configs:
            record(kernel_fn, args, dict(kwargs, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st), (bm, bn, w, st))
        return configs[0][1]  # (the BLOCK_N of a launch: how many ddelta partial rows it wrote)

    class Prepass:  # stands in for _cartesian_kernel[grid](...)
        def __getitem__(self, grid):
            return lambda *args, **kwargs: record(real_prepass, args, dict(kwargs), None)

    saved = pk._launch, pk._cartesian_kernel, pk._AUTOTUNE
    real_prepass = saved[1]
    pk._launch, pk._cartesian_kernel, pk._AUTOTUNE = launch, Prepass(), all_configs
    try:
        for B, H, Tq, Tk, D, dtype, causal, q_offset in cases:
            case = f"D={D} {str(dtype)[6:]} Tq={Tq} Tk={Tk}"
            q, do = (torch.randn(B, H, Tq, D, dtype=dtype) for _ in range(2))
            k, v = (torch.randn(B, H, Tk, D, dtype=dtype) for _ in range(2))
            args = (torch.zeros(H, D), model_lib.pope_frequencies(D), causal, D ** -0.5, q_offset)
            out, lse = pk._fwd(q, k, v, *args)
            if Tq > pk._DECODE_MAX_TQ:
                pk._bwd(do, q, k, v, *args[:2], out, lse, *args[2:])
    finally:
        pk._launch, pk._cartesian_kernel, pk._AUTOTUNE = saved
    return rows


def aot_decode_report(B=1, H=12, N=8192, D=64, capability=90):
    """Compile the decoding kernels as KVCache's one-token step launches them (bf16, the 124M model's
    heads): ready 2D-wide keys, PoPE's Cartesian turn, PoPE's magnitudes alone, RoPE's turn; and one chunk
    (a 64-slot cache: the program writes the output with no partials)."""
    import triton
    target = triton.backends.compiler.GPUTarget("cuda", capability, 64)
    rows, saved = [], pk._decode_split_kernel

    class Record:  # stands in for kernel[grid](...)
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *args, **kwargs: rows.append(_aot_row(self.fn, args, kwargs, target, case, (
                kwargs.get("BLOCK_N"), kwargs.get("num_warps"))))

    pk._decode_split_kernel = Record(saved)
    theta, delta, inv = model_lib.pope_frequencies(D), torch.zeros(H, D), model_lib.yarn_inv_freq(D, 1e4, 1.0, N)[0]
    try:
        for case, Dk, kw, n in (("ready keys, 2D wide", 2 * D, {}, N), ("pope, Cartesian keys", 2 * D, dict(
                theta=theta, delta=delta), N), ("pope, magnitudes", D, dict(theta=theta, delta=delta), N),
                ("rope", D, dict(inv_freq=inv), N), ("pope, magnitudes, one chunk", D, dict(theta=theta, delta=delta),
                                                     64)):
            q = torch.zeros(B, H, 1, Dk if not kw else D, dtype=torch.bfloat16)
            kc, vc = torch.zeros(B, H, n, Dk, dtype=torch.bfloat16), torch.zeros(B, H, n, D, dtype=torch.bfloat16)
            pk.decode_attention(q, q, q[..., :D], kc, vc, torch.tensor([n - 1]), D ** -0.5, **kw)
    finally:
        pk._decode_split_kernel = saved
    return rows


def aot_warp_specialize(configs=((64, 64, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3)), D=64, capability=90):
    """Does Triton specialise warps (producer/consumer, setmaxnreg) in the forward's key loop on sm_<capability>?
    Compiles a copy of pope_kernel.py whose key loop is tl.range(..., warp_specialize=True), in each config, without
    a GPU; a failed compile's row names the compiler pass that failed (from Triton's stderr)."""
    import triton
    loop = "for start_n in range(lo_hi[0], lo_hi[1], BLOCK_N):"
    src = open(pk.__file__).read()
    i = src.index(loop, src.index("def _fwd_inner("))
    src = src[:i] + "for start_n in tl.range(lo_hi[0], lo_hi[1], BLOCK_N, warp_specialize=True):" + src[i + len(loop):]
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "pope_kernel_ws.py"), "w") as f:
            f.write(src)
        ws = kernel_variant(f.name, "pope_kernel_ws")
    calls = []
    ws._launch = lambda kernel, tuned, blocks, grid, args, kwargs, key: calls.append((kernel, args, kwargs)) or 64
    ws._cartesian = lambda x, theta, delta, pos0, o=None, do=None: x  # (the key pre-pass is not compiled here)
    B, H, T = 1, 2, 256
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.bfloat16) for _ in range(3))
    ws._fwd(q, k, v, torch.zeros(H, D), model_lib.pope_frequencies(D), True, D ** -0.5, 0)
    kernel, args, kwargs = calls[0]
    target = triton.backends.compiler.GPUTarget("cuda", capability, 32)
    print(f"# pope_kernel.py forward, key loop with warp_specialize=True, sm_{capability}, D={D} bf16 causal, "
          f"triton {triton.__version__}", flush=True)
    for bm, bn, w, st in configs:
        with tempfile.TemporaryFile("w+") as err:  # (the MLIR pass manager writes its failure to fd 2)
            sys.stderr.flush()
            fd2 = os.dup(2)
            os.dup2(err.fileno(), 2)
            try:
                c = _aot_compile(kernel, args, dict(kwargs, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st), target)
                failed = None
            except Exception as e:
                failed = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            finally:
                os.dup2(fd2, 2)
                os.close(fd2)
            err.seek(0)
            passes = sorted(set(re.findall(r"Pipeline failed while executing \[`(\w+)`", err.read())))
        if failed:
            print(f"{(bm, bn, w, st)}  failed: {failed} (failed pass: {', '.join(passes) or 'none named'})", flush=True)
        else:
            ptx = c.asm["ptx"]
            print(f"{(bm, bn, w, st)}  compiled: {_resources(c)}, shared {c.metadata.shared}, "
                  f"setmaxnreg {'setmaxnreg' in ptx}, wgmma {ptx.count('wgmma.mma_async')}", flush=True)


def aot():
    import triton
    pk._DIRECT = False  # (the reports stand in for kernel[grid](...): every launch goes that way; none runs)
    print(f"# triton {triton.__version__}, sm_90; stack = bytes of spills; shared of {HOPPER_SMEM} per block")
    for D in (64, 128):
        for r in aot_report([(1, 2, 256, 256, D, torch.bfloat16, True, 0),
                             (1, 2, 1, 256, D, torch.bfloat16, True, 255)]):
            print(f"{r['kernel']:20s} {r['case']:34s} {str(r['config']):18s} regs {r['reg']:3d} "
                  f"stack {r['stack']:4d} shared {r['shared']:6d} wgmma {r['wgmma']}", flush=True)
    for r in aot_decode_report():
        print(f"{r['kernel']:22s} {r['case']:24s} BLOCK_N, warps {str(r['config']):10s} regs {r['reg']:3d} "
              f"stack {r['stack']:4d} shared {r['shared']:6d}", flush=True)
    aot_warp_specialize()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="+", choices=["kernel", "check", "train", "sample", "sample_cli", "aot", "host",
                                                "decode", "sweep", "launch", "ab", "tune"],
                    help="one or more benchmarks, run in the order given")
    ap.add_argument("--json", default=None,
                    help="sample, sample_cli, decode, sweep: also write the rows to this JSON file")
    ap.add_argument("--head_dim", type=int, default=64, choices=[32, 64, 128], help="sweep: the head dim")
    ap.add_argument("--variant", default=None, help="ab: the path of a modified copy of pope_kernel.py")
    ap.add_argument("--parts", default="fwd,graph",
                    help="ab: fwd (the forward, each launch config) and/or graph (forward+backward as a CUDA graph)")
    ap.add_argument("--modes", default="eager,graph,compile",
                    help="sample: decoding modes to measure, comma-separated (compile takes ~15 s per row)")
    a = ap.parse_args()
    modes = tuple(a.modes.split(","))
    if not set(modes) <= {"eager", "graph", "compile"} or not modes:
        ap.error(f"--modes takes eager, graph and compile, got {a.modes!r}")
    if "ab" in a.what and not a.variant:
        ap.error("ab needs --variant PATH, a modified copy of pope_kernel.py")
    if not set(a.parts.split(",")) <= {"fwd", "graph"}:
        ap.error(f"--parts takes fwd and graph, comma-separated; got {a.parts!r}")
    for what in a.what:
        if what == "aot":
            aot()
            continue
        if not torch.cuda.is_available():
            raise SystemExit(f"error: 'bench.py {what}' needs a CUDA GPU ('bench.py aot' does not)")
        if what == "check":
            kernel_ok, decode_ok, train_ok = check(), decode_check(), train_graph_check()
            if not (kernel_ok and decode_ok and train_ok):
                raise SystemExit("error: " + " and ".join(w for w, good in (("kernel check", kernel_ok),
                                                                          ("decode check", decode_ok),
                                                                          ("train graph check", train_ok)) if not good)
                                 + " FAILED")
        if what in ("kernel", "train"):
            globals()[what]()
        if what == "sample":
            sample_bench(modes, a.json)
        if what == "sample_cli":
            sample_cli(a.json)
        if what == "host":
            host()
        if what == "decode":
            write_json(a.json, "decode", decode_sweep())
        if what == "sweep":
            write_json(a.json, "sweep", sweep(a.head_dim))
        if what == "launch":
            launch()
        if what == "tune":
            tune()
        if what == "ab":  # (the variant loaded once for both parts)
            variant = kernel_variant(a.variant)
            if "fwd" in a.parts.split(","):
                ab(variant)
            if "graph" in a.parts.split(","):
                ab_graph(variant)
