r"""
Perplexity against context length: does a model trained at context T still predict well at 2T ..
10T? For PoPE, RoPE and RoPE+YaRN checkpoints; tables on stdout (perplexity by length, ending with
the longest length's change against the shortest's, and NLL by position), every number in --json,
a PNG with --plot.

Usage:
  python eval_extrapolation.py --ckpt out-pope/ckpt.pt out-rope/ckpt.pt --yarn \
      --data data/openwebtext/val.bin
  python eval_extrapolation.py --ckpt A.pt B.pt --labels PoPE,RoPE --data pg.jsonl \
      --json r.json --plot r.png
  python eval_extrapolation.py --ckpt out-rope/ckpt.pt --data hf:pg19 --lengths 1024,4096 \
      --yarn_scale 4

Scored tokens: the same B targets t_1 .. t_B at every length, B the largest multiple of the longest
length within --max_tokens and the data. At length L the first B + 1 tokens are cut into windows of
L from the start (no overlap), the last one shorter (B mod L tokens) where L does not divide B. Each
window is scored at every position; the NLL by position bucket comes from the same windows. The
attention code is the checkpoint's (its attn_impl) unless --attn_impl is given.
"""

import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from model import CheckpointError, load_checkpoint
from prepare.common import (AT_LEAST_1, DEVICE_RULE, KERNEL_RULE, PrepareError, check_flags,
                            check_kernel, check_outputs, die, load_meta, output_file, read_tokens,
                            resolve_device, run_main, vocab_key, write_json)

