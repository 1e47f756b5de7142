"""
Sample from a trained checkpoint.

Usage:
    python sample.py --out_dir=out [--start="Once upon a time"] [--start=FILE:prompt.txt]
                     [--num_samples=3] [--max_new_tokens=200] [--temperature=0.8]
                     [--top_k=200] [--seed=1337] [--device=auto] [--save=samples/x]

Text is decoded with tiktoken's gpt2 encoding when the dataset's meta.json says
"tokenizer": "gpt2", and with its "itos" list otherwise. Datasets whose meta.json
names a "format" (a module in prepare/, e.g. jsb, maestro, genome) are rendered
by that module's decode(); with --save, its save_sample() also writes a file
(e.g. MIDI for music).
"""

import argparse
import importlib
import os
import sys
from contextlib import nullcontext

import torch

from model import load_checkpoint


def load_codec(meta):
    """(encode, decode) for a dataset's meta.json: gpt2 BPE or a character list."""
    if meta.get("tokenizer") == "gpt2":
        import tiktoken
        enc = tiktoken.get_encoding("gpt2")
        return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode
    if "itos" in meta:
        itos = meta["itos"]
        stoi = {s: i for i, s in enumerate(itos)}
        single = all(len(s) == 1 for s in itos)

        def encode(s):
            if not single:
                raise ValueError("this vocabulary has multi-character tokens; give the prompt as token ids")
            bad = sorted(set(c for c in s if c not in stoi))
            if bad:
                raise ValueError(f"characters {bad} are not in the vocabulary ({''.join(itos)!r})")
            return [stoi[c] for c in s]
        return encode, lambda ids: "".join(itos[i] for i in ids)
    raise ValueError("meta.json needs either \"tokenizer\": \"gpt2\" or an \"itos\" list")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="out", help="folder holding ckpt.pt")
    p.add_argument("--ckpt", default=None, help="checkpoint path (default: out_dir/ckpt.pt)")
    p.add_argument("--start", default="\n", help="prompt text, or FILE:path to read it from a file "
                   "(for prepare/ formats: that module's token names, see python prepare/NAME.py --help)")
    p.add_argument("--num_samples", type=int, default=3)
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top_k", type=int, default=200)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto")
    p.add_argument("--save", default=None, help="path prefix: write each sample with the dataset format's save_sample()")
    args = p.parse_args(argv)

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    torch.manual_seed(args.seed)
    ckpt_path = args.ckpt or os.path.join(args.out_dir, "ckpt.pt")
    if not os.path.isfile(ckpt_path):
        sys.exit(f"error: checkpoint {ckpt_path} not found; train one with train.py or pass --out_dir/--ckpt")
    model, ckpt = load_checkpoint(ckpt_path, device=device)
    meta = ckpt.get("meta", {})
    fmt = importlib.import_module("prepare." + meta["format"]) if meta.get("format") else None
    encode, decode = load_codec(meta)
    if fmt is not None:  # the dataset's own token names, e.g. "<s> C5 G4 E4 C3" for JSB
        encode = (lambda s: fmt.encode(s, meta)) if hasattr(fmt, "encode") else encode  # noqa: E731
        decode = (lambda ids: fmt.decode(ids, meta)) if hasattr(fmt, "decode") else decode  # noqa: E731

    start = args.start
    if start.startswith("FILE:"):
        with open(start[5:], encoding="utf-8") as f:
            start = f.read()
    try:
        ids = encode(start) if start else []
    except (ValueError, KeyError, SystemExit) as e:
        sys.exit(f"error: cannot encode --start={start[:40]!r}: {e}")
    if not ids:
        sys.exit("error: the prompt encodes to no tokens; give a non-empty --start")
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else nullcontext()
    with ctx:
        for i in range(args.num_samples):
            y = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k)
            out = y[0].tolist()
            print(decode(out))
            print("---------------")
            if args.save and fmt is not None and hasattr(fmt, "save_sample"):
                print("wrote", fmt.save_sample(out, meta, f"{args.save}_{i}"))


if __name__ == "__main__":
    main()
