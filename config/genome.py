# Human reference genome with PoPE, the PoPE paper's genome setting
# (arXiv 2509.10534): 1024 wide, 16 heads, 16 layers, context 1000 tokens of
# 6-mers (vocabulary 4107, Nucleotide-Transformer style), delta initialised
# U(-2pi, 0).
# The paper does not give these, so they are ours: 16 x 8 sequences of 1000
# tokens per step (128k tokens), AdamW 3e-4 -> 3e-5 cosine over 20k
# iterations (~2.6B tokens, ~5 passes over hg38) with 2k warmup, beta2 0.95,
# weight decay 0.1, no dropout.
# Data:  python prepare/genome.py --input hg38.fa.gz      (or $POPE_SHARED_DATA/genome/chr20.fa.gz)
# Usage: python train.py config/genome.py                      (PoPE)
#        python train.py config/genome.py --pos_emb=rope --out_dir=out-genome-rope   (RoPE)
#        torchrun --standalone --nproc_per_node=8 train.py config/genome.py
out_dir = "out-genome-pope"
dataset = "genome"
pos_emb = "pope"
pope_delta_init = "uniform"
n_layer = 16
n_head = 16
n_embd = 1024
block_size = 1000
dropout = 0.0
batch_size = 16
gradient_accumulation_steps = 8  # 16 x 8 = 128 sequences per step (split over DDP ranks)
learning_rate = 3e-4
min_lr = 3e-5
max_iters = 20000
lr_decay_iters = 20000
warmup_iters = 2000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_interval = 1000
eval_iters = 50
log_interval = 10
always_save_checkpoint = False
