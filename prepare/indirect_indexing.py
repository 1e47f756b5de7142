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
"""

import argparse
import os
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
    """Example text -> token ids (one per character)."""
    return [STOI[c] for c in text]


def decode(ids, meta=None):
    """Token ids -> the example text (rows end in "\\n" padding)."""
    itos = meta["itos"] if meta and "itos" in meta else ITOS
    return "".join(itos[int(i)] for i in ids)


def format_example(string, char, shift, target):
    return f"{string}, {char}, {shift:+d}, {target}"


def parse_example(line):
    """'ABC..., C, +4, T' -> (string, char, shift, target)."""
    string, char, shift, target = line.split(", ")
    return string, char, int(shift), target


def row_len_for(max_len, max_shift):
    """Longest example (string, ", C, +S, T") plus one "\\n"."""
    return max_len + len(", C, +") + len(str(max_shift)) + len(", T") + 1


def generate_rows(n, rng, min_len=MIN_LEN, max_len=MAX_LEN, max_shift=MAX_SHIFT):
    """n examples as (rows (n, row_len) uint8 token ids, target positions (n,))."""
    row_len = row_len_for(max_len, max_shift)
    length = rng.integers(min_len, max_len + 1, size=n)
    letters = rng.permuted(np.tile(np.arange(52, dtype=np.uint8), (n, 1)), axis=1)[:, :max_len]
    shift = rng.integers(-max_shift, max_shift + 1, size=n)
    lo = np.maximum(0, -shift)
    hi = length - np.maximum(0, shift)  # exclusive; > lo since length > max_shift
    src = rng.integers(lo, hi)
    tgt = src + shift
    ar = np.arange(n)

    rows = np.full((n, row_len), PAD, dtype=np.uint8)
    ids = _LETTER_IDS[letters]
    in_string = np.arange(max_len)[None, :] < length[:, None]
    rows[:, :max_len][in_string] = ids[in_string]

    comma, space = STOI[","], STOI[" "]
    a = np.abs(shift)
    two = a >= 10
    ones, tens = _DIGIT_IDS[a % 10], _DIGIT_IDS[a // 10]
    char, target = ids[ar, src], ids[ar, tgt]
    sign = np.where(shift >= 0, STOI["+"], STOI["-"])
    suffix = np.stack([
        np.full(n, comma), np.full(n, space), char, np.full(n, comma), np.full(n, space), sign,
        np.where(two, tens, ones),
        np.where(two, ones, comma),
        np.where(two, comma, space),
        np.where(two, space, target),
        np.where(two, target, PAD),
    ], axis=1).astype(np.uint8)
    width = min(suffix.shape[1], row_len - max_len)  # the last column is padding when no shift has 2 digits
    rows[ar[:, None], length[:, None] + np.arange(width)[None, :]] = suffix[:, :width]
    target_pos = length + 9 + two
    return rows, target_pos


def generate_split(n, seed, split, min_len=MIN_LEN, max_len=MAX_LEN, max_shift=MAX_SHIFT):
    """All rows of one split: (tokens (n*row_len,), mask (n*row_len,))."""
    row_len = row_len_for(max_len, max_shift)
    rng = np.random.default_rng([seed, SPLIT_SEED_INDEX[split]])
    toks = np.empty((n, row_len), dtype=np.uint8)
    mask = np.zeros((n, row_len), dtype=np.uint8)
    with common.progress(total=n, desc=split, unit="ex") as bar:
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            rows, tpos = generate_rows(m, rng, min_len, max_len, max_shift)
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


QUICK = {"n_train": 100_000, "min_len": 8, "max_len": 12, "max_shift": 3, "name": "indirect_indexing_quick"}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="the CPU quick-start variant: strings of 8-12 letters, shifts in [-3, 3], 100k train "
                        "examples, written to data/indirect_indexing_quick (config/indirect_indexing_quick.py)")
    p.add_argument("--out_dir", default=None, help="output folder (default data/indirect_indexing, "
                                                   "with --quick data/indirect_indexing_quick)")
    p.add_argument("--n_train", type=int, default=None, help="train examples (paper: 1,000,000; --quick: 100,000)")
    p.add_argument("--n_val", type=int, default=10_000, help="val examples (paper: 10,000)")
    p.add_argument("--n_test", type=int, default=10_000, help="test examples (paper: 10,000)")
    p.add_argument("--seed", type=int, default=1234, help="base seed; split k uses default_rng([seed, k])")
    p.add_argument("--min_len", type=int, default=None, help=f"shortest string (paper: {MIN_LEN})")
    p.add_argument("--max_len", type=int, default=None, help=f"longest string (paper: {MAX_LEN}, at most 52)")
    p.add_argument("--max_shift", type=int, default=None, help=f"shifts are in [-max_shift, +max_shift] (paper: {MAX_SHIFT})")
    return p


def rebuild_command(args):
    """meta["prepare"]: the command line that rebuilds this dataset (see common.command_line)."""
    name = QUICK["name"] if args.quick else NAME
    return common.command_line(NAME, build_parser(), args, defaults={"out_dir": str(common.default_out_dir(name))})


def _physical_memory():
    """This machine's RAM in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def main(argv=None):
    args = build_parser().parse_args(argv)
    command = rebuild_command(args)
    base = QUICK if args.quick else {"n_train": 1_000_000, "min_len": MIN_LEN, "max_len": MAX_LEN,
                                     "max_shift": MAX_SHIFT, "name": NAME}
    for k in ("n_train", "min_len", "max_len", "max_shift"):
        if getattr(args, k) is None:
            setattr(args, k, base[k])
    out_dir = Path(args.out_dir) if args.out_dir else common.default_out_dir(base["name"])
    sizes = {"train": args.n_train, "val": args.n_val, "test": args.n_test}
    for split, n in sizes.items():
        if n <= 0:
            raise common.PrepareError(f"--n_{split} must be positive, got {n}")
    if not 0 <= args.max_shift < args.min_len <= args.max_len <= 52:
        raise common.PrepareError("need 0 <= max_shift < min_len <= max_len <= 52 "
                                  f"(got max_shift {args.max_shift}, min_len {args.min_len}, max_len {args.max_len})")
    if args.seed < 0:  # numpy's SeedSequence takes non-negative integers only
        raise common.PrepareError(f"--seed must be >= 0, got {args.seed}")
    row_len = row_len_for(args.max_len, args.max_shift)
    # a split is built in memory: its uint8 rows and mask, then the uint16 copy written (~4 bytes a token)
    split, n = max(sizes.items(), key=lambda kv: kv[1])
    need, have = 4 * n * row_len, _physical_memory()
    if have and need > have:
        raise common.PrepareError(
            f"--n_{split} {n:,}: the {split} split is built in memory and needs about {need / 2**30:,.1f} GiB "
            f"({row_len} tokens an example, ~4 bytes a token), more than this machine's {have / 2**30:,.1f} GiB; "
            f"pass a smaller --n_{split} (at most ~{have // (4 * row_len):,})")
    counts = {}
    with common.staged_dataset(out_dir) as stage:
        for split, n in sizes.items():
            toks, mask = generate_split(n, args.seed, split, args.min_len, args.max_len, args.max_shift)
            counts[split] = common.write_bin(stage / f"{split}.bin", toks, np.uint16)
            common.write_bin(stage / f"{split}_mask.bin", mask, np.uint8)
        meta = {
            "format": NAME,
            "prepare": command,
            "vocab_size": len(ITOS),
            "dtype": "uint16",
            "itos": ITOS,
            "row_len": row_len,
            "pad_id": PAD,
            "n_examples": sizes,
            "tokens": counts,
            "seed": args.seed,
            "string_len": [args.min_len, args.max_len],
            "max_shift": args.max_shift,
            "mask": "1 at the target letter only (one scored token per row)",
            "source": "generated (PoPE paper, arXiv 2509.10534, indirect indexing)",
        }
        common.write_meta(stage, meta)
    common.report(out_dir, counts, {s: f"{n:,} examples x {row_len}" for s, n in sizes.items()})
    return counts


if __name__ == "__main__":
    common.run_main(main)
