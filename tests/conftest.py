"""Shared test setup: the repo root on sys.path, and an offline tiktoken cache.

The gpt2 encoding comes from TIKTOKEN_CACHE_DIR; when it is unset, a writable
copy of ../shared/tiktoken_cache (next to the repo) is used, as in CI."""
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if "TIKTOKEN_CACHE_DIR" not in os.environ:
    src = os.path.join(ROOT, "..", "shared", "tiktoken_cache")
    if os.path.isdir(src):
        dst = os.path.join(tempfile.gettempdir(), "pope_gpt_tiktoken_cache")
        if not os.path.isdir(dst):
            shutil.copytree(src, dst)
        os.environ["TIKTOKEN_CACHE_DIR"] = dst
