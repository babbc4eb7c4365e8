"""Loaders of real checkpoints: the GGUF file format, and one name table per model."""
