"""Train wing, a run on disk and in a sweep: its directory, claimed and locked (`rundir`), who it is (`runinfo`:
choices, overrides, W&B name), what it reports (`results`: results.json, read by the report wing too), resuming
it (`resume`), and the sweep's summary of its jobs (`sweep`). Imports the model wing and the train wing's `config`,
`launch` and `monitoring` (the console).
"""
