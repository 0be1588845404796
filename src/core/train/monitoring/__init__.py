"""Train wing, what a run measures and shows while it trains: train.py's own Lightning callbacks (progress,
checkpoints, validation at the end; `callbacks`), the `callbacks` config group (`callback_group`), decoding at
validation, the diagnostics and image callbacks, compute and peak memory (FLOPs, MFU), the loggers and metrics.csv,
the console's lines and the run's summary line. Imports the model, data and eval wings, and the train wing's
`config` and `launch`.
"""
