"""prepare/ as scripts and as a package, prepare/common.py's helpers, and the
task configs (config/<task>.py, config/indirect_indexing_quick.py)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prepare import common  # noqa: E402

SCRIPTS = ["openwebtext", "indirect_indexing", "jsb", "maestro", "genome"]
TASKS = ["indirect_indexing", "jsb", "maestro", "genome"]


def test_every_script_runs_with_help():
    for name in SCRIPTS:
        r = subprocess.run([sys.executable, str(REPO / "prepare" / f"{name}.py"), "--help"],
                           capture_output=True, text=True, timeout=120, cwd="/")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("usage: ") and "--out_dir" in r.stdout, name


def test_import_is_light_and_modules_have_decode():
    code = ("import sys, prepare.openwebtext, prepare.indirect_indexing, prepare.jsb, prepare.maestro, prepare.genome\n"
            "heavy = [m for m in ('tiktoken', 'miditok', 'symusic', 'datasets', 'torch') if m in sys.modules]\n"
            "print(heavy)\n"
            "for n in ('openwebtext', 'indirect_indexing', 'jsb', 'maestro', 'genome'):\n"
            "    m = sys.modules['prepare.' + n]\n"
            "    assert callable(m.encode) and callable(m.decode) and m.NAME == n and m.__doc__.count('Usage:') == 1, n\n"
            "assert callable(prepare.jsb.save_sample) and callable(prepare.maestro.save_sample)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_progress_is_tqdm_on_stderr(capsys):
    from tqdm import tqdm
    bar = common.progress(range(5), desc="items", unit="it")
    assert isinstance(bar, tqdm)
    assert list(bar) == [0, 1, 2, 3, 4]
    assert "items: 100%" in capsys.readouterr().err
    with common.progress(total=None, desc="bytes", unit="B") as b:
        assert isinstance(b, tqdm)
        b.update(1234)
    assert b.n == 1234 and "bytes: 1.23kB" in capsys.readouterr().err


def test_bin_writer_is_atomic_and_checks_range(tmp_path):
    w = common.BinWriter(tmp_path / "x.bin", np.uint16)
    w.write([1, 2, 3])
    assert not (tmp_path / "x.bin").exists()  # only the .tmp until close
    assert w.close() == 3
    assert np.fromfile(tmp_path / "x.bin", dtype=np.uint16).tolist() == [1, 2, 3]
    w = common.BinWriter(tmp_path / "y.bin", np.uint16)
    with pytest.raises(ValueError, match="out of range"):
        w.write([70000])
    w.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]
    assert common.dtype_for_vocab(65536) == np.uint16 and common.dtype_for_vocab(65537) == np.uint32


def test_download_fails_fast_with_the_hint(tmp_path):
    with pytest.raises(common.PrepareError, match=r"could not download http://127.0.0.1:9/x.npz .*pass it with --input"):
        common.download("http://127.0.0.1:9/x.npz", tmp_path / "x.npz", hint="Download it and pass it with --input FILE.",
                        timeout=5)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["genome", "jsb", "maestro"])
def test_a_failed_download_leaves_no_folder_behind(name, tmp_path, monkeypatch):
    """Offline, no --input: the real common.download runs and fails, and the run removes the folders it made
    (common.removing_new_folders); a parent or an out_dir that was there before the run stays, empty."""
    import importlib
    import urllib.error
    import urllib.request
    if name == "maestro":
        pytest.importorskip("miditok")
    script = importlib.import_module(f"prepare.{name}")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    out = tmp_path / "data" / name
    argv = ["--out_dir", str(out)] + (["--num_proc", "1"] if name == "maestro" else [])
    with pytest.raises(common.PrepareError, match="could not download .*--input"):
        script.main(argv)
    assert list(tmp_path.iterdir()) == []
    for made in (tmp_path / "data", out):  # a parent, then out_dir itself, there before the run
        made.mkdir()
        with pytest.raises(common.PrepareError, match="could not download"):
            script.main(argv)
        assert list(tmp_path.iterdir()) == [tmp_path / "data"] and made.is_dir() and list(made.iterdir()) == [], made


def test_missing_input_exits_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "prepare" / "jsb.py"), "--input", str(tmp_path / "none.npz"),
                        "--out_dir", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == f"error: --input {tmp_path / 'none.npz'} does not exist"


# -----------------------------------------------------------------------------
# configs, read as train.py reads them: through its configurator

def train_config(*args):
    """(cfg, problems): train.py's defaults with args applied by the configurator
    (an unknown key or a wrongly typed value exits), and its list of nonsense settings."""
    import train
    from configurator import config_problems, configure
    cfg, _ = configure([str(a) for a in args], {k: getattr(train, k) for k in train.config_keys})
    return cfg, config_problems(cfg)


@pytest.mark.parametrize("task", TASKS)
def test_task_configs(task):
    """A task's one config trains PoPE, and the RoPE baseline its header gives (the same
    file with --pos_emb=rope and another out_dir) is as valid; block_size fits the rows
    the task's prepare script writes."""
    path = REPO / "config" / f"{task}.py"
    cfg, problems = train_config(path)
    assert problems == [] and cfg["pos_emb"] == "pope" and cfg["dataset"] == task, problems
    text = path.read_text()
    rope = f"python train.py config/{task}.py --pos_emb=rope --out_dir={cfg['out_dir'].removesuffix('-pope')}-rope"
    assert text.startswith("#") and f"python train.py config/{task}.py" in text and rope in text
    assert not (REPO / "config" / f"{task}_rope.py").exists()
    rope_cfg, problems = train_config(path, *rope.split()[3:])
    assert problems == [] and rope_cfg["pos_emb"] == "rope" and rope_cfg["out_dir"] != cfg["out_dir"], problems
    if task == "indirect_indexing":  # rows of row_len tokens: x = row[:-1]
        from prepare import indirect_indexing as ii
        assert cfg["block_size"] == ii.row_len_for(ii.MAX_LEN, ii.MAX_SHIFT) - 1
    if task == "jsb":  # a chorale per row of --max_len tokens
        from prepare import jsb
        assert cfg["block_size"] >= jsb.build_parser().get_default("max_len") - 1


