"""
Sample from a trained checkpoint:
python sample.py --out_dir=out --start="Once upon a time" --num_samples=3
The prompt (--start, or FILE:path) is in the dataset's format: GPT-2 text, or a prepare/ format's
token names (python prepare/NAME.py --help); without it, the format's start of a piece. Decoding
runs on a static KV cache of --context positions (default block_size); a longer prompt keeps its
last tokens, a longer sample recomputes each token from the last --context. --decode: graph (the
one-token step as a CUDA graph), compile (compiled first) or eager. --dtype: bf16 weights on CUDA
by default; autocast computes as train.py does. Samples go to stdout, timings to stderr;
--save=PREFIX writes PREFIX_<i>.txt (or the dataset's own, e.g. .mid).
"""

import time  # first: the time to the first token counts from here
T_START = time.perf_counter()

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from functools import partial  # noqa: E402

import torch  # noqa: E402

from model import CheckpointError, KVCache, load_checkpoint  # noqa: E402
from prepare.common import (  # noqa: E402
    AT_LEAST_1,
    DEVICE_RULE,
    SEED_RULE,
    PrepareError,
    check_flags,
    check_outputs,
    check_vocab,
    codec,
    die,
    format_module,
    physical_memory,
    resolve_device,
    save_sample,
)

T_IMPORTS = time.perf_counter()
GRAPH_MIN_TOKENS = 32  # --decode=auto: eager below this many new tokens (capturing does not pay)
FLAGS = {  # as train.py's RULES
    **dict.fromkeys(("num_samples", "max_new_tokens", "top_k", "context"), AT_LEAST_1),
    "temperature": (lambda v, a: 0 <= v < math.inf, ">= 0 and finite (0: greedy)"),
    "device": DEVICE_RULE,
    "seed": SEED_RULE,
}


