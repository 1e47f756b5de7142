"""Bad input to sample.py and the prepare scripts ends in one line naming the
problem and the fix, never a traceback, and leaves what was there: a prompt file
that is missing, binary or a folder; an infinite temperature; a checkpoint with
NaN weights, an unknown format or one that needs pickle; a read-only folder and
a full disk (simulated: the write calls under one folder raise OSError(EROFS),
or the token writes raise ENOSPC). Tiny models and datasets: seconds in all."""
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


def test_sample_prompt_file_and_format_errors_name_the_file(ckpts, tmp_path, capsys):
    good = f"--ckpt={ckpts / 'good.pt'}"
    (tmp_path / "bin.txt").write_bytes(b"ab\xff\xfe\x00c")
    for bad in (tmp_path / "none.txt", tmp_path / "bin.txt", tmp_path):
        assert str(bad) in sample_main(capsys, good, f"--start=FILE:{bad}")
    assert "no_such_format" in sample_main(capsys, f"--ckpt={ckpts / 'format.pt'}", "--start=abc")
    (tmp_path / "p.txt").write_text("hgf", encoding="utf-8")  # a text file is the prompt
    sample.main(["--device=cpu", "--max_new_tokens=3", "--num_samples=1", good, f"--start=FILE:{tmp_path / 'p.txt'}"])
    assert capsys.readouterr().out.startswith("hgf")


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


class _FullDisk:
    """open() for prepare/common.py whose files take `free` bytes in all, then raise ENOSPC."""
    def __init__(self, free):
        self.free = free

    def __call__(self, path, mode="r", *args, **kwargs):
        f, disk = open(path, mode, *args, **kwargs), self

        class Full:
            name = f.name

            def write(self, data):
                n = memoryview(data).nbytes
                if n > disk.free:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                disk.free -= n
                return f.write(data)

            def close(self):
                f.close()
        return Full() if "w" in mode else f


@pytest.mark.parametrize("fault", ["read-only", 0, 5000, 17000])  # the disk full in train.bin, in test.bin
def test_a_prepare_run_that_cannot_write_leaves_the_old_set(tmp_path, capsys, monkeypatch, readonly, fault):
    out = tmp_path / "d" / "ii"
    ii.main(OLD + ["--out_dir", str(out)])
    old = snapshot(out)
    if fault == "read-only":
        readonly(out.parent)
    else:
        monkeypatch.setattr(common, "open", _FullDisk(fault), raising=False)
    run_main(ii.main, NEW + ["--out_dir", str(out)], capsys)
    monkeypatch.undo()
    assert snapshot(out) == old and os.listdir(out.parent) == ["ii"]


def test_openwebtext_refuses_a_read_only_folder_before_reading_the_input(tmp_path, capsys, monkeypatch,
                                                                      readonly):
    (tmp_path / "in.txt").write_text("one document\n\n\nanother\n", encoding="utf-8")
    monkeypatch.setattr(owt, "count_documents", lambda *a: pytest.fail("read the input first"))
    (tmp_path / "ro").mkdir()
    readonly(tmp_path / "ro")
    run_main(owt.main, ["--input", str(tmp_path / "in.txt"), "--out_dir", str(tmp_path / "ro" / "owt")],
             capsys)
    monkeypatch.undo()
    assert list((tmp_path / "ro").iterdir()) == []
