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
    counts = owt.main(["--input", str(text_dir / "owt_sample.jsonl"), "--out_dir", str(out), "--num_proc", "2"])
    return out, counts


def test_split_rule():
    is_val = owt.val_documents(1000)
    assert is_val.sum() == 1 and np.flatnonzero(is_val)[0] == np.random.default_rng(2357).permutation(1000)[0]
    assert owt.val_documents(2).sum() == 1
    assert owt.val_documents(8_013_769).sum() == math.ceil(0.0005 * 8_013_769) == 4_007
    with pytest.raises(common.PrepareError, match="at least 2 documents"):
        owt.val_documents(1)


def test_owt_sample_counts_and_exact_decode(prepared, docs, text_dir):
    out, counts = prepared
    assert len(docs) == 1000
    assert counts == {"train": 1_053_684, "val": 1_315}
    meta = common.load_meta(out)
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257 and meta["dtype"] == "uint16"
    assert meta["documents"] == {"train": 999, "val": 1} and meta["format"] == "openwebtext"
    assert meta["tokens"] == counts
    assert meta["prepare"] == (f"python prepare/openwebtext.py --input {common.repo_path(text_dir / 'owt_sample.jsonl')} "
                               f"--out_dir {common.repo_path(out)}")
    assert common.check_dataset(out) == meta
    assert not (out / "test.bin").exists() and not (out / "train_mask.bin").exists()
    enc = owt.get_encoding()
    val_doc = int(np.random.default_rng(2357).permutation(1000)[0])
    val = np.asarray(read_bin(out, "val"))
    assert val[-1] == 50256 and (val[:-1] != 50256).all()
    assert enc.decode(val[:-1].tolist()) == docs[val_doc]
    assert owt.decode(val[:-1], meta) == docs[val_doc]
    train = np.asarray(read_bin(out, "train"))
    ends = np.flatnonzero(train == 50256)
    assert len(ends) == 999 and ends[-1] == len(train) - 1
    # train documents in input order, each exactly its text, then EOT
    train_docs = [d for i, d in enumerate(docs) if i != val_doc]
    starts = np.concatenate([[0], ends[:-1] + 1])
    for k in (0, 1, 500, 998):
        assert enc.decode(train[starts[k]:ends[k]].tolist()) == train_docs[k]
    assert sum(len(enc.encode_ordinary(d)) + 1 for d in docs) == 1_054_999


def test_workers_batches_and_reruns_give_identical_files(prepared, text_dir, docs, tmp_path, monkeypatch):
    # a 300-document slice: 1 worker in one batch, then a re-run with 2 workers in batches of 7 documents
    sl = tmp_path / "slice.jsonl"
    sl.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs[:300]), encoding="utf-8")
    owt.main(["--input", str(sl), "--out_dir", str(tmp_path / "a"), "--num_proc", "1"])
    first = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    meta = common.load_meta(tmp_path / "a")
    assert meta["documents"] == {"train": 299, "val": 1}
    # --num_proc does not change the output, so the recorded command leaves it out
    assert meta["prepare"] == (f"python prepare/openwebtext.py --input {common.repo_path(sl)} "
                               f"--out_dir {common.repo_path(tmp_path / 'a')}")
    monkeypatch.setattr(owt, "BATCH_DOCS", 7)
    owt.main(["--input", str(sl), "--out_dir", str(tmp_path / "a"), "--num_proc", "2"])
    assert sorted(first) == ["meta.json", "train.bin", "val.bin"]
    for name in first:
        assert (tmp_path / "a" / name).read_bytes() == first[name], name


