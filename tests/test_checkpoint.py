"""model.read_checkpoint, the one checkpoint reader: every kind of file that is not an intact
train.py checkpoint is refused with CheckpointError naming the file, nothing is run or changed,
and every script that reads checkpoints exits non-zero naming the file. Tiny models: seconds."""
import dataclasses
import math
import shutil

import pytest
import torch

import eval_extrapolation
import eval_frequencies
import sample
from model import GPT, CheckpointError, GPTConfig, load_checkpoint, read_checkpoint


class _Payload:
    """Unpickling this runs code: it creates the file at self.path."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpts")
    torch.manual_seed(1234)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=8, pos_emb="pope",
                    attn_impl="torch")
    ck = {"model": GPT(cfg).state_dict(), "model_args": dataclasses.asdict(cfg),
          "config": {"dataset": "toy"},
          "meta": {"itos": list("abcdefgh"), "vocab_size": 8, "dtype": "uint16"}}
    torch.save(ck, d / "good.pt")
    nan = {k: v.clone() for k, v in ck["model"].items()}
    nan["lm_head.weight"][3, 5] = math.nan
    torch.save({**ck, "model": nan}, d / "nan.pt")
    inf = {k: v.clone() for k, v in ck["model"].items()}
    inf["transformer.wte.weight"][2, 7] = -math.inf
    torch.save({**ck, "model": inf}, d / "inf.pt")
    torch.save({**ck, "config": {"evil": _Payload(str(d / "pwned"))}}, d / "code.pt")
    torch.save(ck["model"], d / "state_dict.pt")
    torch.save(torch.zeros(3, 4), d / "tensor.pt")
    (d / "empty.pt").write_bytes(b"")
    (d / "cut.pt").write_bytes((d / "good.pt").read_bytes()[:-200])
    (d / "junk.pt").write_bytes(b"not a checkpoint")
    (d / "folder.pt").mkdir()
    # (not in BAD)
    torch.save({**ck, "meta": {**ck["meta"], "format": "no_such_format"}}, d / "format.pt")
    return d


BAD = [
    "nan.pt",
    "inf.pt",
    "code.pt",
    "state_dict.pt",
    "tensor.pt",
    "empty.pt",
    "cut.pt",
    "junk.pt",
    "folder.pt",
    "missing.pt",
    "flipped.pt",
]


@pytest.mark.parametrize("name", BAD)
def test_reader_refuses_what_is_not_an_intact_checkpoint(files, tmp_path, damage, name):
    path = files / name
    if name == "flipped.pt":  # one bit of tensor data: only the zip's CRC tells
        path = tmp_path / name
        shutil.copy(files / "good.pt", path)
        damage(path)
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert not (files / "pwned").exists()  # the pickled payload never ran
    assert (path.read_bytes() if path.is_file() else None) == before


def test_reader_loads_an_intact_checkpoint(files):
    model, ck = load_checkpoint(str(files / "good.pt"))
    want = torch.load(files / "good.pt", weights_only=True)["model"]
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
    assert not model.training and ck["config"] == {"dataset": "toy"}


def test_a_device_fault_is_not_called_a_damaged_file(files):
    # torch's own: no CUDA here, or no GPU 99
    with pytest.raises((AssertionError, RuntimeError)) as e:
        load_checkpoint(str(files / "good.pt"), device="cuda:99")
    assert not isinstance(e.value, CheckpointError)


@pytest.mark.parametrize("name", ["nan.pt", "code.pt", "tensor.pt"])
@pytest.mark.parametrize("script", [sample, eval_frequencies, eval_extrapolation])
def test_every_script_refuses_a_bad_checkpoint(files, tmp_path, capsys, script, name):
    data = tmp_path / "val.bin"
    data.write_bytes(bytes(4096))
    argv = {sample: [f"--ckpt={files / name}", "--start=abc", "--max_new_tokens=2"],
            eval_frequencies: ["--ckpt", str(files / name), "--data", str(data)],
            eval_extrapolation: ["--ckpt", str(files / name), "--data", str(data)]}[script]
    with pytest.raises(SystemExit) as e:
        script.main(argv)
    msg = e.value.code if isinstance(e.value.code, str) else capsys.readouterr().err
    assert (e.value.code not in (0, None) and str(files / name) in msg
            and not (files / "pwned").exists())


def test_sample_prompt_file_and_format_errors_name_the_file(files, tmp_path, capsys):
    """sample.py: a prompt file that is binary or a folder, a dataset format this code lacks: exit
    status not 0, one line naming the file or the format, nothing printed; a text file is the
    prompt."""
    def sample_main(*args):
        return sample.main(["--device=cpu", "--max_new_tokens=3", "--num_samples=1",
                            *map(str, args)])
    (tmp_path / "bin.txt").write_bytes(b"ab\xff\xfe\x00c")
    cases = (
        (files / "good.pt", f"FILE:{tmp_path / 'bin.txt'}", tmp_path / "bin.txt"),
        (files / "good.pt", f"FILE:{tmp_path}", tmp_path),
        (files / "format.pt", "abc", "no_such_format"),
    )
    for ckpt, start, named in cases:
        with pytest.raises(SystemExit) as e:
            sample_main(f"--ckpt={ckpt}", f"--start={start}")
        out, err = capsys.readouterr()
        msg = e.value.code if isinstance(e.value.code, str) else err
        assert e.value.code not in (0, None) and out == "" and len(msg.strip().splitlines()) == 1
        assert str(named) in msg and "Traceback" not in err
    (tmp_path / "p.txt").write_text("hgf", encoding="utf-8")
    sample_main(f"--ckpt={files / 'good.pt'}", f"--start=FILE:{tmp_path / 'p.txt'}")
    assert capsys.readouterr().out.startswith("hgf")
