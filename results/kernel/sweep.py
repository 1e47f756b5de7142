"""Launch configs of the three training kernels at head dim D (--head_dim, 64 or 128), timed in place: each
kernel's GPU µs (torch.profiler, bench.gpu_kernels) within a bf16 causal forward+backward of pope_attention
at the 124M step's attention shapes (32k tokens: (32,H,1k), (8,H,4k), (2,H,16k); and (16,H,1k); H = 768/D
heads). A config is set for all three kernels at once where each compiles (each kernel's time is read on its
own), else for those that do; the others run _BLOCKS' first config. Configs are compiled first by parallel
worker processes (Triton's disk cache), then timed one by one. On an H200:
    PYTHONPATH=. python results/kernel/sweep.py --json F [--head_dim 128]
then --step T:tokens,... --json F (D=64, the 124M model's): bench.py train's pope-kernel row with _BLOCKS as
it is (autotuned) and with each kernel's sweep winner alone (F's "winners"), in turn, twice, in one process;
--fwd: the forward kernel's GPU µs in forward-only calls (no gradients: eval, prefill) for the configs
FWD_FIRST, at batch 1 to 16."""
import argparse
import json
import os
import subprocess
import sys

os.environ["POPE_AUTOTUNE"] = "0"  # fixed configs: _BLOCKS[kind][D][0], which this script sets
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import bench  # noqa: E402
import model  # noqa: E402
import pope_kernel as pk  # noqa: E402

KINDS = {"fwd": "_pope_fwd", "dkdv": "_pope_bwd_dkdv", "dq": "_pope_bwd_dq"}
CONFIGS = [(bm, bn, w, s) for bm in (32, 64, 128) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]
FWD_FIRST = ((64, 64, 4, 2), (128, 64, 4, 3))  # the forward's first config before and after this sweep


def setup(B, H, T, D):
    q, k, v, delta, do = bench.inputs(B, H, T, D, torch.bfloat16, seed=T)
    theta = model.pope_frequencies(D, device="cuda")
    leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
    return (lambda: pk.pope_attention(q, k, v, model.pope_delta(delta), theta).backward(do)), leaves


def use(cfgs):  # {kind: config}, the rest at DEFAULT
    for kind in KINDS:
        pk._BLOCKS[kind][D] = [cfgs.get(kind, DEFAULT[kind])]


