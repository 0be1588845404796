"""Data wing: tasks (`data.tasks`), corpora, tokenizers, the token codec and the prepared-data cache. Imports
`archsweep.variants` and the model wing.

Reading and preparing data imports no torch: tasks prepare their data while train.py checks a config, before the
heavy imports.
"""
