"""eval_downstream.py over lm-evaluation-harness: the GPT adapter against a direct float64
computation, the local data through the harness's own tasks (prompts checked on the real files), the
whole CLI offline against direct scores, the refusals, and that a dataset's remote code is never
trusted unless asked."""
import copy
import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch

try:
    import lm_eval  # noqa: F401
except ImportError:  # CI installs it (POPE_SHARED_DATA is set there): fail there, skip elsewhere
    if os.environ.get("POPE_SHARED_DATA"):
        raise
    pytest.skip("lm-eval is not installed (requirements-dev.txt)", allow_module_level=True)

import eval_downstream as ed  # noqa: E402
from helpers import large_weights_, script_error  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from prepare.common import codec  # noqa: E402

EOT, T = 50256, 32  # GPT-2's <|endoftext|>; the tiny model's block_size


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(checkpoint path, model, encode, the model in float64): a tiny GPT with weights large enough
    for clear next-token maxima."""
    torch.manual_seed(1234)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=T, vocab_size=50304, pos_emb="pope",
                    attn_impl="torch")
    model = large_weights_(GPT(cfg))
    path = str(tmp_path_factory.mktemp("ckpt") / "ckpt.pt")
    torch.save({"model": model.state_dict(), "model_args": dataclasses.asdict(cfg),
                "meta": {"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16"},
                "config": {"dataset": "openwebtext"}}, path)
    return path, model.eval(), codec({"tokenizer": "gpt2"})[0], copy.deepcopy(model).double()


@torch.no_grad()
def direct(model64, ctx, cont):
    """(sum of log p(cont | ctx), cont is the argmax at every step): one unbatched float64 forward
    over the last T + 1 tokens (a continuation longer than T: its last T tokens)."""
    seq = (ctx + cont)[-(T + 1):]
    cont = cont[-(len(seq) - 1):]
    x = torch.tensor([seq[:-1]])
    logits, _ = model64(x, x)
    lp = torch.log_softmax(logits[0, :, :50257].double(), dim=-1)
    js = range(len(seq) - len(cont), len(seq))  # token j is predicted at position j - 1
    return sum(lp[j - 1, seq[j]].item() for j in js), all(lp[j - 1].argmax() == seq[j] for j in js)


def harness_encode(encode, ctx, cont):
    """The harness's rule (TemplateLM): an empty context is <|endoftext|>; trailing spaces of the
    context go to the continuation; cont = tokens of the whole past the context's."""
    if ctx == "":
        return [EOT], encode(cont)
    n = len(ctx) - len(ctx.rstrip())
    if n:
        ctx, cont = ctx[:-n], ctx[-n:] + cont
    whole, c = encode(ctx + cont), encode(ctx)
    return c, whole[len(c):]


def greedy_tokens(model64, ctx, n):
    """n tokens, each the argmax given what precedes it in the window that scores them."""
    seq, start = list(ctx), max(0, len(ctx) + n - (T + 1))
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([seq[start:]])
            logits, _ = model64(x, x)
            seq.append(int(logits[0, -1, :50257].argmax()))
    return seq[len(ctx):]


def test_scores_match_a_direct_float64_computation(tiny):
    """loglikelihood (batches mix lengths: right padding must not matter; a long context is cut on
    the left), its token-level form with continuations that are the model's own argmax (greedy True)
    or not, and loglikelihood_rolling (disjoint windows of T predicted tokens)."""
    from lm_eval.api.instance import Instance
    _, model, encode, model64 = tiny
    lm = ed.make_lm(model, encode, batch_size=3)
    long_ctx = "The quick brown fox jumps over the lazy dog near the river bank. " * 4
    assert len(encode(long_ctx)) > T + 1
    reqs = [("The cat sat on", " the mat"), ("Question: why?\nAnswer:", " because it is."),
            ("", " Hello world"), ("Trailing space ", "moves"),
            (long_ctx, " and then it slept for a very long while."),
            ("One", " two three four five six seven eight nine ten")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(reqs)],
                           disable_tqdm=True)
    for (ctx, cont), (ll, greedy) in zip(reqs, got):
        ref_ll, ref_greedy = direct(model64, *harness_encode(encode, ctx, cont))
        assert (ll, greedy) == (pytest.approx(ref_ll, rel=1e-4, abs=1e-4), ref_greedy), (ctx, cont)
    ctxs = [encode("Once upon a time"), encode(long_ctx), [EOT]]
    pairs = ([(c, greedy_tokens(model64, c, 3)) for c in ctxs]
             + [(c, encode(" zebra crossing")) for c in ctxs])
    got = lm._loglikelihood_tokens([(("", ""), c, t) for c, t in pairs], disable_tqdm=True)
    for (c, t), (ll, greedy) in zip(pairs, got):
        ref_ll, ref_greedy = direct(model64, c, t)
        assert (ll, greedy) == (pytest.approx(ref_ll, rel=1e-4, abs=1e-4), ref_greedy)
    assert [g for _, g in got] == [True] * 3 + [False] * 3
    texts = ["A short text.", " ".join(f"word{i}" for i in range(40))]  # the second: three windows
    assert len(encode(texts[1])) > 2 * T
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (s,), i)
                                    for i, s in enumerate(texts)], disable_tqdm=True)
    for text, ll in zip(texts, got):
        # each window: T predicted tokens with as much left context as fits
        full = [EOT] + encode(text)
        ref = sum(direct(model64, full[max(0, b - T):a + 1], full[a + 1:b + 1])[0]
                  for a in range(0, len(full) - 1, T) for b in [min(a + T, len(full) - 1)])
        assert ll == pytest.approx(ref, rel=1e-4, abs=1e-4), text


