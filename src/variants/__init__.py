"""Swappable Transformer parts in plain PyTorch (no lightning, hydra, omegaconf or wandb imports)."""
