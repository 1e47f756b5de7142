"""prepare/openwebtext.py on the real OWT sample and English corpora ($POPE_SHARED_DATA/text):
counts, the split rule, EOT placement, exact decode, worker-count independence, bad input, and
the Hub's parquet route with a stub in place of the download."""
import json
import math
import sys
import types

import numpy as np
import pytest

from prepare import common
from prepare import openwebtext as owt


def read_bin(d, split):
    return np.fromfile(d / f"{split}.bin", dtype=np.uint16)


@pytest.fixture(scope="module")
def text_dir(shared_data):
    return shared_data / "text"


@pytest.fixture(scope="module")
def docs(text_dir):
    return [json.loads(line)["text"] for line in open(text_dir / "owt_sample.jsonl", encoding="utf-8")]


@pytest.fixture(scope="module")
def prepared(text_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("owt")
    counts = owt.main(["--input", str(text_dir / "owt_sample.jsonl"), "--out_dir", str(out),
                       "--num_proc", "2"])
    return out, counts


def test_split_rule():
    is_val = owt.val_documents(1000)
    assert is_val.sum() == 1 and np.flatnonzero(is_val)[0] == np.random.default_rng(2357).permutation(1000)[0]
    assert owt.val_documents(2).sum() == 1
    assert owt.val_documents(8_013_769).sum() == math.ceil(0.0005 * 8_013_769) == 4_007
    with pytest.raises(common.PrepareError):
        owt.val_documents(1)


def encoded(texts):
    """The independent reference: each document's gpt2 tokens, then <|endoftext|>."""
    enc = owt.get_encoding()
    return np.array([i for t in texts for i in enc.encode_ordinary(t) + [owt.EOT]], dtype=np.uint16)


def test_owt_sample_is_its_documents_encoded_and_split_by_the_rule(prepared, docs):
    out, counts = prepared
    is_val = owt.val_documents(len(docs))
    for split in ("train", "val"):
        want = encoded([d for d, v in zip(docs, is_val) if v == (split == "val")])
        assert np.array_equal(read_bin(out, split), want), split
    meta = common.load_meta(out)
    assert counts == meta["tokens"] == {"train": 1_053_684, "val": 1_315}
    assert meta["documents"] == {"train": 999, "val": 1}
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257 and common.check_dataset(out) == meta
    assert owt.decode(read_bin(out, "val")[:-1], meta) == docs[int(np.flatnonzero(is_val)[0])]


def test_workers_and_batches_do_not_change_the_files(docs, tmp_path, monkeypatch):
    sl = tmp_path / "slice.jsonl"
    sl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:300]), encoding="utf-8")
    owt.main(["--input", str(sl), "--out_dir", str(tmp_path / "a"), "--num_proc", "1"])
    first = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    monkeypatch.setattr(owt, "BATCH_DOCS", 7)
    owt.main(["--input", str(sl), "--out_dir", str(tmp_path / "a"), "--num_proc", "2"])
    assert sorted(first) == ["meta.json", "train.bin", "val.bin"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == first  # (--num_proc: not recorded)


def test_a_folder_of_text_files_and_a_held_out_val(text_dir, tmp_path):
    eng = text_dir / "english"
    docs = {f: (eng / f).read_text(encoding="utf-8").rstrip("\n").split("\n\n\n")  # (--txt_doc_sep's default)
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
    meta = common.load_meta(out)  # --input's documents in train, in sorted path order; --val_input's in val
    assert meta["source"] == ["a.txt", "c.jsonl", "sub/b.txt"]
    assert meta["documents"] == {"train": 4, "val": 59}
    assert np.array_equal(read_bin(out, "train"), encoded(union[:2] + [union[3], union[2]]))
    assert np.array_equal(read_bin(out, "val"), encoded(docs["inaugural.txt"]))


def stub_datasets(monkeypatch, load_dataset):
    """datasets replaced by load_dataset; the HF offline switches hf_documents may set are put back after."""
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "0")


@pytest.mark.parametrize("files, named", [
    ({"empty.jsonl": ""}, "empty.jsonl"),
    ({"one.jsonl": '{"text": "only one document"}\n'}, "2 documents"),
    ({"bad.jsonl": '{"text": "fine"}\n{"text": broken\n'}, "bad.jsonl:2"),
    ({"field.jsonl": '{"body": "x"}\n{"body": "y"}\n'}, "'text'"),
    ({"d/x.csv": "a,b\n"}, "d"),
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
    """datasets 4 refuses the dataset's loading script: the parquet files of refs/convert/parquet are
    loaded instead (here a stub in place of the download: no network in tests)."""
    docs = ["The first web page.", "A second one, longer than the first.", "A third."]
    calls = []

    def load_dataset(path, revision=None, split=None):
        calls.append((path, revision, split))
        return [{"text": t} for t in docs]
    stub_datasets(monkeypatch, load_dataset)
    counts = owt.main(["--out_dir", str(tmp_path / "o"), "--num_proc", "1"])
    assert calls == [("Skylion007/openwebtext", "refs/convert/parquet", "train")]
    assert "3 documents" in capsys.readouterr().err  # (not the 8,013,769 of OpenWebText: said, not silent)
    enc, val = owt.get_encoding(), owt.val_documents(3)
    want = {s: [i for t, v in zip(docs, val) if v == (s == "val") for i in enc.encode_ordinary(t) + [owt.EOT]]
            for s in ("train", "val")}
    assert {s: read_bin(tmp_path / "o", s).tolist() for s in want} == want
    assert counts == {s: len(w) for s, w in want.items()}
    assert common.load_meta(tmp_path / "o")["prepare"] == \
        f"python prepare/openwebtext.py --out_dir {common.repo_path(tmp_path / 'o')}"


def test_without_input_offline_is_one_line_naming_input(tmp_path, monkeypatch):
    def load_dataset(*a, **k):
        raise ConnectionError("no network")
    stub_datasets(monkeypatch, load_dataset)
    with pytest.raises(common.PrepareError, match="--input"):
        owt.main(["--out_dir", str(tmp_path / "o"), "--num_proc", "1"])
    assert list(tmp_path.iterdir()) == []
