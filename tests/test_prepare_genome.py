"""prepare/genome.py on slices of GRCh37 chr20 ($POPE_SHARED_DATA/genome): vocabulary, a reference
tokenizer, N handling, held-out regions and chromosomes, round trip, bad input."""
import gzip
import re

import numpy as np
import pytest
from helpers import read_bin

from prepare import common
from prepare import genome


@pytest.fixture(scope="module")
def chr20(shared_data):
    with gzip.open(shared_data / "genome" / "chr20.fa.gz", "rt") as f:
        seq = "".join(line.strip() for line in f if not line.startswith(">"))
    assert len(seq) == 63_025_520
    return seq


def ref_tokens(seq):
    """A plain-Python statement of the tokenization, to check the numpy one."""
    out = []
    for contig in filter(None, re.split(r"[^ACGT]+", seq.upper())):
        k = len(contig) // 6 * 6
        out += [6 + int(contig[i:i + 6].translate(str.maketrans("ACGT", "0123")), 4)
                for i in range(0, k, 6)]
        out += [4102 + "ACGT".index(b) for b in contig[k:]] + [4]
    return out


def write_fasta(path, records, width=60):
    text = "".join(f">{name}\n"
                   + "".join(seq[i:i + width] + "\n" for i in range(0, len(seq), width))
                   for name, seq in records)
    with (gzip.open(path, "wt") if str(path).endswith(".gz") else open(path, "w")) as f:
        f.write(text)


@pytest.fixture(scope="module")
def records(chr20):
    r1 = chr20[26_300_000:26_320_000]              # ends in the 3.1 Mb N run (431 N)
    r1 = r1[:100] + r1[100:700].lower() + r1[700:]  # soft-masked bases count as bases
    r2 = chr20[29_800_000:29_812_345]              # starts inside an N run (3,908 N)
    r3 = chr20[61_000_000:61_010_007]
    r3 = r3[:5000] + "R" + r3[5001:]               # an IUPAC code breaks the sequence too
    return [("chr1 a description", r1), ("chr2", r2), ("3", r3)]


def test_vocabulary_and_round_trip():
    assert genome.VOCAB_SIZE == 4107 and len(set(genome.ITOS)) == 4107
    assert genome.ITOS[:6] == ["<unk>", "<pad>", "<mask>", "<cls>", "<eos>", "<bos>"]
    assert (genome.ITOS[6] == "AAAAAA" and genome.ITOS[7] == "AAAAAC"
            and genome.ITOS[4101] == "TTTTTT")
    assert (genome.ITOS[4102:] == ["A", "C", "G", "T", "N"]
            and genome.ITOS[6 + int("012301", 4)] == "ACGTAC")
    assert genome.encode("ACGTAC") == [6 + int("012301", 4), 4]
    rng = np.random.default_rng(0)
    for n in [1, 5, 6, 7, 12, 13, 1000, 1003]:
        s = "".join(rng.choice(list("ACGT"), n))
        ids = genome.encode_contig(s)
        assert (len(ids) == n // 6 + n % 6 and genome.decode(ids) == s
                and genome.encode(s) == ref_tokens(s))
    assert genome.decode(genome.encode("ACGTACGTNNNNacgtRAC")) == "ACGTACGT\nACGT\nAC\n"


def test_regions_held_out_chromosomes_and_decode_match_the_reference(tmp_path, records):
    write_fasta(tmp_path / "s.fa.gz", records)
    counts = genome.main(["--input", str(tmp_path / "s.fa.gz"), "--out_dir", str(tmp_path / "o")])
    meta = common.load_meta(tmp_path / "o")
    expect = {"train": [], "val": [], "test": []}
    regions = {}
    for name, seq in records:
        L = len(seq)
        t = L - round(0.01 * L)
        v = t - round(0.01 * L)
        expect["train"] += ref_tokens(seq[:v])
        expect["val"] += ref_tokens(seq[v:t])
        expect["test"] += ref_tokens(seq[t:])
        regions[name.split()[0]] = {"val": [v, t], "test": [t, L]}
    assert {s: read_bin(tmp_path / "o", s).tolist() for s in common.SPLITS} == expect
    assert (counts == {s: len(t) for s, t in expect.items()}
            == {"train": 6_270, "val": 45, "test": 45})
    assert meta["holdout_regions"] == regions
    assert meta["records"] == [{"name": "chr1", "length": 20_000, "acgt": 19_569},
                               {"name": "chr2", "length": 12_345, "acgt": 8_437},
                               {"name": "3", "length": 10_007, "acgt": 10_006}]
    assert meta["dropped_bases"] == 431 + 3_908 + 1
    assert meta["vocab_size"] == 4107 and meta["format"] == "genome" and meta["itos"] == genome.ITOS
    assert meta["source"] == str(tmp_path / "s.fa.gz")  # the input given, not hg38's URL
    assert meta["tokens"] == counts and common.check_dataset(tmp_path / "o", common.SPLITS) == meta
    write_fasta(tmp_path / "s.fa", records)  # plain FASTA, held-out chromosomes
    counts = genome.main(["--input", str(tmp_path / "s.fa"), "--out_dir", str(tmp_path / "o"),
                          "--val_chroms", "2", "--test_chroms", "chr3"])
    assert (counts
            == {"train": len(ref_tokens(records[0][1])), "val": len(ref_tokens(records[1][1])),
                "test": len(ref_tokens(records[2][1]))}
            == {"train": 3_265, "val": 1_408, "test": 1_673})
    train, test = (genome.decode(read_bin(tmp_path / "o", s)).splitlines()
                   for s in ("train", "test"))
    assert train == [records[0][1][:19_569].upper()]  # one contig: the bases before the N run
    assert test == [records[2][1][:5000], records[2][1][5001:]]
    meta = common.load_meta(tmp_path / "o")
    assert meta["holdout_regions"] == {} and meta["tokens"] == counts
    # the chromosome that is not in the file
    for option in (["--val_chroms", "9"], ["--chroms", "chr2,9"]):
        with pytest.raises(common.PrepareError, match="'9'"):
            genome.main(["--input", str(tmp_path / "s.fa"), "--out_dir", str(tmp_path / "p"),
                         *option])
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("name, text, named", [
    ("empty.fa", "", "empty.fa"),
    ("n.fa", ">chr1\n" + "N" * 5000 + "\n", "'train'"),
    ("text.fa", "ACGT without a header\n", "text.fa"),
    ("dir", None, "dir"),
])
def test_bad_input_is_refused_and_writes_nothing(tmp_path, name, text, named):
    if text is None:
        (tmp_path / name).mkdir()
    else:
        (tmp_path / name).write_text(text)
    with pytest.raises(common.PrepareError, match=named):
        genome.main(["--input", str(tmp_path / name), "--out_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