def test_quick_config_matches_quick_data():
    from prepare import indirect_indexing as ii
    cfg, problems = train_config(REPO / "config" / "indirect_indexing_quick.py")
    assert problems == [] and cfg["dataset"] == ii.QUICK["name"] and cfg["pos_emb"] == "pope"
    assert cfg["block_size"] == ii.row_len_for(ii.QUICK["max_len"], ii.QUICK["max_shift"]) - 1
    assert (cfg["device"], cfg["dtype"], cfg["compile"]) == ("cpu", "float32", False)
    assert "python prepare/indirect_indexing.py --quick" in (REPO / "config" / "indirect_indexing_quick.py").read_text()


def test_the_common_module_says_what_it_is_when_run():
    r = subprocess.run([sys.executable, str(REPO / "prepare" / "common.py"), "--help"],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0 and r.stdout.startswith("usage: ") and "a module, not a script" in r.stdout, r


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "config").glob("*.py")))
def test_config_names_the_attention_that_runs(name):
    """A PoPE config leaves attn_impl at "auto" only where the Triton kernel takes its head dim
    (pope_kernel.kernel_unsupported_reason: 32, 64 or 128); elsewhere (MAESTRO's 384 / 8 = 48) it says
    "torch": under "auto" model.py would warn in every attention call on CUDA, a break in a compiled graph."""
    cfg, problems = train_config(REPO / "config" / f"{name}.py")
    assert problems == [], problems
    head_dim = cfg["n_embd"] // cfg["n_head"]
    if cfg["pos_emb"] == "pope" and cfg["attn_impl"] == "auto":
        assert head_dim in (32, 64, 128), f"config/{name}.py: head dim {head_dim} with attn_impl='auto'"
    if name == "maestro":
        assert (head_dim, cfg["attn_impl"]) == (48, "torch")
