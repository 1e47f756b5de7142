"""
Sample from a trained checkpoint.

Usage:
    python sample.py --out_dir=out [--start="Once upon a time"] [--start=FILE:prompt.txt]
                     [--num_samples=3] [--max_new_tokens=200] [--temperature=0.8]
                     [--top_k=200] [--seed=1337] [--device=auto] [--context=N]
                     [--decode=auto|eager|graph|compile] [--compile] [--save=samples/x]
                     [--dtype=auto|bfloat16|float32|autocast]

The prompt is written in the dataset's own format: GPT-2 text for
openwebtext-style data; for the prepare/ formats their token names (see
python prepare/NAME.py --help), e.g. "NZTUIGWkXFrhCJDzscat, N, +4, " for indirect
indexing, a DNA string for genome (left open: the model continues its contig).
Without --start the prompt is the format's start of a piece (<s> for JSB,
BOS_None for MAESTRO, a new contig for genome), else a newline.
The samples of one prompt are generated as one batch. Only ids of
the dataset's real vocabulary are ever sampled. --temperature=0 is greedy.
--save=PREFIX writes each sample to PREFIX_<i> in the dataset's format (MIDI
for music, .txt otherwise).

Decoding runs on a static KV cache of --context positions (default the model's
block_size). A larger context lets positions count on past block_size (PoPE
extrapolates; RoPE shows why it needs YaRN); a prompt longer than the context
keeps its last tokens (with a warning), and once a sample fills the context each
further token is computed from the last --context tokens from scratch (slow).
--decode: "graph" (the default on CUDA) captures the one-token step once as a
CUDA graph and replays it; "compile" (or --compile) runs torch.compile on it
first (tens of seconds); "eager" (the default on the CPU) calls it from Python.
--dtype: on CUDA the weights and activations are bf16 by default (PoPE's δ and the
frequencies stay float32); --dtype=autocast computes as train.py does (bf16 matmuls
over float32 weights), at the cost of casts at every step.
Samples go to stdout; on stderr: the decoding setup, prefill time, time to the
first token, capture time and the decode rate without them.
"""

import time  # first: the time to the first token counts from here
T_START = time.perf_counter()

import argparse  # noqa: E402
import importlib  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402

import torch  # noqa: E402

