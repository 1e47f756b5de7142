"""Human reference genome as Nucleotide-Transformer-style 6-mer tokens.

Usage:
    python prepare/genome.py --input $POPE_SHARED_DATA/genome/chr20.fa.gz     # GRCh37 chr20 sample
    python prepare/genome.py --input hg38.fa.gz --val_chroms 21 --test_chroms 22
    python prepare/genome.py --input hg38.fa.gz --chroms $(seq -s, 1 22),X \\
        --val_chroms 21 --test_chroms 22
    python prepare/genome.py  # downloads hg38.fa.gz from UCSC (~940 MB, needs network)

Source: hg38 from UCSC, https://hgdownload.soe.ucsc.edu/goldenPath/hg38/bigZips/hg38.fa.gz
(the HF dataset InstaDeepAI/human_reference_genome holds the same assembly).
Any local FASTA, plain or gzip/bgzip (.fa, .fa.gz, .fasta...), works with
--input; a folder means every FASTA file in it, in sorted order.

Tokenization (vocab 4107, id = position):
    0..5       <unk> <pad> <mask> <cls> <eos> <bos>
    6..4101    the 4096 6-mers in lexicographic order over A<C<G<T:
               id = 6 + sum(code(b_i) * 4**(5-i)), code A=0 C=1 G=2 T=3
               (AAAAAA = 6, AAAAAC = 7, ..., TTTTTT = 4101)
    4102..4106 single nucleotides A C G T N
Bases are upper-cased (soft-masking is ignored). Every character that is
not A/C/G/T (N runs, and the rare IUPAC codes such as R or Y) is dropped
and breaks the sequence: each maximal run of A/C/G/T (a "contig") is cut
into 6-mers from its first base, the last len % 6 bases become single
nucleotide tokens, and <eos> follows the contig. So decode() gives one
contig per line and decode(tokens of a contig) is the contig exactly.
<unk>, <pad>, <mask>, <cls>, <bos> and N are in the vocabulary (4107, as
in the Nucleotide Transformer) but never written.

Splits: validation and test are held-out chromosomes (--val_chroms,
--test_chroms; names match with or without a "chr" prefix) or, when none is
given, held-out regions: of every other record, the last --holdout_frac
(default 1%) of its coordinates goes to test and the --holdout_frac before
that to val, the rest to train. meta.json records each region (0-based,
half open) and the bases dropped. Contigs never span a split boundary.
Context for the paper's model: 1000 tokens (config/genome.py).
"""

import gzip
import re
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from prepare import common

NAME = "genome"
URL = "https://hgdownload.soe.ucsc.edu/goldenPath/hg38/bigZips/hg38.fa.gz"
SPECIALS = ["<unk>", "<pad>", "<mask>", "<cls>", "<eos>", "<bos>"]
EOS = SPECIALS.index("<eos>")
PROMPT = ""  # sample.py's default prompt: nothing yet, so encode_prompt starts a new contig
BASES = "ACGT"
K = 6
KMER0 = len(SPECIALS)                  # 6
SINGLE0 = KMER0 + 4 ** K               # 4102
KMERS = ["".join(BASES[(n >> (2 * (K - 1 - i))) & 3] for i in range(K)) for n in range(4 ** K)]
ITOS = SPECIALS + KMERS + list("ACGTN")
VOCAB_SIZE = len(ITOS)                 # 4107
FASTA_SUFFIXES = (".fa", ".fasta", ".fna", ".fa.gz", ".fasta.gz", ".fna.gz")

_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _b in enumerate(BASES):
    _LUT[ord(_b)] = _i
    _LUT[ord(_b.lower())] = _i
_POW = (4 ** np.arange(K - 1, -1, -1)).astype(np.int64)


# -----------------------------------------------------------------------------
# tokens

def encode_contig(seq):
    """A/C/G/T string (or uint8 codes 0..3) -> token ids, no <eos>."""
    codes = (_LUT[np.frombuffer(seq.encode("ascii"), dtype=np.uint8)] if isinstance(seq, str)
             else np.asarray(seq))
    if codes.size and codes.max() > 3:
        raise ValueError("encode_contig takes A/C/G/T only")
    k = len(codes) // K
    kmers = codes[:k * K].reshape(k, K).astype(np.int64) @ _POW + KMER0
    singles = codes[k * K:].astype(np.int64) + SINGLE0
    return np.concatenate([kmers, singles])


