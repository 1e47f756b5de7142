"""
Benchmarks of the PoPE kernel and the model on one CUDA GPU (the GPU correctness checks:
tests/test_gpu.py).

    python bench.py kernel
        causal bf16 attention, (B,H,T,D) = (8,12,1k,64), (2,12,4k,64) and (1,12,16k,64): fwd,
        fwd+bwd eager and as a CUDA graph, TFLOP/s, peak memory, GPU time per CUDA kernel; the PoPE
        kernel, PoPE's PyTorch path, RoPE+SDPA, SDPA d=64, d=128
    python bench.py train --block_size 4096
        the 124M training step, compiled, bf16, 32k tokens a step: RoPE, PoPE on the kernel and on
        the PyTorch path; median ms/step of iterations 20-39, peak memory
    python bench.py sample
        decoding tok/s of the 124M model (bf16 weights as sample.py's), PoPE and RoPE, batch 1 and
        8, context 1k and 8k, eager, graphed

Every job prints a header (commit and whether the tree is dirty, GPU, torch and triton versions,
date, the command); --json PATH also writes the header and the rows as JSON. RESULTS.md quotes the
tables with it.
"""

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import pope_kernel as pk
from model import (GPT, GPTConfig, apply_rope, cuda_graph, pope_attention_torch, pope_delta,
                   pope_frequencies, rope_cos_sin, yarn_inv_freq)
from prepare.common import write_json

ROOT = os.path.dirname(os.path.abspath(__file__))


def header():
    """Where and what ran: printed as '# key: value' lines, and the JSON's "header"."""
    def git(*args):
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip()
    # POPE_COMMIT / POPE_DIRTY where the tree is a copy whose .git may be stale (results/setup.sh)
    info = dict(commit=os.environ.get("POPE_COMMIT") or git("rev-parse", "HEAD"),
                dirty=(os.environ.get("POPE_DIRTY")
                       or ("yes" if git("status", "--porcelain", "-uno") else "no")),
                gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                command=" ".join(["python", os.path.basename(sys.argv[0])] + sys.argv[1:]))
    for k, v in info.items():
        print(f"# {k}: {v}", flush=True)
    return info


def row(fmt, **r):  # print one table row, return it for the JSON
    print(fmt.format(**r), flush=True)
    return r


# -----------------------------------------------------------------------------
# kernel: attention alone

def inputs(B, H, T, D, dtype, seed):
    """(B, H, T, D) views of (B, T, H, D) memory, as model.py's q, k, v and dO are (the kernel's
    gradients come back laid out so: contiguous leaves would add autograd's copy into their layout
    to each backward)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
                   for _ in range(4))
    delta = torch.rand(H, D, device="cuda", generator=g) * -7.0 + 0.5  # partly outside [-2pi, 0]
    return q, k, v, delta, do


def graph_ms(step, leaves):
    """Median time of one CUDA graph replay of step() (warm: tuned, compiled), L2 flushed between
    replays."""
    def fresh_step():  # the leaves' gradients made anew each call, as in training
        for x in leaves:
            x.grad = None
        step()
    return do_bench(cuda_graph(fresh_step, warmup=2)[0], warmup=25, rep=100, return_mode="median")


def peak_mb(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def gpu_kernels(step, leaves, n=10):
    """[(CUDA kernel name cut at 40 characters, GPU µs per call of step)], longest first."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            for x in leaves:
                x.grad = None
            step()
        torch.cuda.synchronize()
    events = [(e.key[:40], e.self_device_time_total / n) for e in p.key_averages()
              if e.self_device_time_total > 0]
    return sorted(events, key=lambda e: -e[1])


