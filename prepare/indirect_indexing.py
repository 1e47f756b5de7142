"""Indirect indexing, the PoPE paper's diagnostic task (arXiv 2509.10534).

Usage:
    python prepare/indirect_indexing.py                      # paper: 1M / 10k / 10k examples
    python prepare/indirect_indexing.py --n_train 100000     # smaller train split
    python prepare/indirect_indexing.py --quick              # the CPU quick-start variant
    python prepare/indirect_indexing.py --out_dir /tmp/ii --seed 7

Nothing is downloaded: the examples are generated from fixed seeds, with
numpy and vectorised (1M examples take a few seconds).

An example is one line of text
    `<string>, <char>, <shift>, <target>`     e.g.  `NZTUIGWkXFrhCJDzscat, N, +4, I`
- string: 20 to 40 distinct letters (length uniform in [20, 40]), sampled
  without replacement from [A-Za-z];
- shift: uniform integer in [-15, +15], written with its sign ("+0" for 0);
- char: a letter of the string. Draws whose target would fall outside the
  string are re-drawn: the source position is re-drawn with the shift kept,
  so the shift stays uniform and, given the shift, the source position is
  uniform over the positions whose target exists;
- target: the letter at (index of char + shift).

Vocabulary (character level, 67 tokens, id = position in this list):
    "\\n", " ", "+", ",", "-", "0".."9", "A".."Z", "a".."z"
"\\n" ends an example and also pads it.

Rows: meta.json has row_len 52: every example is one row of exactly 52
tokens (the longest example is 51 characters, then at least one "\\n"), so
{split}.bin holds n_examples * 52 tokens. The loss mask
({split}_mask.bin) is 1 only at the target letter, so training and the
accuracy (exact match of the greedy target token) score that token alone.

Splits: train / val / test = 1,000,000 / 10,000 / 10,000 examples (the
paper's), each from its own fixed seed: numpy default_rng([seed, k]) with
k = 0, 1, 2 for train, val, test and --seed 1234 by default.

--quick writes an easier variant for CPU demos to data/indirect_indexing_quick:
strings of 8-12 letters, shifts in [-3, +3], rows of 23 tokens, 100k / 10k /
10k examples (config/indirect_indexing_quick.py trains on it). --min_len,
--max_len and --max_shift set any other variant (max_shift < min_len).

Two format variants, for testing what the paper's text leaves open (both keep
the rows, masks, seeds and draws of the default; RESULTS.md, section 1):
--shift_format token writes the shift as one of 31 extra tokens "<-15>" ..
"<+15>" (vocabulary 98, rows of 50), and --order question_first puts the
letter and shift before the string: `N, +4, NZTUIGWkXFrhCJDzscat, I`.
"""

import argparse
import re
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from prepare import common

NAME = "indirect_indexing"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
ITOS = ["\n", " ", "+", ",", "-"] + list("0123456789") + list(LETTERS)
STOI = {c: i for i, c in enumerate(ITOS)}
PAD = STOI["\n"]
MIN_LEN, MAX_LEN, MAX_SHIFT = 20, 40, 15
SPLIT_SEED_INDEX = {"train": 0, "val": 1, "test": 2}
CHUNK = 100_000  # examples generated per rng round (fixed: part of the output's definition)

_LETTER_IDS = np.array([STOI[c] for c in LETTERS], dtype=np.uint8)
_DIGIT_IDS = np.array([STOI[c] for c in "0123456789"], dtype=np.uint8)


def encode(text, meta=None):
    """Example text -> token ids: one per character, a "<+4>" shift token as one."""
    itos = meta["itos"] if meta and "itos" in meta else ITOS
    stoi = {c: i for i, c in enumerate(itos)}
    try:
        return [stoi[c] for c in re.findall(r"<[+-]\d+>|.", text, flags=re.S)]
    except KeyError as e:
        c, shifts = e.args[0], [t for t in itos if len(t) > 1]
        raise ValueError(
            f"unknown {'token' if len(c) > 1 else 'character'} {c!r}; "
            "the text takes A-Z, a-z, 0-9, ' ', ',', '+', '-' and newline"
            + (f", and the shift tokens {shifts[0]!r} .. {shifts[-1]!r}"
               if shifts else "")) from None