def contigs(codes):
    """(start, end) of every maximal run of codes < 4."""
    valid = (codes < 4).view(np.int8)
    d = np.diff(np.concatenate([[0], valid, [0]]).astype(np.int8))
    return zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist())


def tokenize(codes):
    """uint8 codes (0..3 = ACGT, 255 = anything else) -> (ids, n contigs):
    every contig's tokens followed by <eos>."""
    parts, n = [], 0
    for s, e in contigs(codes):
        parts.append(encode_contig(codes[s:e]))
        parts.append(np.array([EOS], dtype=np.int64))
        n += 1
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return ids, n


def encode(seq, meta=None):
    """Any sequence string -> token ids as the prepared files hold them
    (every contig followed by <eos>; characters other than A/C/G/T break it)."""
    return tokenize(_LUT[np.frombuffer(seq.encode("ascii"), dtype=np.uint8)])[0].tolist()


def encode_prompt(seq, meta=None):
    """sample.py's prompt: the start of a contig, encoded as encode does but left open (no <eos>
    after its last contig, which would tell the model that the contig ended; whitespace at its end
    is ignored, so a file's last newline does not close it either). An empty prompt is [<eos>]: a
    new contig starts, as after any other."""
    if not seq.strip():
        return [EOS]
    ids = encode(seq.rstrip(), meta)
    if not ids:
        raise ValueError(
            "the prompt holds no A/C/G/T: give a DNA string (or none, for a new contig)")
    return ids[:-1]


