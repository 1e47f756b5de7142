"""sample.py's refusals (issue 80): a flag out of its range (its FLAGS table), a checkpoint whose
model and meta disagree on the vocabulary (train.py's padding rule, prepare/common.model_vocab), a
KV cache too large to allocate. Each: exit status 2, one line naming the flag or the file, nothing
sampled (stdout empty), the checkpoint unchanged. --save's writes: tests/test_faults.py."""
import dataclasses

import pytest
import torch
from helpers import run_exit, script_error

import sample
from model import GPT, GPTConfig
from prepare.common import model_vocab

ITOS = list("\nabcdefghijklmnopqrstuvwxyz")
CPU = ["--device=cpu", "--max_new_tokens=3"]


def save(path, vocab_size, meta, pos_emb="pope"):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=vocab_size,
                    pos_emb=pos_emb)
    torch.save({"model": GPT(cfg).state_dict(), "model_args": dataclasses.asdict(cfg),
                "config": {}, "meta": meta}, path)
    return path


def refused(ck, args, named):
    before = ck.read_bytes()
    code, out, err = run_exit(sample.main, [f"--ckpt={ck}", *CPU, *args])
    assert code == 2 and out == "" and "Traceback" not in err, (code, out, err)
    assert named in err and len(err.strip().splitlines()) == 1, err
    assert ck.read_bytes() == before


@pytest.mark.parametrize("flag", ["--context=0", "--context=-5", "--num_samples=0", "--top_k=-1",
                                  "--temperature=nan", "--device=cuda:64", "--device=tpu",
                                  "--seed=-1", f"--seed={2**63}"])
def test_a_flag_out_of_range_is_refused(tmp_path, flag):
    ck = save(tmp_path / "m.pt", len(ITOS), {"vocab_size": len(ITOS), "itos": ITOS})
    refused(ck, [flag], flag.split("=")[0])


@pytest.mark.parametrize("model_v, meta", [
    (67, {"vocab_size": 5, "itos": ITOS[:5]}),  # ids 0..4 of a model of 67: 5..66 never drawn
    (27, {"vocab_size": 40, "itos": ITOS}),  # meta's ids past the model's
    (50257, {"vocab_size": 50257, "tokenizer": "gpt2"}),  # train.py pads gpt2's to 50304
])
def test_a_checkpoint_whose_model_and_meta_disagree_on_the_vocabulary_is_refused(tmp_path,
                                                                                  model_v, meta):
    ck = save(tmp_path / "m.pt", model_v, meta)
    refused(ck, ["--start=abc"], str(ck))


def test_the_padded_gpt2_vocabulary_samples(tmp_path, capsys):
    """The padding rule sample.py checks is train.py's: a GPT-2 checkpoint as train.py makes it."""
    meta = {"vocab_size": 50257, "tokenizer": "gpt2"}
    ck = save(tmp_path / "m.pt", model_vocab(meta), meta)
    sample.main([f"--ckpt={ck}", *CPU, "--num_samples=1", "--start=Hello"])
    assert capsys.readouterr().out.startswith("Hello")


@pytest.mark.parametrize("flag", ["--context=1099511627776", "--num_samples=1099511627776"])
def test_a_kv_cache_too_large_to_allocate_is_one_line(tmp_path, flag):
    """2**40 positions or samples (past any machine's memory): refused before any allocation, also
    on a host that overcommits (where allocating would start and get the process killed)."""
    ck = save(tmp_path / "m.pt", len(ITOS), {"vocab_size": len(ITOS), "itos": ITOS})
    assert flag.split("=")[0] in script_error(sample.main, [f"--ckpt={ck}", *CPU, flag])


@pytest.mark.parametrize("memory, refused", [(2**20, True), (2**30, False)])
def test_a_kv_cache_larger_than_the_hosts_memory_is_refused(tmp_path, monkeypatch, capsys,
                                                              memory, refused):
    """The check compares the cache with the host's RAM, not with what malloc grants."""
    ck = save(tmp_path / "m.pt", len(ITOS), {"vocab_size": len(ITOS), "itos": ITOS})
    monkeypatch.setattr(sample, "physical_memory", lambda: memory)
    argv = [f"--ckpt={ck}", *CPU, "--num_samples=8", "--context=4096", "--max_new_tokens=2"]
    if refused:
        assert "--num_samples" in script_error(sample.main, argv)
    else:
        sample.main(argv)
        assert capsys.readouterr().out.count("---------------") == 8


def test_save_does_not_overwrite_an_earlier_calls_samples(tmp_path, capsys):
    """--save=PREFIX twice: the second call is refused before sampling, the first's file kept."""
    ck = save(tmp_path / "m.pt", len(ITOS), {"vocab_size": len(ITOS), "itos": ITOS})
    argv = [f"--ckpt={ck}", *CPU, "--num_samples=1", f"--save={tmp_path / 's'}"]
    sample.main(argv)
    first = (tmp_path / "s_0.txt").read_bytes()
    capsys.readouterr()
    assert str(tmp_path / "s_0") in script_error(sample.main, argv + ["--seed=2"])
    assert (tmp_path / "s_0.txt").read_bytes() == first


def test_a_jsb_prompt_without_its_start_token_is_refused(tmp_path, capsys):
    """JSB rows start with <s>, then S A T B in turn: without it every note lands in the next voice."""
    meta = {"format": "jsb", "vocab_size": 90, "itos": [str(i) for i in range(90)]}
    ck = save(tmp_path / "m.pt", 90, meta)
    code, out, _ = run_exit(sample.main, [f"--ckpt={ck}", *CPU, "--start=C5 G4 E4 C3"])
    assert out == "" and "--start" in str(code)  # sys.exit's one line, nothing sampled
    sample.main([f"--ckpt={ck}", *CPU, "--num_samples=1", "--start=<s> C5 G4 E4 C3"])
    assert capsys.readouterr().out.count("---------------") == 1
