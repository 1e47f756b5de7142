"""Bad input to sample.py and the prepare scripts ends in one line naming the
problem and the fix, never a traceback, and leaves what was there: a prompt file
that is missing, binary or a folder; an infinite temperature; a checkpoint with
NaN weights, an unknown format or one that needs pickle; a read-only folder and
a full disk (simulated: the write calls under one folder raise OSError(EROFS),
or the token writes raise ENOSPC); indirect_indexing arguments that numpy would
reject only after the work started. Tiny models and datasets: seconds in all."""
import dataclasses
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import sample  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from prepare import common  # noqa: E402
from prepare import indirect_indexing as ii  # noqa: E402
from prepare import openwebtext as owt  # noqa: E402

SEED = int(os.environ.get("POPE_TEST_SEED", "1234"))
ITOS = list("abcdefgh")


def one_line_error(excinfo, capsys, code=None):
    """The text of a SystemExit raised with a message (sys.exit("error: ...")) or
    printed to stderr before exiting with a status (after progress bars, if any);
    asserts it is one line and that no traceback was printed."""
    e = excinfo.value
    err = capsys.readouterr().err
    msg = e.code if isinstance(e.code, str) else err.rstrip("\n").split("\n")[-1]
    assert msg.startswith("error: ") and "\n" not in msg and "Traceback" not in err + msg, err + msg
    if code is not None:
        assert e.code == code, (e.code, msg)
    return msg


# -----------------------------------------------------------------------------
# sample.py

@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """A tiny character-level checkpoint, and copies of it with NaN/inf weights,
    an unknown dataset format and a pickled object (a marker file shows whether
    loading ran it)."""
    d = tmp_path_factory.mktemp("ckpts")
    torch.manual_seed(SEED)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=len(ITOS), pos_emb="pope",
                    attn_impl="torch")
    model = GPT(cfg)
    ck = {"model": model.state_dict(), "model_args": dataclasses.asdict(cfg), "config": {"dataset": "toy"},
          "meta": {"itos": ITOS, "vocab_size": len(ITOS), "dtype": "uint16"}}
    torch.save(ck, d / "good.pt")
    state = {k: v.clone() for k, v in ck["model"].items()}
    state["lm_head.weight"][3, 5] = float("nan")
    state["transformer.h.0.mlp.c_fc.weight"][0, 1] = float("inf")
    torch.save({**ck, "model": state}, d / "nan.pt")
    torch.save({**ck, "meta": {**ck["meta"], "format": "no_such_format"}}, d / "format.pt")
    torch.save({**ck, "config": {"evil": _Payload(str(d / "pwned"))}}, d / "pickle.pt")
    return d


