# Indirect indexing with PoPE, the PoPE paper's diagnostic (arXiv 2509.10534):
# d_model 512, 8 heads, 8 layers, delta initialised U(-2pi, 0); batch 64,
# AdamW 2e-4 -> 2e-5 cosine over 100k iterations with 4k warmup, beta2 0.99,
# weight decay 0.01, grad clip 1.0, no dropout: the paper's App. B.2/B.3 as
# quoted by an independent replication (PrashRangarajan/mapformer,
# INDIRECT_PREREG.md). Runs before 2026-12-07 used weight decay 0.1
# (--weight_decay=0.1 repeats them; RESULTS.md §1 says which run used which).
# Accuracy = exact match of the greedy target letter, logged
# by train.py's eval ("acc", over the masked target tokens only).
# Data:  python prepare/indirect_indexing.py           (1M / 10k / 10k examples, rows of 52)
# Usage: python train.py config/indirect_indexing.py                      (PoPE)
#        python train.py config/indirect_indexing.py --pos_emb=rope \
#            --out_dir=out-indirect-indexing-rope   (RoPE)
# Test accuracy of the checkpoint:
#        python train.py config/indirect_indexing.py --init_from=resume --eval_only=True \
#            --eval_full=True --eval_splits=test
out_dir = "out-indirect-indexing-pope"
dataset = "indirect_indexing"
pos_emb = "pope"
pope_delta_init = "uniform"
n_layer = 8
n_head = 8
n_embd = 512
block_size = 51  # rows of 52 tokens: x = row[:-1], y = row[1:]
dropout = 0.0
batch_size = 64
gradient_accumulation_steps = 1
learning_rate = 2e-4
min_lr = 2e-5
max_iters = 100000
lr_decay_iters = 100000
warmup_iters = 4000
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
eval_interval = 2000
eval_iters = 100
log_interval = 100
always_save_checkpoint = False