from model import CheckpointError, KVCache, load_checkpoint
from prepare.common import PrepareError, check_writable, codec, die, prepare_scripts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="out", help="folder holding ckpt.pt")
    p.add_argument("--ckpt", default=None, help="checkpoint path (default: out_dir/ckpt.pt)")
    p.add_argument("--start", default=None, help="prompt text, or FILE:path to read it from a file (default: the "
                   "dataset format's start of a piece: <s> for JSB, BOS_None for MAESTRO, a new contig for genome; "
                   "else a newline)")
    p.add_argument("--num_samples", type=int, default=3, help="samples of the prompt, generated as one batch")
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=200, help="sample among the k most likely ids (>= 1)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto (cuda if available) | cpu | cuda | cuda:N")
    p.add_argument("--context", type=int, default=None,
                   help="positions the KV cache holds (default: block_size); past block_size, positions count on")
    p.add_argument("--decode", default="auto", choices=["auto", "eager", "graph", "compile"],
                   help="auto: graph on CUDA, eager on the CPU; graph (CUDA): replay the one-token step as a CUDA "
                        "graph; compile (CUDA): torch.compile it, then the graph")
    p.add_argument("--compile", action="store_true", help="the same as --decode=compile (CUDA)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "autocast"],
                   help="auto: bfloat16 on CUDA, float32 on the CPU; bfloat16: the weights (PoPE's delta and the "
                        "frequencies stay float32) and activations in bf16; autocast: bf16 matmuls over float32 "
                        "weights and residual stream, as train.py computes (slower: casts at every step)")
    p.add_argument("--save", default=None, help="path prefix: also write each sample to PREFIX_<i> in its format")
    args = p.parse_args(argv)
    for ok, msg in ((args.num_samples >= 1, "--num_samples must be >= 1"),
                    (args.max_new_tokens >= 1, "--max_new_tokens must be >= 1"),
                    (math.isfinite(args.temperature) and args.temperature >= 0,  # inf would sample uniformly
                     f"--temperature must be >= 0 and finite (0 = greedy), got {args.temperature}"),
                    (args.top_k >= 1, "--top_k must be >= 1 (1 = greedy)")):
        if not ok:
            die(msg)
    start = args.start
    if start is not None and start.startswith("FILE:"):  # read before the checkpoint: a wrong path fails at once
        path = start[5:]
        try:
            with open(path, encoding="utf-8") as f:
                start = f.read()
        except FileNotFoundError:
            sys.exit(f"error: --start=FILE:{path}: no such file; give the path of a text file holding the prompt")
        except IsADirectoryError:
            sys.exit(f"error: --start=FILE:{path} is a folder; give the path of a text file holding the prompt")
        except UnicodeDecodeError as e:
            sys.exit(f"error: --start=FILE:{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                     f"{e.start}); give a UTF-8 text file with the prompt in the dataset's format")
        except OSError as e:
            sys.exit(f"error: --start=FILE:{path}: cannot read it ({e.strerror or e})")
    if args.save:  # before the slow part: a folder that cannot be written is refused now
        try:
            check_writable(f"{args.save}_0", "--save")
        except PrepareError as e:
            sys.exit(f"error: {e}")

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: --device=cuda but CUDA is not available here; pass --device=cpu")
    if args.compile and args.decode not in ("auto", "compile"):
        sys.exit(f"error: --compile asks for --decode=compile, but --decode={args.decode} was given; pass one of them")
    mode = "compile" if args.compile else args.decode
    mode = ("graph" if device.startswith("cuda") else "eager") if mode == "auto" else mode
    if mode != "eager" and not device.startswith("cuda"):
        sys.exit(f"error: --decode={mode} replays a CUDA graph and needs a CUDA device; use --decode=eager on {device}")
    if args.context is not None and args.context < 1:
        p.error(f"--context must be >= 1, got {args.context}")
    torch.manual_seed(args.seed)
    ckpt_path = args.ckpt or os.path.join(args.out_dir, "ckpt.pt")
    try:
        model, ckpt = load_checkpoint(ckpt_path, device=device)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    meta = ckpt.get("meta", {})
    fmt = None
    if meta.get("format"):  # the dataset's own token names, from prepare/<format>.py
        if meta["format"] not in (known := prepare_scripts()):
            sys.exit(f"error: {ckpt_path} names the dataset format {meta['format']!r}, which no prepare/ script "
                     f"here reads (known: {', '.join(known)}); sample with the version of this code that wrote it")
        fmt = importlib.import_module("prepare." + meta["format"])
    try:
        encode, decode = codec(meta)
    except (PrepareError, ValueError) as e:
        sys.exit(f"error: {e}")
    if fmt is not None:  # the dataset's own token names, e.g. "<s> C5 G4 E4 C3" for JSB
        # a prompt is the start of a piece: a format that ends each piece with a marker (genome) leaves it open
        enc = getattr(fmt, "encode_prompt", None) or getattr(fmt, "encode", None)
        encode = (lambda s: enc(s, meta)) if enc else encode  # noqa: E731
        decode = (lambda ids: fmt.decode(ids, meta)) if hasattr(fmt, "decode") else decode  # noqa: E731
    if start is None:  # the format's own start of a piece (JSB's <s>, MAESTRO's BOS), else a newline
        start = getattr(fmt, "PROMPT", "\n")

    try:
        ids = encode(start)
    except (ValueError, KeyError, SystemExit) as e:
        sys.exit(f"error: cannot encode --start={start[:40]!r}: {e}")
    if not ids:
        sys.exit("error: the prompt encodes to no tokens; give a non-empty --start")
    context = args.context or model.config.block_size
    if len(ids) > context:
        print(f"warning: the prompt has {len(ids)} tokens, more than the context of {context}: keeping its last "
              f"{context} (--context=N holds more)", file=sys.stderr)
        ids = ids[-context:]
    if len(ids) + args.max_new_tokens > context:
        print(f"note: prompt + max_new_tokens = {len(ids) + args.max_new_tokens} > context {context}: past it, each "
              f"token is computed from the last {context} tokens from scratch (slow); --context=N holds more",
              file=sys.stderr)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, :].repeat(args.num_samples, 1)
    dtype = ("bfloat16" if device.startswith("cuda") else "float32") if args.dtype == "auto" else args.dtype
    if dtype != "autocast":  # (the checkpoint's weights are float32)
        model.cast_weights_(getattr(torch, dtype))
    # which form the cache keeps PoPE's keys in: KVCache's own rule, asked of a one-slot cache
    mu = KVCache(model, 1, 1, torch.bfloat16 if dtype == "autocast" else model.lm_head.weight.dtype).mu
    keys = ("PoPE keys as magnitudes, their phases made by the decoding kernel" if mu else "PoPE keys in Cartesian "
            "form") if model.config.pos_emb == "pope" else f"{model.config.pos_emb} keys"
    print(f"decoding: {mode}, {'bf16 autocast' if dtype == 'autocast' else dtype}, static KV cache of {context} "
          f"positions (block_size {model.config.block_size}), {keys}; prefill attention: SDPA", file=sys.stderr)
    if device.startswith("cuda:"):
        torch.cuda.set_device(device)  # the CUDA graph is captured on the current device's streams
    ctx = torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if dtype == "autocast" else nullcontext()
    times = {}
    with ctx:
        t0 = time.perf_counter()
        y = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                           vocab_size=meta.get("vocab_size"), context=context, mode=mode, times=times)
        dt = time.perf_counter() - t0
    for i, row in enumerate(y.tolist()):
        print(decode(row))
        print("---------------")
        if args.save:
            os.makedirs(os.path.dirname(os.path.abspath(args.save)), exist_ok=True)
            if fmt is not None and hasattr(fmt, "save_sample"):
                path = fmt.save_sample(row, meta, f"{args.save}_{i}")
            else:
                path = f"{args.save}_{i}.txt"
                with open(path, "w", encoding="utf-8") as f:
                    f.write(decode(row))
            print(f"wrote {path}", file=sys.stderr)
    B, n = args.num_samples, args.max_new_tokens - 1  # the first new token comes from the prefill
    print(f"prefill: {B} x {len(ids)} tokens in {times['prefill'] * 1e3:,.1f} ms; time to first token "
          f"{t0 - T_START + times['prefill']:.2f} s since start", file=sys.stderr)
    if mode != "eager" and n > 0:
        print(f"{'torch.compile + ' if mode == 'compile' else ''}CUDA graph capture: {times['capture']:.2f} s",
              file=sys.stderr)
    if n > 0:
        print(f"decode: {B} x {n} tokens in {times['decode']:.2f} s: {B * n / times['decode']:,.1f} tokens/s "
              f"(batch {B}; prefill and capture excluded)", file=sys.stderr)
    total = B * (n + 1)
    print(f"total: {total:,} new token{'s' * (total > 1)} in {dt:.2f} s, "
          f"{time.perf_counter() - T_START:.1f} s since start", file=sys.stderr)


if __name__ == "__main__":
    main()
