# "PoPE+ft": the YaRN fine-tuning recipe of config/finetune_yarn.py without YaRN:
# continue a checkpoint at 4x its training context (block_size 4096) for 500
# steps, lr 6e-5 after 20 linear warmup steps and then constant (no decay), 64
# sequences of 4096 tokens per step (arXiv 2509.10534). Meant for PoPE
# checkpoints; for a RoPE one it gives plain "RoPE+ft" (no frequency scaling).
# The architecture and pos_emb come from the checkpoint; weights only (fresh
# optimizer, iter 0).
#
# Usage:
#   python train.py config/finetune_pope.py --init_from=out-pope/ckpt.pt [--out_dir=out-pope-ft] [--dataset=openwebtext]
#   torchrun --standalone --nproc_per_node=8 train.py config/finetune_pope.py --init_from=out-pope/ckpt.pt
# then: python eval_extrapolation.py --ckpt out-pope/ckpt.pt out-pope-ft/ckpt.pt --data data/openwebtext/val.bin

init_from = "out-pope/ckpt.pt"  # placeholder: override with --init_from=path/to/ckpt.pt
out_dir = "out-pope-ft"
block_size = 4 * 1024
rope_scaling = 1.0  # no YaRN
rope_scaling_orig_len = 0

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
