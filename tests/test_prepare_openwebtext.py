"""prepare/openwebtext.py on the real OWT sample and English corpora ($POPE_SHARED_DATA/text): the
tokens equal an independent encoding, the split rule, worker-count independence, bad input, and the
Hub's parquet route with a stub in place of the download."""
import json
import math
import sys
import types

import numpy as np
import pytest
import tiktoken
from helpers import read_bin

from prepare import common
from prepare import openwebtext as owt


@pytest.fixture(scope="module")
def text_dir(shared_data):
    return shared_data / "text"


def test_split_rule():
    is_val = owt.val_documents(1000)
    assert (is_val.sum() == 1
            and np.flatnonzero(is_val)[0] == np.random.default_rng(2357).permutation(1000)[0])
    assert owt.val_documents(2).sum() == 1
    assert owt.val_documents(8_013_769).sum() == math.ceil(0.0005 * 8_013_769) == 4_007
    with pytest.raises(common.PrepareError):
        owt.val_documents(1)


def encoded(texts):
    """The independent reference: each document's gpt2 tokens, then <|endoftext|>."""
    enc = tiktoken.get_encoding("gpt2")
    return np.array([i for t in texts for i in enc.encode_ordinary(t) + [50256]], dtype=np.uint16)


def test_owt_sample_is_its_documents_encoded_and_split_by_the_rule(text_dir, tmp_path, monkeypatch):
    src, out = text_dir / "owt_sample.jsonl", tmp_path / "owt"
    docs = [json.loads(line)["text"] for line in open(src, encoding="utf-8")]
    counts = owt.main(["--input", str(src), "--out_dir", str(out), "--num_proc", "2"])
    is_val = owt.val_documents(len(docs))
    for split in ("train", "val"):
        want = encoded([d for d, v in zip(docs, is_val) if v == (split == "val")])
        assert np.array_equal(read_bin(out, split), want), split
    meta = common.load_meta(out)
    assert counts == meta["tokens"] == {"train": 1_053_684, "val": 1_315}
    assert meta["documents"] == {"train": 999, "val": 1}
    assert (meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257
            and common.check_dataset(out) == meta)
    assert owt.decode(read_bin(out, "val")[:-1], meta) == docs[int(np.flatnonzero(is_val)[0])]
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(owt, "BATCH_DOCS", 7)  # workers and batches do not change the files
    owt.main(["--input", str(src), "--out_dir", str(out), "--num_proc", "1"])
    assert sorted(first) == ["meta.json", "train.bin", "val.bin"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first  # (--num_proc: not recorded)


def test_a_folder_of_text_files_and_a_held_out_val(text_dir, tmp_path):
    eng = text_dir / "english"
    # "\n\n\n": --txt_doc_sep's default
    docs = {f: (eng / f).read_text(encoding="utf-8").rstrip("\n").split("\n\n\n")
            for f in ("state_union.txt", "inaugural.txt")}
    union, d = docs["state_union.txt"], tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("\n\n\n".join(union[:2]), encoding="utf-8")
    (d / "sub" / "b.txt").write_text(union[2], encoding="utf-8")
    (d / "c.jsonl").write_text(json.dumps({"text": union[3]}) + "\n", encoding="utf-8")
    (d / "ignored.csv").write_text("x\n")
    out = tmp_path / "h"
    owt.main(["--input", str(d), "--val_input", str(eng / "inaugural.txt"), "--out_dir", str(out),
              "--num_proc", "2"])
    # --input's documents in train, in sorted path order; --val_input's in val
    meta = common.load_meta(out)
    assert meta["source"] == ["a.txt", "c.jsonl", "sub/b.txt"]
    assert meta["documents"] == {"train": 4, "val": 59}
    assert np.array_equal(read_bin(out, "train"), encoded(union[:2] + [union[3], union[2]]))
    assert np.array_equal(read_bin(out, "val"), encoded(docs["inaugural.txt"]))


@pytest.mark.parametrize("files, named", [
    ({"empty.jsonl": ""}, "empty.jsonl"),
    ({"one.jsonl": '{"text": "only one document"}\n'}, None),  # (too few to split)
    ({"bad.jsonl": '{"text": "fine"}\n{"text": broken\n'}, "bad.jsonl:2"),
    ({"field.jsonl": '{"body": "x"}\n{"body": "y"}\n'}, "'text'"),
    ({"d/x.csv": "a,b\n"}, "in/d"),
    ({"e.txt": ""}, "e.txt"),
])
def test_bad_input_is_refused_and_writes_nothing(tmp_path, files, named):
    for name, text in files.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_text(text)
    first = tmp_path / "in" / next(iter(files)).split("/")[0]
    with pytest.raises(common.PrepareError, match=named):
        owt.main(["--input", str(first), "--out_dir", str(tmp_path / "o"), "--num_proc", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_without_input_the_hubs_parquet_conversion_is_loaded(tmp_path, monkeypatch, capsys):
    """datasets 4 refuses the dataset's loading script: the parquet files of refs/convert/parquet
    are loaded instead (here a stub in place of the download: no network in tests); offline, one
    line naming --input."""
    docs, calls = ["The first web page.", "A second one, longer than the first.", "A third."], []

    def load_dataset(path, revision=None, split=None):
        calls.append((path, revision, split))
        if len(calls) > 1:
            raise ConnectionError("no network")
        return [{"text": t} for t in docs]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # (put back after the test)
        monkeypatch.setenv(name, "0")
    counts = owt.main(["--out_dir", str(tmp_path / "o"), "--num_proc", "1"])
    assert calls == [("Skylion007/openwebtext", "refs/convert/parquet", "train")]
    # the warning: not OpenWebText's count (said, not silent)
    assert "8,013,769" in capsys.readouterr().err
    val = owt.val_documents(3)
    want = {s: encoded([t for t, v in zip(docs, val) if v == (s == "val")]).tolist()
            for s in ("train", "val")}
    assert {s: read_bin(tmp_path / "o", s).tolist() for s in want} == want
    assert counts == {s: len(w) for s, w in want.items()}
    assert common.load_meta(tmp_path / "o")["prepare"] == \
        f"python prepare/openwebtext.py --out_dir {common.repo_path(tmp_path / 'o')}"
    with pytest.raises(common.PrepareError, match="--input"):
        owt.main(["--out_dir", str(tmp_path / "p"), "--num_proc", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
