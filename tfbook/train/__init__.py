"""Learning: data windows, schedules, the optimiser, checkpoints and one training loop.

    data        token streams -> (B, T) windows and shifted targets; padded seq2seq batches
    schedules   warmup + cosine decay; the inverse square root of Vaswani et al.
    optim       AdamW with decay on matrices only; clipping by the global gradient norm
    checkpoint  model + optimiser + loop state as safetensors and JSON (no pickle)
    loop        TrainConfig and train(): the loop every chapter and script calls
    distributed data parallelism over processes (torch.distributed, gloo), equal to one process
    scaling     power-law fits of a sweep, with their uncertainty
    corpus_lm   the small GPT of the training chapter: corpus, tokenizer, yardsticks
"""
