"""
The attention kernel against its speed and memory targets, as a markdown table, read from the raw outputs of one
set of H200 runs: `bench.py kernel` (graph, eager, peak memory per path and shape), `bench.py train` (the 124M
step), `bench.py host` (host time per eager call) and `bench.py check` (bitwise-deterministic gradients). Ratios
are computed here from the printed numbers; nothing is measured.

Usage:
    python results/kernel/targets.py > results/kernel/targets.md
    python results/kernel/targets.py --before results/kernel/bench-kernel-ab-before.txt   # also: graph ms before
"""
import argparse
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--kernel", default=os.path.join(HERE, "bench-kernel.txt"), help="bench.py kernel's output")
ap.add_argument("--train", default=os.path.join(HERE, "..", "train_speed", "bench-train-profile.log"),
                help="bench.py train's output")
ap.add_argument("--host", default=os.path.join(HERE, "bench-host-tuned.log"), help="bench.py host's output")
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

print("| target | (B,H,T,d) | measured | ratio | met |")
print("|---|---|---|---:|---|")
for s in shapes:
    ours, sdpa = k["pope kernel", s][2], k["SDPA d=128", s][2]
    was = f" (before: {before['pope kernel', s][2]:.3f})" if before else ""
    print(f"| fwd+bwd graph ≤ SDPA d=128 graph | {s} | {ours:.3f}{was} vs {sdpa:.3f} ms | {ours / sdpa:.2f} | "
          f"{'yes' if ours <= sdpa else 'no'} |")
for s in shapes:  # (bench.py kernel outputs before 2026-12-02 have no SDPA d=64 row)
    if ("SDPA d=64", s) in k:
        ours, sdpa = k["pope kernel", s][2], k["SDPA d=64", s][2]
        print(f"| fwd+bwd graph ≤ 1.4× SDPA d=64 graph | {s} | {ours:.3f} vs {sdpa:.3f} ms | {ours / sdpa:.2f} | "
              f"{'yes' if ours <= 1.4 * sdpa else 'no'} |")
for s in shapes:
    ours, rope = k["pope kernel", s][2], k["rope+SDPA d=64", s][1]
    print(f"| fwd+bwd graph ≤ eager RoPE + SDPA | {s} | {ours:.3f} vs {rope:.3f} ms | {ours / rope:.2f} | "
          f"{'yes' if ours <= rope else 'no'} |")
for s in shapes:
    ours, rope = k["pope kernel", s][1], k["rope+SDPA d=64", s][1]
    print(f"| eager fwd+bwd ≤ eager RoPE + SDPA | {s} | {ours:.3f} vs {rope:.3f} ms | {ours / rope:.2f} | "
          f"{'yes' if ours <= rope else 'no'} |")
s = shapes[0]
print(f"| eager minus graph ≤ 0.2 ms | {s} | {k['pope kernel', s][1] - k['pope kernel', s][2]:.3f} ms | – | "
      f"{'yes' if k['pope kernel', s][1] - k['pope kernel', s][2] <= 0.2 else 'no'} |")
pope_host = need(host, "pope kernel fwd+bwd (with pope_delta, as model.py)", a.host, "bench.py host")
rope_host = need(host, "rope + SDPA fwd+bwd", a.host, "bench.py host")
print(f"| host time of an eager fwd+bwd ≤ 0.2 ms | {s} | {pope_host:.1f} µs (RoPE + SDPA {rope_host:.1f}) | "
      f"{pope_host / rope_host:.2f} of RoPE's | {'yes' if pope_host <= 200 else 'no'} |")
r = need(step, "rope  attn_impl=auto", a.train, "bench.py train")
p = need(step, "pope  attn_impl=triton", a.train, "bench.py train")
print(f"| 124M step ≤ 1.05× RoPE | 16 × 1024 | {p:.2f} vs {r:.2f} ms | {p / r:.3f} | {'yes' if p <= 1.05 * r else 'no'} |")
for s in shapes:
    ours, rope = k["pope kernel", s][3], k["rope+SDPA d=64", s][3]
    print(f"| peak memory ≤ RoPE + SDPA's | {s} | {ours:.0f} vs {rope:.0f} MB | {ours / rope:.2f} | "
          f"{'yes' if ours <= rope else 'no'} |")
print(f"| bitwise-deterministic gradients | bench.py check | {det[0]} of {det[1]} cases | – | "
      f"{'yes' if det[0] == det[1] and det[1] else 'no'} |")
