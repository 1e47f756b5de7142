"""prepare/jsb.py on the real JSB Chorales ($POPE_SHARED_DATA/music): counts, exact round trip
against the JSON, npz == json, the download route, bad input, no unpickling without
--allow_pickle."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import read_bin

from prepare import common
from prepare import jsb


@pytest.fixture(scope="module")
def music(shared_data):
    return shared_data / "music"


@pytest.fixture(scope="module")
def prepared(music, tmp_path_factory):
    out = tmp_path_factory.mktemp("jsb")
    return out, jsb.main(["--input", str(music / "Jsb16thSeparated.json"), "--out_dir", str(out)])


def test_vocabulary_and_prompts():
    assert len(jsb.ITOS) == 90 and len(set(jsb.ITOS)) == 90 and jsb.ITOS[:3] == ["<s>", "R", "A0"]
    assert jsb.ITOS[60 - 21 + 2] == "C4" and jsb.ITOS[-1] == "C8" and jsb.ITOS[81 - 19] == "A5"
    assert (jsb.encode("<s> C5 G4 E4 C3 . R A#2")
            == [0, 72 - 19, 67 - 19, 64 - 19, 48 - 19, 1, 1, 46 - 19])
    assert jsb.roll_from_ids(jsb.encode("<s> C5 G4 E4 C3")).tolist() == [[72, 67, 64, 48]]
    with pytest.raises(ValueError, match="H2"):
        jsb.encode("C4 H2")
    assert jsb.encode_prompt("<s> C5 G4 E4 C3") == jsb.encode("<s> C5 G4 E4 C3")
    for voices_shifted in ("C5 G4 E4 C3", ""):
        with pytest.raises(ValueError):
            jsb.encode_prompt(voices_shifted)


def test_counts_masks_and_exact_round_trip(prepared, music):
    out, counts = prepared
    meta = common.load_meta(out)
    assert meta["format"] == "jsb" and meta["vocab_size"] == 90 and meta["itos"] == jsb.ITOS
    assert meta["row_len"] == 2048 and meta["dtype"] == "uint16"
    assert meta["chorales"] == {"train": 229, "val": 76, "test": 77}
    assert meta["rows"] == {"train": 231, "val": 79, "test": 79}
    assert meta["chorales_split_over_rows"] == {"train": 2, "val": 3, "test": 2}
    # 4 tokens per 16th-note step: 55,228 / 18,408 / 18,900 steps
    assert meta["scored_tokens"] == {"train": 220_912, "val": 73_632, "test": 75_600}
    assert counts == meta["tokens"] == {"train": 231 * 2048, "val": 79 * 2048, "test": 79 * 2048}
    assert common.check_dataset(out, common.SPLITS) == meta
    ref = json.loads((music / "Jsb16thSeparated.json").read_text())
    for split, key in jsb.SOURCE_SPLITS.items():
        toks, mask = read_bin(out, split), read_bin(out, split, "_mask")
        assert len(toks) == len(mask) == counts[split] and toks.max() < 90
        rows, mrows = toks.reshape(-1, 2048), mask.reshape(-1, 2048)
        assert (rows[:, 0] == jsb.START).all() and (mrows[:, 0] == 0).all()
        assert (toks[mask == 1] != jsb.START).all() and (toks[mask == 0] == jsb.START).all()
        want = np.concatenate([np.asarray(p) for p in ref[key]])
        assert np.array_equal(jsb.roll_from_ids(toks[mask == 1]), want), split
    first = np.asarray(ref["test"][0])  # encode and roll are inverse
    assert np.array_equal(jsb.roll_from_ids(jsb.encode_piece(first)), first)
    assert list(jsb.encode_piece(first[:1])) == [first[0, v] - 19 for v in range(4)]


def test_npz_json_and_the_download_give_identical_bins(prepared, music, tmp_path, monkeypatch):
    fetched, src = [], music / "Jsb16thSeparated.json"

    def download(url, out_dir, hint):  # offline stand-in for common.download
        fetched.append(url)
        dest = Path(out_dir) / "raw" / "Jsb16thSeparated.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        return dest if dest.exists() else shutil.copyfile(src, dest)
    monkeypatch.setattr(common, "download", download)
    jsb.main(["--input", str(music / "Jsb16thSeparated.npz"), "--allow_pickle", "--out_dir",
              str(tmp_path / "npz")])
    for _ in range(2):  # the re-run swaps the set in and keeps the download
        jsb.main(["--out_dir", str(tmp_path / "dl")])
    assert fetched == [jsb.URL] * 2 and jsb.URL.endswith("/Jsb16thSeparated.json")
    assert (tmp_path / "dl" / "raw" / "Jsb16thSeparated.json").read_bytes() == src.read_bytes()
    for name in (f"{s}{x}.bin" for s in common.SPLITS for x in ("", "_mask")):
        assert (prepared[0] / name).read_bytes() == (tmp_path / "npz" / name).read_bytes() == \
            (tmp_path / "dl" / name).read_bytes(), name


def test_npz_without_allow_pickle_is_refused_and_never_unpickled(tmp_path, music):
    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))
    arr = np.empty(2, dtype=object)
    arr[0], arr[1] = np.full((4, 4), 60.0, dtype=np.float16), Payload()
    np.savez(tmp_path / "Jsb16thSeparated.npz", train=arr, valid=arr, test=arr)
    for src in (tmp_path / "Jsb16thSeparated.npz", tmp_path, music / "Jsb16thSeparated.npz"):
        # the file, its folder, the real one
        with pytest.raises(common.PrepareError, match="--allow_pickle"):
            jsb.main(["--input", str(src), "--out_dir", str(tmp_path / "o")])
        assert not (tmp_path / "pwned").exists() and not (tmp_path / "o").exists()
    # the payload is real: --allow_pickle (trusted files) runs it
    with pytest.raises(common.PrepareError):
        jsb.main(["--input", str(tmp_path), "--allow_pickle", "--out_dir", str(tmp_path / "o")])
    assert (tmp_path / "pwned").is_dir()


def test_long_chorale_continues_in_next_row():
    roll = np.tile(np.array([[72, 67, 64, -1]]), (600, 1))  # > 511 steps per row
    rows, masks = jsb.rows_for_piece(roll, 2048)
    assert len(rows) == 2 and [int(m.sum()) for m in masks] == [511 * 4, 89 * 4]
    assert np.array_equal(jsb.roll_from_ids(np.concatenate(rows)), roll)


def test_decode_and_save_sample(prepared, tmp_path):
    out, _ = prepared
    toks = read_bin(out, "test")[:2048]
    assert [r.split() for r in jsb.decode(toks[:9]).splitlines()] == [["step", "S", "A", "T", "B"],
                                                                      ["0", "F4", "C4", "A3", "F3"],
                                                                      ["1", "F4", "C4", "A3", "F3"]]
    symusic = pytest.importorskip("symusic")
    score = symusic.Score(path := jsb.save_sample(toks, common.load_meta(out), tmp_path / "sample"))
    assert path.endswith(".mid") and [t.name for t in score.tracks] == ["S", "A", "T", "B"]
    assert min(n.pitch for t in score.tracks for n in t.notes) >= 36


@pytest.mark.parametrize("name, text, named", [
    ("empty.json", {"train": [[[60, 55, 52, 48]]], "valid": [[[60, 55, 52, 48]]], "test": []},
     "'test'"),
    ("bad.json", {"train": [[[60, 55, 52, 130]]], "valid": [[[60, 55, 52, 48]]],
                  "test": [[[60, 55, 52, 48]]]}, "130"),
    ("folder", None, "folder"),
])
def test_bad_input_is_refused_and_writes_nothing(tmp_path, name, text, named):
    if text is None:
        (tmp_path / name).mkdir()
    else:
        (tmp_path / name).write_text(json.dumps(text))
    with pytest.raises(common.PrepareError, match=named):
        jsb.main(["--input", str(tmp_path / name), "--out_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
