"""prepare/common.py and the scripts: a dataset is written as a set (staged beside out_dir, swapped
in whole; an error or a kill leaves the old or the new complete set; a user's files are never
deleted), meta["prepare"] rebuilds it, check_dataset refuses what training cannot use, a daily
mistake is one line with exit 2. Tiny seeded sets."""
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prepare import common
from prepare import indirect_indexing as ii

REPO = Path(__file__).resolve().parent.parent
OLD = ["--quick", "--n_train", "300", "--n_val", "50", "--n_test", "50"]
NEW = ["--quick", "--n_train", "200", "--n_val", "40", "--n_test", "40", "--max_len", "20",
       "--max_shift", "5"]


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}


def beside(d):
    """What a run for out_dir d left next to it (staging, old set, lock)."""
    return sorted(p.name for p in Path(d).parent.iterdir() if p.name.startswith(Path(d).name + "."))


def build(out, args):
    ii.main(args + ["--out_dir", str(out)])
    return snapshot(out)


@pytest.fixture
def old_set(tmp_path):
    return tmp_path / "ii", build(tmp_path / "ii", OLD)


def test_rerun_replaces_the_set_and_keeps_downloads_and_links(old_set, tmp_path):
    out, old = old_set
    assert sorted(old) == sorted(common.DATASET_FILES) and beside(out) == []
    (out / "raw").mkdir()
    (out / "raw" / "source.npz").write_bytes(b"downloaded")
    new = build(out, NEW)
    assert json.loads(new["meta.json"])["row_len"] == 31 and new["train.bin"] != old["train.bin"]
    (tmp_path / "link").symlink_to(out)
    assert (build(tmp_path / "link", OLD)["train.bin"] == old["train.bin"]
            and (tmp_path / "link").is_symlink())
    assert beside(out) == []
    assert (out / "raw" / "source.npz").read_bytes() == b"downloaded"


def fail_in_split(monkeypatch, split):
    real = ii.generate_split
    monkeypatch.setattr(ii, "generate_split",
                        lambda n, seed, s, *a: (_ for _ in ()).throw(RuntimeError(s))
                        if s == split else real(n, seed, s, *a))


KILLER = r"""
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from prepare import common, indirect_indexing as ii
point, real_rename, real_write = sys.argv[1], os.rename, common.write_bin
def write_bin(path, arr, dtype):  # "write": killed once train is staged; "pause": waits there
    n = real_write(path, arr, dtype)
    if path.name == "train_mask.bin" and point in ("write", "pause"):
        print("paused", flush=True)
        os.kill(os.getpid(), signal.SIGKILL) if point == "write" else time.sleep(600)
    return n
def rename(a, b):  # "renames": killed after out_dir -> .old; "swapped": after .tmp -> out_dir
    real_rename(a, b)
    if point in ("renames", "swapped") and (point == "renames") == os.fspath(b).endswith(".old"):
        os.kill(os.getpid(), signal.SIGKILL)
common.write_bin, os.rename = write_bin, rename
ii.main(sys.argv[2:])
"""


def killer(point, out, args):
    return ([sys.executable, "-c", KILLER.format(repo=str(REPO)), point] + args
            + ["--out_dir", str(out)])


@pytest.mark.parametrize("point", ["error", "write", "renames", "swapped"])
def test_an_error_or_a_kill_leaves_a_complete_set_and_the_next_run_cleans_up(old_set, point,
                                                                              monkeypatch):
    out, old = old_set
    if point == "error":
        fail_in_split(monkeypatch, "test")
        with pytest.raises(RuntimeError):
            ii.main(NEW + ["--out_dir", str(out)])
        monkeypatch.undo()
    else:
        r = subprocess.run(killer(point, out, NEW), capture_output=True, text=True, timeout=120)
        assert r.returncode == -signal.SIGKILL, r.stderr
    if point == "renames":  # out_dir is gone, the complete old set waits beside it
        assert not out.exists() and snapshot(out.parent / "ii.old") == old
        with pytest.raises(common.PrepareError, match=str(out)) as e:
            common.check_dataset(out)
        assert "ii.old" in str(e.value)  # (where the set is)
    else:
        assert (common.check_dataset(out, common.SPLITS)["row_len"]
                == (31 if point == "swapped" else 23))
        assert point == "swapped" or snapshot(out) == old
    fail_in_split(monkeypatch, "val")  # a next run that fails: the old set back, nothing beside it
    with pytest.raises(RuntimeError):
        ii.main(OLD + ["--out_dir", str(out)])
    monkeypatch.undo()
    assert (point == "swapped" or snapshot(out) == old) and beside(out) == []
    assert build(out, OLD) == old and beside(out) == []