DEFAULT_MAX_TOKENS = 1 << 20  # default cap on the scored tokens per length
FLAGS = {**dict.fromkeys(("max_tokens", "bucket_size", "batch_tokens", "batch_size"), AT_LEAST_1),
         "yarn_scale": (lambda v, a: 1 <= v < math.inf, ">= 1 and finite"), "device": DEVICE_RULE,
         "attn_impl": KERNEL_RULE}  # flag: (rule, what it must be), as train.py's RULES


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--ckpt", nargs="+", required=True, help="one or more train.py checkpoints (ckpt.pt)")
    add("--data", required=True, help="a prepared split X.bin (meta.json beside it); X.txt or "
        'X.jsonl ({"text": ...} a line), tokenized as each checkpoint was; hf:pg19 (PG-19 test '
        "split, HF datasets)")
    add("--lengths",
        help="comma-separated context lengths (default: the smallest block size x 1..10)")
    add("--labels", help="comma-separated series names, one per --ckpt (default: D of D/ckpt.pt)")
    add("--yarn", action="store_true", help="add a +YaRN series per RoPE checkpoint: "
        "s(L) = max(s_ckpt, L / L0), L0 its original context (the plain series keeps the "
        "checkpoint's s_ckpt)")
    add("--yarn_only", action="store_true",
        help="with --yarn: drop the plain series of RoPE checkpoints")
    add("--yarn_scale", type=float,
        help="a fixed YaRN scale s >= 1 instead of s(L) (implies --yarn)")
    add("--max_tokens", type=int,
        help=f"scored tokens per length, at most (default {DEFAULT_MAX_TOKENS})")
    add("--bucket_size", type=int,
        help="positions a bucket of the NLL by position (default: block size)")
    add("--batch_tokens", type=int,
        help="tokens per forward pass (default 16384 on CUDA, 2048 on the CPU)")
    add("--batch_size", type=int, help="windows per forward pass (overrides --batch_tokens)")
    add("--json", help="write every number here")
    add("--plot", help="write a PNG here: perplexity by length, NLL by position (needs matplotlib)")
    add("--device", default="auto", help="auto (cuda if available) | cpu | cuda | cuda:1 ...")
    add("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
        help="auto: bf16 on CUDA")
    add("--attn_impl", choices=["auto", "torch", "triton"],
        help="attention code (default: the checkpoint's)")
    add("--no_progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    check_flags(args, FLAGS)
    args.yarn = args.yarn or args.yarn_scale is not None
    if args.yarn_only and not args.yarn:
        die("--yarn_only needs --yarn (or --yarn_scale)")
    if args.lengths is not None:
        try:
            args.lengths = sorted({int(x) for x in args.lengths.split(",") if x.strip()})
        except ValueError:
            die(f"--lengths must be comma-separated integers, got {args.lengths!r}")
        if not args.lengths or args.lengths[0] < 1:
            die(f"--lengths must be integers >= 1, got {args.lengths}")
    args.labels = args.labels and [x.strip() for x in args.labels.split(",")]
    if args.labels and len(args.labels) != len(args.ckpt):
        die(f"--labels has {len(args.labels)} names for {len(args.ckpt)} checkpoints")
    # fail before the slow part
    if missing := [path for path in args.ckpt if not os.path.isfile(path)]:
        die(f"checkpoint {missing[0]} not found (train.py writes out_dir/ckpt.pt)")
    try:  # before the slow part
        check_outputs(json=args.json, plot=args.plot)
    except PrepareError as e:
        die(e)
    args.kind = data_kind(args.data)
    return args


def data_kind(spec):
    kind = "hf" if spec.startswith("hf:") else os.path.splitext(spec)[1].lower()[1:]
    if kind not in ("hf", "bin", "txt", "jsonl"):
        die("--data must be a .bin (with meta.json beside it), .txt, .jsonl or hf:NAME; "
            f"got {spec}")
    if kind != "hf" and not (os.path.isfile(spec) and os.path.getsize(spec)):
        die(f"data file {spec} is missing or empty")
    return kind


def hf_docs(spec):
    name, _, split = spec[3:].partition(":")
    repo, split = {"pg19": "deepmind/pg19"}.get(name, name), split or "test"
    # bounded waits: offline, fail, never hang
    for var in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        os.environ.setdefault(var, "10")
    try:  # no `datasets`, no network, missing scripts, auth: all end the same way
        import datasets
        for row in datasets.load_dataset(repo, split=split, streaming=True):
            if "text" not in row:
                die(f"{repo} has no 'text' column (columns: {sorted(row)})")
            yield row["text"]
    except Exception as e:  # noqa: BLE001
        die(f"could not load {repo} (split {split}) with datasets ({type(e).__name__}: {e}); "
            "it needs `pip install datasets` and the network or a cached copy; else pass a local "
            ".jsonl or .txt as --data")


def load_tokens(spec, meta, need, ckpt, dataset=None):
    """--data's tokens for a checkpoint whose training data had this meta.json (read_tokens)."""
    try:
        toks = read_tokens(spec, meta, need, ckpt,
                           docs=hf_docs(spec) if data_kind(spec) == "hf" else None,
                           dataset=dataset)
    except PrepareError as e:
        die(e)
    folder = os.path.dirname(os.path.abspath(spec))
    row_len = data_kind(spec) == "bin" and load_meta(folder).get("row_len")
    if row_len:  # (its meta.json: read_tokens has checked it)
        print(f"note: {spec} holds rows of {row_len} tokens; windows run across rows and score "
              "every token (a _mask.bin is not read)", file=sys.stderr)
    return toks


def choose_budget(N, lengths, cap, explicit, data):
    """The scored tokens B for a stream of N tokens: the largest multiple of the longest length
    within the cap and the N - 1 targets. A length that does not divide B ends in a shorter window
    (whole windows at every length would need a multiple of their least common multiple: 1,290,240
    tokens for 512 x 1..10)."""
    Lmax = max(lengths)
    if explicit and cap < Lmax:
        die(f"--max_tokens={cap} is less than the longest length {Lmax}; "
            "every length needs a window")
    if N < Lmax + 1:
        die(f"{data} has {N or 'no'} tokens; one window of the longest length {Lmax} needs "
            f"{Lmax + 1}: give more data or shorter --lengths")
    if explicit and cap > N - 1:
        die(f"--max_tokens={cap} but {data} has only {N} tokens ({N - 1} scoreable targets); "
            f"at most {(N - 1) // Lmax * Lmax} at length {Lmax}")
    B = min(cap, N - 1) // Lmax * Lmax
    if short := [(L, B % L) for L in lengths if B % L]:
        print(f"note: every length scores the same {B} tokens; the last window is shorter at "
              + ", ".join(f"L={L} ({r} tokens)" for L, r in short), file=sys.stderr)
    return B


def nll_stats(nll_sum, tokens):
    nll = float(nll_sum) / tokens
    return {"nll": nll, "ppl": math.inf if nll >= 700 else math.exp(nll),  # (exp: 710)
            "tokens": tokens}


def position_buckets(nll_sum, count, size):
    """Mean NLL over positions a .. a + size - 1, from the windows' per-position sums and counts."""
    return [{"start": a,
             "end": min(a + size, len(nll_sum)),
             **nll_stats(nll_sum[a:a + size].sum(), int(count[a:a + size].sum()))}
            for a in range(0, len(nll_sum), size)]


@torch.no_grad()
def run_series(s, lengths, args, device, ctx, bucket_size, bar):
    """One series at every length. At length L, n, rest = divmod(B, L): window j < n feeds t_{jL}
    .. t_{jL+L-1} (positions 0 .. L-1) and scores t_{jL+1} .. t_{jL+L}; where rest > 0, a last
    window feeds t_{nL} .. t_{B-1} and scores t_{nL+1} .. t_B. Every length scores t_1 .. t_B."""
    m = s["m"]
    model = m["model"]
    cuda = device.startswith("cuda")
    rope = m["cfg"].pos_emb == "rope"
    rec = {"label": s["label"], "ckpt": m["path"], "pos_emb": m["cfg"].pos_emb, "results": {},
           "block_size": m["cfg"].block_size, "params": model.get_num_params(),
           "attention": m["attention"], "tokens_available": int(len(m["toks"])),
           "max_tokens": m["budget"],
           "yarn": {"eval_time": s["yarn"], "ckpt_scale": m["s_ckpt"], "orig_len": m["orig_len"],
                    "rule": "s = s_ckpt" if not s["yarn"]
                    else "fixed --yarn_scale" if args.yarn_scale
                    else "s = max(s_ckpt, L / orig_len)"} if rope else None}
    for L in lengths:
        bar.set_description(f"{s['label']} L={L}")
        if rope:
            scale = m["s_ckpt"]
            if s["yarn"]:
                scale = float(args.yarn_scale or max(m["s_ckpt"], L / m["orig_len"]))
            # at every length: series may share the model
            model.set_rope_scaling(scale, m["orig_len"])
        bs = args.batch_size or max(1, (args.batch_tokens or (16384 if cuda else 2048)) // L)
        if cuda:  # peak memory above the weights: shows the attention never holds a T x T tensor
            torch.cuda.reset_peak_memory_stats()
            mem0 = torch.cuda.memory_allocated()
        n, rest = divmod(m["budget"], L)
        # (first token, windows, window length) a pass: n whole windows, bs at a time, the short one
        passes = [(j * L, min(bs, n - j), L) for j in range(0, n, bs)]
        if rest:
            passes.append((n * L, 1, rest))
        t0, nll_sum, count = time.time(), np.zeros(L), np.zeros(L, dtype=np.int64)  # per position
        for start, k, T in passes:
            chunk = np.asarray(m["toks"][start:start + k * T + 1], dtype=np.int64)
            w = torch.from_numpy(chunk).to(device)
            x, y = w[:-1].view(k, T), w[1:].view(k, T)
            with ctx:
                logits, _ = model(x, y)
            # window by window, so that only one window's float32 logits exist at a time
            nll = torch.stack([F.cross_entropy(lg.float(), t, reduction="none")
                               for lg, t in zip(logits, y)])
            nll_sum[:T] += nll.double().sum(0).cpu().numpy()
            count[:T] += k
            del logits
            bar.update(k)
        r = rec["results"][str(L)] = {"length": L, **nll_stats(nll_sum.sum(), int(count.sum())),
                                      "windows": n, "short_window": rest, "windows_per_batch": bs,
                                      "seconds": round(time.time() - t0, 3),
                                      "buckets": position_buckets(nll_sum, count, bucket_size)}
        if cuda:
            r["peak_extra_mem_mb"] = round((torch.cuda.max_memory_allocated() - mem0) / 2**20, 1)
        if rope:
            r["rope_scaling"] = scale
            r["mscale"] = 0.1 * math.log(scale) + 1.0 if scale > 1 else 1.0
    first, last = rec["results"][str(min(lengths))]["ppl"], rec["results"][str(max(lengths))]["ppl"]
    rec["ppl_change_pct"] = 100 * (last / first - 1)  # the longest length against the shortest
    return rec


def print_tables(series, lengths):
    w, tok0 = max(12, *(len(s["label"]) + 2 for s in series)), series[0]["results"]

    def ppl(r):  # the scored tokens in brackets where they differ from the first series'
        return (f"{r['ppl']:.3f}" if r["ppl"] < 1e4 else f"{r['ppl']:.3e}") + \
            ("" if r["tokens"] == tok0[str(r["length"])]["tokens"] else f" [{r['tokens']}]")
    rows = [s["results"][str(max(lengths))]["buckets"] for s in series]
    for title, first, body in [
            ("perplexity by context length [scored tokens]", "length",
             [(f"{L} [{tok0[str(L)]['tokens']}]", [ppl(s["results"][str(L)]) for s in series])
              for L in lengths]
             + [(f"{max(lengths)} vs {min(lengths)}",
                 [f"{s['ppl_change_pct']:+.1f}%" for s in series])]),
            (f"NLL (nats/token) by position in the windows of length {max(lengths)}", "positions",
             [(f"{b['start']}-{b['end'] - 1}", [f"{r[i]['nll']:.4f}" for r in rows])
              for i, b in enumerate(rows[0])])]:
        head = f"{first:>17} " + "".join(f"{s['label']:>{w}}" for s in series)
        print(f"\n{title}\n{head}\n" + "-" * len(head))
        for key, cells in body:
            print(f"{key:>17} " + "".join(f"{c:>{w}}" for c in cells))


def write_plot(path, series, lengths):
    """Perplexity against length, and the NLL by position bucket in the longest windows (where a
    model that does not extrapolate breaks: the average over the window dilutes it)."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    fig = Figure(figsize=(13, 5), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    Lmax = max(lengths)
    for s in series:  # a null (infinite) value leaves a gap
        ax.plot(lengths, [s["results"][str(L)]["ppl"] or math.nan for L in lengths], marker="o",
                label=s["label"])
        buckets = s["results"][str(Lmax)]["buckets"]
        bx.plot([(b["start"] + b["end"] - 1) / 2 for b in buckets],
                [b["nll"] or math.nan for b in buckets],
                marker=".", label=s["label"])
    for T in sorted({s["block_size"] for s in series}):  # the training contexts
        for a in (ax, bx):
            a.axvline(T, color="gray", linestyle=":", linewidth=1)
    ax.set(yscale="log", xlabel="context length (tokens)", ylabel="perplexity",
           title="Perplexity by length")
    bx.set(xlabel="position in the window (bucket centre)", ylabel="NLL (nats/token)",
           title=f"NLL by position, windows of {Lmax} tokens")
    for a in (ax, bx):
        a.grid(True, which="both", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center",
               ncol=min(6, len(series)))
    with output_file(path) as f:
        fig.savefig(f, dpi=120, format="png")
    return fig


def main(argv=None):
    args = parse_args(argv)
    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    bf16 = args.dtype == "bfloat16"
    if args.dtype == "auto":
        bf16 = cuda and torch.cuda.is_bf16_supported()
    ctx = torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    models, series, labels = [], [], []
    for i, path in enumerate(args.ckpt):
        try:
            # (default: the checkpoint's)
            impl = {"attn_impl": args.attn_impl} if args.attn_impl else {}
            model, ckpt = load_checkpoint(path, device, **impl)
        except CheckpointError as e:
            die(str(e))
        check_kernel(model.config, device, path)
        cfg, base = model.config, os.path.basename(os.path.normpath(path))
        rope = cfg.pos_emb == "rope"
        if args.labels:
            label = args.labels[i]
        elif base != "ckpt.pt":
            label = os.path.splitext(base)[0]
        else:
            label = os.path.basename(os.path.dirname(os.path.abspath(path)))
        print(f"{label}: attention {(attention := model.attention_path())}", file=sys.stderr)
        models.append(m := {"path": path, "model": model, "meta": ckpt.get("meta") or {},
                            "cfg": cfg, "dataset": (ckpt.get("config") or {}).get("dataset"),
                            "attention": attention,
                            "s_ckpt": float(cfg.rope_scaling),  # (as trained)
                            "orig_len": int(cfg.rope_scaling_orig_len or cfg.block_size)})
        yarns = []
        if not (rope and args.yarn_only):
            yarns.append(False)
        if rope and args.yarn:
            yarns.append(True)
        for y in yarns:
            labels.append(name := label + "+YaRN" * y)  # the same checkpoint twice: label, label#2
            k = labels.count(name)
            series.append({"m": m, "label": name + (f"#{k}" if k > 1 else ""), "yarn": y})
        if args.yarn and not rope:
            print(f"note: {label} is pos_emb={cfg.pos_emb}; YaRN applies to RoPE only")
    base_len = min(m["cfg"].block_size for m in models)
    lengths = args.lengths or [base_len * k for k in range(1, 11)]
    bucket_size = args.bucket_size or base_len
    cap, streams = args.max_tokens or max(DEFAULT_MAX_TOKENS, max(lengths)), {}
    for m in models:  # one token stream and budget per tokenizer
        if (key := vocab_key(m["meta"])) not in streams:
            toks = load_tokens(args.data, m["meta"], cap + 1, ckpt=m["path"], dataset=m["dataset"])
            budget = choose_budget(len(toks), lengths, cap, args.max_tokens is not None, args.data)
            streams[key] = toks, budget
        m["toks"], m["budget"] = streams[key]
        if (vmax := int(np.max(np.asarray(m["toks"][:m["budget"] + 1])))) >= m["cfg"].vocab_size:
            die(f"{args.data} holds token id {vmax}; "
                f"{m['path']} has a vocabulary of {m['cfg'].vocab_size}")
    t0 = time.time()
    total = sum(-(-s["m"]["budget"] // L) for s in series for L in lengths)  # windows
    with tqdm(total=total, unit="win", file=sys.stderr, disable=args.no_progress) as bar:
        out = [run_series(s, lengths, args, device, ctx, bucket_size, bar) for s in series]
    print(f"\n{args.data}: {time.time() - t0:.1f}s on {device}{' (bf16 autocast)' if bf16 else ''}")
    print_tables(out, lengths)
    result = {"data": {"spec": args.data, "kind": args.kind}, "lengths": lengths,
              "bucket_size": bucket_size, "device": device,
              "dtype": "bfloat16 autocast" if bf16 else "float32",
              "scored_tokens": "length L: windows j < B // L, inputs [jL, jL+L), "
                               "targets [jL+1, jL+L]; where L does not divide B (= max_tokens) "
                               "a short window, inputs [nL, B), targets [nL+1, B]",
              "models": {s["label"]: s for s in out}}
    # JSON has no inf/nan: null
    result = json.loads(json.dumps(result), parse_constant=lambda _: None)
    if args.json:  # (parse_args found the folders writable)
        write_json(args.json, result)
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, result["models"].values(), lengths)
        print(f"wrote {args.plot}")
    return result


if __name__ == "__main__":
    run_main(main)