def rel_errors(attention, q, k, v, delta, do):
    """Relative errors of attention(q, k, v, delta)'s output and gradients (dq, dk, dv, ddelta)
    against model.py's PyTorch path in float32."""
    xs = [x.detach().float().requires_grad_(True) for x in (q, k, v, delta)]
    ref = pope_attention_torch(*xs[:3], pope_delta(xs[3]))
    ref = [ref] + list(torch.autograd.grad(ref, xs, do.float()))
    xs = [x.detach().clone().requires_grad_(True) for x in (q, k, v, delta)]
    got = attention(*xs)
    got = [got] + list(torch.autograd.grad(got, xs, do))
    return [((a.double() - b.double()).norm() / b.double().norm()).item() for a, b in zip(got, ref)]


def kernel(shapes=((8, 12, 1024, 64), (2, 12, 4096, 64), (1, 12, 16384, 64))):
    try:  # the one published PoPE kernel, a baseline where installed
        from PoPE_pytorch import flash_attn_with_pope
    except ImportError:
        flash_attn_with_pope = None
        print("# pope-pytorch is not installed: its rows are left out "
              "(pip install pope-pytorch==0.2.1)")
    print("# causal bf16 attention, median ms; fwd+bwd eager (host time included) and as one "
          "CUDA graph replay; TFLOP/s of the graph")
    fmt = ("{path:26s} {shape:14s} {fwd:7.3f} {fwdbwd:8.3f} {graph:7.3f} {tflops:8.1f} "
           "{peak_mb:8.0f}")
    print(f"{'path':26s} {'B,H,T,D':14s} {'fwd':>7s} {'fwd+bwd':>8s} {'graph':>7s} {'TFLOP/s':>8s} "
          f"{'peak MB':>8s}")
    rows = []
    for B, H, T, D in shapes:
        q, k, v, delta, do = inputs(B, H, T, D, torch.bfloat16, seed=T)
        q2, k2, v2, _, do2 = inputs(B, H, T, 2 * D, torch.bfloat16, seed=T + 1)
        theta, pos = pope_frequencies(D, device="cuda"), torch.arange(T, device="cuda")
        inv = yarn_inv_freq(D, 10000.0, 1.0, T)[0].cuda()

        def kernel_attention(q, k, v, delta):  # what model.py runs on CUDA
            return pk.pope_attention(q, k, v, pope_delta(delta), theta)

        # RoPE as model.py runs it in training: cos and sin made, then q and k turned
        def rope_sdpa(q, k, v):
            rot = rope_cos_sin(inv, pos)
            return F.scaled_dot_product_attention(apply_rope(q, *rot), apply_rope(k, *rot), v,
                                                  is_causal=True)

        errs = rel_errors(kernel_attention, q, k, v, delta, do)
        print(f"  kernel vs fp32 PyTorch path, {B},{H},{T},{D}: rel err out/dq/dk/dv/ddelta "
              + " ".join(f"{e:.1e}" for e in errs), flush=True)
        leaves = [x.requires_grad_(True) for x in (q, k, v, delta, q2, k2, v2)]
        paths = {  # name: (fn, depth of the score dot, depth of PV, dO)
            "pope kernel": (lambda: kernel_attention(q, k, v, delta), 2 * D, D, do),
            "pope torch (cart.+SDPA)": (lambda: pope_attention_torch(q, k, v, pope_delta(delta)),
                                        2 * D, D, do),
            f"rope+SDPA d={D}": (lambda: rope_sdpa(q, k, v), D, D, do),
            f"SDPA d={D}": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                            D, D, do),
            f"SDPA d={2 * D}": (lambda: F.scaled_dot_product_attention(q2, k2, v2, is_causal=True),
                                2 * D, 2 * D, do2),
        }
        # its fused path: its key bias our delta, its freqs pos * theta
        if flash_attn_with_pope is not None:
            paths["pope-pytorch 0.2.1"] = (lambda: flash_attn_with_pope(
                q, k, v, pos_emb=(pos[:, None].float() * theta, pope_delta(delta)),
                causal=True, fused=True),
                2 * D, D, do)
        for name, (f, dqk, dpv, g) in paths.items():
            # fwd + bwd, causal
            flops = B * H * T * T * (dqk + dpv) + B * H * T * T * (3 * dqk + 2 * dpv)
            with torch.no_grad():
                t_f = do_bench(f, warmup=25, rep=100, return_mode="median")
            t_fb = do_bench(lambda: f().backward(g), warmup=25, rep=100, grad_to_none=leaves,
                            return_mode="median")
            mem = peak_mb(lambda: f().backward(g))
            t_g = graph_ms(lambda: f().backward(g), leaves)
            kernels = gpu_kernels(lambda: f().backward(g), leaves)
            for x in leaves:  # (the next path starts without gradients)
                x.grad = None
            rows.append(row(fmt, path=name, shape=f"{B},{H},{T},{D}", fwd=t_f, fwdbwd=t_fb,
                            graph=t_g, tflops=flops / t_g * 1e-9, peak_mb=mem, kernels=kernels))
        for r in rows[-len(paths):]:  # where each path's GPU time goes, kernel by kernel
            print(f"  {r['path']:24s} GPU µs per fwd+bwd: "
                  + ", ".join(f"{n} {us:.1f}" for n, us in r["kernels"]), flush=True)
        paths = leaves = q = k = v = q2 = k2 = v2 = None
        torch.cuda.empty_cache()
    return rows


