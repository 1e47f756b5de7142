"""prepare/code.py on wheels and folders the tests make: one document per .py file, exactly the
file's text (its tokens decode back to it), split by package, duplicates, empty and non-UTF-8 files
dropped, the same files on a re-run, pinned wheels checked by sha256 (a mismatch refused, nothing
written), and pip asked only for what is missing (a stub: no network in tests)."""
import hashlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tiktoken
from helpers import read_bin, run_exit

from prepare import code
from prepare import common

SHARED = "def shared(x):\n    return x + 1\n"  # in a train package, again in train and in val
LONG = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(1200))  # > 10,240 tokens


def make_wheel(folder, name, version, files, license="MIT"):
    """A wheel of files {member: text or bytes} (written in reverse order: the script sorts them), a
    .dist-info/METADATA naming the package; returns its path."""
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = f"Name: {name}\nVersion: {version}\nLicense-Expression: {license}\n"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
        for member, data in reversed(list(files.items())):
            z.writestr(member, data)
    return path


def encoded(texts):
    """The independent reference: each document's gpt2 tokens, then <|endoftext|>."""
    enc = tiktoken.get_encoding("gpt2")
    return np.array([i for t in texts for i in enc.encode_ordinary(t) + [50256]], dtype=np.uint16)


def documents(out, split):
    """The texts of a split: its tokens cut after each <|endoftext|>, decoded."""
    ids = read_bin(out, split)
    ends = np.flatnonzero(ids == 50256)
    assert len(ends) and ends[-1] == len(ids) - 1
    enc = tiktoken.get_encoding("gpt2")
    return [enc.decode(d[:-1].tolist()) for d in np.split(ids, ends[:-1] + 1)]


WANT = {  # the documents each split must hold, in order
    "train": ["import os\n\nprint(os.sep)\n", SHARED, "class Beta:\n    pass\n"],
    "val": ["import networkx\n"],
    "test": ["SELECT = 'select'\r\n", LONG],
}


@pytest.fixture
def pinned(tmp_path, monkeypatch):
    """Four wheels in tmp_path/wheels pinned as code.PACKAGES; pip (subprocess.run) must not run."""
    d = tmp_path / "wheels"
    d.mkdir()
    wheels = [
        (make_wheel(d, "Beta", "2.0", {"beta/copy.py": SHARED, "beta/latin1.py": b"# caf\xe9\n",
                                       "beta/z.py": WANT["train"][2]}), "train"),
        (make_wheel(d, "alpha", "1.0", {"alpha/__init__.py": "\n", "alpha/a.py": WANT["train"][0],
                                        "alpha/b.py": SHARED, "alpha/data.txt": "x"}), "train"),
        (make_wheel(d, "gamma", "0.1", {"gamma/g.py": WANT["val"][0], "gamma/shared.py": SHARED},
                    "BSD-3-Clause"), "val"),
        (make_wheel(d, "delta", "3.1", {"delta/a.py": WANT["test"][0], "delta/long.py": LONG}),
         "test"),
    ]
    rows = [(p.name, split, p.stat().st_size, 0, "MIT", hashlib.sha256(p.read_bytes()).hexdigest())
            for p, split in wheels]
    monkeypatch.setattr(code, "PACKAGES", rows)

    def no_pip(*a, **kw):
        raise AssertionError(f"pip called: {a}")
    monkeypatch.setattr(code.subprocess, "run", no_pip)
    return d


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_pinned_wheels_give_their_files_split_by_package_the_same_on_a_rerun(pinned, tmp_path,
                                                                             monkeypatch):
    out = tmp_path / "o"
    counts = code.main(["--wheels", str(pinned), "--out_dir", str(out), "--num_proc", "2"])
    for split, texts in WANT.items():
        assert np.array_equal(read_bin(out, split), encoded(texts)), split
        assert documents(out, split) == texts  # the tokens decode back to the files
    meta = common.check_dataset(out, common.SPLITS)
    assert counts == meta["tokens"] == {s: len(encoded(t)) for s, t in WANT.items()}
    assert meta["documents"] == {s: len(t) for s, t in WANT.items()}
    # dropped: beta/copy.py and gamma/shared.py (SHARED again), alpha/__init__.py, beta/latin1.py
    assert meta["dropped"] == {"duplicate": 2, "empty": 1,
                               "not_utf8": ["Beta-2.0-py3-none-any.whl/beta/latin1.py"]}
    splits = {p["name"]: p["split"] for p in meta["packages"]}
    assert splits == {"Beta": "train", "alpha": "train", "gamma": "val", "delta": "test"}
    assert {p["name"]: p["tokens"] for p in meta["packages"]} == {
        "alpha": len(encoded(WANT["train"][:2])), "Beta": len(encoded(WANT["train"][2:])),
        "gamma": counts["val"], "delta": counts["test"]}
    assert {p["name"]: p["license"] for p in meta["packages"]}["gamma"] == "BSD-3-Clause"
    long = {"min_tokens": 10240, "files": 1, "tokens": len(encoded([LONG])) - 1}
    assert meta["long_test_files"] == long
    first = snapshot(out)
    monkeypatch.setattr(code, "BATCH_FILES", 1)  # threads and batches do not change the files
    code.main(["--wheels", str(pinned), "--out_dir", str(out), "--num_proc", "1"])
    assert snapshot(out) == first
    assert sorted(first) == ["meta.json", "test.bin", "train.bin", "val.bin"]


