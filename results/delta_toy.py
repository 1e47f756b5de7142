"""
Does PoPE's phase bias delta keep learning from zero init? A CPU toy for each way of
keeping it in [-2pi, 0] (model.pope_delta: wrap, clamp, project).

Usage:
    python results/delta_toy.py [--seeds 100] [--steps 20] [--lr 1e-2]

Per seed: a 1-layer, 2-head, 32-wide PoPE GPT (vocabulary 37, context 16, delta from
zero, the language models' init), AdamW on one fixed random batch of 8 x 16 tokens.
After the last step: the share of delta entries whose gradient is non-zero, and the
share whose phase (pope_delta of the parameter) is more than 0.01 rad from 0. Prints
mean, min and max over seeds. tests/test_model.py asserts the same for one seed.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from model import GPT, GPTConfig, pope_delta  # noqa: E402


def run(bound, seed, steps, lr):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=37,
                          pos_emb="pope", pope_delta_init="zero", pope_delta_bound=bound,
                          attn_impl="torch"))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    delta = model.transformer.h[0].attn.delta
    idx = torch.randint(0, 37, (8, 17))
    for _ in range(steps):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        live = (delta.grad != 0).double().mean().item()
        opt.step()
        model.project_delta_()  # as train.py does after each step (a no-op unless bound="project")
    used = pope_delta(delta.detach().double(), bound)
    moved = (torch.atan2(torch.sin(used), torch.cos(used)).abs() > 0.01).double().mean().item()
    return live, moved


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100, help="seeds 0..N-1 per bound")
    ap.add_argument("--steps", type=int, default=20, help="AdamW steps")
    ap.add_argument("--lr", type=float, default=1e-2, help="learning rate")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{args.seeds} seeds, {args.steps} AdamW steps, lr {args.lr}, torch {torch.__version__}")
    print("| bound | delta entries with a gradient at the last step: mean (min-max) | "
          "moved > 0.01 rad: mean (min-max) |")
    print("|---|---|---|")
    for bound in ("clamp", "project", "wrap"):
        res = [run(bound, s, args.steps, args.lr) for s in range(args.seeds)]
        live, moved = zip(*res)
        print(f"| {bound} | {sum(live) / len(live):.1%} ({min(live):.0%}-{max(live):.0%}) | "
              f"{sum(moved) / len(moved):.1%} ({min(moved):.0%}-{max(moved):.0%}) |")


if __name__ == "__main__":
    main()