# -----------------------------------------------------------------------------
# train: the 124M model's optimizer step

def train(block_size, tokens=32768, paths=("rope", "pope-kernel", "pope-torch"), profile=False,
          iters=40, timed_from=20):
    """One optimizer step of the 124M model on random tokens as train.py runs it (bf16 autocast,
    torch.compile, fused AdamW, grad clip), batch tokens // block_size; every iteration timed with
    CUDA events, the median of iterations timed_from.. reported, with the peak memory allocated and
    reserved, and each step's host time to enqueue it (host_ms: as long as its times_ms, the GPU
    waited on the host); profile: then the 15 CUDA kernels that take longest in 3 more steps (where
    a path's time goes)."""
    B = max(1, tokens // block_size)
    print(f"# 124M training step, batch {B} x {block_size}, compiled, bf16 autocast; "
          f"median ms of iterations {timed_from}-{iters - 1}")
    impls = {"rope": ("rope", "auto"), "pope-kernel": ("pope", "triton"),
             "pope-torch": ("pope", "torch"), "pope-auto": ("pope", "auto")}
    fmt = ("{path:12s} {ms:9.2f} ms/step {tok_s:12,.0f} tok/s  peak {peak_alloc_gb:5.1f} GB "
           "allocated, {peak_reserved_gb:5.1f} GB reserved  loss {loss:.3f}")
    rows = []
    for path in paths:
        pos_emb, impl = impls[path]
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=block_size,
                              pos_emb=pos_emb, attn_impl=impl)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                fused=True)
        compiled = torch.compile(model)
        x = torch.randint(0, 50257, (B, block_size), device="cuda",
                          generator=torch.Generator("cuda").manual_seed(0))
        torch.cuda.reset_peak_memory_stats()
        times, host = [], []

        def step():
            with torch.autocast("cuda", torch.bfloat16):
                _, loss = compiled(x, x)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        for _ in range(iters):
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            h0 = time.perf_counter()
            t0.record()
            loss = step()
            t1.record()
            host.append((time.perf_counter() - h0) * 1e3)
            t1.synchronize()
            times.append(t0.elapsed_time(t1))
        ms = statistics.median(times[timed_from:])
        tok_s = B * block_size / ms * 1e3
        rows.append(row(fmt, path=path, batch=B, block_size=block_size, ms=ms, tok_s=tok_s,
                        peak_alloc_gb=torch.cuda.max_memory_allocated() / 2**30, loss=loss.item(),
                        peak_reserved_gb=torch.cuda.max_memory_reserved() / 2**30,
                        times_ms=times, host_ms=host))
        if profile:
            from torch.profiler import ProfilerActivity, profile as profiler
            with profiler(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
            print(f"# {path}: CUDA kernels of 3 steps, the 15 longest in total\n"
                  + p.key_averages().table(sort_by="cuda_time_total", row_limit=15), flush=True)
        model = opt = compiled = loss = step = None  # (freed before the next model is built)
        torch.cuda.empty_cache()
    return rows


# -----------------------------------------------------------------------------
# sample: decoding speed

def sample(contexts=(1024, 8192), batches=(1, 8), modes=("eager", "graph"), short=16, long=144):
    """Decoding speed of the 124M model (random weights, bf16 as sample.py casts them): tok/s of new
    tokens of all rows in steady state, B * (long - short) / (time of generate(long) - time of
    generate(short)), both from the same prompt that fills the context but for the new tokens
    (prefill and graph capture cancel out); a warm-up call first (Triton compiles the decoding
    kernel at its first step)."""
    print(f"# decoding, 124M, random weights in bf16; steady-state tok/s (all rows): "
          f"B x {long - short} tokens over the time of generate({long}) - generate({short})")
    fmt = "{model:5s} context {context:5d} batch {batch:2d} {mode:6s} {tok_s:10,.0f} tok/s"
    rows = []
    for pos_emb in ("pope", "rope"):
        for T in contexts:
            torch.manual_seed(0)
            model = GPT(GPTConfig(pos_emb=pos_emb, block_size=T))
            model = model.cuda().eval().cast_weights_(torch.bfloat16)
            for B in batches:
                prompt = torch.randint(0, 50257, (B, T - long), device="cuda",
                                       generator=torch.Generator("cuda").manual_seed(B))
                for mode in modes:
                    def run(n):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        model.generate(prompt, n, temperature=1.0, top_k=200, vocab_size=50257,
                                       mode=mode)
                        torch.cuda.synchronize()
                        return time.perf_counter() - t0
                    run(short)  # (warm-up)
                    dt = run(long) - run(short)
                    rows.append(row(fmt, model=pos_emb, context=T, batch=B, mode=mode,
                                    tok_s=B * (long - short) / dt))
            model = None
            torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="job", required=True)
    jobs = {"kernel": sub.add_parser("kernel",
                                     help="the attention kernel against SDPA and PyTorch paths"),
            "train": sub.add_parser("train",
                                    help="the 124M compiled training step, 32k tokens a step"),
            "sample": sub.add_parser("sample",
                                     help="decoding tok/s of the 124M model, eager and graphed")}
    for p in jobs.values():
        p.add_argument("--json", metavar="PATH",
                       help="also write the header and the rows to PATH as JSON")
    jobs["train"].add_argument("--block_size", type=int, default=1024, help="the context T")
    jobs["train"].add_argument("--tokens", type=int, default=32768,
                               help="tokens a step: batch tokens // T")
    jobs["train"].add_argument("--profile", action="store_true",
                               help="the longest CUDA kernels of each path")
    jobs["train"].add_argument(
        "--paths", default="rope,pope-kernel,pope-torch",
        help="comma-separated, among rope, pope-kernel, pope-torch, pope-auto")
    a = ap.parse_args()
    paths = a.paths.split(",") if a.job == "train" else []
    if not set(paths) <= {"rope", "pope-kernel", "pope-torch", "pope-auto"}:
        ap.error(f"--paths takes rope, pope-kernel, pope-torch and pope-auto; got {a.paths!r}")
    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        ap.error(f"--json {a.json}: no such folder")
    if not torch.cuda.is_available():
        sys.exit(f"error: bench.py {a.job} needs a CUDA GPU")
    info = header()
    rows = dict(kernel=kernel, sample=sample,
                train=lambda: train(a.block_size, a.tokens, paths, a.profile))[a.job]()
    if a.json:
        write_json(a.json, dict(header=info, rows=rows))
