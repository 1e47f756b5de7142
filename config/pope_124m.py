# GPT-124M on OpenWebText, the paper's setup (arXiv 2509.10534), PoPE by default
# and RoPE with the override below (the same model, data and schedule): 12 layers,
# 12 heads of dim 64, RMSNorm, batch 64 x 1024 tokens, AdamW 6e-4 -> 6e-5 cosine
# over 100k iterations with 1k warmup, weight decay 0.01, beta2 0.95, clip 1.0,
# no dropout. The paper reports validation perplexity 21.33 (PoPE) and 21.55 (RoPE).
# Data:  python prepare/openwebtext.py
# Usage: python train.py config/pope_124m.py                                    (PoPE)
#        python train.py config/pope_124m.py --pos_emb=rope --out_dir=out-rope-124m   (RoPE)
#        torchrun --standalone --nproc_per_node=8 train.py config/pope_124m.py
out_dir = "out-pope-124m"
dataset = "openwebtext"
pos_emb = "pope"
pope_delta_init = "zero"
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
batch_size = 16
gradient_accumulation_steps = 4  # 16 x 4 = 64 sequences per step (split over DDP ranks)
learning_rate = 6e-4
min_lr = 6e-5
max_iters = 100000
lr_decay_iters = 100000
warmup_iters = 1000
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
dropout = 0.0
eval_interval = 1000
eval_iters = 200
log_interval = 10
compile = True
