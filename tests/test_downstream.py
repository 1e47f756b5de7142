"""eval_downstream.py over lm-evaluation-harness: the GPT adapter against a direct
float64 computation with the model, the local data fed through the harness's
own tasks (prompts checked on the real files), the whole CLI offline, the
refusals, and that a dataset's remote code is never trusted unless asked.
The seed is SEED below (POPE_TEST_SEED overrides it); failures print it."""
import copy
import dataclasses
import fractions
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

try:
    import lm_eval  # noqa: F401
except ImportError:  # CI installs it (POPE_SHARED_DATA is set there): fail there, skip elsewhere
    if os.environ.get("POPE_SHARED_DATA"):
        raise
    pytest.skip('lm-eval is not installed (pip install "lm-eval>=0.4,<0.5")', allow_module_level=True)

import eval_downstream as ed  # noqa: E402
from helpers import large_weights_  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from prepare.common import codec  # noqa: E402

SEED = int(os.environ.get("POPE_TEST_SEED", "1234"))
EOT = 50256
T = 32  # block_size of the tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(checkpoint path, float32 model, encode) of a tiny random GPT with weights
    large enough that its next-token distributions have clear maxima."""
    torch.manual_seed(SEED)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=T, vocab_size=50304, pos_emb="pope",
                    attn_impl="torch")
    with torch.no_grad():
        model = large_weights_(GPT(cfg))
    path = str(tmp_path_factory.mktemp("ckpt") / "ckpt.pt")
    torch.save({"model": model.state_dict(), "model_args": dataclasses.asdict(cfg),
                "meta": {"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16"},
                "config": {"dataset": "openwebtext", "seed": SEED}}, path)
    torch.load(path, weights_only=True)  # loads without unpickling code
    encode, _ = codec({"tokenizer": "gpt2"})
    return path, model.eval(), encode


@torch.no_grad()
def direct(model64, ctx, cont):
    """(sum of log p(cont | ctx), cont is the argmax at every step): one
    unbatched float64 forward over the last T + 1 tokens (a continuation
    longer than T: its last T tokens)."""
    seq = (ctx + cont)[-(T + 1):]
    cont = cont[-(len(seq) - 1):]
    x = torch.tensor([seq[:-1]])
    logits, _ = model64(x, x)
    lp = torch.log_softmax(logits[0, :, :50257].double(), dim=-1)
    total, greedy = 0.0, True
    for j in range(len(seq) - len(cont), len(seq)):  # token j is predicted at position j - 1
        total += lp[j - 1, seq[j]].item()
        greedy &= bool(lp[j - 1].argmax() == seq[j])
    return total, greedy


def harness_encode(encode, ctx, cont):
    """The harness's rule (TemplateLM): an empty context is <|endoftext|>; trailing
    spaces of the context go to the continuation; cont = tokens of the whole past the context's."""
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


def test_loglikelihood_matches_direct_float64(tiny):
    from lm_eval.api.instance import Instance
    _, model, encode = tiny
    model64 = copy.deepcopy(model).double()
    long_ctx = "The quick brown fox jumps over the lazy dog near the river bank. " * 4
    reqs = [("The cat sat on", " the mat"), ("Question: why?\nAnswer:", " because it is."),
            ("", " Hello world"), ("Trailing space ", "moves"),
            (long_ctx, " and then it slept for a very long while."),
            ("One", " two three four five six seven eight nine ten")]
    lm = ed.make_lm(model, encode, batch_size=3)  # batches mix lengths: right padding must not matter
    got = lm.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(reqs)],
                           disable_tqdm=True)
    assert len(encode(long_ctx)) > T + 1  # the long one is cut on the left
    for (ctx, cont), (ll, greedy) in zip(reqs, got):
        ref_ll, ref_greedy = direct(model64, *harness_encode(encode, ctx, cont))
        assert ll == pytest.approx(ref_ll, rel=1e-4, abs=1e-4), f"seed={SEED} {ctx[:20]!r}+{cont!r}"
        assert greedy == ref_greedy, f"seed={SEED} {ctx[:20]!r}+{cont!r}"
    # token level, with continuations that are the model's own argmax (greedy True)
    ctxs = [encode("Once upon a time"), encode(long_ctx), [EOT]]
    pairs = [(c, greedy_tokens(model64, c, 3)) for c in ctxs] + [(c, encode(" zebra crossing")) for c in ctxs]
    got = lm._loglikelihood_tokens([(("", ""), c, t) for c, t in pairs], disable_tqdm=True)
    for (c, t), (ll, greedy) in zip(pairs, got):
        ref_ll, ref_greedy = direct(model64, c, t)
        assert ll == pytest.approx(ref_ll, rel=1e-4, abs=1e-4), f"seed={SEED}"
        assert greedy == ref_greedy, f"seed={SEED}"
    assert [g for _, g in got] == [True] * 3 + [False] * 3, f"seed={SEED}"


