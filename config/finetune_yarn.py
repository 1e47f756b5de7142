# RoPE+YaRN fine-tuning: continue a RoPE checkpoint at 4x its training context
# with YaRN scale s = 4 (arXiv 2309.00071), the recipe of the PoPE paper
# (arXiv 2509.10534): 500 steps, lr 6e-5 after 20 linear warmup steps and then
# constant (no decay), 64 sequences of 4096 tokens per step. The architecture
# and pos_emb come from the checkpoint; weights only (fresh optimizer, iter 0).
# YaRN's original length is the source checkpoint's block_size (1024 for the
# 124M configs), saved as rope_scaling_orig_len in the new checkpoint.
#
# Usage:
#   python train.py config/finetune_yarn.py --init_from=out-rope/ckpt.pt [--out_dir=out-rope-yarn] [--dataset=openwebtext]
#   torchrun --standalone --nproc_per_node=8 train.py config/finetune_yarn.py --init_from=out-rope/ckpt.pt
# then: python eval_extrapolation.py --ckpt out-rope/ckpt.pt out-rope-yarn/ckpt.pt --data data/openwebtext/val.bin
# The same recipe without YaRN ("PoPE+ft"): config/finetune_pope.py.

init_from = "out-rope/ckpt.pt"  # placeholder: override with --init_from=path/to/rope/ckpt.pt
out_dir = "out-rope-yarn"
block_size = 4 * 1024
rope_scaling = 4.0  # YaRN s: block_size / the source's block_size
rope_scaling_orig_len = 0  # 0: the source checkpoint's block_size

# 64 sequences per step (batch_size x gradient_accumulation_steps; accumulation is
# split over DDP ranks, so 8 divides 1, 2, 4 or 8 GPUs)
batch_size = 8
gradient_accumulation_steps = 8

max_iters = 500
learning_rate = 6e-5
warmup_iters = 20
decay_lr = False  # constant learning_rate after the warmup

eval_interval = 100
eval_iters = 50
log_interval = 10
