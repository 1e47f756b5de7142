"""MAESTRO piano performances as REMI tokens (miditok).

Usage:
    python prepare/maestro.py --input $POPE_SHARED_DATA/music/maestro  # v2.0.0 sample (973 files)
    python prepare/maestro.py --input maestro-v3.0.0/                # full v3 (unzipped midi zip)
    python prepare/maestro.py             # downloads the v3.0.0 MIDI zip (~57 MB, needs network)

Needs: pip install miditok (it brings symusic). Tested with miditok 3.1.0,
symusic 0.6.0.

Source: MAESTRO v3.0.0 (v2.0.0 reads the same way),
https://storage.googleapis.com/magentadata/datasets/maestro/v3.0.0/maestro-v3.0.0-midi.zip
--input is the folder that holds maestro-v*.csv and the MIDI files named in
its midi_filename column. The csv's split column gives the official split:
train -> train, validation -> val, test -> test; files keep the csv order.
A file that cannot be parsed (corrupt MIDI) or that has no notes is skipped
and counted in meta.json (skipped_corrupt, skipped_empty); a csv row whose
file is missing is counted too (missing). An empty csv, or no readable file
in a split, is an error.

Tokenization: miditok REMI with this configuration, a vocabulary of 328
(the paper's ~328):
    3 specials   PAD_None, BOS_None, EOS_None (ids 0, 1, 2)
    1 Bar_None
   89 Pitch_21 .. Pitch_109 (miditok's default range: the 88 piano keys and 109)
   32 Velocity_* (32 bins)
   64 Duration_* (beat resolution 8 per beat up to 4 beats, 4 per beat to 12)
   96 Position_0 .. Position_95 (8 per beat, bars up to 12 beats)
   32 Tempo_* (32 bins, 40-250 bpm)
    9 TimeSig_* (miditok's default time signature range)
    2 Pedal_0, PedalOff_0 (sustain pedal)
No drum pitches, no programs: all tracks of a file are merged into one piano
track (MAESTRO files have one). meta.json "itos" lists every token name.

Each piece is written as BOS, its REMI tokens, EOS; pieces follow each other
in one stream per split (no row_len), and train.py takes windows of
block_size = 2048 tokens (the paper's max length) from it.

Augmentation (train only): every train piece is written 2 * --transpose + 1
times, transposed by 0, -1, +1, -2, +2, -3, +3 semitones for --transpose 3.
A transposition is applied to the Pitch tokens (the same tokens as
transposing the MIDI, which tests check); one that would push a note out of
21..109 is left out and counted (transpositions_skipped).
"""

import csv
import io
import os
import sys
import zipfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from prepare import common

NAME = "maestro"
URL = "https://storage.googleapis.com/magentadata/datasets/maestro/v3.0.0/maestro-v3.0.0-midi.zip"
CSV_SPLITS = {"train": "train", "validation": "val", "test": "test"}
VOCAB_SIZE = 328
PITCH_LOW, PITCH_HIGH = 21, 109  # miditok's default piano range (inclusive)
PAD, BOS, EOS = 0, 1, 2
PROMPT = "BOS_None"  # sample.py's default prompt: the start of a piece

_TOKENIZER = None


def make_tokenizer():
    """The REMI tokenizer described in the module docstring (328 tokens)."""
    miditok = common.require("miditok", "miditok", "MAESTRO tokenization (REMI)")
    cfg = miditok.TokenizerConfig(
        pitch_range=(PITCH_LOW, PITCH_HIGH),
        beat_res={(0, 4): 8, (4, 12): 4},
        num_velocities=32,
        special_tokens=["PAD", "BOS", "EOS"],
        use_chords=False,
        use_rests=False,
        use_tempos=True,
        num_tempos=32,
        tempo_range=(40, 250),
        use_time_signatures=True,
        use_sustain_pedals=True,
        use_pitch_bends=False,
        use_programs=False,
        use_pitchdrum_tokens=False,
    )
    tok = miditok.REMI(cfg)
    if len(tok) != VOCAB_SIZE:
        raise common.PrepareError(f"this miditok version gives a REMI vocabulary of {len(tok)}, "
                                  f"expected {VOCAB_SIZE}; use miditok 3.1.0")
    return tok


def itos_of(tok):
    itos = [None] * len(tok)
    for name, i in tok.vocab.items():
        itos[i] = name
    return itos


def _init_worker():
    global _TOKENIZER
    _TOKENIZER = make_tokenizer()