def requests_of(tm, spec, limit):
    """{task: [(context, continuation), ...]} that the harness builds for `spec`."""
    out = {}
    for name, task in tm.load([spec])["tasks"].items():
        task.build_all_requests(limit=limit, rank=0, world_size=1)
        out[name] = [inst.args for inst in task.instances]
    return out


def test_local_data_through_the_harness_tasks(tiny, shared_data, monkeypatch):
    """The local files, converted by config/lm_eval/local_data.py, give the harness's own prompts;
    the loaders read every row; a task without data (CBT: not in these files) is reported, the
    others run."""
    monkeypatch.syspath_prepend(ed.CONFIG_DIR)
    from local_data import arc, hellaswag, lambada, piqa
    evals = str(shared_data / "evals")
    tm = ed.task_manager(list(ed.TASKS), evals, limit=2)
    r = requests_of(tm, "local_piqa", 2)["piqa"]
    assert r[0] == ("Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:",
                    " Provide the guinea pig with a cage full of a few inches of bedding made of "
                    "ripped paper strips, you will also need to supply it with a water bottle "
                    "and a food dish.")
    assert r[2:] == [("Question: dresser\nAnswer:", " replace drawer with bobby pin"),
                     ("Question: dresser\nAnswer:", " finish, woodgrain with  bobby pin")]
    r = requests_of(tm, "local_arc_easy", 1)["arc_easy"]
    q = ("Question: Which statement best explains why photosynthesis is the foundation of most "
         "food webs?\nAnswer:")
    assert ([c for c, _ in r] == [q] * 4
            and r[3][1] == " The producers in all ecosystems are plants.")
    r = requests_of(tm, "local_lambada_openai", 2)["lambada_openai"]
    assert r[1][1] == " Shane" and r[1][0].endswith("\"I can make it there on my own,")
    r = requests_of(tm, "local_hellaswag", 2)["hellaswag"]  # ctx_b capitalised, as from the HF rows
    assert r[0] == ("Roof shingle removal: A man is sitting on a roof. He",
                    " is using wrap to wrap a pair of skis.")
    assert r[4][0] == ("Clean and jerk: A lady walks to a barbell. She bends down and grabs the "
                       "pole. The lady")
    r = requests_of(tm, "local_blimp", 1)
    assert len(r) == 67 and r["blimp_adjunct_island"] == [
        ("", " Who should Derek hug after shocking Richard?"),
        ("", " Who should Derek hug Richard after shocking?")]
    assert len(lambada(evals)["test"]) == 5153 and len(arc(evals)["test"]) == 2376
    assert sorted(piqa(evals)["validation"]["label"]).count(1) == 928
    hs = hellaswag(evals)["validation"]
    assert (len(hs) == 10042
            and [hs["label"].count(str(k)) for k in range(4)] == [2515, 2485, 2584, 2458])
    # a wikiHow row: no ctx_b
    assert hs[3243]["ctx_b"] == "" and sum(1 for b in hs["ctx_b"] if b) == 3246
    # (as main sets it: the bootstrap without a process pool)
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")
    _, table, errors = ed.evaluate(ed.make_lm(*tiny[1:3]), ["cbt", "arc_easy"], evals, limit=1)
    assert (list(errors) == ["cbt"] and list(table) == ["arc_easy"]
            and table["arc_easy"] in (0.0, 1.0))


