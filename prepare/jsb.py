"""JSB Chorales (16th-note grid, 4 voices) for next-token modelling.

Usage:
    python prepare/jsb.py --input $POPE_SHARED_DATA/music/Jsb16thSeparated.json
    python prepare/jsb.py --input $POPE_SHARED_DATA/music          # a folder holding the .json
    python prepare/jsb.py  # downloads the .json (needs network)
    python prepare/jsb.py --input Jsb16thSeparated.npz --allow_pickle
        # the pickled .npz: trusted files only

Source: the standard Boulanger-Lewandowski (2012) split in the Coconet
"Jsb16thSeparated" format, https://github.com/czhuang/JSB-Chorales-dataset
(Jsb16thSeparated.json, or the same data as Jsb16thSeparated.npz): 229 / 76 / 77
chorales for train / valid / test, each a (T, 4) array of MIDI pitches
(soprano, alto, tenor, bass) per 16th note, -1 (json) or NaN (npz) for a silent
voice. "valid" is written as val.

Input: the .json is the default and the documented input. The .npz stores its
pieces as object arrays, which numpy can only read by unpickling them, and
unpickling a crafted file runs arbitrary code before any check; so an .npz is
read only with --allow_pickle (use it only for files you trust). Both files
give byte-identical .bin files.

Tokenization: raster scan, time-major: at each 16th-note step the four
voices S, A, T, B, one token each, so a chorale of T steps is 4T tokens and
the voice of a token is its offset mod 4 after the row's start token.
Vocabulary, 90 tokens (the paper's size), id = position:
    0      "<s>"   starts every row, and pads it (never scored)
    1      "R"     silent voice (rest)
    2..89  MIDI pitch 21..108 (the 88 piano keys, id = pitch - 19), named
           "A0", "A#0", "B0", "C1", ..., "C4" (= 60), ..., "C8"; sharps only.
The data uses pitches 36..81; a pitch outside 21..108 is an error.
Held notes and repeated notes are not distinguished (as in the source).

Rows: one chorale per row of exactly --max_len tokens (default 2048; meta
row_len), laid out as <s>, the chorale's tokens, then <s> padding. A row
holds at most (max_len - 1) // 4 = 511 steps; the few longer chorales
(2 train, 3 valid, 2 test) continue in the next row, which starts with <s>
again. The loss mask is 1 on every chorale token and 0 on <s>, so each
token of a split is scored exactly once: the scored tokens are 4 x steps
(train 220,912, val 73,632, test 75,600), the paper's test NLL per token.
"""

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from prepare import common

NAME = "jsb"
URL = "https://github.com/czhuang/JSB-Chorales-dataset/raw/master/Jsb16thSeparated.json"
SOURCE_SPLITS = {"train": "train", "val": "valid", "test": "test"}
NOTE_NAMES = ["C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B"]
LOW, HIGH = 21, 108
START, REST = 0, 1
PROMPT = "<s>"  # sample.py's default prompt: the start of a row
ITOS = ["<s>", "R"] + [f"{NOTE_NAMES[p % 12]}{p // 12 - 1}" for p in range(LOW, HIGH + 1)]
VOICES = ("S", "A", "T", "B")


# -----------------------------------------------------------------------------
# reading

def find_input(path):
    """The input file: path itself, or in a folder Jsb16thSeparated.json (else
    Jsb16thSeparated.npz, else the first .json, else the first .npz)."""
    path = Path(path)
    if path.is_dir():
        for name in ("Jsb16thSeparated.json", "Jsb16thSeparated.npz"):
            if (path / name).exists():
                return path / name
        cands = sorted(path.glob("*.json")) + sorted(path.glob("*.npz"))
        if not cands:
            raise common.PrepareError(f"no .json or .npz JSB file in {path}")
        return cands[0]
    if not path.exists():
        raise common.PrepareError(f"--input {path} does not exist")
    return path


def _read_json(path):
    raw = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError("expected a JSON object with the keys train, valid, test")
    return {key: [np.asarray(p, dtype=np.float64) for p in raw[key]] if key in raw else None
            for key in SOURCE_SPLITS.values()}


def _read_npz(path):
    """Unpickles: only behind --allow_pickle."""
    with np.load(path, allow_pickle=True, encoding="latin1") as raw:
        return {key: ([np.asarray(p, dtype=np.float64) for p in raw[key]]
                      if key in raw.files else None)
                for key in SOURCE_SPLITS.values()}


