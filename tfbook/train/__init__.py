"""Learning: data windows, schedules, the optimiser, checkpoints and one training loop.

    data        token streams -> (B, T) windows and shifted targets; padded seq2seq batches
    schedules   warmup + cosine decay; the inverse square root of Vaswani et al.
    optim       AdamW with decay on matrices only; clipping by the global gradient norm
    checkpoint  model + optimiser + loop state as safetensors and JSON (no pickle)
    loop        TrainConfig and train(): the loop every chapter and script calls
"""
