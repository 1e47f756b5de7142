"""prepare/common.py: a dataset is written as a set (staged beside out_dir, swapped in whole; a
failure or a kill leaves the old or the new complete set; a user's files are never deleted),
meta["prepare"] rebuilds it, check_dataset refuses what training cannot use. Tiny seeded sets."""
import json
import os
import re
import shlex
import shutil
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
FILES = ["meta.json", "test.bin", "test_mask.bin", "train.bin", "train_mask.bin", "val.bin", "val_mask.bin"]


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
    out = tmp_path / "ii"
    return out, build(out, OLD)


def test_rerun_replaces_the_set_byte_identically(old_set):
    out, old = old_set
    assert sorted(old) == FILES and beside(out) == []
    new = build(out, NEW)
    assert json.loads(new["meta.json"])["row_len"] == 31 and new["train.bin"] != old["train.bin"]
    assert build(out, OLD) == old and beside(out) == []


def fail_in_split(monkeypatch, split):
    real = ii.generate_split
    monkeypatch.setattr(ii, "generate_split", lambda n, seed, s, *a: (_ for _ in ()).throw(RuntimeError(s))
                        if s == split else real(n, seed, s, *a))


@pytest.mark.parametrize("split", ["train", "test"])
def test_an_error_mid_run_leaves_the_old_set(old_set, monkeypatch, split):
    out, old = old_set
    fail_in_split(monkeypatch, split)
    with pytest.raises(RuntimeError):
        ii.main(NEW + ["--out_dir", str(out)])
    assert snapshot(out) == old and beside(out) == []


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
    return [sys.executable, "-c", KILLER.format(repo=str(REPO)), point] + args + ["--out_dir", str(out)]


