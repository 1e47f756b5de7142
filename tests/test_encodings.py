"""Every text input decodes strictly as UTF-8 (issue 80): a byte that is not is one line naming the
file and the byte's offset, and nothing is written (prepare's out_dir, train.py's out_dir); a config
file that raises or does not parse is one line naming it. Prompts: test_checkpoint, test_decode."""
from functools import partial

import pytest
from helpers import run_here, script_error
from test_train import args, refused

from prepare import common
from prepare import openwebtext as owt

GOOD = b'{"text": "one document"}\n{"text": "another"}\n'
BAD_LINE = b'{"text": "caf\xe9"}\n'  # Latin-1's e-acute: not UTF-8

CASES = {  # case: ({file: bytes}, openwebtext's arguments, the file named, the bad byte's offset)
    "a .jsonl line": ({"a.jsonl": GOOD + BAD_LINE}, ["--input", "a.jsonl"], "a.jsonl",
                      len(GOOD) + BAD_LINE.index(b"\xe9")),
    "a Latin-1 .txt": ({"a.txt": b"d\xe9j\xe0 vu\n\n\nanother"}, ["--input", "a.txt"], "a.txt", 1),
    "a --val_input": ({"v.txt": b"ok\n\xff", "a.jsonl": GOOD},
                      ["--input", "a.jsonl", "--val_input", "v.txt"], "v.txt", 3),
    "a file in a folder": ({"in/b/c.jsonl": BAD_LINE, "in/a.jsonl": GOOD}, ["--input", "in"],
                           "c.jsonl", BAD_LINE.index(b"\xe9")),
}


@pytest.mark.parametrize("case", CASES)
def test_openwebtext_input_not_utf8_names_file_and_offset(tmp_path, monkeypatch, case):
    files, argv, named, offset = CASES[case]
    monkeypatch.chdir(tmp_path)
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    argv = argv + ["--out_dir", "out", "--num_proc", 1]
    line = script_error(partial(common.run_main, owt.main), argv)
    assert named in line and str(offset) in line, line
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == []  # (.tmp, .lock)


def test_a_maestro_csv_that_is_not_utf8(tmp_path):
    pytest.importorskip("miditok")
    from prepare import maestro
    folder = tmp_path / "in"
    folder.mkdir()
    head = b"canonical_composer,canonical_title,split,year,midi_filename,audio_filename,duration\n"
    row = b"Dvo\xf8\xe1k,x,train,2004,a.midi,a.wav,1\n"  # (Latin-1)
    (folder / "maestro-v3.0.0.csv").write_bytes(head + row)
    argv = ["--input", folder, "--out_dir", tmp_path / "out", "--num_proc", 1]
    line = script_error(partial(common.run_main, maestro.main), argv)
    assert "maestro-v3.0.0.csv" in line and str(len(head) + 3) in line, line
    assert not (tmp_path / "out").exists()


CONFIGS = {"not UTF-8": b"batch_size = 8  # \xe9\n", "a syntax error": b"n_layer = (\n",
           "an exception": b"batch_size = 8\nn_layer = 1 / 0\n",
           "an unknown name": b"n_layer = n_heads\n"}  # (n_head, a setting, it may read)


@pytest.mark.parametrize("case", CONFIGS)
def test_a_config_file_that_cannot_be_run_is_one_line(data_root, tmp_path, case):
    (tmp_path / "bad.py").write_bytes(CONFIGS[case])
    p = run_here(args(data_root, "bad.py", "--out_dir=o", "--max_iters=2"), tmp_path, check=False)
    refused(p, "bad.py")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py"]
