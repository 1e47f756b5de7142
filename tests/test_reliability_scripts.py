"""sample.py's refusals beyond tests/test_decode.py's: a prompt file that is binary or a folder, a checkpoint
naming a dataset format this code lacks: exit status not 0, one line naming the file or the format, nothing
printed; a text file is the prompt."""
import dataclasses

import pytest
import torch

import sample
from model import GPT, GPTConfig

ITOS = list("abcdefgh")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpts")
    torch.manual_seed(1234)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=len(ITOS), attn_impl="torch")
    ck = {"model": GPT(cfg).state_dict(), "model_args": dataclasses.asdict(cfg), "config": {"dataset": "toy"},
          "meta": {"itos": ITOS, "vocab_size": len(ITOS), "dtype": "uint16"}}
    torch.save(ck, d / "good.pt")
    torch.save({**ck, "meta": {**ck["meta"], "format": "no_such_format"}}, d / "format.pt")
    return d


def sample_main(*args):
    return sample.main(["--device=cpu", "--max_new_tokens=3", "--num_samples=1", *map(str, args)])


def test_sample_prompt_file_and_format_errors_name_the_file(ckpts, tmp_path, capsys):
    (tmp_path / "bin.txt").write_bytes(b"ab\xff\xfe\x00c")
    for ckpt, start, named in ((ckpts / "good.pt", f"FILE:{tmp_path / 'bin.txt'}", tmp_path / "bin.txt"),
                               (ckpts / "good.pt", f"FILE:{tmp_path}", tmp_path),
                               (ckpts / "format.pt", "abc", "no_such_format")):
        with pytest.raises(SystemExit) as e:
            sample_main(f"--ckpt={ckpt}", f"--start={start}")
        out, err = capsys.readouterr()
        msg = e.value.code if isinstance(e.value.code, str) else err
        assert e.value.code not in (0, None) and out == "" and len(msg.strip().splitlines()) == 1
        assert str(named) in msg and "Traceback" not in err
    (tmp_path / "p.txt").write_text("hgf", encoding="utf-8")
    sample_main(f"--ckpt={ckpts / 'good.pt'}", f"--start=FILE:{tmp_path / 'p.txt'}")
    assert capsys.readouterr().out.startswith("hgf")
