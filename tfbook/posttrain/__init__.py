"""Part VII, after pre-training: chat templates and the assistant mask (chat), supervised
fine-tuning (sft), LoRA adapters saved and loaded (adapters), preference optimisation (dpo),
GRPO with a checkable reward (rewards, rollouts, grpo) and evaluation (evaluate)."""