def load_pieces(path, allow_pickle=False):
    """{'train'|'val'|'test': [int array (T, 4), -1 = silent]} from the .json, or
    from the .npz when allow_pickle (the .npz is read by unpickling: trusted files only)."""
    path = find_input(path)
    if path.suffix == ".npz" and not allow_pickle:
        raise common.PrepareError(
            f"{path} is a pickled .npz (numpy reads its object arrays only by unpickling, which "
            "can run code): pass the .json form of the data (Jsb16thSeparated.json, the same "
            "chorales) with --input, or add --allow_pickle if you trust this file")
    if path.suffix not in (".npz", ".json"):
        raise common.PrepareError(
            f"{path}: expected a .json (or, with --allow_pickle, a .npz) file")
    try:
        raw = _read_npz(path) if path.suffix == ".npz" else _read_json(path)
    except Exception as e:
        raise common.PrepareError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    out = {}
    for split, key in SOURCE_SPLITS.items():
        pieces = raw[key]
        if pieces is None:
            raise common.PrepareError(f"{path} has no '{key}' split")
        if not pieces:
            raise common.PrepareError(f"{path}: split '{key}' is empty")
        conv = []
        for i, p in enumerate(pieces):
            if p.ndim != 2 or p.shape[1] != 4 or p.shape[0] == 0:
                raise common.PrepareError(
                    f"{path}: {key}[{i}] has shape {p.shape}, expected (T>0, 4)")
            p = np.where(np.isnan(p), -1, p)
            if np.any(p != np.round(p)):
                raise common.PrepareError(f"{path}: {key}[{i}] has non-integer pitches")
            p = p.astype(np.int64)
            bad = (p != -1) & ((p < LOW) | (p > HIGH))
            if bad.any():
                raise common.PrepareError(
                    f"{path}: {key}[{i}] has pitch {p[bad][0]} outside {LOW}..{HIGH}")
            conv.append(p)
        out[split] = conv
    return out, path


# -----------------------------------------------------------------------------
# tokens

def encode_piece(roll):
    """(T, 4) pitches (-1 = silent) -> 4T token ids, time-major S A T B."""
    roll = np.asarray(roll)
    return np.where(roll < 0, REST, roll - LOW + 2).astype(np.int64).ravel()


def encode(text, meta=None):
    """Whitespace-separated token names -> ids ("." is accepted for "R"), e.g.
    "<s> C5 G4 E4 C3" (a prompt: the start token and one 16th-note step)."""
    stoi = {s: i for i, s in enumerate(ITOS)}
    stoi["."] = REST
    try:
        return [stoi[t] for t in text.split()]
    except KeyError as e:
        raise ValueError(
            f"unknown JSB token {e.args[0]!r}; "
            "tokens are <s>, R (or .) and note names A0..C8") from None


def encode_prompt(text, meta=None):
    """sample.py's prompt: encode's ids, first <s> as in every training row (the voices S A T B
    follow it in turn: a prompt without it would put each note in the next voice)."""
    ids = encode(text)
    if ids[:1] != [START]:
        raise ValueError('a JSB prompt starts with <s>, as every row does: "<s> C5 G4 E4 C3"')
    return ids


