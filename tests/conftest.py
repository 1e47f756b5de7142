"""Shared test setup: the repo root on sys.path, an offline tiktoken cache, and
the real data samples.

The gpt2 encoding comes from TIKTOKEN_CACHE_DIR; when it is unset, a writable
copy of ../shared/tiktoken_cache (next to the repo) is used, as in CI. The real
samples come from $POPE_SHARED_DATA, else ../shared/data."""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if "TIKTOKEN_CACHE_DIR" not in os.environ:
    src = os.path.join(ROOT, "..", "shared", "tiktoken_cache")
    if os.path.isdir(src):
        dst = os.path.join(tempfile.gettempdir(), "pope_gpt_tiktoken_cache")
        if not os.path.isdir(dst):
            shutil.copytree(src, dst)
        os.environ["TIKTOKEN_CACHE_DIR"] = dst


@pytest.fixture(scope="session")
def shared_data():
    """The real data samples. Missing, they fail the test where POPE_SHARED_DATA
    names them (CI), and skip it otherwise."""
    env = os.environ.get("POPE_SHARED_DATA")
    path = Path(env) if env else Path(ROOT).parent / "shared" / "data"
    if not path.is_dir():
        (pytest.fail if env else pytest.skip)(f"shared data not found at {path} (set POPE_SHARED_DATA)")
    return path
