# A small GPT for the length-extrapolation study (RESULTS.md): 6 layers, 6 heads
# of dim 64, 384 wide, trained at context 512 on ~6M tokens of English text.
# Not a paper setting: the paper's extrapolation models are its OWT 124M+ runs
# (context 1024, PG-19 test). Ours: PoPE and RoPE on the same batches (same
# seed), AdamW 1e-3 -> 1e-4 cosine over 1,200 steps of 32 x 512 tokens
# (~20M tokens, ~3.3 passes over the data) with 100 warmup steps; weight decay
# 0.01, beta2 0.95, clip 1.0, no dropout as in the paper's OWT setup.
# Val is a held-out corpus of long documents (65 State of the Union addresses),
# which eval_extrapolation.py reads at 1-10x the context.
# Data:  python prepare/openwebtext.py --out_dir data/english \
#            --input $POPE_SHARED_DATA/text/owt_sample.jsonl \
#            $POPE_SHARED_DATA/text/english/{abc,brown,inaugural}.txt \
#            $POPE_SHARED_DATA/text/english/{movie_reviews,tinyshakespeare,webtext}.txt \
#            --val_input $POPE_SHARED_DATA/text/english/state_union.txt
# Usage: python train.py config/english_small.py                               (PoPE)
#        python train.py config/english_small.py --pos_emb=rope --out_dir=out-english-rope
out_dir = "out-english-pope"
dataset = "english"
pos_emb = "pope"
pope_delta_init = "zero"
n_layer = 6
n_head = 6
n_embd = 384
block_size = 512
dropout = 0.0
batch_size = 32
gradient_accumulation_steps = 1
learning_rate = 1e-3
min_lr = 1e-4
max_iters = 1200
lr_decay_iters = 1200
warmup_iters = 100
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_interval = 100
eval_iters = 40
log_interval = 20
always_save_checkpoint = True  # the final checkpoint: PoPE and RoPE compared at equal tokens
compile = True