def test_a_wheel_that_is_not_the_pinned_file_is_refused_and_nothing_is_written(pinned, tmp_path):
    name = code.PACKAGES[2][0]
    make_wheel(pinned, "gamma", "0.1", {"gamma/g.py": "import networkx  # changed\n"})
    assert (pinned / name).is_file()
    status, _, err = run_exit(lambda a: common.run_main(code.main, a),
                              ["--wheels", pinned, "--out_dir", tmp_path / "o"])
    assert status == 2 and name in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]


def test_missing_wheels_are_asked_of_pip_and_refused_when_it_cannot_fetch_them(pinned, tmp_path,
                                                                              monkeypatch):
    (pinned / code.PACKAGES[1][0]).unlink()
    calls = []

    def pip(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)  # (offline)
    monkeypatch.setattr(code.subprocess, "run", pip)
    with pytest.raises(common.PrepareError, match=code.PACKAGES[1][0]):
        code.main(["--wheels", str(pinned), "--out_dir", str(tmp_path / "o")])
    assert calls == [[sys.executable, "-m", "pip", *code.PIP, "--dest", str(pinned), "alpha==1.0"]]
    assert "--no-deps" in code.PIP and "--only-binary=:all:" in code.PIP
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]


@pytest.fixture
def folder(tmp_path):
    """An --input folder: a wheel, a package folder, a module, and entries without .py files."""
    d = tmp_path / "site"
    (d / "pkg" / "sub").mkdir(parents=True)
    (d / "pkg" / "a").mkdir()
    (d / "Foo.Bar-1.0.dist-info").mkdir()
    (d / "Foo.Bar-1.0.dist-info" / "METADATA").write_text("Name: Foo.Bar\n")
    make_wheel(d, "Foo.Bar", "1.0", {"foo_bar/__init__.py": "X = 1\n"}, "Apache-2.0")
    (d / "pkg" / "sub" / "a.py").write_text("A = 'a'\n")
    (d / "pkg" / "a" / "z.py").write_text("Z = 0\n")
    (d / "pkg" / "b.py").write_bytes("B = 'ü'\n".encode())
    (d / "pkg" / "notes.txt").write_text("not code\n")
    (d / "mod.py").write_text(SHARED)
    (d / "README.txt").write_text("not code\n")
    return d


def test_a_folder_of_packages_split_as_named(folder, tmp_path):
    out = tmp_path / "o"
    code.main(["--input", str(folder), "--val_packages", "foo-bar", "--test_packages", "MOD",
               "--out_dir", str(out), "--num_proc", "1"])
    meta = common.load_meta(out)
    assert [(p["name"], p["split"], p["license"]) for p in meta["packages"]] == [
        ("Foo.Bar", "val", "Apache-2.0"), ("mod", "test", "not stated"),
        ("pkg", "train", "not stated")]
    assert documents(out, "train") == ["Z = 0\n", "B = 'ü'\n", "A = 'a'\n"]  # a/z, b, sub/a
    assert documents(out, "val") == ["X = 1\n"] and documents(out, "test") == [SHARED]
    assert meta["source"] == common.repo_path(folder)


@pytest.mark.parametrize("args, named", [
    (["--val_packages", "pkg"], "--test_packages"),  # the held-out packages must be named
    (["--val_packages", "pkg", "--test_packages", "numpy"], "numpy"),  # a package not in the folder
    (["--val_packages", "pkg,mod", "--test_packages", "mod"], "mod"),  # in two splits
    (["--val_packages", "pkg,foo.bar", "--test_packages", "mod"], "'train'"),  # no train package
    (["--val_packages", "mod", "--test_packages", "pkg", "--wheels", "w"], "--wheels"),
])
def test_bad_input_is_refused_and_writes_nothing(folder, tmp_path, args, named):
    with pytest.raises(common.PrepareError, match=named):
        code.main(["--input", str(folder), "--out_dir", str(tmp_path / "o"), *args])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_a_split_left_without_files_is_refused(folder, tmp_path):
    (folder / "mod.py").write_text("A = 'a'\n")  # the test package only repeats a train file
    with pytest.raises(common.PrepareError, match="'test'"):
        code.main(["--input", str(folder), "--val_packages", "foo_bar", "--test_packages", "mod",
                   "--out_dir", str(tmp_path / "o")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_help_lists_every_pinned_wheel():
    status, out, _ = run_exit(code.main, ["--help"])
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    for wheel, split, *_ in code.PACKAGES:
        name, version = wheel.split("-")[:2]
        assert [split, name, version] in [r[:3] for r in rows], wheel
    assert status == 0 and len({r[0] for r in code.PACKAGES}) == len(code.PACKAGES)