def test_loglikelihood_rolling_matches_direct(tiny):
    from lm_eval.api.instance import Instance
    _, model, encode = tiny
    model64 = copy.deepcopy(model).double()
    texts = ["A short text.", " ".join(f"word{i}" for i in range(40))]
    lm = ed.make_lm(model, encode, batch_size=2)
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (s,), i)
                                    for i, s in enumerate(texts)], disable_tqdm=True)
    for text, ll in zip(texts, got):
        toks = encode(text)
        full = [EOT] + toks  # disjoint chunks of T predicted tokens, each with as much left context as fits
        ref = 0.0
        for a in range(0, len(toks), T):
            b = min(a + T, len(toks))
            ctx = full[max(0, b - T):a + 1]
            ref += direct(model64, ctx, full[a + 1:b + 1])[0]
        assert ll == pytest.approx(ref, rel=1e-4, abs=1e-4), f"seed={SEED} {text[:20]!r}"
    assert len(encode(texts[1])) > 2 * T  # three windows


def requests_of(tm, spec, limit):
    """{task: [(context, continuation), ...]} that the harness builds for `spec`."""
    out = {}
    for name, task in tm.load([spec])["tasks"].items():
        task.build_all_requests(limit=limit, rank=0, world_size=1)
        out[name] = [inst.args for inst in task.instances]
    return out


def test_local_data_through_the_harness_tasks(shared_data):
    """The local files, converted by config/lm_eval/local_data.py, give the
    harness's own prompts; counts as in the data README."""
    sys.path.insert(0, ed.CONFIG_DIR)
    from local_data import arc, hellaswag, lambada, piqa
    evals = str(shared_data / "evals")
    tm = ed.task_manager(list(ed.TASKS), evals, limit=2)
    r = requests_of(tm, "local_piqa", 2)["piqa"]
    assert r[0] == ("Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:",
                    " Provide the guinea pig with a cage full of a few inches of bedding made of ripped "
                    "paper strips, you will also need to supply it with a water bottle and a food dish.")
    assert r[2:] == [("Question: dresser\nAnswer:", " replace drawer with bobby pin"),
                     ("Question: dresser\nAnswer:", " finish, woodgrain with  bobby pin")]
    r = requests_of(tm, "local_arc_easy", 1)["arc_easy"]
    q = ("Question: Which statement best explains why photosynthesis is the foundation of most food webs?"
         "\nAnswer:")
    assert [c for c, _ in r] == [q] * 4 and r[3][1] == " The producers in all ecosystems are plants."
    r = requests_of(tm, "local_lambada_openai", 2)["lambada_openai"]
    assert r[1][1] == " Shane" and r[1][0].endswith("\"I can make it there on my own,")
    r = requests_of(tm, "local_hellaswag", 2)["hellaswag"]  # ctx_b capitalised, as from the HF rows
    assert r[0] == ("Roof shingle removal: A man is sitting on a roof. He",
                    " is using wrap to wrap a pair of skis.")
    assert r[4][0] == "Clean and jerk: A lady walks to a barbell. She bends down and grabs the pole. The lady"
    r = requests_of(tm, "local_blimp", 1)
    assert len(r) == 67 and r["blimp_adjunct_island"] == [
        ("", " Who should Derek hug after shocking Richard?"),
        ("", " Who should Derek hug Richard after shocking?")]
    assert len(lambada(evals)["test"]) == 5153 and len(arc(evals)["test"]) == 2376
    assert sorted(piqa(evals)["validation"]["label"]).count(1) == 928
    hs = hellaswag(evals)["validation"]
    assert len(hs) == 10042 and [hs["label"].count(str(k)) for k in range(4)] == [2515, 2485, 2584, 2458]
    wikihow = hs[3243]  # ends with a whole sentence: no ctx_b
    assert wikihow["activity_label"] == "Personal Care and Style" and wikihow["ctx_b"] == ""
    assert len(set(hs["activity_label"])) == 192 and sum(1 for b in hs["ctx_b"] if b) == 3246


CBT_STORY = ["With almost everything else to make them happy , they wanted one thing : they had no "
             "children ."] + [f"Sentence number {i} is `` here '' , is n't it ?" for i in range(2, 21)]


def write_cbt(folder, sub):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"cbtest_{sub}_test_2500ex.txt"), "w") as f:
        for _ in range(2):
            f.writelines(f"{i} {s}\n" for i, s in enumerate(CBT_STORY, 1))
            f.write("21 `` Oh , XXXXX , '' said the Queen .\tAlice\t\tBob|Alice|Queen\n\n")