def pick_device(name):
    """torch.device(name), CUDA's with its index ("cuda": the current one): the graph's device."""
    device = torch.device(resolve_device(name))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def main(argv=None):
    """sample.py's command line (argv: its arguments; None: sys.argv's)."""
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    p.add_argument("--out_dir", default="out", help="folder holding ckpt.pt")
    p.add_argument("--ckpt", default=None, help="checkpoint path (default: out_dir/ckpt.pt)")
    p.add_argument("--start", default=None, help="text, or FILE:path")
    p.add_argument("--num_samples", type=int, default=3, help="samples of the prompt, one batch")
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=200)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto (cuda if there is a GPU), cpu, cuda[:N]")
    p.add_argument("--context", type=int, default=None, help="KV cache positions")
    p.add_argument("--decode", default="auto", choices=["auto", "eager", "graph", "compile"],
                   help=f"auto: graph on CUDA past {GRAPH_MIN_TOKENS} new tokens, else eager")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "autocast"])
    p.add_argument("--save", default=None, help="also write sample i to PREFIX_i.txt (or .mid)")
    args = p.parse_args(argv)
    check_flags(args, FLAGS)
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    mode = args.decode
    if mode == "auto":
        mode = "graph" if cuda and args.max_new_tokens > GRAPH_MIN_TOKENS else "eager"
    if mode != "eager" and not cuda:
        sys.exit(f"error: --decode={mode} needs CUDA; use --decode=eager on {args.device}")
    start = args.start
    if start is not None and start.startswith("FILE:"):  # now, before the checkpoint
        try:
            with open(start[5:], encoding="utf-8") as f:
                start = f.read()
        except (OSError, UnicodeDecodeError) as e:
            sys.exit(f"error: --start={start}: cannot read a UTF-8 prompt from it ({e})")
    elif start is not None and not start.isascii():  # argv's undecodable bytes arrive as surrogates
        try:
            start.encode("utf-8")
        except UnicodeEncodeError:
            die("--start is not valid UTF-8; fix its encoding or pass it as --start=FILE:path")
    ckpt_path = args.ckpt or os.path.join(args.out_dir, "ckpt.pt")
    try:
        if args.save:  # before the slow part
            check_outputs(save=f"{args.save}_0")
        t_load = time.perf_counter()
        model, ckpt = load_checkpoint(ckpt_path, device=device)
        t_load = time.perf_counter() - t_load
        meta = ckpt.get("meta", {})
        encode, decode = codec(meta)
        fmt = format_module(meta)
    except (CheckpointError, PrepareError, ValueError) as e:
        die(e)
    cfg = model.config
    check_vocab(meta, cfg.vocab_size, ckpt_path)
    if fmt is not None:  # the dataset's own token names, e.g. "<s> C5 G4 E4 C3" for JSB
        enc = getattr(fmt, "encode_prompt", None) or getattr(fmt, "encode", None)
        if enc:
            encode = partial(enc, meta=meta)
        if hasattr(fmt, "decode"):
            decode = partial(fmt.decode, meta=meta)
    start = getattr(fmt, "PROMPT", "\n") if start is None else start
    try:
        ids = encode(start)
    except (ValueError, KeyError, SystemExit) as e:
        sys.exit(f"error: cannot encode --start={start[:40]!r}: {e}")
    if not ids:
        sys.exit("error: the prompt encodes to no tokens; give a non-empty --start")
    context = args.context or cfg.block_size
    if len(ids) > context:
        print(f"note: the prompt has {len(ids)} tokens, more than the context of {context}: "
              f"keeping its last {context} (--context=N holds more)", file=sys.stderr)
        ids = ids[-context:]
    cache = KVCache.nbytes(cfg, args.num_samples, context, 2)  # (2 bytes at the least)
    ram = physical_memory()
    if not cuda and ram and cache > ram:  # (CUDA's allocator refuses at once)
        die(f"a KV cache of {args.num_samples} samples x {context} positions needs at least "
            f"{cache / 2**30:,.1f} GiB, more than the host's RAM: lower --num_samples or --context")
    torch.manual_seed(args.seed)
    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if cuda else "float32"
    amp = dtype == "autocast"
    if not amp:  # (the checkpoint's weights are float32)
        model.cast_weights_(getattr(torch, dtype))
    if cuda:
        torch.cuda.set_device(device)  # the CUDA graph is captured on the current device's streams
    times = {}
    t0 = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16) if amp else nullcontext():
        print(f"decoding: {mode}, {'bf16 autocast' if amp else dtype}, KV cache of {context} "
              f"positions, one-token steps: {model.attention_path(T=context, decoding=True)}",
              file=sys.stderr)
        try:
            x = torch.tensor(ids, dtype=torch.long, device=device)[None, :]
            x = x.repeat(args.num_samples, 1)
            y = model.generate(
                x,
                args.max_new_tokens,
                temperature=args.temperature,
                top_k=args.top_k,
                vocab_size=meta.get("vocab_size"),
                context=context,
                mode=mode,
                times=times,
            )
        except RuntimeError as e:  # (torch.OutOfMemoryError on CUDA; the CPU's allocator says so)
            if not isinstance(e, torch.OutOfMemoryError) and "can't allocate memory" not in str(e):
                raise
            die(f"out of memory for {args.num_samples} samples x {context} positions (KV cache) on "
                f"{device}: lower --num_samples, --context or --max_new_tokens")
    for i, row in enumerate(y.tolist()):
        print(decode(row) + "\n---------------")
        if args.save:
            try:
                path = save_sample(row, meta, f"{args.save}_{i}", decode)
            except PrepareError as e:  # (a full disk, a read-only folder: no partial file stays)
                die(e)
            print(f"wrote {path}", file=sys.stderr)
    B = args.num_samples
    n = args.max_new_tokens - 1  # the first new token comes from the prefill
    print(f"prefill: {B} x {len(ids)} tokens in {times['prefill'] * 1e3:,.1f} ms; time to first "
          f"token {t0 - T_START + times['prefill']:.2f} s since start (imports "
          f"{T_IMPORTS - T_START:.2f} s, checkpoint {t_load:.2f} s)", file=sys.stderr)
    if n > 0:
        rate = B * n / times["decode"]
        print(f"decode: {B} x {n} tokens in {times['decode']:.2f} s: {rate:,.1f} tokens/s "
              f"(capture {times['capture']:.2f} s excluded)",
              file=sys.stderr)


if __name__ == "__main__":
    main()
