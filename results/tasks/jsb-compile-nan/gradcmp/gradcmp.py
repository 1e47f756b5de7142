"""Probe (next session, one H200): does torch.compile's bf16 backward get layer 0's gradients right with q, k, v
made by view-permute-unbind (model.py before 3d55f91) and by split (since)? Per shape: an eager model and a
compiled copy from one init, dropout 0, fused AdamW; an eval pass first (as train.py), then 4 steps on the same
batches; per step the norm-wise relative error of compiled against eager for layer 0's c_attn rows q, k, v.
Usage: python .tk/gradcmp.py FORM   (FORM: split | permute; patches nothing, reads model.py as it is)"""
import copy, sys
import torch
from model import GPT, GPTConfig

form = sys.argv[1]
for name, cfg, B in (("jsb", dict(n_layer=6, n_head=8, n_embd=256, vocab_size=96, block_size=2047), 16),
                     ("ii", dict(n_layer=8, n_head=8, n_embd=512, vocab_size=64, block_size=51), 64)):
    for pe in ("pope", "rope"):
        torch.manual_seed(1340)
        eager = GPT(GPTConfig(**cfg, pos_emb=pe, attn_impl="torch", dropout=0.0)).cuda()
        comp = copy.deepcopy(eager)
        fwd = torch.compile(comp)
        opts = [torch.optim.AdamW(m.parameters(), lr=2e-4, fused=True) for m in (eager, comp)]
        T, V = cfg["block_size"], cfg["vocab_size"]
        x = torch.randint(V, (B, T + 1), device="cuda")
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
            fwd.eval()(x[:, :-1], x[:, 1:], (x[:, 1:] > 3).float())
        fwd.train()
        errs = []
        for i in range(4):
            x = torch.randint(V, (B, T + 1), device="cuda")
            for m, f in ((eager, eager), (comp, fwd)):
                with torch.autocast("cuda", torch.bfloat16):
                    f(x[:, :-1], x[:, 1:], (x[:, 1:] > 3).float())[1].backward()
            ga, gb = (m.transformer.h[0].attn.c_attn.weight.grad.float() for m in (comp, eager))
            errs.append([round(((a - b).norm() / b.norm()).item(), 4) for a, b in zip(ga.chunk(3), gb.chunk(3))])
            for o, m in zip(opts, (eager, comp)):
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
                o.step()
                o.zero_grad(set_to_none=True)
        print(f"{form} {name} {pe}: layer 0 c_attn grad rel err (q, k, v) per step: {errs}", flush=True)
