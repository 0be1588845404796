"""Train wing: one train.py job (checks, then fit), the LightningModule, callbacks, optimisers and schedules,
loggers, run identity and sweep bookkeeping. Imports `archsweep.variants` and the model, data and eval wings."""
