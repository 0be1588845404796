"""Train wing, settings checked before any heavy import: the schemas of the plain config groups (`schemas`), the
rules across fields (`rules`), the diagnostics' settings (`diagnostics`), the arithmetic of warmup-stable-decay
schedules and their budget branches (`wsd`), and the checked `Setup` a job hands its fit (`setup`). Light: no
torch, Lightning or wandb. Imports `archsweep.variants` and the model, data and eval wings; no other part of the
train wing.
"""