class _Payload:
    """Unpickling this runs code: it creates the file at self.path."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def sample_main(capsys, *args):
    with pytest.raises(SystemExit) as e:
        sample.main(["--device=cpu", "--max_new_tokens=4", "--num_samples=2", *args])
    return one_line_error(e, capsys)


@pytest.mark.parametrize("t", ["inf", "nan", "-inf"])
def test_sample_refuses_a_temperature_that_is_not_finite(ckpts, capsys, t):
    """inf sampled uniformly with rc 0; refused before the checkpoint is read."""
    msg = sample_main(capsys, f"--ckpt={ckpts / 'good.pt'}", "--start=abc", f"--temperature={t}")
    assert msg == f"error: --temperature must be >= 0 and finite (0 = greedy), got {float(t)}"
    assert capsys.readouterr().out == ""


def test_sample_prompt_file_errors_are_one_line(ckpts, tmp_path, capsys):
    good = f"--ckpt={ckpts / 'good.pt'}"
    assert sample_main(capsys, good, f"--start=FILE:{tmp_path / 'none.txt'}") == \
        f"error: --start=FILE:{tmp_path / 'none.txt'}: no such file; give the path of a text file holding the prompt"
    (tmp_path / "bin.txt").write_bytes(b"ab\xff\xfe\x00c")
    assert sample_main(capsys, good, f"--start=FILE:{tmp_path / 'bin.txt'}") == \
        f"error: --start=FILE:{tmp_path / 'bin.txt'} is not UTF-8 text (byte 0xff at offset 2); give a UTF-8 text " \
        "file with the prompt in the dataset's format"
    assert sample_main(capsys, good, f"--start=FILE:{tmp_path}") == \
        f"error: --start=FILE:{tmp_path} is a folder; give the path of a text file holding the prompt"
    # a text file is the prompt
    (tmp_path / "p.txt").write_text("hgf", encoding="utf-8")
    sample.main(["--device=cpu", "--max_new_tokens=3", "--num_samples=1", good, f"--start=FILE:{tmp_path / 'p.txt'}"])
    assert capsys.readouterr().out.startswith("hgf")


def test_sample_refuses_an_unknown_format(ckpts, capsys):
    """meta["format"] named a module that does not exist: ModuleNotFoundError."""
    msg = sample_main(capsys, f"--ckpt={ckpts / 'format.pt'}", "--start=abc")
    assert msg == (f"error: {ckpts / 'format.pt'} names the dataset format 'no_such_format', which no prepare/ "
                   f"script here reads (known: {', '.join(common.prepare_scripts())}); sample with the version of "
                   "this code that wrote it")
    assert "indirect_indexing" in common.prepare_scripts() and "common" not in common.prepare_scripts()


def test_write_atomic_leaves_no_part_of_a_file_behind(tmp_path):
    """A save that fails half-way (a full disk) left path.tmp holding the part written, and
    the space it took; now the error goes through, the old file stays, the part goes."""
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"the old checkpoint")

    def save(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half of a new one")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
    with pytest.raises(OSError) as e:
        common.write_atomic(str(path), save)
    assert e.value.errno == errno.ENOSPC and os.listdir(tmp_path) == ["ckpt.pt"]
    assert path.read_bytes() == b"the old checkpoint"
    common.write_atomic(str(path), lambda tmp: Path(tmp).write_bytes(b"new"))
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["ckpt.pt"]


def test_sample_save_into_a_read_only_folder(ckpts, tmp_path, capsys, monkeypatch, readonly):
    """--save wrote after generating: an EROFS traceback. Now refused before the model runs."""
    ro = tmp_path / "ro"
    ro.mkdir()
    readonly(ro)
    for prefix in (ro / "x", ro / "samples" / "x"):
        msg = sample_main(capsys, f"--ckpt={ckpts / 'good.pt'}", "--start=abc", f"--save={prefix}")
        assert msg.startswith(f"error: --save {prefix}_0: cannot write into {ro} (Read-only file system); "), msg
        assert capsys.readouterr().out == ""
    monkeypatch.undo()
    assert list(ro.iterdir()) == []
    sample.main(["--device=cpu", "--max_new_tokens=3", "--num_samples=2", f"--ckpt={ckpts / 'good.pt'}",
                 "--start=abc", f"--save={tmp_path / 'samples' / 'x'}"])
    assert sorted(os.listdir(tmp_path / "samples")) == ["x_0.txt", "x_1.txt"]


def test_gitignore_covers_the_readme_samples_folder():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    assert "--save=samples/" in (REPO / "README.md").read_text(encoding="utf-8")
    r = subprocess.run(["git", "check-ignore", "-q", "samples/jsb_0.mid"], cwd=REPO, timeout=60)
    assert r.returncode == 0


# -----------------------------------------------------------------------------
# prepare scripts

OLD = ["--quick", "--n_train", "300", "--n_val", "50", "--n_test", "50"]
NEW = ["--quick", "--n_train", "200", "--n_val", "40", "--n_test", "40", "--seed", "7"]


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir())}


def run_main(main, argv, capsys):
    capsys.readouterr()  # the progress bars of earlier runs
    with pytest.raises(SystemExit) as e:
        common.run_main(main, argv)
    return one_line_error(e, capsys, code=2)


def test_prepare_into_a_read_only_folder_leaves_the_old_set(tmp_path, capsys, monkeypatch, readonly):
    out = tmp_path / "ro" / "ii"
    ii.main(OLD + ["--out_dir", str(out)])
    old = snapshot(out)
    readonly(out.parent)
    msg = run_main(ii.main, NEW + ["--out_dir", str(out)], capsys)
    assert msg.startswith(f"error: --out_dir {out}: cannot create {out}.tmp-{os.getpid()} (Read-only file system); ")
    assert msg.endswith("give an --out_dir in a writable folder")
    monkeypatch.undo()
    assert snapshot(out) == old and sorted(os.listdir(out.parent)) == ["ii"]


class _Disk:
    """A disk with `free` bytes left, for the files prepare/common.py opens: a file
    whose write fails with ENOSPC once the disk is full (as the OS's does)."""
    def __init__(self, free):
        self.free = free

    def open(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        return f if "w" not in mode else _FullFile(f, self)


class _FullFile:
    def __init__(self, f, disk):
        self.f, self.disk = f, disk

    def write(self, data):
        n = memoryview(data).nbytes
        if n > self.disk.free:
            self.f.write(memoryview(data).cast("B")[:self.disk.free])
            self.disk.free = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.disk.free -= n
        return self.f.write(data)

    def close(self):
        self.f.close()


@pytest.mark.parametrize("free", [0, 5000, 17000])  # full at train.bin's first write; inside it; in test.bin
def test_prepare_with_a_full_disk_leaves_the_old_set(tmp_path, capsys, monkeypatch, free):
    """numpy's tofile lost the errno ('690000 requested and 501760 written' on a real full
    disk, in a traceback); now the token writes fail with ENOSPC and that is one line."""
    out = tmp_path / "ii"
    ii.main(OLD + ["--out_dir", str(out)])
    old = snapshot(out)
    monkeypatch.setattr(common, "open", _Disk(free).open, raising=False)  # the open of BinWriter
    msg = run_main(ii.main, NEW + ["--out_dir", str(out)], capsys)
    assert msg == (f"error: could not write {out}.tmp-{os.getpid()} (No space left on device); {out} was left as it "
                   "was. Free some disk space, or give an --out_dir on another disk")
    assert snapshot(out) == old and sorted(os.listdir(tmp_path)) == ["ii"]
    monkeypatch.setattr(common, "open", _Disk(10**6).open)  # room enough: the same bytes as without the wrapper
    ii.main(OLD + ["--out_dir", str(out)])
    assert snapshot(out) == old


def test_openwebtext_refuses_a_read_only_folder_before_reading_the_input(tmp_path, capsys, monkeypatch,
                                                                      readonly):
    (tmp_path / "in.txt").write_text("one document\n\n\nanother\n", encoding="utf-8")
    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.setattr(owt, "count_documents", lambda *a: pytest.fail("read the input before checking out_dir"))
    readonly(ro)
    msg = run_main(owt.main, ["--input", str(tmp_path / "in.txt"), "--out_dir", str(ro / "owt"), "--num_proc", "1"],
                   capsys)
    assert msg.startswith(f"error: --out_dir {ro / 'owt'}.tmp-{os.getpid()}: cannot write into {ro} "
                          "(Read-only file system); ")
    monkeypatch.undo()
    assert list(ro.iterdir()) == []


def test_run_main_prints_other_file_errors_in_one_line(capsys):
    def main(argv):
        raise PermissionError(errno.EACCES, "Permission denied", "/some/input.json")
    assert run_main(main, [], capsys) == "error: /some/input.json: Permission denied"


@pytest.mark.parametrize("args, want", [
    (["--seed", "-1"], "error: --seed must be >= 0, got -1"),  # numpy: ValueError
    (["--n_train", str(10**11)], "error: --n_train 100,000,000,000: the train split is built in memory and needs "
                                 "about "),  # numpy: ArrayMemoryError
    (["--quick", "--n_test", str(10**11)], "error: --n_test 100,000,000,000: the test split is built in memory"),
])
def test_indirect_indexing_arguments_are_checked_before_any_work(tmp_path, capsys, args, want):
    msg = run_main(ii.main, args + ["--out_dir", str(tmp_path / "ii")], capsys)
    assert msg.startswith(want), msg
    assert list(tmp_path.iterdir()) == []


def test_indirect_indexing_memory_bound_is_the_arrays_it_allocates(tmp_path, capsys, monkeypatch):
    """The bound is 4 bytes a token of the largest split: 1 + 1 (rows and mask) + 2 (the uint16 copy)."""
    row_len = ii.row_len_for(12, 3)  # --quick
    monkeypatch.setattr(ii, "_physical_memory", lambda: 4 * row_len * 1000)
    msg = run_main(ii.main, ["--quick", "--n_train", "1001", "--n_val", "10", "--n_test", "10",
                             "--out_dir", str(tmp_path / "a")], capsys)
    assert f"({row_len} tokens an example, ~4 bytes a token)" in msg and "at most ~1,000)" in msg
    ii.main(["--quick", "--n_train", "1000", "--n_val", "10", "--n_test", "10", "--out_dir", str(tmp_path / "b")])
    assert common.load_meta(tmp_path / "b")["tokens"]["train"] == 1000 * row_len


def test_indirect_indexing_refuses_a_count_that_is_not_an_integer(tmp_path, capsys):
    """argparse's own error (exit 2, no traceback); pinned so that it stays so."""
    with pytest.raises(SystemExit) as e:
        ii.main(["--n_train", "1e11", "--out_dir", str(tmp_path / "ii")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --n_train: invalid int value: '1e11'" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
