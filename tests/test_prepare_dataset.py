"""prepare/common.py: a dataset is written as a set (staged beside out_dir and
swapped in whole; failures and kills leave the old or the new complete set; a
user's files are never deleted), meta["prepare"], check_dataset and
prepare_command. Datasets are tiny indirect-indexing sets (seeded, < 1 s)."""
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prepare import common  # noqa: E402
from prepare import indirect_indexing as ii  # noqa: E402

OLD = ["--quick", "--n_train", "300", "--n_val", "50", "--n_test", "50"]
NEW = ["--quick", "--n_train", "200", "--n_val", "40", "--n_test", "40", "--min_len", "10", "--max_len", "20",
       "--max_shift", "5"]
FILES = ["meta.json", "test.bin", "test_mask.bin", "train.bin", "train_mask.bin", "val.bin", "val_mask.bin"]


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}


def beside(d):
    """Names next to out_dir that a run for it made (staging/old folders)."""
    d = Path(d)
    return sorted(p.name for p in d.parent.iterdir() if p.name.startswith(d.name + "."))


def build(out, args):
    ii.main(args + ["--out_dir", str(out)])
    return snapshot(out)


@pytest.fixture
def old_set(tmp_path):
    out = tmp_path / "ii"
    return out, build(out, OLD)


# -----------------------------------------------------------------------------
# the set is swapped in whole

def test_rerun_replaces_the_set_and_is_byte_identical(old_set, tmp_path):
    out, old = old_set
    assert sorted(old) == FILES and beside(out) == []
    new = build(out, NEW)
    meta = json.loads(new["meta.json"])
    assert meta["row_len"] == 31 and meta["tokens"] == {"train": 200 * 31, "val": 40 * 31, "test": 40 * 31}
    assert new["train.bin"] != old["train.bin"] and beside(out) == []
    assert build(out, OLD) == old  # back to the first set, byte for byte
    assert build(out, OLD) == old


def test_failed_rerun_reproduction_leaves_the_old_set(old_set):
    # the reproduction: a directory where the re-run would put a temp file
    out, old = old_set
    (out / "val.bin.tmp").mkdir()
    with pytest.raises((common.PrepareError, OSError)):
        ii.main(NEW + ["--out_dir", str(out)])
    (out / "val.bin.tmp").rmdir()
    assert snapshot(out) == old  # not the new train.bin beside the old meta.json and val.bin
    assert beside(out) == []
    common.check_dataset(out, common.SPLITS)