def test_cbt_task(tmp_path):
    write_cbt(str(tmp_path / "cbt"), "CN")
    write_cbt(str(tmp_path / "cbt"), "NE")
    tm = ed.task_manager(["cbt"], str(tmp_path))
    r = requests_of(tm, "local_cbt", 1)
    assert sorted(r) == ["cbt_cn", "cbt_ne"]
    story = "With almost everything else to make them happy, they wanted one thing: they had no " \
        "children. " + \
        " ".join(f'Sentence number {i} is "here", isn\'t it?' for i in range(2, 21))
    assert r["cbt_cn"] == [(story + ' "Oh, ', f'{c}," said the Queen.') for c in ("Bob", "Alice", "Queen")]
    assert tm.load(["local_cbt"])["tasks"]["cbt_ne"].test_docs()[0]["gold"] == 1


def run_cli(*args, env=None, timeout=600):
    e = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, os.path.join(ROOT, "eval_downstream.py"), *args],
                          capture_output=True, text=True, env=e, timeout=timeout, cwd=ROOT)


def test_cli_offline_all_tasks(tiny, shared_data, tmp_path):
    """--data_dir with all six tasks (CBT from a file in the official format),
    --limit 2: the table, the JSON, and PIQA/LAMBADA numbers recomputed directly."""
    path, model, encode = tiny
    data = tmp_path / "evals"
    data.mkdir()
    for name in ("lambada_openai.jsonl", "piqa.jsonl", "arc_easy.jsonl", "hellaswag_val.txt", "blimp"):
        os.symlink(shared_data / "evals" / name, data / name)
    write_cbt(str(data / "CBTest" / "data"), "CN")
    write_cbt(str(data / "CBTest" / "data"), "NE")
    out = tmp_path / "out.json"
    p = run_cli("--ckpt", path, "--data_dir", str(data), "--limit", "2", "--device", "cpu",
                "--batch_size", "16", "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert lines[0] == "| Model | LAMBADA | BLiMP | CBT | HellaSwag | PIQA | ARC-E | Avg |"
    rep = json.loads(out.read_text())["models"][0]
    assert rep["errors"] == {} and sorted(rep["table"]) == sorted(ed.TASKS)
    cells = lines[2].split("|")[2:-1]
    table = [100 * rep["table"][t] for t in ed.TASKS]
    assert [float(c) for c in cells] == [round(v, 1) for v in table + [sum(table) / 6]]
    res = rep["harness"]["results"]
    cbt = (res["cbt_cn"]["acc,none"] + res["cbt_ne"]["acc,none"]) / 2
    assert res["local_cbt"]["acc,none"] == pytest.approx(cbt)
    paradigms = [res[k]["acc,none"] for k in res if k.startswith("blimp_")]
    assert len(paradigms) == 67 and rep["table"]["blimp"] == pytest.approx(sum(paradigms) / 67)
    # PIQA acc / acc_norm (per character) and LAMBADA acc / perplexity from direct float64 scores
    model64 = copy.deepcopy(model).double()
    rows = [json.loads(line) for line in open(data / "piqa.jsonl")][:2]
    acc = acc_norm = 0
    for r in rows:
        ctx = r["query"] + "Answer:"
        lls = [direct(model64, *harness_encode(encode, ctx, " " + c))[0] for c in r["choices"]]
        acc += max(range(2), key=lambda i: lls[i]) == r["gold"]
        acc_norm += max(range(2), key=lambda i: lls[i] / len(r["choices"][i])) == r["gold"]
    assert (res["piqa"]["acc,none"], res["piqa"]["acc_norm,none"]) == (acc / 2, acc_norm / 2), f"seed={SEED}"
    rows = [json.loads(line) for line in open(data / "lambada_openai.jsonl")][:2]
    scores = [direct(model64, *harness_encode(encode, r["context"], " " + r["continuation"])) for r in rows]
    assert res["lambada_openai"]["acc,none"] == sum(g for _, g in scores) / 2
    assert res["lambada_openai"]["perplexity,none"] == pytest.approx(
        math.exp(-sum(s for s, _ in scores) / 2), rel=1e-3), f"seed={SEED}"


def test_cli_cbt_without_data_others_run(tiny, shared_data):
    p = run_cli("--ckpt", tiny[0], "--data_dir", str(shared_data / "evals"), "--tasks", "cbt,arc_easy",
                "--limit", "1", "--device", "cpu")
    assert p.returncode == 0, p.stderr[-3000:]
    row = p.stdout.splitlines()[2].split("|")  # CBT's cell empty, ARC-E's a number, the average marked
    assert row[2].strip() == "-" and float(row[3]) in (0.0, 100.0) and row[4].strip().endswith("*")


def one_line_error(args, capsys, named):
    """ed.main(args) refuses: exit status 2, one line on stderr naming `named`, nothing on stdout."""
    with pytest.raises(SystemExit) as e:
        ed.main([*map(str, args), "--device", "cpu"])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == "" and out.err.count("\n") == 1 and named in out.err, out.err


def test_refusals_come_before_any_work(tiny, tmp_path, monkeypatch, capsys, readonly, damage):
    """A --data_dir that does not exist or holds none of the asked tasks' files, --limit or --batch_size
    below 1, a read-only or folder --json: refused before any checkpoint is read; a checkpoint that is not
    a GPT-2 language model's, or damaged, or not a checkpoint: refused before any task runs."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "piqa.jsonl").write_text("")  # a file of a task not asked for
    (tmp_path / "ro").mkdir()
    readonly(tmp_path / "ro")
    with monkeypatch.context() as m:
        m.setattr(ed, "check_checkpoint", lambda path: pytest.fail("the checkpoints were read first"))
        for args, named in (([tmp_path / "nonexistent"], "nonexistent"),
                            ([tmp_path / "other", "--tasks", "cbt,arc_easy"], str(tmp_path / "other"))):
            one_line_error(["--ckpt", tiny[0], "--data_dir", *args], capsys, named)
        for opt in ("--limit", "--batch_size"):
            one_line_error(["--ckpt", tiny[0], opt, "0"], capsys, opt)
    monkeypatch.setattr(ed, "evaluate", lambda *a, **k: pytest.fail("ran the tasks first"))
    for path in (tmp_path, tmp_path / "ro" / "r.json"):
        one_line_error(["--ckpt", tiny[0], "--json", path], capsys, "--json")
    ck = torch.load(tiny[0], weights_only=True)
    torch.save({**ck, "meta": {"itos": list("abc"), "vocab_size": 3}}, tmp_path / "char.pt")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    torch.save(ck["model"], tmp_path / "state.pt")
    torch.save({**ck, "config": {"odd": fractions.Fraction(1, 3)}}, tmp_path / "pickle.pt")  # (pickle only)
    shutil.copy(tiny[0], tmp_path / "bad.pt")
    damage(tmp_path / "bad.pt")
    for name in ("char.pt", "tensor.pt", "state.pt", "pickle.pt", "bad.pt"):
        one_line_error(["--ckpt", tiny[0], tmp_path / name], capsys, str(tmp_path / name))


def test_offline_tokenizer_is_a_one_line_error(tiny, tmp_path):
    """No tiktoken files and no network (a proxy that refuses): one error line, no traceback."""
    empty = tmp_path / "tk"
    empty.mkdir()
    env = {"TIKTOKEN_CACHE_DIR": str(empty), **{v: "http://127.0.0.1:9" for v in
                                                ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}}
    p = run_cli("--ckpt", tiny[0], "--device", "cpu", env=env, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr[-2000:]


def test_remote_code_is_never_trusted_unless_asked(tiny, monkeypatch):
    """Every dataset load the harness makes (hub mode; a spy stands in for the
    hub) and every task config: no trust_remote_code; --trust_remote_code sets it."""
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
    assert ed.main(["--ckpt", tiny[0], "--device", "cpu"]) == 1  # nothing loads: every task fails, none hangs
    assert sorted((c["path"], c["name"]) for c in calls) == [  # the first BLiMP paradigm / CBT subset
        ("EleutherAI/lambada_openai", "default"), ("Rowan/hellaswag", None), ("allenai/ai2_arc", "ARC-Easy"),
        ("baber/piqa", None), ("cam-cst/cbt", "CN"), ("nyu-mll/blimp", "adjunct_island")]
    assert all(not c.get("trust_remote_code") for c in calls), calls
    assert "HF_DATASETS_TRUST_REMOTE_CODE" not in os.environ
    assert not datasets.config.HF_DATASETS_TRUST_REMOTE_CODE
    from lm_eval.tasks._yaml_loader import load_yaml
    tm = ed.task_manager(list(ed.TASKS), None)
    for name, entry in tm.task_index.items():
        if entry.yaml_path:
            cfg = load_yaml(entry.yaml_path, resolve_func=False)
            assert "trust_remote_code" not in json.dumps(cfg, default=str), name
    calls.clear()
    assert ed.main(["--ckpt", tiny[0], "--device", "cpu", "--tasks", "piqa", "--trust_remote_code"]) == 1
    assert len(calls) == 1 and datasets.config.HF_DATASETS_TRUST_REMOTE_CODE is True
