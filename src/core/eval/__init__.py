"""Eval wing: decoding (greedy, beam, sampling), the metrics training and evaluate.py share, evaluating and
generating from checkpoints, attention maps, the shape trace. Imports `archsweep.variants`, the model and data
wings."""