def test_failed_rerun_reproduction_as_commands(tmp_path):
    out = tmp_path / "ii"
    cmd = [sys.executable, str(REPO / "prepare" / "indirect_indexing.py")]
    subprocess.run(cmd + OLD + ["--out_dir", str(out)], check=True, capture_output=True, timeout=120)
    old = snapshot(out)
    (out / "val.bin.tmp").mkdir()
    r = subprocess.run(cmd + NEW + ["--out_dir", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "val.bin.tmp/" in r.stderr, r.stderr
    (out / "val.bin.tmp").rmdir()
    assert snapshot(out) == old


@pytest.mark.parametrize("split", ["val", "test"])
def test_exception_after_some_splits_leaves_the_old_set(old_set, monkeypatch, split):
    out, old = old_set
    real = ii.generate_split

    def failing(n, seed, s, *a):
        if s == split:
            raise RuntimeError("simulated failure")
        return real(n, seed, s, *a)
    monkeypatch.setattr(ii, "generate_split", failing)
    with pytest.raises(RuntimeError, match="simulated failure"):
        ii.main(NEW + ["--out_dir", str(out)])
    assert snapshot(out) == old and beside(out) == []


def test_failure_inside_the_swap_puts_the_old_set_back(old_set, monkeypatch):
    out, old = old_set
    real = os.rename

    def rename(a, b):
        if Path(b) == out and ".tmp-" in Path(a).name:  # the second rename: staging folder -> out_dir
            raise OSError("simulated rename failure")
        real(a, b)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="simulated"):
        ii.main(NEW + ["--out_dir", str(out)])
    assert snapshot(out) == old and beside(out) == []


KILLER = r"""
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from prepare import common, indirect_indexing as ii
point = sys.argv[1]
if point in ("write", "pause"):  # the new train split is written into the staging folder, then a kill (or a pause)
    real_write = common.write_bin
    def write_bin(path, arr, dtype):
        n = real_write(path, arr, dtype)
        if path.name == "train_mask.bin" and point == "write":
            os.kill(os.getpid(), signal.SIGKILL)
        if path.name == "train_mask.bin":
            print("paused", flush=True)
            time.sleep(600)
        return n
    common.write_bin = write_bin
else:  # killed right after out_dir -> .old ("renames") or after staging folder -> out_dir ("swapped")
    real_rename = os.rename
    def rename(a, b):
        real_rename(a, b)
        if (point == "renames") == os.fspath(b).endswith(".old"):
            os.kill(os.getpid(), signal.SIGKILL)
    os.rename = rename
ii.main(sys.argv[2:])
"""


def killed_run(point, out, args):
    r = subprocess.run([sys.executable, "-c", KILLER.format(repo=str(REPO)), point] + args + ["--out_dir", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    return r


def test_kill_mid_write_leaves_the_old_set_and_the_next_run_cleans_up(old_set):
    out, old = old_set
    r = killed_run("write", out, NEW)
    assert snapshot(out) == old
    left = beside(out)
    assert len(left) == 2 and left[0] == "ii.lock" and re.fullmatch(r"ii\.tmp-\d+", left[1]), left
    assert common.check_dataset(out, common.SPLITS)["row_len"] == 23
    new = build(out, NEW)
    assert beside(out) == [] and json.loads(new["meta.json"])["row_len"] == 31, r.stderr


def test_kill_between_the_renames_then_the_next_run_restores(old_set, monkeypatch):
    out, old = old_set
    killed_run("renames", out, NEW)
    assert not out.exists()
    left = beside(out)
    assert [n.split("-")[0] for n in left] == ["ii.lock", "ii.old", "ii.tmp"], left
    assert snapshot(out.parent / "ii.old") == old  # the complete old set, beside
    with pytest.raises(common.PrepareError) as e:
        common.check_dataset(out)
    assert str(e.value).startswith(f"{out}: no such dataset folder") and "ii.old" in str(e.value)
    # the next run first puts the old set back: a failing one leaves exactly it
    monkeypatch.setattr(ii, "generate_split", lambda *a: (_ for _ in ()).throw(RuntimeError("fail")))
    with pytest.raises(RuntimeError):
        ii.main(NEW + ["--out_dir", str(out)])
    assert snapshot(out) == old and beside(out) == []


def test_kill_after_the_renames_leaves_the_new_set(old_set):
    out, old = old_set
    killed_run("swapped", out, NEW)
    assert json.loads((out / "meta.json").read_text())["row_len"] == 31
    common.check_dataset(out, common.SPLITS)
    assert beside(out) == ["ii.lock", "ii.old"] and snapshot(out.parent / "ii.old") == old
    assert build(out, OLD) == old and beside(out) == []


def test_a_second_run_on_the_same_out_dir_is_refused(old_set):
    """While a run writes out_dir (paused mid-write), another is refused in one line
    naming its PID, and changes nothing; once the first is gone, a run goes through."""
    out, old = old_set
    first = subprocess.Popen([sys.executable, "-c", KILLER.format(repo=str(REPO)), "pause"] + NEW
                             + ["--out_dir", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "paused\n", first.stderr.read()
        stage = f"ii.tmp-{first.pid}"
        assert beside(out) == ["ii.lock", stage]
        with pytest.raises(common.PrepareError) as e:
            ii.main(OLD + ["--out_dir", str(out)])
        assert str(e.value) == (f"{out} is in use by another run (pid {first.pid} holds {out}.lock); "
                                "wait for it to finish")
        assert snapshot(out) == old and beside(out) == ["ii.lock", stage]
    finally:
        first.kill()
        first.communicate()
    assert build(out, NEW) != old and beside(out) == []


# -----------------------------------------------------------------------------
# a user's files

def test_user_files_in_out_dir_are_refused_and_kept(old_set):
    out, old = old_set
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    (out / "mine" / "x.py").write_text("x = 1\n")
    with pytest.raises(common.PrepareError) as e:
        ii.main(NEW + ["--out_dir", str(out)])
    msg = str(e.value)
    assert "\n" not in msg and "mine/" in msg and "notes.txt" in msg and str(out) in msg
    assert (out / "notes.txt").read_text() == "mine" and (out / "mine" / "x.py").exists()
    assert {k: v for k, v in snapshot(out).items() if k != "notes.txt"} == old and beside(out) == []


def test_a_folder_that_is_not_a_dataset_is_refused(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("...")
    (tmp_path / "home" / "train.bin").write_bytes(b"\0\0")  # a dataset's name but user data next to it
    with pytest.raises(common.PrepareError, match=r"thesis\.tex"):
        ii.main(OLD + ["--out_dir", str(tmp_path / "home")])
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["thesis.tex", "train.bin"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(common.PrepareError, match="not a folder"):
        ii.main(OLD + ["--out_dir", str(tmp_path / "file")])


def test_download_cache_is_kept_across_runs_and_rescued_from_leftovers(old_set):
    out, old = old_set
    (out / "raw").mkdir()
    (out / "raw" / "source.npz").write_bytes(b"downloaded")
    build(out, NEW)
    assert (out / "raw" / "source.npz").read_bytes() == b"downloaded"
    # a leftover of a killed run that holds raw/: moved back when out_dir has none
    shutil.move(str(out / "raw"), str(out.parent / "raw"))
    left = out.parent / "ii.tmp-999999999"
    left.mkdir()
    shutil.move(str(out.parent / "raw"), str(left / "raw"))
    (left / "train.bin").write_bytes(b"\1\0")
    assert build(out, OLD) == old
    assert (out / "raw" / "source.npz").read_bytes() == b"downloaded" and beside(out) == []


def test_symlinked_out_dir_stays_a_link(tmp_path):
    real = tmp_path / "disk" / "ii"
    build(real, OLD)
    link = tmp_path / "data_ii"
    link.symlink_to(real)
    new = build(link, NEW)
    assert link.is_symlink() and snapshot(real) == new and beside(real) == []


# -----------------------------------------------------------------------------
# meta["prepare"]

def test_prepare_command_is_recorded_and_rebuilds_the_set(tmp_path):
    out = tmp_path / "ii"
    new = build(out, NEW)
    meta = json.loads(new["meta.json"])
    assert meta["prepare"] == ("python prepare/indirect_indexing.py --quick --n_train 200 --n_val 40 --n_test 40 "
                               f"--min_len 10 --max_len 20 --max_shift 5 --out_dir {common.repo_path(out)}")
    assert meta["tokens"] == {"train": 6200, "val": 1240, "test": 1240}
    # run the recorded command from the repo root: the same bytes
    argv = shlex.split(meta["prepare"])
    assert argv[:2] == ["python", "prepare/indirect_indexing.py"]
    subprocess.run([sys.executable] + argv[1:], cwd=REPO, check=True, capture_output=True, timeout=120)
    assert snapshot(out) == new


def test_rebuild_command_defaults_and_paths(monkeypatch):
    monkeypatch.chdir(REPO)
    cmd = lambda argv: ii.rebuild_command(ii.build_parser().parse_args(argv))  # noqa: E731
    assert cmd([]) == "python prepare/indirect_indexing.py"
    assert cmd(["--quick"]) == "python prepare/indirect_indexing.py --quick"
    assert cmd(["--quick", "--out_dir", "data/indirect_indexing_quick"]) == "python prepare/indirect_indexing.py --quick"
    assert cmd(["--out_dir", "data/indirect_indexing_quick"]) == \
        "python prepare/indirect_indexing.py --out_dir data/indirect_indexing_quick"
    assert cmd(["--seed", "7", "--out_dir", "data/my ii"]) == "python prepare/indirect_indexing.py --seed 7 --out_dir 'data/my ii'"
    monkeypatch.chdir(REPO / "prepare")
    assert cmd(["--out_dir", "../data/x"]) == "python prepare/indirect_indexing.py --out_dir data/x"
    assert common.repo_path(REPO.parent / "shared" / "data") == "../shared/data"
    assert common.repo_path("/") == "/"


# -----------------------------------------------------------------------------
# check_dataset

@pytest.fixture(scope="module")
def good(tmp_path_factory):
    out = tmp_path_factory.mktemp("check") / "indirect_indexing_quick"
    ii.main(["--quick", "--n_train", "40", "--n_val", "20", "--n_test", "20", "--out_dir", str(out)])
    return out


@pytest.fixture
def copy(good, tmp_path):
    d = tmp_path / "indirect_indexing_quick"
    shutil.copytree(good, d)
    return d


def edit_meta(d, **kw):
    meta = json.loads((d / "meta.json").read_text())
    for k, v in kw.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    (d / "meta.json").write_text(json.dumps(meta))


def toks(d, split, dtype=np.uint16):
    return np.fromfile(d / f"{split}.bin", dtype=dtype)


def test_check_dataset_accepts_a_good_set(good):
    meta = common.check_dataset(good)
    assert meta == json.loads((good / "meta.json").read_text())
    assert common.check_dataset(str(good), splits=("train", "val", "test"))["row_len"] == 23


def rebuild_of(d):
    """meta["prepare"] of the good set (a copy keeps the command that made it)."""
    return f"python prepare/indirect_indexing.py --quick --n_train 40 --n_val 20 --n_test 20 --out_dir {common.repo_path(d)}"


FAULTS = {
    # name: (edit the copy, the file named, words in the message, meta readable?)
    "missing meta.json": (lambda d: (d / "meta.json").unlink(), "meta.json", "missing", False),
    "meta not JSON": (lambda d: (d / "meta.json").write_text('{"vocab_size": 67,'), "meta.json", "not valid JSON", False),
    "meta a list": (lambda d: (d / "meta.json").write_text("[1, 2]"), "meta.json", "not an object", False),
    "no vocab_size": (lambda d: edit_meta(d, vocab_size=None), "meta.json", "vocab_size is None", True),
    "vocab_size 0": (lambda d: edit_meta(d, vocab_size=0), "meta.json", "vocab_size is 0", True),
    "vocab_size str": (lambda d: edit_meta(d, vocab_size="67"), "meta.json", "vocab_size is '67'", True),
    "vocab_size bool": (lambda d: edit_meta(d, vocab_size=True), "meta.json", "vocab_size is True", True),
    "dtype float": (lambda d: edit_meta(d, dtype="float32"), "meta.json", "dtype is 'float32'", True),
    "dtype nonsense": (lambda d: edit_meta(d, dtype="uint12"), "meta.json", "dtype is 'uint12'", True),
    "dtype too narrow": (lambda d: edit_meta(d, dtype="uint8", vocab_size=300), "meta.json", "cannot hold", True),
    "missing val.bin": (lambda d: (d / "val.bin").unlink(), "val.bin", "missing", True),
    "odd byte size": (lambda d: open(d / "train.bin", "ab").write(b"\0"), "train.bin", "not a multiple of 2", True),
    "empty bin": (lambda d: open(d / "val.bin", "wb").close(), "val.bin", "empty", True),
    "token count differs": (lambda d: open(d / "val.bin", "ab").write(b"\0\0" * 23), "val.bin",
                            "holds 483 tokens but meta.json records 460", True),
    "not a multiple of row_len": (lambda d: (toks(d, "train")[:-2].tofile(d / "train.bin"),
                                             edit_meta(d, tokens={"train": 918, "val": 460, "test": 460})),
                                  "train.bin", "not a multiple of row_len 23", True),
    "mask length differs": (lambda d: np.fromfile(d / "val_mask.bin", np.uint8)[:-23].tofile(d / "val_mask.bin"),
                            "val_mask.bin", "holds 437 entries but val.bin holds 460", True),
    "token id >= vocab_size": (lambda d: (lambda t: (t.__setitem__(431, 67), t.tofile(d / "val.bin")))(toks(d, "val")),
                               "val.bin", "token id 67 (first out of range at token 431) is >= vocab_size 67", True),
    "mask all zeros": (lambda d: np.zeros(920, np.uint8).tofile(d / "train_mask.bin"), "train_mask.bin",
                       "scores no token", True),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_check_dataset_names_file_fault_and_command(good, copy, fault, monkeypatch):
    monkeypatch.setattr(common, "CHECK_CHUNK", 7)  # the scans go chunk by chunk
    edit, name, words, readable = FAULTS[fault]
    edit(copy)
    with pytest.raises(common.PrepareError) as e:
        common.check_dataset(copy)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{copy / name}: ") and words in msg, msg
    cmd = rebuild_of(good) if readable else f"python prepare/indirect_indexing.py --quick --out_dir {common.repo_path(copy)}"
    assert msg.endswith(f"; rebuild it with: {cmd}"), msg


def test_check_dataset_missing_folder_and_other_names(tmp_path):
    with pytest.raises(common.PrepareError) as e:
        common.check_dataset(tmp_path / "jsb")
    assert str(e.value) == (f"{tmp_path / 'jsb'}: no such dataset folder; rebuild it with: "
                            "python prepare/jsb.py "
                            f"--out_dir {common.repo_path(tmp_path / 'jsb')}")
    with pytest.raises(common.PrepareError) as e:
        common.check_dataset(common.default_out_dir("maestro_nonexistent_name"))
    assert "no prepare command is known for a dataset named 'maestro_nonexistent_name'" in str(e.value)
    assert "python prepare/jsb.py" in str(e.value) and "python prepare/genome.py" in str(e.value)
    # a meta.json without "prepare" (an older dataset): the table's command
    (tmp_path / "genome").mkdir()
    (tmp_path / "genome" / "meta.json").write_text('{"vocab_size": 4107, "dtype": "uint16"}')
    with pytest.raises(common.PrepareError, match=r"train\.bin: missing; rebuild it with: python prepare/genome\.py --out_dir"):
        common.check_dataset(tmp_path / "genome")


def test_check_dataset_ignores_splits_not_asked_and_missing_tokens(copy):
    (copy / "test.bin").unlink()
    edit_meta(copy, tokens=None, dtype=None)  # no counts recorded; no dtype means uint16, as in train.py
    meta = common.check_dataset(copy)
    assert meta["vocab_size"] == 67 and meta["dtype"] == "uint16" and "tokens" not in meta
    with pytest.raises(common.PrepareError, match="test.bin: missing"):
        common.check_dataset(copy, ("train", "val", "test"))


# -----------------------------------------------------------------------------
# prepare_command

def test_prepare_command_table():
    assert common.prepare_command("openwebtext") == "python prepare/openwebtext.py"
    assert common.prepare_command("indirect_indexing") == "python prepare/indirect_indexing.py"
    assert common.prepare_command("indirect_indexing_quick") == "python prepare/indirect_indexing.py --quick"
    assert common.prepare_command("jsb") == "python prepare/jsb.py"
    assert common.prepare_command("maestro") == "python prepare/maestro.py"
    assert common.prepare_command("genome") == "python prepare/genome.py"
    # english: the command in config/english_small.py's header comment
    header = (REPO / "config" / "english_small.py").read_text().split("# Data:", 1)[1].split("# Usage:")[0]
    assert common.prepare_command("english") == " ".join(header.replace("\\\n#", " ").split())
    unknown = common.prepare_command("shakespeare_char")
    assert "shakespeare_char" in unknown
    for s in ("openwebtext", "indirect_indexing", "jsb", "maestro", "genome"):
        assert f"python prepare/{s}.py" in unknown
    # each script's default out_dir is data/<name> for the table's names
    assert ii.QUICK["name"] == "indirect_indexing_quick"
    for name in ("openwebtext", "jsb", "maestro", "genome"):
        mod = __import__(f"prepare.{name}", fromlist=["build_parser"])
        assert Path(mod.build_parser().get_default("out_dir")) == common.default_out_dir(name)
