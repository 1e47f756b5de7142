# Quick start (CPU, no download, a few minutes): a small PoPE GPT on an easy
# variant of the PoPE paper's indirect-indexing task (arXiv 2509.10534):
# strings of 8-12 letters and shifts in [-3, +3] (the paper: 20-40 and
# [-15, +15], config/indirect_indexing.py). Not a paper setting:
# 3 layers, 4 heads, 128 wide, 3,000 steps of 64 examples on the CPU.
# The log shows the loss on the target letter falling from ~4.3 and the target
# accuracy (exact match of the greedy target letter) rising.
# Data:  python prepare/indirect_indexing.py --quick      (data/indirect_indexing_quick, rows of 23)
# Usage: python train.py config/indirect_indexing_quick.py
out_dir = "out-indirect-indexing-quick"
dataset = "indirect_indexing_quick"
pos_emb = "pope"
pope_delta_init = "uniform"
n_layer = 3
n_head = 4
n_embd = 128
block_size = 22  # rows of 23 tokens: x = row[:-1], y = row[1:]
dropout = 0.0
batch_size = 64
gradient_accumulation_steps = 1
learning_rate = 1e-3
min_lr = 1e-4
max_iters = 3000
lr_decay_iters = 3000
warmup_iters = 100
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
eval_interval = 250
eval_iters = 20
log_interval = 50
always_save_checkpoint = False
device = "cpu"
dtype = "float32"
compile = False
