"""
The attention kernel against its speed and memory targets, as a markdown table, read from the raw outputs of one
set of H200 runs: `bench.py kernel` (graph, eager, peak memory per path and shape), `bench.py train` (the 124M
step), `bench.py host` (host time per eager call) and `bench.py check` (bitwise-deterministic gradients). Ratios
are computed here from the printed numbers; nothing is measured.

Usage (RESULTS.md's targets table: python results/summarize.py --write runs the second line):
    python results/kernel/targets.py
    python results/kernel/targets.py --before results/kernel/bench-kernel-swept.txt   # also: graph ms before
"""
import argparse
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--kernel", default=os.path.join(HERE, "bench-kernel.txt"), help="bench.py kernel's output")
ap.add_argument("--train", default=os.path.join(HERE, "..", "train_speed", "bench-train-v3.log"),
                help="bench.py train's output")
ap.add_argument("--host", default=os.path.join(HERE, "bench-host-direct.log"), help="bench.py host's output")
ap.add_argument("--check", default=os.path.join(HERE, "check.txt"), help="bench.py check's output")
ap.add_argument("--before", default=None, help="an earlier bench.py kernel output: its graph ms in a column")
a = ap.parse_args()


def kernel_rows(path):
    """{(path name, shape): (fwd, eager fwd+bwd, graph, peak MB)} from bench.py kernel's table lines."""
    rows = {}
    for line in open(path):
        m = re.match(r"(pope kernel|rope\+SDPA d=64|SDPA d=64|SDPA d=128)\s+(\d+,\d+,\d+,\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                     r"\s+[\d.]+\s+(\d+)\s*$", line)
        if m:
            rows[m[1], m[2]] = tuple(float(x) for x in m.groups()[2:])
    if not rows:
        raise SystemExit(f"error: no kernel table rows in {path}; give bench.py kernel's output")
    return rows


def need(table, key, path, command):
    if key not in table:
        raise SystemExit(f"error: no '{key}' line in {path}; give {command}'s output")
    return table[key]


k = kernel_rows(a.kernel)
before = kernel_rows(a.before) if a.before else {}
shapes = [s for (name, s) in k if name == "pope kernel"]
step = {m[1]: float(m[2]) for m in re.finditer(r"^(\w+\s+attn_impl=\w+)\s+([\d.]+) ms/step", open(a.train).read(), re.M)}
host = {m[1].strip(): float(m[2]) for m in re.finditer(r"^(.+?)\s+host\s+([\d.]+)", open(a.host).read(), re.M)}
check = open(a.check).read()
det = (check.count("bitwise-deterministic=True"), check.count("bitwise-deterministic="))

EAGER, GRAPH, PEAK = 1, 2, 3  # columns of kernel_rows' tuples


def row(target, where, measured, ratio, met):
    print(f"| {target} | {where} | {measured} | {ratio} | {'yes' if met else 'no'} |")


def against(target, column, ref, ref_column, bound=1.0, unit="ms", digits=3, optional=False, with_before=False):
    """One row per shape: the kernel's column against ref's, met at or under bound times ref's
    (with_before: also the kernel's number in --before's table)."""
    for s in shapes:
        if optional and (ref, s) not in k:
            continue
        ours, other = k["pope kernel", s][column], need(k, (ref, s), a.kernel, "bench.py kernel")[ref_column]
        was = f" (before: {before['pope kernel', s][column]:.{digits}f})" if before and with_before else ""
        row(target, s, f"{ours:.{digits}f}{was} vs {other:.{digits}f} {unit}", f"{ours / other:.2f}",
            ours <= bound * other)


print("| target | (B,H,T,d) | measured | ratio | met |")
print("|---|---|---|---:|---|")
against("fwd+bwd graph ≤ SDPA d=128 graph", GRAPH, "SDPA d=128", GRAPH, with_before=True)
# (older bench.py kernel outputs have no SDPA d=64 row)
against("fwd+bwd graph ≤ 1.4× SDPA d=64 graph", GRAPH, "SDPA d=64", GRAPH, bound=1.4, optional=True)
against("fwd+bwd graph ≤ eager RoPE + SDPA", GRAPH, "rope+SDPA d=64", EAGER)
against("eager fwd+bwd ≤ eager RoPE + SDPA", EAGER, "rope+SDPA d=64", EAGER)
s = shapes[0]
excess = k["pope kernel", s][EAGER] - k["pope kernel", s][GRAPH]
row("eager minus graph ≤ 0.2 ms", s, f"{excess:.3f} ms", "–", excess <= 0.2)
pope_host = need(host, "pope kernel fwd+bwd (with pope_delta, as model.py)", a.host, "bench.py host")
rope_host = need(host, "rope + SDPA fwd+bwd", a.host, "bench.py host")
row("host time of an eager fwd+bwd ≤ 0.2 ms", s, f"{pope_host:.1f} µs (RoPE + SDPA {rope_host:.1f})",
    f"{pope_host / rope_host:.2f} of RoPE's", pope_host <= 200)
r = need(step, "rope  attn_impl=auto", a.train, "bench.py train")
p = need(step, "pope  attn_impl=triton", a.train, "bench.py train")
row("124M step ≤ 1.05× RoPE", "16 × 1024", f"{p:.2f} vs {r:.2f} ms", f"{p / r:.3f}", p <= 1.05 * r)
against("peak memory ≤ RoPE + SDPA's", PEAK, "rope+SDPA d=64", PEAK, unit="MB", digits=0)
row("bitwise-deterministic gradients", "bench.py check", f"{det[0]} of {det[1]} cases", "–",
    det[0] == det[1] and det[1])
