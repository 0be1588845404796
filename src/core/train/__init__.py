"""Train wing: one train.py job (checks, then fit), the LightningModule, callbacks, optimisers and schedules,
loggers, run identity and sweep bookkeeping. Imports `archsweep.variants` and the model, data and eval wings.

Where things are (each sub-package's docstring says what it owns and which others it may import):

    lit.py        the LightningModule: loss, optimiser, schedule and metrics around a built model
    lifecycle/    one job from config to results: checks, job, fit, trainer, interrupts, budget branches
    config/       light settings: the groups' schemas, rules across fields, the checked Setup, WSD arithmetic
    optimisers/   AdamW, Muon and the learning-rate schedules the `optim` and `schedule` groups name
    monitoring/   what a run measures and shows: callbacks, diagnostics, compute, loggers, console lines
    runs/         a run on disk and in a sweep: its directory, identity, results.json, resume, sweep summary
    launch/       how one run's processes start and split: torchrun ranks, submitit tasks, FSDP sharding

Inside the wing imports run one way: config, launch <- optimisers <- lit; config, launch <- monitoring <- runs
<- lifecycle (which may import all of them and lit).
"""
