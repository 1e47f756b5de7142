# GPT-124M on Python source (prepare/code.py: the .py files of pinned PyPI packages, val and test
# packages held out), the model of config/pope_124m.py at its context of 1024: 12 layers, 12
# heads of dim 64, RMSNorm, batch 64 x 1024 tokens, AdamW 6e-4 -> 6e-5 cosine, weight decay 0.01,
# beta2 0.95, clip 1.0, no dropout. The schedule is shortened to 2,000 steps with 100 warmup (131M
# tokens, about 2.7 passes over the train split): one run fits a 30-minute GPU lease at the 124M
# step rate of RESULTS.md §5, a checkpoint every 250 steps for a resume. PoPE and RoPE runs of one
# seed draw the same batches. results/code.sh trains both and evaluates them at 1k..10k tokens.
# Data:  python prepare/code.py               (offline: --wheels DIR, a folder of the pinned wheels)
# Usage: python train.py config/code_124m.py                                       (PoPE)
#        python train.py config/code_124m.py --pos_emb=rope --out_dir=out-code-rope  (RoPE)
out_dir = "out-code-pope"
dataset = "code"
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
max_iters = 2000
lr_decay_iters = 2000
warmup_iters = 100
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
dropout = 0.0
eval_interval = 250
eval_iters = 50
log_interval = 10
always_save_checkpoint = True  # the final checkpoint: PoPE and RoPE compared at equal tokens
compile = True