def decode(ids, meta=None):
    """Token ids -> the example text (rows end in "\\n" padding)."""
    itos = meta["itos"] if meta and "itos" in meta else ITOS
    return "".join(itos[int(i)] for i in ids)


def shift_tokens(max_shift):
    """--shift_format token: one vocabulary entry per shift, "<-15>" .. "<+15>"."""
    return [f"<{k:+d}>" for k in range(-max_shift, max_shift + 1)]


def vocabulary(shift_format="chars", max_shift=MAX_SHIFT):
    return ITOS + (shift_tokens(max_shift) if shift_format == "token" else [])


def format_example(string, char, shift, target, shift_format="chars", order="string_first"):
    s = f"{shift:+d}" if shift_format == "chars" else f"<{shift:+d}>"
    return (f"{string}, {char}, {s}, {target}" if order == "string_first"
            else f"{char}, {s}, {string}, {target}")


def parse_example(line, order="string_first"):
    """'ABC..., C, +4, T' (or 'C, <+4>, ABC..., T') -> (string, char, shift, target)."""
    a, b, c, target = line.split(", ")
    string, char, shift = (a, b, c) if order == "string_first" else (c, a, b)
    return string, char, int(shift.strip("<>")), target


def row_len_for(max_len, max_shift, shift_format="chars"):
    """Longest example (string, ", C, ", the shift, ", T") plus one "\n"."""
    shift_len = 1 + len(str(max_shift)) if shift_format == "chars" else 1
    return max_len + len(", C, ") + shift_len + len(", T") + 1


def _concat(segments, row_len):
    """Each example's segments one after another, "\n"-padded to row_len: segments
    are (tokens (n, w), lengths (n,)); returns rows (n, row_len) and each
    segment's start column (n,)."""
    n = len(segments[0][1])
    rows = np.full((n, row_len), PAD, dtype=np.uint8)
    start = np.zeros(n, dtype=np.int64)
    starts = []
    for toks, lens in segments:
        cols = start[:, None] + np.arange(toks.shape[1])[None, :]
        keep = np.arange(toks.shape[1])[None, :] < lens[:, None]
        rows[np.nonzero(keep)[0], cols[keep]] = toks[keep]
        starts.append(start)
        start = start + lens
    return rows, starts


