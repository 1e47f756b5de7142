"""prepare/jsb.py on the real JSB Chorales ($POPE_SHARED_DATA/music): counts, exact round trip
against the JSON, npz == json, the recorded command, bad input, no unpickling without --allow_pickle."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from prepare import common
from prepare import jsb


def read_bin(d, split, suffix=""):
    return np.fromfile(d / f"{split}{suffix}.bin", dtype=np.uint8 if suffix else np.uint16)


@pytest.fixture(scope="module")
def music(shared_data):
    return shared_data / "music"


@pytest.fixture(scope="module")
def prepared(music, tmp_path_factory):
    out = tmp_path_factory.mktemp("jsb")
    counts = jsb.main(["--input", str(music / "Jsb16thSeparated.json"), "--out_dir", str(out)])
    return out, counts


def test_vocabulary():
    assert len(jsb.ITOS) == 90 and len(set(jsb.ITOS)) == 90
    assert jsb.ITOS[:3] == ["<s>", "R", "A0"]
    assert jsb.ITOS[60 - 21 + 2] == "C4" and jsb.ITOS[-1] == "C8" and jsb.ITOS[81 - 19] == "A5"


def test_encode_prompt():
    assert jsb.encode("<s> C5 G4 E4 C3 . R A#2") == [0, 72 - 19, 67 - 19, 64 - 19, 48 - 19, 1, 1, 46 - 19]
    assert jsb.roll_from_ids(jsb.encode("<s> C5 G4 E4 C3")).tolist() == [[72, 67, 64, 48]]
    with pytest.raises(ValueError, match="H2"):
        jsb.encode("C4 H2")


def test_counts(prepared, music):
    out, counts = prepared
    meta = common.load_meta(out)
    assert meta["format"] == "jsb" and meta["vocab_size"] == 90 and meta["itos"] == jsb.ITOS
    assert meta["row_len"] == 2048 and meta["dtype"] == "uint16"
    assert meta["chorales"] == {"train": 229, "val": 76, "test": 77}
    assert meta["rows"] == {"train": 231, "val": 79, "test": 79}
    assert meta["chorales_split_over_rows"] == {"train": 2, "val": 3, "test": 2}
    # 4 tokens per 16th-note step: 55,228 / 18,408 / 18,900 steps
    assert meta["scored_tokens"] == {"train": 220_912, "val": 73_632, "test": 75_600}
    assert counts == {"train": 231 * 2048, "val": 79 * 2048, "test": 79 * 2048}
    assert meta["tokens"] == counts and common.check_dataset(out, common.SPLITS) == meta
    for split, n in counts.items():
        toks, mask = read_bin(out, split), read_bin(out, split, "_mask")
        assert len(toks) == len(mask) == n
        rows, mrows = toks.reshape(-1, 2048), mask.reshape(-1, 2048)
        assert (rows[:, 0] == jsb.START).all() and (mrows[:, 0] == 0).all()
        assert (toks[mask == 1] != jsb.START).all() and (toks[mask == 0] == jsb.START).all()
        assert toks.max() < 90


def test_exact_round_trip_against_json(prepared, music):
    out, _ = prepared
    ref = json.loads((music / "Jsb16thSeparated.json").read_text())
    for split, key in jsb.SOURCE_SPLITS.items():
        toks, mask = read_bin(out, split), read_bin(out, split, "_mask")
        want = np.concatenate([np.asarray(p) for p in ref[key]])
        assert np.array_equal(jsb.roll_from_ids(toks[mask == 1]), want), split
    # piece by piece for the first test chorale, and encode/roll are inverse
    first = np.asarray(ref["test"][0])
    assert np.array_equal(jsb.roll_from_ids(jsb.encode_piece(first)), first)
    assert list(jsb.encode_piece(first[:1])) == [first[0, v] - 19 for v in range(4)]


def test_npz_and_json_give_identical_bins(prepared, music, tmp_path):
    out, _ = prepared
    jsb.main(["--input", str(music / "Jsb16thSeparated.npz"), "--allow_pickle",
              "--out_dir", str(tmp_path / "npz")])
    for split in common.SPLITS:
        for name in (f"{split}.bin", f"{split}_mask.bin"):
            assert (out / name).read_bytes() == (tmp_path / "npz" / name).read_bytes(), name


def evil_npz(path, marker):
    """An .npz laid out like Jsb16thSeparated.npz whose object array, when
    unpickled, creates the folder marker."""
    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))
    piece = np.full((4, 4), 60.0, dtype=np.float16)
    arr = np.empty(2, dtype=object)
    arr[0], arr[1] = piece, Payload()
    np.savez(path, train=arr, valid=arr, test=arr)
    return path


def test_npz_without_allow_pickle_is_refused_and_never_unpickled(tmp_path, music):
    evil = evil_npz(tmp_path / "Jsb16thSeparated.npz", tmp_path / "pwned")
    for argv in (["--input", str(evil)], ["--input", str(tmp_path)], ["--input", str(music / evil.name)]):
        with pytest.raises(common.PrepareError, match="--allow_pickle"):  # the file, its folder, the real one
            jsb.main(argv + ["--out_dir", str(tmp_path / "o")])
        assert not (tmp_path / "pwned").exists() and not (tmp_path / "o").exists()
    with pytest.raises(common.PrepareError):  # the payload is real: --allow_pickle (trusted files) runs it
        jsb.main(["--input", str(evil), "--allow_pickle", "--out_dir", str(tmp_path / "o")])
    assert (tmp_path / "pwned").is_dir()


def test_without_input_the_json_is_downloaded_into_raw_and_kept(prepared, music, tmp_path, monkeypatch):
    fetched, src = [], music / "Jsb16thSeparated.json"

    def download(url, dest, hint, timeout=15.0):  # offline stand-in for common.download
        fetched.append(url)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copyfile(src, dest)
        return dest
    monkeypatch.setattr(common, "download", download)
    out = tmp_path / "jsb"
    jsb.main(["--out_dir", str(out)])
    jsb.main(["--out_dir", str(out)])  # the re-run swaps the set in and keeps the download
    assert fetched == [jsb.URL] * 2 and jsb.URL.endswith("/Jsb16thSeparated.json")
    assert (out / "raw" / "Jsb16thSeparated.json").read_bytes() == src.read_bytes()
    for split in common.SPLITS:
        assert (out / f"{split}.bin").read_bytes() == (prepared[0] / f"{split}.bin").read_bytes()


def test_long_chorale_continues_in_next_row(tmp_path):
    steps = 600  # > 511 steps per row
    roll = np.tile(np.array([[72, 67, 64, -1]]), (steps, 1))
    rows, masks = jsb.rows_for_piece(roll, 2048)
    assert len(rows) == 2 and [int(m.sum()) for m in masks] == [511 * 4, 89 * 4]
    assert np.array_equal(jsb.roll_from_ids(np.concatenate(rows)), roll)


def test_decode_and_save_sample(prepared, tmp_path):
    out, _ = prepared
    toks = read_bin(out, "test")[:2048]
    text = jsb.decode(toks[:9])
    assert text.splitlines() == ["step    S    A    T    B", "   0   F4   C4   A3   F3",
                                 "   1   F4   C4   A3   F3"]
    path = jsb.save_sample(toks, common.load_meta(out), tmp_path / "sample")
    try:
        import symusic
    except ImportError:
        assert path.endswith(".txt") and Path(path).read_text().startswith("step")
        return
    assert path.endswith(".mid")
    score = symusic.Score(path)
    assert [t.name for t in score.tracks] == ["S", "A", "T", "B"]
    assert min(n.pitch for t in score.tracks for n in t.notes) >= 36


@pytest.mark.parametrize("name, text, named", [
    ("empty.json", {"train": [[[60, 55, 52, 48]]], "valid": [[[60, 55, 52, 48]]], "test": []}, "'test'"),
    ("bad.json", {"train": [[[60, 55, 52, 130]]], "valid": [[[60, 55, 52, 48]]],
                  "test": [[[60, 55, 52, 48]]]}, "130"),
    ("folder", None, "folder"),
    ("nope.npz", None, "nope.npz"),
])
def test_bad_input_is_refused_and_writes_nothing(tmp_path, name, text, named):
    if text is not None:
        (tmp_path / name).write_text(json.dumps(text))
    elif name == "folder":
        (tmp_path / name).mkdir()
    with pytest.raises(common.PrepareError, match=named):
        jsb.main(["--input", str(tmp_path / name), "--out_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