def tokenize_file(path, tok=None):
    """(status, ids or message) for one MIDI file: status is 'ok',
    'corrupt' (cannot be parsed) or 'empty' (no notes)."""
    tok = tok or _TOKENIZER
    import symusic
    try:
        score = symusic.Score(str(path))
    except Exception as e:
        return "corrupt", f"{type(e).__name__}: {e}"
    tracks = [t for t in score.tracks if len(t.notes)]
    if not tracks:
        return "empty", "no notes"
    if len(score.tracks) > 1:  # merge into one piano track
        t0 = tracks[0]
        for t in tracks[1:]:
            t0.notes.extend(t.notes)
            t0.pedals.extend(t.pedals)
            t0.controls.extend(t.controls)
        t0.notes.sort()
        t0.pedals.sort()
        t0.controls.sort()
        score.tracks = [t0]
    try:
        seqs = tok.encode(score)
    except Exception as e:
        return "corrupt", f"tokenizer: {type(e).__name__}: {e}"
    seq = seqs[0] if isinstance(seqs, list) else seqs
    if not seq.ids:
        return "empty", "no tokens"
    return "ok", np.asarray(seq.ids, dtype=np.int64)


class Transposer:
    """Shift the Pitch tokens of an id array by k semitones."""

    def __init__(self, itos):
        self.pitch = np.full(len(itos), -1, dtype=np.int64)
        self.id_of = np.full(128, -1, dtype=np.int64)
        for i, name in enumerate(itos):
            if name.startswith("Pitch_"):
                p = int(name.split("_")[1])
                self.pitch[i] = p
                self.id_of[p] = i

    def __call__(self, ids, k):
        """Transposed ids, or None if a note would leave 21..109."""
        if k == 0:
            return ids
        p = self.pitch[ids]
        is_pitch = p >= 0
        q = p[is_pitch] + k
        if q.size and (q.min() < PITCH_LOW or q.max() > PITCH_HIGH):
            return None
        out = ids.copy()
        out[is_pitch] = self.id_of[q]
        return out


def offsets_for(transpose):
    return [0] + [s * k for k in range(1, transpose + 1) for s in (-1, 1)]


# -----------------------------------------------------------------------------
# decode / sample

def encode(text, meta):
    """Whitespace-separated REMI token names (as decode writes them) -> ids."""
    stoi = {s: i for i, s in enumerate(meta["itos"])}
    try:
        return [stoi[t] for t in text.split()]
    except KeyError as e:
        raise ValueError(f"unknown REMI token {e.args[0]!r} (see meta.json itos)") from None


def decode(ids, meta):
    """Token names, space separated, a new line at every Bar/BOS/EOS."""
    itos = meta["itos"]
    out = []
    for i in ids:
        name = itos[int(i)] if 0 <= int(i) < len(itos) else f"<{int(i)}?>"
        if name in ("Bar_None", "BOS_None", "EOS_None") and out:
            out.append("\n")
        elif out:
            out.append(" ")
        out.append(name)
    return "".join(out) + "\n"


def save_sample(ids, meta, path_without_ext):
    """Write the tokens as a MIDI file (special tokens dropped); returns its path. A sample with no
    notes is still written, with a warning on stderr."""
    tok = make_tokenizer()
    if meta is not None and meta.get("itos") and meta["itos"] != itos_of(tok):
        raise common.PrepareError(
            "meta.json's vocabulary differs from this miditok's REMI vocabulary")
    ids = [int(i) for i in ids if int(i) not in (PAD, BOS, EOS)]
    out = f"{path_without_ext}.mid"
    score = tok.decode([ids])
    with common.output_file(out) as f:  # whole or not at all (a full disk)
        f.write(score.dumps_midi())
    # (an untrained model's tokens, say): silent, but not silently
    if not any(len(t.notes) for t in score.tracks):
        common.log(
            f"warning: {out} has no notes: no Pitch, Velocity, Duration group among the sample's "
            f"{len(ids)} tokens (an untrained model's output?); written anyway")
    return out


# -----------------------------------------------------------------------------
# main

def find_csv(folder):
    folder = Path(folder)
    if not folder.is_dir():
        raise common.PrepareError(
            f"--input {folder} is not a folder (expected the MAESTRO folder with maestro-v*.csv)")
    cands = sorted(folder.glob("maestro-v*.csv")) or sorted(folder.glob("*/maestro-v*.csv"))
    if not cands:
        raise common.PrepareError(
            f"no maestro-v*.csv in {folder}; pass the unzipped MAESTRO folder")
    return cands[-1]


def read_rows(csv_path):
    text = common.utf8(Path(csv_path).read_bytes(), csv_path)
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    if not rows:
        raise common.PrepareError(f"{csv_path} lists no MIDI files (empty input)")
    for col in ("split", "midi_filename"):
        if col not in rows[0]:
            raise common.PrepareError(f"{csv_path} has no '{col}' column")
    bad = sorted({r["split"] for r in rows} - set(CSV_SPLITS))
    if bad:
        raise common.PrepareError(f"{csv_path}: unknown split values {bad}")
    return rows