def roll_from_ids(ids):
    """Inverse of encode_piece on chorale tokens (<s> ids are skipped; a
    trailing partial step is dropped): (T, 4) pitches, -1 = silent."""
    ids = np.asarray([i for i in ids if i != START], dtype=np.int64)
    ids = ids[: len(ids) // 4 * 4].reshape(-1, 4)
    return np.where(ids == REST, -1, ids - 2 + LOW)


def rows_for_piece(roll, max_len):
    """Rows (k, max_len) and masks for one chorale."""
    steps = (max_len - 1) // 4
    toks = encode_piece(roll).reshape(-1, 4)
    rows, masks = [], []
    for s in range(0, len(toks), steps):
        chunk = toks[s:s + steps].ravel()
        row = np.full(max_len, START, dtype=np.int64)
        mask = np.zeros(max_len, dtype=np.uint8)
        row[1:1 + len(chunk)] = chunk
        mask[1:1 + len(chunk)] = 1
        rows.append(row)
        masks.append(mask)
    return rows, masks


def _split_groups(ids):
    """Token ids -> list of chorales, each a list of steps (lists of names)."""
    groups, cur, step = [], [], []
    for i in ids:
        i = int(i)
        if i == START:
            if step:
                cur.append(step)
                step = []
            if cur:
                groups.append(cur)
                cur = []
            continue
        step.append(ITOS[i] if 0 <= i < len(ITOS) else "?")
        if len(step) == 4:
            cur.append(step)
            step = []
    if step:
        cur.append(step)
    if cur:
        groups.append(cur)
    return groups


def decode(ids, meta=None):
    """Readable piano roll: one line per 16th note, columns S A T B, '.' for
    a rest, a '--' line between chorales (at <s>)."""
    out = []
    for g, steps in enumerate(_split_groups(ids)):
        if g:
            out.append("--")
        out.append("step    S    A    T    B")
        for t, step in enumerate(steps):
            cells = " ".join(f"{'.' if x == 'R' else x:>4}" for x in step)
            out.append(f"{t:4d} {cells}")
    return "\n".join(out) + "\n"


def save_sample(ids, meta, path_without_ext):
    """Write a 4-track MIDI file (S, A, T, B; 16th = 120 ticks at 120 bpm;
    equal consecutive pitches of a voice are joined into one held note) when
    symusic (installed with miditok) is present, else the text piano roll.
    Returns the written path."""
    try:
        import symusic
    except ImportError:
        with common.output_file(f"{path_without_ext}.txt") as f:
            f.write(decode(ids, meta).encode("utf-8"))
        return f"{path_without_ext}.txt"
    steps = [s for g in _split_groups(ids) for s in g if len(s) == 4]
    score = symusic.Score(480)
    tick = 120
    for v, vname in enumerate(VOICES):
        track = symusic.Track(name=vname, program=0)
        start, cur = 0, None
        for t, step in enumerate(steps + [["R"] * 4]):
            name = step[v]
            pitch = None if name in ("R", "?") else ITOS.index(name) - 2 + LOW
            if pitch != cur:
                if cur is not None:
                    track.notes.append(symusic.Note(start * tick, (t - start) * tick, cur, 80))
                start, cur = t, pitch
        score.tracks.append(track)
    with common.output_file(f"{path_without_ext}.mid") as f:  # whole or not at all (a full disk)
        f.write(score.dumps_midi())
    return f"{path_without_ext}.mid"


# -----------------------------------------------------------------------------
# main

def build_parser():
    p = common.script_parser(
        __doc__,
        NAME,
        help="Jsb16thSeparated.json, or a folder holding it (without it: download the .json from "
             + URL + ")",
    )
    p.add_argument("--allow_pickle", action="store_true",
                   help="also read the .npz form (Jsb16thSeparated.npz). DANGEROUS: it stores "
                        "object arrays, which numpy can only read by unpickling, and unpickling a "
                        "crafted file runs arbitrary code; use it only for files you trust (the "
                        ".json holds the same data, with no pickle)")
    p.add_argument("--max_len", type=int, default=2048, help="row length in tokens (default 2048)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.max_len < 5:
        raise common.PrepareError("--max_len must be at least 5 (one start token and one step)")
    out_dir = Path(args.out_dir)
    with common.staged_dataset(out_dir) as stage:
        src = args.input or common.download(
            URL, out_dir, f"Download {URL} and pass it with --input FILE.")
        pieces, src = load_pieces(src, allow_pickle=args.allow_pickle)

        counts, scored, extra, n_rows, n_split = {}, {}, {}, {}, {}
        for split, plist in pieces.items():
            rows, masks = [], []
            for roll in common.progress(plist, desc=split, unit="chorale"):
                r, m = rows_for_piece(roll, args.max_len)
                rows += r
                masks += m
                n_split[split] = n_split.get(split, 0) + (len(r) > 1)
            toks = np.concatenate(rows)
            mask = np.concatenate(masks)
            counts[split] = common.write_bin(stage / f"{split}.bin", toks, np.uint16)
            common.write_bin(stage / f"{split}_mask.bin", mask, np.uint8)
            scored[split] = int(mask.sum())
            n_rows[split] = len(rows)
            extra[split] = f"{len(plist)} chorales, {len(rows)} rows, {scored[split]:,} scored"
        meta = {
            "format": NAME,
            "prepare": common.command_line(NAME, build_parser(), args),
            "vocab_size": len(ITOS),
            "dtype": "uint16",
            "itos": ITOS,
            "row_len": args.max_len,
            "pad_id": START,
            "start_id": START,
            "chorales": {s: len(p) for s, p in pieces.items()},
            "rows": n_rows,
            "chorales_split_over_rows": n_split,
            "tokens": counts,
            "scored_tokens": scored,
            "source": "https://github.com/czhuang/JSB-Chorales-dataset",
            "input": Path(src).name,
        }
        common.write_meta(stage, meta)
    common.report(out_dir, counts, extra)
    return counts


if __name__ == "__main__":
    common.run_main(main)
