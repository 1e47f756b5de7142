"""prepare/maestro.py on a slice of the real MAESTRO v2.0.0 sample
($POPE_SHARED_DATA/music/maestro): the official split, REMI vocabulary, transposition (against
transposing the MIDI), corrupt and missing files skipped and counted, MIDI round trip, unusable
input, miditok missing."""
import collections
import csv
import re
import shutil
import sys

import numpy as np
import pytest
from helpers import read_bin

from prepare import common
from prepare import maestro


# the shortest pieces of each split, so that the test stays fast
TRAIN = ["2011/MIDI-Unprocessed_22_R1_2011_MID--AUDIO_R1-D8_12_Track12_wav.midi",
         "2008/MIDI-Unprocessed_08_R1_2008_01-05_ORIG_MID--AUDIO_08_R1_2008_wav--5.midi"]
VAL = ["2015/MIDI-Unprocessed_R1_D1-1-8_mid--AUDIO-from_mp3_06_R1_2015_wav--3.midi"]
TEST = ["2008/MIDI-Unprocessed_09_R3_2008_01-07_ORIG_MID--AUDIO_09_R3_2008_wav--2.midi"]


@pytest.fixture(scope="module")
def src(shared_data):
    return shared_data / "music" / "maestro"


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("miditok", reason="pip install miditok for the MAESTRO tests")
    return maestro.make_tokenizer()


def make_slice(src, dst, extra_rows=()):
    """A MAESTRO folder with the chosen rows of the real csv (and files), a
    corrupt (truncated) MIDI listed as train and a train row whose file is missing."""
    with open(src / "maestro-v2.0.0.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, {r["midi_filename"]: r for r in reader}
    chosen = [rows[n] for n in TRAIN + VAL + TEST]
    for r in chosen:
        (dst / r["midi_filename"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / r["midi_filename"], dst / r["midi_filename"])
    data = (src / TRAIN[0]).read_bytes()
    (dst / "2011" / "corrupt.midi").write_bytes(data[:len(data) // 2])
    chosen.insert(1, dict(chosen[0], midi_filename="2011/corrupt.midi"))
    chosen.insert(2, dict(chosen[0], midi_filename="2011/missing.midi"))
    with open(dst / "maestro-v2.0.0.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(chosen + list(extra_rows))
    return dst


@pytest.fixture(scope="module")
def prepared(src, tok, tmp_path_factory):
    folder = make_slice(src, tmp_path_factory.mktemp("maestro_in"))
    out = tmp_path_factory.mktemp("maestro_out")
    counts = maestro.main(["--input", str(folder), "--out_dir", str(out), "--num_proc", "2"])
    return folder, out, counts


def test_vocabulary(tok, monkeypatch):
    itos = maestro.itos_of(tok)
    assert len(itos) == 328 and itos[:4] == ["PAD_None", "BOS_None", "EOS_None", "Bar_None"]
    assert collections.Counter(name.split("_")[0] for name in itos) == {
        "PAD": 1, "BOS": 1, "EOS": 1, "Bar": 1, "Pitch": 89, "Velocity": 32, "Duration": 64,
        "Position": 96, "Tempo": 32, "TimeSig": 9, "Pedal": 1, "PedalOff": 1}
    assert ("Pitch_21" in itos and "Pitch_109" in itos
            and "Pitch_20" not in itos and "Pitch_110" not in itos)
    # makes `import miditok` fail: one line naming it
    monkeypatch.setitem(sys.modules, "miditok", None)
    with pytest.raises(common.PrepareError, match="miditok"):
        maestro.make_tokenizer()


def test_counts_skips_and_streams_match_direct_tokenization_and_midi_transposition(prepared, tok):
    folder, out, counts = prepared
    meta = common.load_meta(out)
    assert meta["format"] == "maestro" and meta["vocab_size"] == 328 and meta["dtype"] == "uint16"
    assert meta["pieces"] == {"train": 2, "val": 1, "test": 1} and meta["skipped_empty"] == 0
    assert meta["skipped_corrupt"] == 1 and meta["skipped_corrupt_files"] == ["2011/corrupt.midi"]
    assert meta["missing"] == 1 and meta["transpose"] == [0, -1, 1, -2, 2, -3, 3]
    # train piece 2 reaches pitch 107: +3 would leave Pitch_21..Pitch_109, so it is left out
    assert (meta["transpositions_skipped"] == 1
            and meta["sequences"] == {"train": 7 + 6, "val": 1, "test": 1})
    # BOS + tokens + EOS per sequence: 641 and 4,931 REMI tokens (train), 2,436 (val), 3,283 (test)
    assert counts == {"train": 7 * (641 + 2) + 6 * (4_931 + 2), "val": 2_436 + 2, "test": 3_283 + 2}
    for split, names in (("val", VAL), ("test", TEST)):
        status, ids = maestro.tokenize_file(folder / names[0], tok)
        assert (status == "ok"
                and read_bin(out, split).tolist() == [maestro.BOS, *ids.tolist(), maestro.EOS])
    train = read_bin(out, "train")
    bos, eos = np.flatnonzero(train == maestro.BOS), np.flatnonzero(train == maestro.EOS)
    seqs = [train[b + 1:e] for b, e in zip(bos, eos)]
    assert len(seqs) == 13 and eos[-1] == len(train) - 1
    # each piece transposed by 0, -1, +1, -2, +2, -3, +3: the same tokens as transposing the MIDI
    import symusic
    for piece, first, offsets in ((TRAIN[0], 0, [0, -1, 1, -2, 2, -3, 3]),
                                  (TRAIN[1], 7, [0, -1, 1, -2, 2, -3])):
        score = symusic.Score(str(folder / piece))
        for seq, k in zip(seqs[first:first + len(offsets)], offsets):
            assert seq.tolist() == tok.encode(score.shift_pitch(k))[0].ids, (piece, k)
    top = max(n.pitch for n in symusic.Score(str(folder / TRAIN[1])).tracks[0].notes)
    assert top + 3 > maestro.PITCH_HIGH


def test_decode_and_midi_round_trip(prepared, tmp_path, tok):
    folder, out, _ = prepared
    meta = common.load_meta(out)
    val = read_bin(out, "val")
    assert maestro.decode(val[:40], meta).split() == [meta["itos"][i] for i in val[:40]]
    assert maestro.encode(maestro.decode(val, meta), meta) == val.tolist()
    path = maestro.save_sample(val, meta, tmp_path / "sample")
    status, ids = maestro.tokenize_file(path, tok)
    assert path.endswith(".mid") and status == "ok" and ids.tolist() == val[1:-1].tolist()


@pytest.mark.parametrize("case", ["empty csv", "no csv", "every test file corrupt"])
def test_unusable_input_is_refused_and_writes_nothing(src, tok, tmp_path, case):
    folder = tmp_path / "in"
    if case == "every test file corrupt":
        make_slice(src, folder.mkdir() or folder)
        (folder / TEST[0]).write_bytes(b"MThd not really a midi file")
    elif folder.mkdir() or case == "empty csv":
        (folder / "maestro-v2.0.0.csv").write_text(
            "canonical_composer,canonical_title,split,year,midi_filename,audio_filename,duration\n")
    with pytest.raises(common.PrepareError, match=re.escape(str(folder))) as e:
        maestro.main(["--input", str(folder), "--out_dir", str(tmp_path / "o"), "--num_proc", "1"])
    assert "corrupt" not in case or "'test'" in str(e.value)
    assert not (tmp_path / "o").exists()
