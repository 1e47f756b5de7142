"""prepare/ as scripts and as a package, and the configs' block_size against the rows the
prepare scripts write."""
import subprocess
import sys
from pathlib import Path

import pytest

from prepare import common

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = ["openwebtext", "indirect_indexing", "jsb", "maestro", "genome"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_runs_with_help_from_anywhere(name):
    r = subprocess.run([sys.executable, str(REPO / "prepare" / f"{name}.py"), "--help"],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0 and "--out_dir" in r.stdout, r.stderr


def test_import_is_light_and_modules_decode():
    code = ("import sys, prepare.openwebtext, prepare.indirect_indexing, prepare.jsb, prepare.maestro, "
            "prepare.genome\n"
            "print([m for m in ('tiktoken', 'miditok', 'symusic', 'datasets', 'torch')\n"
            "       if m in sys.modules])\n"
            f"assert all(callable(sys.modules['prepare.' + n].decode) for n in {SCRIPTS!r})\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=str(REPO))
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
    assert common.prepare_scripts() == sorted(SCRIPTS)


@pytest.mark.parametrize("argv, named", [
    (["jsb.py", "--input", "{tmp}/none.npz"], "none.npz"),
    (["openwebtext.py", "--input", "{tmp}/none.jsonl"], "none.jsonl"),
    (["genome.py", "--input", "{tmp}/none.fa"], "none.fa"),
    (["indirect_indexing.py", "--n_val", "0"], "--n_val"),
    (["indirect_indexing.py", "--seed", "-1"], "--seed"),
    (["indirect_indexing.py", "--min_len", "10", "--max_shift", "10"], "max_shift"),
    (["indirect_indexing.py", "--n_train", str(10**11)], "--n_train"),  # more memory than any machine has
])
def test_a_daily_mistake_is_one_line_exit_2_and_writes_nothing(tmp_path, argv, named):
    argv = [a.format(tmp=tmp_path) for a in argv]
    r = subprocess.run([sys.executable, str(REPO / "prepare" / argv[0]), *argv[1:],
                        "--out_dir", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and err and err[-1].startswith("error: ") and named in err[-1], r.stderr
    assert "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []


def config(name):
    """A config file's settings, read as the plain Python assignments it is."""
    cfg = {}
    exec((REPO / "config" / f"{name}.py").read_text(), {}, cfg)
    return cfg


def test_configs_fit_the_rows_their_data_has():
    from prepare import indirect_indexing as ii
    from prepare import jsb
    quick = config("indirect_indexing_quick")
    assert quick["dataset"] == ii.QUICK["name"]
    assert quick["block_size"] == ii.row_len_for(ii.QUICK["max_len"], ii.QUICK["max_shift"]) - 1
    assert config("indirect_indexing")["block_size"] == ii.row_len_for(ii.MAX_LEN, ii.MAX_SHIFT) - 1
    assert config("jsb")["block_size"] >= jsb.build_parser().get_default("max_len") - 1
