"""Train wing, one train.py job from config to results: the checks before any heavy import (`checks`), the job
and the outcome it records (`job`), building, fitting and testing the run (`fit`), the Lightning Trainer and data
module (`trainer`), stopping early (`interrupts`: signals, `Interrupted`, the one place stops are caught), and
budget branches of WSD runs (`branches`). Imports the model, data and eval wings and any part of the train wing.
"""
