"""The framework around the variants, in five wings whose imports run one way (a test holds it):

    archsweep.variants <- model <- data <- eval <- train <- report <- entry points (archsweep.cli)

- `model`: the typed model config, assembling a model from it, checkpoints.
- `data`: tasks, tokenizers, the token codec and the prepared-data cache.
- `eval`: decoding, metrics, evaluation of checkpoints, attention maps, the shape trace.
- `train`: the LightningModule, fitting, one job of train.py, callbacks, optimisers, loggers, sweeps.
- `report`: comparing the runs of sweeps.
"""