def generate_rows(n, rng, min_len=MIN_LEN, max_len=MAX_LEN, max_shift=MAX_SHIFT,
                  shift_format="chars", order="string_first"):
    """n examples as (rows (n, row_len) uint8 token ids, target positions (n,))."""
    length = rng.integers(min_len, max_len + 1, size=n)
    letters = rng.permuted(np.tile(np.arange(52, dtype=np.uint8), (n, 1)), axis=1)[:, :max_len]
    shift = rng.integers(-max_shift, max_shift + 1, size=n)
    lo = np.maximum(0, -shift)
    hi = length - np.maximum(0, shift)  # exclusive; > lo since length > max_shift
    src = rng.integers(lo, hi)
    ar = np.arange(n)
    ids = _LETTER_IDS[letters]
    char, target = ids[ar, src, None], ids[ar, src + shift, None]
    if shift_format == "chars":  # sign, then one or two digits
        a, two = np.abs(shift), np.abs(shift) >= 10
        digits = np.stack(
            [np.where(two, _DIGIT_IDS[a // 10], _DIGIT_IDS[a % 10]), _DIGIT_IDS[a % 10]], axis=1)
        shift_seg = (
            np.concatenate([np.where(shift >= 0, STOI["+"], STOI["-"])[:, None], digits], axis=1),
            2 + two,
        )
    else:  # one token: "<-max_shift>" is id len(ITOS)
        shift_seg = ((len(ITOS) + max_shift + shift)[:, None], np.ones(n, dtype=np.int64))
    one = np.ones(n, dtype=np.int64)
    sep = (np.tile(np.array([STOI[","], STOI[" "]], dtype=np.int64), (n, 1)), 2 * one)
    string, char, target = (ids, length), (char, one), (target, one)
    segments = [string, sep, char, sep, shift_seg, sep, target] if order == "string_first" else \
        [char, sep, shift_seg, sep, string, sep, target]
    rows, starts = _concat(segments, row_len_for(max_len, max_shift, shift_format))
    return rows, starts[-1]


def generate_split(n, seed, split, min_len=MIN_LEN, max_len=MAX_LEN, max_shift=MAX_SHIFT,
                   shift_format="chars", order="string_first"):
    """All rows of one split: (tokens (n*row_len,), mask (n*row_len,))."""
    row_len = row_len_for(max_len, max_shift, shift_format)
    rng = np.random.default_rng([seed, SPLIT_SEED_INDEX[split]])
    toks = np.empty((n, row_len), dtype=np.uint8)
    mask = np.zeros((n, row_len), dtype=np.uint8)
    with common.progress(total=n, desc=split, unit="ex") as bar:
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            rows, tpos = generate_rows(m, rng, min_len, max_len, max_shift, shift_format, order)
            toks[start:start + m] = rows
            mask[start + np.arange(m), tpos] = 1
            bar.update(m)
    return toks.ravel(), mask.ravel()


def content_floor(min_len=MIN_LEN, max_len=MAX_LEN, max_shift=MAX_SHIFT):
    """Exact accuracies of two rules that use no positional skill, under this
    generator's distribution (length and shift uniform; given the shift, the
    source uniform over the positions whose target exists). The yardstick for
    "has the model learned indirect indexing", rather than E[1/length]:
      copy:  answer the source letter when the shift is 0, else guess uniformly
             among the string's other letters;
      valid: the same, but guess only among the letters that can be a target of
             this shift (positions max(0, k)..L-1+min(0, k)), source excluded.
    Returns {"copy": acc, "valid": acc}."""
    copy = valid = 0.0
    lengths, shifts = range(min_len, max_len + 1), range(-max_shift, max_shift + 1)
    for L in lengths:
        for k in shifts:
            p = 1.0 / (len(lengths) * len(shifts))
            if k == 0:
                copy, valid = copy + p, valid + p
                continue
            copy += p / (L - 1)
            sources = range(max(0, -k), L - max(0, k))
            targets = range(max(0, k), L + min(0, k))
            valid += p * sum(1.0 / (len(targets) - (i in targets)) for i in sources) / len(sources)
    return {"copy": copy, "valid": valid}


QUICK = {"n_train": 100_000, "min_len": 8, "max_len": 12, "max_shift": 3,
         "name": "indirect_indexing_quick"}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="the CPU quick-start variant: strings of 8-12 letters, shifts in [-3, 3], "
                        "100k train examples, written to data/indirect_indexing_quick "
                        "(config/indirect_indexing_quick.py)")
    p.add_argument("--out_dir", default=None, help="output folder (default data/indirect_indexing, "
                                                   "with --quick data/indirect_indexing_quick)")
    p.add_argument("--n_train", type=int, default=None,
                   help="train examples (paper: 1,000,000; --quick: 100,000)")
    p.add_argument("--n_val", type=int, default=10_000, help="val examples (paper: 10,000)")
    p.add_argument("--n_test", type=int, default=10_000, help="test examples (paper: 10,000)")
    p.add_argument("--seed", type=int, default=1234,
                   help="base seed; split k uses default_rng([seed, k])")
    p.add_argument("--min_len", type=int, default=None, help=f"shortest string (paper: {MIN_LEN})")
    p.add_argument("--max_len", type=int, default=None,
                   help=f"longest string (paper: {MAX_LEN}, at most 52)")
    p.add_argument("--max_shift", type=int, default=None,
                   help=f"shifts are in [-max_shift, +max_shift] (paper: {MAX_SHIFT})")
    p.add_argument("--shift_format", default="chars", choices=["chars", "token"],
                   help="chars (the paper's text): sign and digits, one token each; token: "
                        "the shift as one of 2*max_shift+1 extra tokens <-15> .. <+15>")
    p.add_argument("--order", default="string_first", choices=["string_first", "question_first"],
                   help="string_first (the paper's): string, letter, shift, target; "
                        "question_first: letter, shift, string, target, so the model knows what "
                        "to look for while it reads the string")
    return p


def rebuild_command(args):
    """meta["prepare"]: the command line that rebuilds this dataset (see common.command_line)."""
    name = QUICK["name"] if args.quick else NAME
    return common.command_line(NAME, build_parser(), args,
                               defaults={"out_dir": str(common.REPO_ROOT / "data" / name)})


def main(argv=None):
    args = build_parser().parse_args(argv)
    command = rebuild_command(args)
    base = QUICK if args.quick else {"n_train": 1_000_000, "min_len": MIN_LEN, "max_len": MAX_LEN,
                                     "max_shift": MAX_SHIFT, "name": NAME}
    for k in ("n_train", "min_len", "max_len", "max_shift"):
        if getattr(args, k) is None:
            setattr(args, k, base[k])
    out_dir = Path(args.out_dir) if args.out_dir else common.REPO_ROOT / "data" / base["name"]
    sizes = {"train": args.n_train, "val": args.n_val, "test": args.n_test}
    for split, n in sizes.items():
        if n <= 0:
            raise common.PrepareError(f"--n_{split} must be positive, got {n}")
    if not 0 <= args.max_shift < args.min_len <= args.max_len <= 52:
        raise common.PrepareError(
            "need 0 <= max_shift < min_len <= max_len <= 52 "
            f"(got max_shift {args.max_shift}, min_len {args.min_len}, max_len {args.max_len})")
    if args.seed < 0:  # numpy's SeedSequence takes non-negative integers only
        raise common.PrepareError(f"--seed must be >= 0, got {args.seed}")
    row_len = row_len_for(args.max_len, args.max_shift, args.shift_format)
    itos = vocabulary(args.shift_format, args.max_shift)
    # a split is built in memory: uint8 rows and mask, then the uint16 copy (~4 bytes a token)
    split, n = max(sizes.items(), key=lambda kv: kv[1])
    need = 4 * n * row_len
    have = common.physical_memory()
    if have and need > have:
        raise common.PrepareError(
            f"--n_{split} {n:,}: the {split} split is built in memory and needs about "
            f"{need / 2**30:,.1f} GiB ({row_len} tokens an example, ~4 bytes a token), more than "
            f"this machine's {have / 2**30:,.1f} GiB; pass a smaller --n_{split} "
            f"(at most ~{have // (4 * row_len):,})")
    counts = {}
    with common.staged_dataset(out_dir) as stage:
        for split, n in sizes.items():
            toks, mask = generate_split(n, args.seed, split,
                                        args.min_len, args.max_len, args.max_shift,
                                        args.shift_format, args.order)
            counts[split] = common.write_bin(stage / f"{split}.bin", toks, np.uint16)
            common.write_bin(stage / f"{split}_mask.bin", mask, np.uint8)
        meta = {
            "format": NAME,
            "prepare": command,
            "vocab_size": len(itos),
            "dtype": "uint16",
            "itos": itos,
            "row_len": row_len,
            "pad_id": PAD,
            "n_examples": sizes,
            "tokens": counts,
            "seed": args.seed,
            "string_len": [args.min_len, args.max_len],
            "max_shift": args.max_shift,
            "shift_format": args.shift_format,
            "order": args.order,
            "mask": "1 at the target letter only (one scored token per row)",
            "source": "generated (PoPE paper, arXiv 2509.10534, indirect indexing)",
        }
        common.write_meta(stage, meta)
    common.report(out_dir, counts, {s: f"{n:,} examples x {row_len}" for s, n in sizes.items()})
    return counts


if __name__ == "__main__":
    common.run_main(main)
