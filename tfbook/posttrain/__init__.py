"""Part VII, after pre-training: chat templates (and, later, SFT, DPO, GRPO and evaluation)."""
