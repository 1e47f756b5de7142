"""results/summarize.py: tables from eval.json, metrics.jsonl and training logs (take-off steps, mean ± std)."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def summarize(*args):
    r = subprocess.run([sys.executable, str(REPO / "results" / "summarize.py"), *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in r.stdout.splitlines() if line.startswith("| ") and not line.startswith("| run")}


def test_takeoff_from_metrics_and_logs(tmp_path):
    """The first eval above each threshold, from a metrics.jsonl and from a log of the same evals."""
    accs = {0: 0.01, 2000: 0.14, 4000: 0.151, 6000: 0.49, 8000: 0.52, 10000: 0.40}
    run = tmp_path / "seed7-pope"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for it, acc in accs.items():
            f.write(json.dumps({"iter": it, "loss": 1.0, "dt_ms": 1.0, "tok_per_s": 1.0}) + "\n")
            f.write(json.dumps({"iter": it, "eval": {"val": {"loss": 2.0, "acc": acc}}}) + "\n")
    (tmp_path / "seed7-rope.log").write_text("model: ...\n" + "".join(
        f"iter {it}: loss 1.0\nstep {it}: train loss 1.5 acc 0.9, val loss 2.0 acc {acc * 0.5:.4f}\n"
        for it, acc in accs.items()))
    rows = summarize("--takeoff", "15,50", run / "metrics.jsonl", tmp_path / "seed7-rope.log")
    assert rows["seed7-pope"] == ["4000", "8000", "40.00"]
    assert rows["seed7-rope"] == ["6000", "–", "20.00"]  # halved: 0.245 at 6000, never above 50%


def test_mean_and_std_over_seeds(tmp_path):
    """Runs differing only in the seed form a group with the sample mean ± std."""
    for seed, acc in ((101, 0.2), (102, 0.4), (103, 0.9)):
        (tmp_path / f"seed{seed}-pope").mkdir()
        (tmp_path / f"seed{seed}-pope" / "eval.json").write_text(
            json.dumps({"iter": 100, "test": {"loss": acc, "acc": acc}}))
    rows = summarize(*sorted(tmp_path.glob("seed*-pope/eval.json")))
    assert rows["seed102-pope"] == ["100", "0.4000", "40.00"]
    assert rows["pope"] == ["3", "0.5000 ± 0.3606", "50.00 ± 36.06"]  # stdev([.2,.4,.9]) = 0.36056