def fetch(out_dir):
    z = common.download(URL, out_dir, f"Download {URL}, unzip it, and pass the folder holding "
                                          "maestro-v3.0.0.csv with --input DIR.")
    folder = z.parent / "maestro-v3.0.0"
    if not folder.exists():
        with zipfile.ZipFile(z) as zf:
            zf.extractall(z.parent)
    return folder


def build_parser():
    p = common.script_parser(
        __doc__,
        NAME,
        help="MAESTRO folder with maestro-v*.csv and the MIDI files (without it: download "
             + URL + ")",
    )
    p.add_argument("--transpose", type=int, default=3,
                   help="train transpositions up to +-N semitones (default 3, 0 = none)")
    p.add_argument("--num_proc", type=int, default=min(8, os.cpu_count() or 1),
                   help="tokenizer worker processes")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not 0 <= args.transpose <= 12:
        raise common.PrepareError("--transpose must be in 0..12")
    out_dir = Path(args.out_dir)
    tok = make_tokenizer()  # fails fast, naming miditok, when it is missing
    common.require("symusic", "miditok", "reading MIDI (symusic, installed with miditok)")
    with common.staged_dataset(out_dir) as stage:
        folder = Path(args.input) if args.input else fetch(out_dir)
        csv_path = find_csv(folder)
        rows = read_rows(csv_path)
        itos = itos_of(tok)
        transposer = Transposer(itos)
        offsets = offsets_for(args.transpose)

        jobs, missing = [], []
        for r in rows:
            path = csv_path.parent / r["midi_filename"]
            if path.is_file():
                jobs.append((CSV_SPLITS[r["split"]], r["midi_filename"], path))
            else:
                missing.append(r["midi_filename"])
        if missing:
            common.log(
                f"warning: {len(missing)} MIDI files listed in {csv_path.name} are missing, "
                f"e.g. {missing[0]}")

        pieces = {s: 0 for s in common.SPLITS}
        sequences = {s: 0 for s in common.SPLITS}
        corrupt, empty, skipped_tr = [], [], 0
        import multiprocessing as mp
        with common.split_writers(stage, common.SPLITS) as writers:
            with mp.get_context("spawn").Pool(max(1, args.num_proc),
                                              initializer=_init_worker) as pool:
                results = pool.imap(tokenize_file, [j[2] for j in jobs], chunksize=2)
                for (split, name, _), (status, res) in zip(jobs, common.progress(
                        results, total=len(jobs), desc="tokenizing", unit="file")):
                    if status == "corrupt":
                        corrupt.append(name)
                        common.log(f"skipped corrupt MIDI {name}: {res}")
                        continue
                    if status == "empty":
                        empty.append(name)
                        continue
                    pieces[split] += 1
                    for k in (offsets if split == "train" else [0]):
                        ids = transposer(res, k)
                        if ids is None:
                            skipped_tr += 1
                            continue
                        writers[split].write(np.concatenate([[BOS], ids, [EOS]]))
                        sequences[split] += 1
            for s in common.SPLITS:
                if pieces[s] == 0:
                    raise common.PrepareError(
                        f"no readable MIDI file in split '{s}' of {csv_path} "
                        f"({len(corrupt)} corrupt, {len(empty)} empty, {len(missing)} missing)")
        counts = {s: w.count for s, w in writers.items()}
        meta = {
            "format": NAME,
            "prepare": common.command_line(NAME, build_parser(), args),
            "vocab_size": len(itos),
            "dtype": "uint16",
            "itos": itos,
            "pad_id": PAD, "bos_id": BOS, "eos_id": EOS,
            "tokenization": "miditok REMI (see prepare/maestro.py)",
            "transpose": offsets,
            "pieces": pieces,
            "sequences": sequences,
            "tokens": counts,
            "skipped_corrupt": len(corrupt),
            "skipped_corrupt_files": corrupt,
            "skipped_empty": len(empty),
            "missing": len(missing),
            "transpositions_skipped": skipped_tr,
            "csv": csv_path.name,
            "source": URL,
        }
        common.write_meta(stage, meta)
    common.report(out_dir, counts,
                  {s: f"{pieces[s]} pieces, {sequences[s]} sequences" for s in counts})
    if corrupt:
        print(f"  skipped {len(corrupt)} corrupt MIDI file(s)")
    return counts


if __name__ == "__main__":
    common.run_main(main)