def test_txt_input(text_dir, tmp_path):
    counts = owt.main(["--input", str(text_dir / "english" / "inaugural.txt"), "--out_dir", str(tmp_path / "i")])
    meta = common.load_meta(tmp_path / "i")
    assert meta["documents"] == {"train": 58, "val": 1}  # 59 addresses, ceil(0.0005 * 59) = 1 to val
    assert sum(counts.values()) == 59 + sum(
        len(owt.get_encoding().encode_ordinary(d))
        for d in (text_dir / "english" / "inaugural.txt").read_text(encoding="utf-8").rstrip("\n").split("\n\n\n"))
    # a folder: every .txt/.jsonl under it in sorted order; --txt_doc_sep "" = one document per file
    text = (text_dir / "english" / "inaugural.txt").read_text(encoding="utf-8")
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text(text[:5000], encoding="utf-8")
    (d / "sub" / "b.txt").write_text(text[5000:9000], encoding="utf-8")
    (d / "c.jsonl").write_text(json.dumps({"text": text[9000:9500]}) + "\n", encoding="utf-8")
    (d / "ignored.csv").write_text("x\n")
    owt.main(["--input", str(d), "--out_dir", str(tmp_path / "j"), "--txt_doc_sep", "", "--num_proc", "1"])
    meta = common.load_meta(tmp_path / "j")
    assert meta["source"] == ["a.txt", "c.jsonl", "sub/b.txt"]
    assert meta["prepare"] == (f"python prepare/openwebtext.py --input {common.repo_path(d)} --txt_doc_sep '' "
                               f"--out_dir {common.repo_path(tmp_path / 'j')}")
    assert meta["documents"] == {"train": 2, "val": 1}
    ids = np.concatenate([read_bin(tmp_path / "j", s) for s in ("train", "val")])
    assert sorted(owt.decode(ids).split("<|endoftext|>")[:-1]) == sorted([text[:5000], text[9000:9500], text[5000:9000]])


def test_several_inputs_and_held_out_val(text_dir, tmp_path):
    eng = text_dir / "english"
    out = tmp_path / "h"
    owt.main(["--input", str(eng / "inaugural.txt"), str(eng / "webtext.txt"),
              "--val_input", str(eng / "state_union.txt"), "--out_dir", str(out), "--num_proc", "2"])
    meta = common.load_meta(out)
    assert meta["documents"] == {"train": 59 + 6, "val": 65}
    assert meta["source"] == ["inaugural.txt", "webtext.txt"] and meta["val_source"] == ["state_union.txt"]
    assert "val_fraction" not in meta
    rp = lambda name: common.repo_path(eng / name)  # noqa: E731
    assert meta["prepare"] == (f"python prepare/openwebtext.py --input {rp('inaugural.txt')} {rp('webtext.txt')} "
                               f"--val_input {rp('state_union.txt')} --out_dir {common.repo_path(out)}")
    assert meta["tokens"] == {"train": len(read_bin(out, "train")), "val": len(read_bin(out, "val"))}

    def docs(name):
        return (eng / name).read_text(encoding="utf-8").rstrip("\n").split("\n\n\n")

    def stream(texts):
        enc = owt.get_encoding()
        return np.concatenate([np.array(enc.encode_ordinary(t) + [owt.EOT]) for t in texts])

    # every --input document in train, in input order; every --val_input document in val
    assert np.array_equal(read_bin(out, "train"), stream(docs("inaugural.txt") + docs("webtext.txt")))
    assert np.array_equal(read_bin(out, "val"), stream(docs("state_union.txt")))
    with pytest.raises(common.PrepareError, match="--val_input"):
        (tmp_path / "empty.txt").write_text("")
        owt.main(["--input", str(eng / "inaugural.txt"), "--val_input", str(tmp_path / "empty.txt"),
                  "--out_dir", str(tmp_path / "e")])


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
])
def test_bad_input_is_refused_and_writes_nothing(tmp_path, files, named):
    for name, text in files.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_text(text)
    first = tmp_path / "in" / next(iter(files)).split("/")[0]
    with pytest.raises(common.PrepareError, match=named):
        owt.main(["--input", str(first), "--out_dir", str(tmp_path / "o"), "--num_proc", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_without_input_the_hubs_parquet_conversion_is_loaded(tmp_path, monkeypatch):
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
