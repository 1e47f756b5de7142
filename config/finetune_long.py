# Fine-tuning at 4x the training context, the PoPE paper's recipe (arXiv 2509.10534):
# continue a checkpoint at block_size 4096 for 500 steps, lr 6e-5 after 20 linear
# warmup steps and then constant (no decay), 64 sequences of 4096 tokens per step.
# The architecture and pos_emb come from the checkpoint; weights only (fresh
# optimizer, iter 0). The paper's two fine-tunes differ in one key:
#   "PoPE+ft"   a PoPE checkpoint as it is;
#   RoPE+YaRN   a RoPE checkpoint with YaRN scale s = 4 (arXiv 2309.00071):
#               --rope_scaling=4.0, s = 4096 / the source's block_size. YaRN's
#               original length is the source's (a YaRN checkpoint's own, else its
#               block_size: 1024 for config/pope_124m.py), saved as rope_scaling_orig_len.
#
# Usage:
#   python train.py config/finetune_long.py \
#       --init_from=out-pope-124m/ckpt.pt   # PoPE+ft -> out-pope-ft
#   python train.py config/finetune_long.py --init_from=out-rope-124m/ckpt.pt --rope_scaling=4.0 \
#       --out_dir=out-rope-yarn
#   torchrun --standalone --nproc_per_node=8 train.py config/finetune_long.py \
#       --init_from=out-pope-124m/ckpt.pt
# The data is train.py's default dataset (openwebtext) unless --dataset names another:
# pass the source checkpoint's (e.g. --dataset=english for config/english_small.py models).
# then: python eval_extrapolation.py \
#           --ckpt out-pope-124m/ckpt.pt out-pope-ft/ckpt.pt out-rope-yarn/ckpt.pt \
#           --data data/openwebtext/val.bin

init_from = "out-pope-124m/ckpt.pt"  # config/pope_124m.py's; another: --init_from=path/to/ckpt.pt
out_dir = "out-pope-ft"
block_size = 4 * 1024
# rope_scaling (YaRN s) and rope_scaling_orig_len: the checkpoint's unless given (a RoPE source
# without YaRN, fine-tuned as it is, gives "RoPE+ft")

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