@pytest.mark.parametrize("point", ["write", "renames", "swapped"])
def test_a_kill_leaves_a_complete_set_and_the_next_run_cleans_up(old_set, point, monkeypatch):
    out, old = old_set
    r = subprocess.run(killer(point, out, NEW), capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    if point == "renames":  # out_dir is gone, the complete old set waits beside it
        assert not out.exists() and snapshot(out.parent / "ii.old") == old
        with pytest.raises(common.PrepareError, match=re.escape(str(out))):
            common.check_dataset(out)
    else:
        assert common.check_dataset(out, common.SPLITS)["row_len"] == {"write": 23, "swapped": 31}[point]
        assert point == "swapped" or snapshot(out) == old
    fail_in_split(monkeypatch, "val")  # a next run that fails: the old set back, nothing beside it
    with pytest.raises(RuntimeError):
        ii.main(OLD + ["--out_dir", str(out)])
    monkeypatch.undo()
    assert point == "swapped" or snapshot(out) == old
    assert beside(out) == [] and build(out, OLD) == old and beside(out) == []


def test_a_second_run_on_the_same_out_dir_is_refused(old_set):
    out, old = old_set
    first = subprocess.Popen(killer("pause", out, NEW), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout.readline() == "paused\n", first.stderr.read()
        with pytest.raises(common.PrepareError, match=re.escape(f"{out}.lock")):
            ii.main(OLD + ["--out_dir", str(out)])
        assert snapshot(out) == old
    finally:
        first.kill()
        first.communicate()
    assert build(out, NEW) != old and beside(out) == []


@pytest.mark.parametrize("mine", ["notes.txt", "mine/x.py"])
def test_a_users_files_in_out_dir_are_refused_and_kept(old_set, mine):
    out, old = old_set
    (out / mine).parent.mkdir(exist_ok=True)
    (out / mine).write_text("mine")
    with pytest.raises(common.PrepareError, match=mine.split("/")[0]):
        ii.main(NEW + ["--out_dir", str(out)])
    assert (out / mine).read_text() == "mine" and {k: v for k, v in snapshot(out).items() if k in old} == old
    assert beside(out) == []


def test_download_cache_and_symlinked_out_dir_are_kept(old_set, tmp_path):
    out, old = old_set
    (out / "raw").mkdir()
    (out / "raw" / "source.npz").write_bytes(b"downloaded")
    build(out, NEW)
    assert (out / "raw" / "source.npz").read_bytes() == b"downloaded"
    link = tmp_path / "link"
    link.symlink_to(out)
    build(link, OLD)
    assert link.is_symlink() and snapshot(out)["train.bin"] == old["train.bin"] and beside(out) == []
    assert (out / "raw" / "source.npz").read_bytes() == b"downloaded"


def test_the_recorded_command_rebuilds_the_set(tmp_path, monkeypatch):
    out = tmp_path / "ii"
    new = build(out, NEW)
    meta = json.loads(new["meta.json"])
    assert meta["prepare"] == ("python prepare/indirect_indexing.py --quick --n_train 200 --n_val 40 "
                               f"--n_test 40 --max_len 20 --max_shift 5 --out_dir {common.repo_path(out)}")
    argv = shlex.split(meta["prepare"])
    subprocess.run([sys.executable] + argv[1:], cwd=REPO, check=True, capture_output=True, timeout=120)
    assert snapshot(out) == new
    monkeypatch.chdir(REPO / "prepare")
    cmd = lambda argv: ii.rebuild_command(ii.build_parser().parse_args(argv))  # noqa: E731
    assert cmd(["--quick", "--out_dir", "../data/indirect_indexing_quick"]) == \
        "python prepare/indirect_indexing.py --quick"
    assert cmd(["--seed", "7", "--out_dir", "../data/my ii"]) == \
        "python prepare/indirect_indexing.py --seed 7 --out_dir 'data/my ii'"
    assert common.repo_path(REPO.parent / "shared" / "data") == "../shared/data"
    assert common.repo_path("/") == "/"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    out = tmp_path_factory.mktemp("check") / "indirect_indexing_quick"
    ii.main(["--quick", "--n_train", "40", "--n_val", "20", "--n_test", "20", "--out_dir", str(out)])
    return out


def edit_meta(d, **kw):
    (d / "meta.json").write_text(json.dumps({**json.loads((d / "meta.json").read_text()), **kw}))


def set_token(d, split, i, value):
    t = np.fromfile(d / f"{split}.bin", dtype=np.uint16)
    t[i] = value
    t.tofile(d / f"{split}.bin")


FAULTS = {  # name: (how the copy is damaged, the file named, whether meta.json still names its command)
    "no meta.json": (lambda d: (d / "meta.json").unlink(), "meta.json", False),
    "meta.json not JSON": (lambda d: (d / "meta.json").write_text('{"vocab_size": 67,'), "meta.json", False),
    "meta.json a list": (lambda d: (d / "meta.json").write_text("[1]"), "meta.json", False),
    "vocab_size a string": (lambda d: edit_meta(d, vocab_size="67"), "meta.json", True),
    "dtype too narrow": (lambda d: edit_meta(d, dtype="uint8", vocab_size=300), "meta.json", True),
    "dtype signed": (lambda d: edit_meta(d, dtype="int16"), "meta.json", True),
    "no val.bin": (lambda d: (d / "val.bin").unlink(), "val.bin", True),
    "odd byte count": (lambda d: open(d / "train.bin", "ab").write(b"\0"), "train.bin", True),
    "empty split": (lambda d: open(d / "val.bin", "wb").close(), "val.bin", True),
    "token count differs": (lambda d: open(d / "val.bin", "ab").write(b"\0\0" * 23), "val.bin", True),
    "a partial row": (lambda d: (open(d / "train.bin", "ab").write(b"\0\0"), edit_meta(d, tokens={})),
                      "train.bin", True),
    "mask length differs": (lambda d: open(d / "val_mask.bin", "ab").write(b"\0"), "val_mask.bin", True),
    "token id >= vocab_size": (lambda d: set_token(d, "val", 431, 67), "val.bin", True),
    "mask all zeros": (lambda d: np.zeros(920, np.uint8).tofile(d / "train_mask.bin"), "train_mask.bin",
                       True),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_check_dataset_names_the_file_and_the_rebuild_command(good, tmp_path, fault, monkeypatch):
    d = tmp_path / "indirect_indexing_quick"
    shutil.copytree(good, d)
    assert common.check_dataset(d, common.SPLITS) == json.loads((d / "meta.json").read_text())
    monkeypatch.setattr(common, "CHECK_CHUNK", 7)  # the scans go chunk by chunk
    edit, name, readable = FAULTS[fault]
    edit(d)
    with pytest.raises(common.PrepareError) as e:
        common.check_dataset(d)
    msg = str(e.value)
    cmd = json.loads((good / "meta.json").read_text())["prepare"] if readable else \
        f"python prepare/indirect_indexing.py --quick --out_dir {common.repo_path(d)}"
    assert "\n" not in msg and msg.startswith(f"{d / name}: ") and msg.endswith(f"rebuild it with: {cmd}"), \
        msg


def test_check_dataset_of_a_missing_folder_names_its_script(tmp_path):
    for name, want in (("jsb", "python prepare/jsb.py --out_dir "), ("mine", "python prepare/genome.py")):
        with pytest.raises(common.PrepareError, match=re.escape(str(tmp_path / name))) as e:
            common.check_dataset(tmp_path / name)
        assert want in str(e.value)


def test_download_fails_fast_and_leaves_nothing(tmp_path):
    with pytest.raises(common.PrepareError, match="http://127.0.0.1:9/x.npz.*--input FILE"):
        common.download("http://127.0.0.1:9/x.npz", tmp_path / "raw" / "x.npz", "Pass it with --input FILE.",
                        timeout=5)
    assert list(tmp_path.iterdir()) == []


def test_lock_folder_holds_one_lock_per_folder_and_unlock_deletes_it(tmp_path):
    common.lock_folder(tmp_path, "wait")
    assert os.path.exists(tmp_path / ".lock") and str(tmp_path / ".lock") in common._LOCKS
    common.unlock_folder(tmp_path)
    assert not os.path.exists(tmp_path / ".lock") and str(tmp_path / ".lock") not in common._LOCKS


def test_a_users_folder_named_like_the_staging_folder_is_kept(old_set):
    out, old = old_set
    (out.parent / "ii.tmp").mkdir()
    (out.parent / "ii.tmp" / "thesis.tex").write_text("mine")
    with pytest.raises(common.PrepareError, match="thesis.tex"):
        ii.main(NEW + ["--out_dir", str(out)])
    assert (out.parent / "ii.tmp" / "thesis.tex").read_text() == "mine" and snapshot(out) == old
