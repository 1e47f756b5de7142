"""Shared test setup: the repo root on sys.path, one CPU thread per process, the gpt2 encoding from
TIKTOKEN_CACHE_DIR (unset: a copy of ../shared/tiktoken_cache), the real samples (shared_data),
test_kernel.py's interpreter suite started early, and the fixtures damage and data_root."""
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# One thread per process (and the runs it starts): the test models are tiny and processes share CI's
# two cores; with two threads each, small ops wait at OpenMP's barrier (a 32-wide linear layer took
# 1.8 ms, not 28 us) and the suite ran about twice as long. Set OMP_NUM_THREADS for another count.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402  (after the variable: torch reads it when it starts its thread pool)

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

if "TIKTOKEN_CACHE_DIR" not in os.environ:
    src = os.path.join(ROOT, "..", "shared", "tiktoken_cache")
    if os.path.isdir(src):
        dst = os.path.join(tempfile.gettempdir(), "pope_gpt_tiktoken_cache")
        if not os.path.isdir(dst):
            shutil.copytree(src, dst)
        os.environ["TIKTOKEN_CACHE_DIR"] = dst


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected what they deselect
def pytest_collection_modifyitems(session, config, items):
    """test_kernel.py's interpreter suite starts once the tests are collected, when
    test_interpreter_suite is selected; that test, moved last, waits for it."""
    suite = [item for item in items if item.name == "test_interpreter_suite"]
    for item in suite:
        items.remove(item)
        items.append(item)
        item.module.start_interpreter_suite()


@pytest.fixture(scope="session")
def shared_data():
    """The real data samples. Missing, they fail the test where POPE_SHARED_DATA names them, else
    skip it."""
    env = os.environ.get("POPE_SHARED_DATA")
    path = Path(env) if env else Path(ROOT).parent / "shared" / "data"
    if not path.is_dir():
        (pytest.fail if env else pytest.skip)(
            f"shared data not found at {path} (set POPE_SHARED_DATA)")
    return path


@pytest.fixture
def damage():
    """damage(path): flip one bit in the middle of the largest tensor inside the zip torch.save
    wrote at path (what a bad disk or copy does); returns that member's name. Only the zip's CRC-32
    tells."""
    def apply(path):
        with zipfile.ZipFile(path) as z:
            info = max((i for i in z.infolist() if "/data/" in i.filename),
                       key=lambda i: i.file_size)
        b = bytearray(Path(path).read_bytes())
        head = info.header_offset  # local header: 30 bytes, then the name and the extra field
        name_len, extra_len = (int.from_bytes(b[head + k:head + k + 2], "little") for k in (26, 28))
        b[head + 30 + name_len + extra_len + info.file_size // 2] ^= 0x04
        Path(path).write_bytes(bytes(b))
        return info.filename
    return apply


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """Seeded: toy (a periodic char stream with noise, vocabulary 20), wide (the same, vocabulary
    30), rows (fixed rows of 12 with one scored target each)."""
    import numpy as np
    from helpers import write_rows
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    for name, V in (("toy", 20), ("wide", 30)):
        os.makedirs(root / name)
        seq = ((np.arange(30000) % 17) + rng.integers(0, 3, 30000)).astype(np.uint16)
        seq[:27000].tofile(root / name / "train.bin")
        seq[27000:].tofile(root / name / "val.bin")
        meta = {"vocab_size": V, "dtype": "uint16", "itos": [chr(97 + i) for i in range(V)]}
        (root / name / "meta.json").write_text(json.dumps(meta))
    write_rows(root / "rows", 12, seed=1)
    return root
