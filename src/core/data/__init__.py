"""Data wing: tasks (`data.tasks`), corpora, tokenizers, the token codec, the prepared-data cache, and token shards
(`data.shards`: the format and its readers; `data.prepare`: the `archsweep-prepare` command). Imports
`archsweep.variants` and the model wing.

Reading and preparing data imports no torch: tasks prepare their data while train.py checks a config, before the
heavy imports.
"""