def test_a_second_run_on_the_same_out_dir_is_refused(old_set):
    out, old = old_set
    first = subprocess.Popen(killer("pause", out, NEW), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "paused\n", first.stderr.read()
        with pytest.raises(common.PrepareError, match=f"{out}.lock"):
            ii.main(OLD + ["--out_dir", str(out)])
        assert snapshot(out) == old
    finally:
        first.kill()
        first.communicate()
    assert build(out, NEW) != old and beside(out) == []


@pytest.mark.parametrize("kind", ["folder", "dangling link", "link to a file", "fifo"])
def test_a_lock_that_is_not_a_regular_file_is_refused(old_set, tmp_path, kind):
    """<out_dir>.lock a folder, a link or a fifo: refused naming it; the set, the lock and what a
    link points to unchanged (train.py's out_dir/.lock: tests/test_train.py)."""
    out, old = old_set
    lock, mine = tmp_path / "ii.lock", tmp_path / "mine"
    mine.write_text("mine")
    if kind == "folder":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to(mine if kind == "link to a file" else tmp_path / "nowhere")
    with pytest.raises(common.PrepareError, match="ii.lock"):
        ii.main(NEW + ["--out_dir", str(out)])
    assert snapshot(out) == old and mine.read_text() == "mine"
    assert not (tmp_path / "nowhere").exists()
    assert os.path.lexists(lock) and beside(out) == ["ii.lock"]


@pytest.mark.parametrize("mine", [
    "ii/notes.txt",
    "ii/mine/x.py",
    "ii.tmp/thesis.tex",
    "ii.old/thesis.tex",
])
def test_a_users_files_in_or_beside_out_dir_are_refused_and_kept(old_set, mine):
    out, old = old_set
    (out.parent / mine).parent.mkdir(exist_ok=True)
    (out.parent / mine).write_text("mine")
    with pytest.raises(common.PrepareError, match=mine.split("/")[1]):
        ii.main(NEW + ["--out_dir", str(out)])
    assert (out.parent / mine).read_text() == "mine" and {k: snapshot(out)[k] for k in old} == old


def test_the_recorded_command_rebuilds_the_set(tmp_path, monkeypatch):
    out = tmp_path / "ii"
    new = build(out, NEW)
    meta = json.loads(new["meta.json"])
    assert meta["prepare"] == ("python prepare/indirect_indexing.py --quick --n_train 200 "
                               "--n_val 40 --n_test 40 --max_len 20 --max_shift 5 "
                               f"--out_dir {common.repo_path(out)}")
    subprocess.run([sys.executable] + shlex.split(meta["prepare"])[1:], cwd=REPO, check=True,
                   timeout=120)
    assert snapshot(out) == new
    # paths as a command run from the repo root takes them, quoted
    monkeypatch.chdir(REPO / "prepare")
    args = ii.build_parser().parse_args(["--seed", "7", "--out_dir", "../data/my ii"])
    assert ii.rebuild_command(args) == (
        "python prepare/indirect_indexing.py --seed 7 --out_dir 'data/my ii'")


def edit_meta(d, **kw):
    (d / "meta.json").write_text(json.dumps({**json.loads((d / "meta.json").read_text()), **kw}))


# name: (how the copy is damaged, the file named, whether meta.json still names its command)
FAULTS = {
    "no meta.json": (lambda d: (d / "meta.json").unlink(), "meta.json", False),
    "meta.json not JSON": (lambda d: (d / "meta.json").write_text('{"vocab_size": 67,'),
                           "meta.json", False),
    "vocab_size a string": (lambda d: edit_meta(d, vocab_size="67"), "meta.json", True),
    "dtype too narrow": (lambda d: edit_meta(d, dtype="uint8", vocab_size=300), "meta.json", True),
    "no val.bin": (lambda d: (d / "val.bin").unlink(), "val.bin", True),
    "odd byte count": (lambda d: open(d / "train.bin", "ab").write(b"\0"), "train.bin", True),
    "token count differs": (lambda d: open(d / "val.bin", "ab").write(b"\0\0" * 23),
                            "val.bin", True),
    "a partial row": (lambda d: (open(d / "train.bin", "ab").write(b"\0\0"),
                                 edit_meta(d, tokens={})),
                      "train.bin", True),
    "no train_mask.bin": (lambda d: (d / "train_mask.bin").unlink(), "train_mask.bin", True),
    "mask length differs": (lambda d: open(d / "val_mask.bin", "ab").write(b"\0"),
                            "val_mask.bin", True),
    "token id >= vocab_size": (lambda d: np.full(460, 67, np.uint16).tofile(d / "val.bin"),
                               "val.bin", True),
    "mask all zeros": (lambda d: np.zeros(920, np.uint8).tofile(d / "train_mask.bin"),
                       "train_mask.bin", True),
    "a mask byte of 7": (lambda d: np.full(920, 7, np.uint8).tofile(d / "train_mask.bin"),
                         "train_mask.bin", True),  # (it would weigh those tokens 7 times)
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_check_dataset_names_the_file_and_the_rebuild_command(tmp_path, fault):
    d = tmp_path / "indirect_indexing_quick"
    ii.main(["--quick", "--n_train", "40", "--n_val", "20", "--n_test", "20", "--out_dir", str(d)])
    cmd = json.loads((d / "meta.json").read_text())["prepare"]
    assert common.check_dataset(d, common.SPLITS) == json.loads((d / "meta.json").read_text())
    edit, name, readable = FAULTS[fault]
    edit(d)
    with pytest.raises(common.PrepareError) as e:
        common.check_dataset(d)
    if not readable:
        cmd = f"python prepare/indirect_indexing.py --quick --out_dir {common.repo_path(d)}"
    assert "\n" not in str(e.value) and str(d / name) in str(e.value) and cmd in str(e.value)
    for folder, script in (("jsb", "python prepare/jsb.py --out_dir "),
                           ("mine", "python prepare/genome.py")):
        # no folder: the script that makes it
        with pytest.raises(common.PrepareError, match=script):
            common.check_dataset(tmp_path / folder)


def test_output_file_keeps_the_old_file_when_the_save_fails(tmp_path):
    """An interrupt half-way through a write leaves the old file and no .tmp; a write that ends
    replaces it (the read-only and full-disk faults: tests/test_faults.py)."""
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), common.output_file(path) as f:
        f.write(b"half")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["ckpt.pt"]
    with common.output_file(path) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["ckpt.pt"]


def test_a_format_this_repo_lacks_is_one_line():
    """meta.json's "format" names the prepare/ module of its tokens (sample.py imports it)."""
    with pytest.raises(common.PrepareError, match="nonexistent"):
        common.format_module({"format": "nonexistent"})
    assert common.format_module({"format": "jsb"}).__name__ == "prepare.jsb"
    assert common.format_module({}) is None


@pytest.mark.parametrize("argv, named", [
    (["jsb.py", "--input", "{tmp}/none.npz"], "none.npz"),
    (["openwebtext.py", "--input", "{tmp}/none.jsonl"], "none.jsonl"),
    (["genome.py", "--input", "{tmp}/none.fa"], "none.fa"),
    (["indirect_indexing.py", "--n_val", "0"], "--n_val"),
    (["indirect_indexing.py", "--seed", "-1"], "--seed"),
    (["indirect_indexing.py", "--min_len", "10", "--max_shift", "10"], "max_shift"),
    # more memory than any machine has
    (["indirect_indexing.py", "--n_train", str(10**11)], "--n_train"),
])
def test_a_daily_mistake_is_one_line_exit_2_and_writes_nothing(tmp_path, argv, named):
    argv = [a.format(tmp=tmp_path) for a in argv]
    r = subprocess.run([sys.executable, str(REPO / "prepare" / argv[0]), *argv[1:], "--out_dir",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120, cwd="/")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and named in err[0], r.stderr
    assert list(tmp_path.iterdir()) == []