def compile_worker(indices):  # one line of JSON per (config, kind) that compiles and runs
    step, _ = setup(2, H, 1024, D)
    for i in indices:
        for kind in KINDS:
            use({kind: CONFIGS[i]})
            try:
                step()
                torch.cuda.synchronize()
                print(json.dumps([i, kind]), flush=True)
            except Exception as e:  # out of shared memory or registers: the config is left out
                print(f"# {CONFIGS[i]} {kind}: {type(e).__name__}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", help="comma-separated config indices to compile (internal)")
    ap.add_argument("--head_dim", type=int, default=64, choices=(64, 128))
    ap.add_argument("--procs", type=int, default=14)
    ap.add_argument("--json")
    ap.add_argument("--step", help="T:tokens,... : the 124M step, _BLOCKS against the winners in --json")
    ap.add_argument("--fwd", action="store_true", help="forward-only calls, FWD_FIRST's configs")
    a = ap.parse_args()
    if a.step and a.head_dim != 64:
        ap.error("--step times the 124M model, whose head dim is 64")
    D, H = a.head_dim, 768 // a.head_dim  # the globals of use() and compile_worker(), as DEFAULT
    SHAPES = tuple((B, H, T, D) for B, T in ((16, 1024), (32, 1024), (8, 4096), (2, 16384)))
    DEFAULT = {kind: pk._BLOCKS[kind][D][0] for kind in KINDS}
    if a.worker is not None:
        compile_worker([int(i) for i in a.worker.split(",")])
        sys.exit(0)
    info = bench.header()
    if a.fwd:
        for B, T in ((1, 1024), (8, 1024), (16, 1024), (1, 4096), (8, 4096), (1, 16384), (2, 16384)):
            q, k, v, delta, _ = bench.inputs(B, H, T, D, torch.bfloat16, seed=T)
            theta = model.pope_frequencies(D, device="cuda")
            us = []
            for cfg in FWD_FIRST:
                use({"fwd": cfg})
                with torch.no_grad():
                    us.append(dict(bench.gpu_kernels(lambda: pk.pope_attention(q, k, v, delta, theta), []))
                              ["_pope_fwd"])
            print(f"{B},{H},{T},{D} forward-only _pope_fwd µs: " + ", ".join(
                f"{c} {u:.1f}" for c, u in zip(FWD_FIRST, us)) + f"; ratio {us[1] / us[0]:.3f}", flush=True)
        sys.exit(0)
    if a.step:
        winners = {kind: tuple(c) for kind, c in json.load(open(a.json))["winners"].items()}
        lists = {kind: list(pk._BLOCKS[kind][D]) for kind in KINDS}
        print(f"# A: _BLOCKS at D={D} as committed, autotuned {lists}\n# B: the sweep's winners {winners}")
        B_ = {k: [winners[k]] for k in KINDS}
        for spec in a.step.split(","):
            T, tokens = (int(x) for x in spec.split(":"))
            for rep in range(2):
                for name, tuned, blocks in (("A", True, lists), ("B", False, B_)):
                    pk._AUTOTUNE = tuned
                    for kind in KINDS:
                        pk._BLOCKS[kind][D] = list(blocks[kind])
                    print(f"# {name} (run {rep + 1})", flush=True)
                    bench.train(T, tokens, ["pope-kernel"])
        sys.exit(0)
    print(f"# configs (BLOCK_M, BLOCK_N, warps, stages): {len(CONFIGS)} a kernel; defaults {DEFAULT}")
    procs = [subprocess.Popen([sys.executable, __file__, "--head_dim", str(D), "--worker",
                               ",".join(str(i) for i in range(p, len(CONFIGS), a.procs))],
                              stdout=subprocess.PIPE, text=True) for p in range(a.procs)]
    ok = set()
    for p in procs:
        try:
            out, _ = p.communicate(timeout=420)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        ok |= {tuple(json.loads(line)) for line in out.splitlines() if line.startswith("[")}
    print(f"# compiled and ran: {len(ok)} of {3 * len(CONFIGS)} (config, kernel) pairs", flush=True)
    rows = []
    for B, H, T, D in SHAPES:
        step, leaves = setup(B, H, T, D)
        for i, cfg in enumerate(CONFIGS):
            kinds = [kind for kind in KINDS if (i, kind) in ok]
            if not kinds:
                continue
            use({kind: cfg for kind in kinds})
            try:
                us = dict(bench.gpu_kernels(step, leaves, n=5))
            except Exception as e:
                print(f"# {cfg} at {B},{H},{T},{D}: {type(e).__name__}", flush=True)
                continue
            for kind in kinds:
                rows.append(bench.row("{shape:16s} {kind:5s} {cfg:18s} {us:9.1f}", shape=f"{B},{H},{T},{D}",
                                      kind=kind, cfg=str(cfg), us=us[KINDS[kind]]))
        del step, leaves
        torch.cuda.empty_cache()
    winners = {}
    shapes = [f"{B},{H},{T},{D}" for B, H, T, D in SHAPES]
    print("# per kernel, the 8 configs of least summed slowdown over the shapes (1.000 = the best at each): "
          + " ".join(shapes))
    for kind in KINDS:
        best = {s: min(r["us"] for r in rows if r["kind"] == kind and r["shape"] == s) for s in
                {r["shape"] for r in rows}}
        score = {}
        for r in rows:
            if r["kind"] == kind:
                score.setdefault(r["cfg"], {})[r["shape"]] = r["us"] / best[r["shape"]]
        full = {c: v for c, v in score.items() if len(v) == len(best)}
        ranked = sorted(full, key=lambda c: sum(full[c].values()))
        winners[kind] = CONFIGS[[str(c) for c in CONFIGS].index(ranked[0])]
        for c in ranked[:8] + [str(DEFAULT[kind])]:
            print(f"{kind:5s} {c:18s} " + " ".join(f"{full.get(c, {}).get(s, float('nan')):.3f}"
                                                     for s in shapes), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(header=info, rows=rows, winners=winners), f, indent=1)