def decode(ids, meta=None):
    """Token ids -> nucleotides; <eos> ends a line (one contig per line),
    other special tokens appear as their names."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS:
            out.append("\n")
        elif 0 <= i < VOCAB_SIZE:
            out.append(ITOS[i])
        else:
            out.append("<?>")
    return "".join(out)


# -----------------------------------------------------------------------------
# reading

def _is_gzip(path):
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def read_fasta(path, chunk_size=1 << 24):
    """Yield (name, upper-case sequence bytes) per record, streaming."""
    path = Path(path)
    raw = open(path, "rb")
    f = gzip.GzipFile(fileobj=raw) if _is_gzip(path) else raw
    total = path.stat().st_size
    bar = common.progress(total=total, desc=path.name, unit="B")
    name, buf, carry, seen_header = None, bytearray(), b"", False
    try:
        while True:
            try:
                chunk = f.read(chunk_size)
            except (OSError, EOFError) as e:
                raise common.PrepareError(f"{path}: corrupt compressed FASTA ({e})") from e
            bar.update(raw.tell() - bar.n)
            data = carry + chunk
            if chunk:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    carry = data
                    continue
                block, carry = data[:cut], data[cut:]
            else:
                block, carry = data, b""
                if not block:
                    break
            pos = 0
            while pos < len(block):
                h = block.find(b">", pos)
                body = block[pos:] if h == -1 else block[pos:h]
                if body.strip() and not seen_header:
                    raise common.PrepareError(
                        f"{path}: not a FASTA file (no '>' header before the sequence)")
                buf += body.replace(b"\n", b"").replace(b"\r", b"").replace(b" ", b"")
                if h == -1:
                    break
                if seen_header:
                    yield name, bytes(buf).upper()
                buf = bytearray()
                e = block.find(b"\n", h)
                e = len(block) if e == -1 else e
                header = block[h + 1:e].decode("ascii", "replace").strip()
                name = header.split()[0] if header else f"record{e}"
                seen_header = True
                pos = e + 1
        if seen_header:
            yield name, bytes(buf).upper()
    finally:
        bar.close()
        f.close()
        raw.close()


def input_files(path):
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.lower().endswith(FASTA_SUFFIXES))
        if not files:
            raise common.PrepareError(f"no FASTA file ({', '.join(FASTA_SUFFIXES)}) in {path}")
        return files
    if not path.exists():
        raise common.PrepareError(f"--input {path} does not exist")
    return [path]


def _norm(name):
    return re.sub(r"^chr", "", name, flags=re.IGNORECASE)


# -----------------------------------------------------------------------------
# main

def build_parser():
    p = common.script_parser(
        __doc__,
        NAME,
        help="FASTA file (.fa/.fa.gz) or folder of them (without it: download " + URL + ")",
    )
    p.add_argument("--val_chroms", default="",
                   help="comma list of records held out as val, e.g. 21 (default: regions)")
    p.add_argument("--test_chroms", default="",
                   help="comma list of records held out as test, e.g. 22 (default: regions)")
    p.add_argument("--chroms", default="",
                   help="comma list of records to use at all (default: every record)")
    p.add_argument("--holdout_frac", type=float, default=0.01,
                   help="fraction of each record's coordinates held out per split when no "
                        "chromosome is given")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out_dir)
    if not 0 < args.holdout_frac < 0.5:
        raise common.PrepareError("--holdout_frac must be in (0, 0.5)")
    lst = lambda s: {_norm(x.strip()) for x in s.split(",") if x.strip()}
    val_chroms, test_chroms, keep = lst(args.val_chroms), lst(args.test_chroms), lst(args.chroms)
    if val_chroms & test_chroms:
        raise common.PrepareError(
            "chromosomes in both --val_chroms and --test_chroms: "
            f"{sorted(val_chroms & test_chroms)}")
    f = args.holdout_frac

    with common.staged_dataset(out_dir) as stage:
        src = args.input or common.download(
            URL, out_dir, f"Download {URL} (or any reference FASTA, plain or gzip) and pass it "
                          "with --input FILE.")
        stats = {s: {"bases": 0, "contigs": 0} for s in common.SPLITS}
        records, regions, dropped, seen, names = [], {}, 0, set(), []
        with common.split_writers(stage, common.SPLITS) as writers:
            for path in input_files(src):
                for name, seq in read_fasta(path):
                    names.append(name)
                    if keep and _norm(name) not in keep:
                        continue
                    seen.add(_norm(name))
                    codes = _LUT[np.frombuffer(seq, dtype=np.uint8)]
                    L = len(codes)
                    n_acgt = int((codes < 4).sum())
                    dropped += L - n_acgt
                    records.append({"name": name, "length": L, "acgt": n_acgt})
                    if _norm(name) in val_chroms:
                        parts = [("val", 0, L)]
                    elif _norm(name) in test_chroms:
                        parts = [("test", 0, L)]
                    else:
                        cut_t = L - int(round(f * L)) if not test_chroms else L
                        cut_v = cut_t - int(round(f * L)) if not val_chroms else cut_t
                        parts = [("train", 0, cut_v), ("val", cut_v, cut_t), ("test", cut_t, L)]
                        held = {s: [a, b] for s, a, b in parts if s != "train" and b > a}
                        if held:
                            regions[name] = held
                    for split, a, b in parts:
                        if b <= a:
                            continue
                        ids, n = tokenize(codes[a:b])
                        writers[split].write(ids)
                        stats[split]["bases"] += int((codes[a:b] < 4).sum())
                        stats[split]["contigs"] += n
                    common.log(f"{name}: {L:,} bases, {n_acgt:,} A/C/G/T")
            missing = (val_chroms | test_chroms | keep) - seen
            if missing:
                fixes = ["give a FASTA that holds them"]
                if missing & (val_chroms | test_chroms):
                    fixes.append(
                        "omit --val_chroms/--test_chroms to hold out regions of each record")
                if missing & keep:
                    fixes.append("name only its records in --chroms")
                shown = (f"{names}" if len(names) <= 8
                         else f"{names[:8]} ... ({len(names)} in all)")  # (hg38: 455)
                raise common.PrepareError(
                    f"chromosomes not found in {src}: {sorted(missing)}; its records are "
                    f"{shown}: " + ", or ".join(fixes))
            if not records:
                raise common.PrepareError(f"no FASTA records in {src}")
            for s in common.SPLITS:
                if writers[s].count == 0:
                    raise common.PrepareError(
                        f"split '{s}' is empty: {src} has no A/C/G/T bases for it "
                        "(empty input, or only N?)")
        counts = {s: w.count for s, w in writers.items()}
        meta = {
            "format": NAME,
            "prepare": common.command_line(NAME, build_parser(), args),
            "vocab_size": VOCAB_SIZE,
            "dtype": "uint16",
            "itos": ITOS,
            "eos_id": EOS,
            "kmer": K,
            "records": records,
            "holdout_regions": regions,
            "val_chroms": sorted(val_chroms),
            "test_chroms": sorted(test_chroms),
            "holdout_frac": f,
            "dropped_bases": dropped,
            "split_stats": stats,
            "tokens": counts,
            "source": common.repo_path(args.input) if args.input else URL,
            "input": [p.name for p in input_files(src)],
        }
        common.write_meta(stage, meta)
    common.report(out_dir, counts, {
        s: f"{stats[s]['bases']:,} bases, "
           f"{stats[s]['contigs']} contig{'s' * (stats[s]['contigs'] != 1)}"
        for s in counts
    })
    return counts


if __name__ == "__main__":
    common.run_main(main)