def test_cli_offline_all_tasks(tiny, shared_data, tmp_path):
    """--data_dir with all six tasks, --limit 2: the table's cells and the JSON agree; CBT (our task
    from a file in the official format: the story detokenized, the blank filled by each candidate)
    is the mean of its two subsets, BLiMP of its 67 paradigms; PIQA and LAMBADA recomputed from
    direct float64 scores."""
    path, _, encode, model64 = tiny
    data = tmp_path / "evals"
    (data / "CBTest" / "data").mkdir(parents=True)
    for name in ("lambada_openai.jsonl", "piqa.jsonl", "arc_easy.jsonl", "hellaswag_val.txt",
                 "blimp"):
        os.symlink(shared_data / "evals" / name, data / name)
    story = ["With almost everything else to make them happy , they wanted one thing : they had no",
             "children ."]
    story += [f"Sentence number {i} is `` here '' , is n't it ?" for i in range(3, 21)]
    # answer, candidates
    question = "21 `` Oh , XXXXX , '' said the Queen .\tAlice\t\tBob|Alice|Queen\n\n"
    for sub in ("CN", "NE"):  # two questions each, in CBT's tokenized text
        (data / "CBTest" / "data" / f"cbtest_{sub}_test_2500ex.txt").write_text(
            2 * ("".join(f"{i} {s}\n" for i, s in enumerate(story, 1)) + question))
    tm = ed.task_manager(["cbt"], str(data))
    r = requests_of(tm, "local_cbt", 1)
    story = ("With almost everything else to make them happy, they wanted one thing: they had no "
             "children. "
             + " ".join(f'Sentence number {i} is "here", isn\'t it?' for i in range(3, 21)))
    assert sorted(r) == ["cbt_cn", "cbt_ne"] and r["cbt_cn"] == [
        (story + ' "Oh, ', f'{c}," said the Queen.') for c in ("Bob", "Alice", "Queen")]
    assert tm.load(["local_cbt"])["tasks"]["cbt_ne"].test_docs()[0]["gold"] == 1
    out = tmp_path / "out.json"
    p = subprocess.run([sys.executable, ed.__file__, "--ckpt", path, "--data_dir", str(data),
                        "--limit", "2", "--device", "cpu", "--batch_size", "16",
                        "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads(out.read_text())["models"][0]
    assert rep["errors"] == {} and sorted(rep["table"]) == sorted(ed.TASKS)
    table = [100 * rep["table"][t] for t in ed.TASKS]
    assert [float(c) for c in p.stdout.splitlines()[2].split("|")[2:-1]] == \
        [round(v, 1) for v in table + [sum(table) / 6]]
    res = rep["harness"]["results"]
    cbt = (res["cbt_cn"]["acc,none"] + res["cbt_ne"]["acc,none"]) / 2
    assert res["local_cbt"]["acc,none"] == pytest.approx(cbt)
    paradigms = [res[k]["acc,none"] for k in res if k.startswith("blimp_")]
    assert len(paradigms) == 67 and rep["table"]["blimp"] == pytest.approx(sum(paradigms) / 67)
    acc = acc_norm = 0  # PIQA: acc and acc_norm (per character)
    for r in map(json.loads, (data / "piqa.jsonl").read_text().splitlines()[:2]):
        ctx = r["query"] + "Answer:"
        lls = [direct(model64, *harness_encode(encode, ctx, " " + c))[0] for c in r["choices"]]
        acc += max(range(2), key=lambda i: lls[i]) == r["gold"]
        acc_norm += max(range(2), key=lambda i: lls[i] / len(r["choices"][i])) == r["gold"]
    assert (res["piqa"]["acc,none"], res["piqa"]["acc_norm,none"]) == (acc / 2, acc_norm / 2)
    rows = map(json.loads, (data / "lambada_openai.jsonl").read_text().splitlines()[:2])
    scores = [direct(model64, *harness_encode(encode, r["context"], " " + r["continuation"]))
              for r in rows]
    assert res["lambada_openai"]["acc,none"] == sum(g for _, g in scores) / 2
    ppl = math.exp(-sum(s for s, _ in scores) / 2)
    assert res["lambada_openai"]["perplexity,none"] == pytest.approx(ppl, rel=1e-3)


def test_refusals_come_before_any_work(tiny, tmp_path, monkeypatch):
    """Exit status 2, one line naming the option or file: before any checkpoint is read, a
    --data_dir that does not exist or holds none of the asked tasks' files, --limit or --batch_size
    below 1, a --device this machine lacks; before any task runs, a folder as --json, a checkpoint
    not of a GPT-2 language model or not a checkpoint at all, one whose model has fewer ids than
    its meta's tokenizer, one trained on the Triton kernel off CUDA (--attn_impl=torch runs it)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "piqa.jsonl").write_text("")  # a file of a task not asked for
    ck = torch.load(tiny[0], weights_only=True)
    torch.save({**ck, "meta": {"itos": list("abc"), "vocab_size": 3}}, tmp_path / "char.pt")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    small = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=T, vocab_size=1000)
    torch.save({**ck, "model": GPT(small).state_dict(), "model_args": dataclasses.asdict(small)},
               tmp_path / "small.pt")  # a model smaller than its meta's GPT-2 ids
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=T, vocab_size=50304,
                    attn_impl="triton")
    torch.save({**ck, "model": GPT(cfg).state_dict(), "model_args": dataclasses.asdict(cfg)},
               tmp_path / "triton.pt")
    monkeypatch.setattr(ed, "evaluate", lambda *a, **k: pytest.fail("ran the tasks first"))
    with monkeypatch.context() as m:
        m.setattr(ed, "check_checkpoint", lambda path: pytest.fail("read a checkpoint first"))
        cases = (
            (["--data_dir", tmp_path / "nonexistent"], "nonexistent"),
            (["--data_dir", tmp_path / "other", "--tasks", "cbt,arc_easy"], "other"),
            (["--limit", 0], "--limit"),
            (["--batch_size", 0], "--batch_size"),
            (["--device", "cuda:64"], "--device"),
            (["--attn_impl", "triton"], "--attn_impl"),
        )
        for args, named in cases:
            argv = ["--ckpt", tiny[0], "--device", "cpu", *args]
            assert named in script_error(ed.main, argv), args
    cases = (
        (["--json", tmp_path], "--json"),
        (["--ckpt", tiny[0], tmp_path / "char.pt"], "char"),
        (["--ckpt", tiny[0], tmp_path / "tensor.pt"], "tensor.pt"),
        (["--ckpt", tmp_path / "triton.pt"], "--attn_impl"),
        (["--ckpt", tiny[0], tmp_path / "small.pt"], "small.pt"),
    )
    for args, named in cases:
        assert named in script_error(ed.main, ["--ckpt", tiny[0], *args, "--device", "cpu"]), args


def test_remote_code_is_never_trusted_unless_asked(tiny, monkeypatch):
    """Every dataset load the harness makes (hub mode; a spy stands in for the hub): no
    trust_remote_code, whatever the user's shell sets; --trust_remote_code sets it."""
    import datasets
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        raise ConnectionError("no network in this test")
    monkeypatch.setattr(datasets, "load_dataset", spy)
    monkeypatch.setattr(ed, "hub_reachable", lambda: True)
    monkeypatch.setenv("HF_DATASETS_TRUST_REMOTE_CODE", "1")  # the user's shell: must not count
    monkeypatch.setattr(datasets.config, "HF_DATASETS_TRUST_REMOTE_CODE", False, raising=False)
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "DISABLE_MULTIPROC"):
        monkeypatch.setenv(var, "0")  # restored after the test
    # nothing loads: every task fails, none hangs
    assert ed.main(["--ckpt", tiny[0], "--device", "cpu"]) == 1
    # the first BLiMP paradigm / CBT subset
    assert sorted((c["path"], c["name"]) for c in calls) == [
        ("EleutherAI/lambada_openai", "default"),
        ("Rowan/hellaswag", None),
        ("allenai/ai2_arc", "ARC-Easy"),
        ("baber/piqa", None),
        ("cam-cst/cbt", "CN"),
        ("nyu-mll/blimp", "adjunct_island")]
    assert all(not c.get("trust_remote_code") for c in calls), calls
    assert "HF_DATASETS_TRUST_REMOTE_CODE" not in os.environ
    assert not datasets.config.HF_DATASETS_TRUST_REMOTE_CODE
    calls.clear()
    assert ed.main(["--ckpt", tiny[0], "--device", "cpu", "--tasks", "piqa",
                    "--trust_remote_code"]) == 1
    assert len(calls) == 1 and datasets.config.HF_DATASETS_TRUST_REMOTE_CODE is True
