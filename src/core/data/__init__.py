"""Reading corpora, tokenizers and the prepared-data cache behind the file-based tasks (text, translation).

Nothing here imports torch: tasks prepare their data while train.py checks a config, before the heavy imports.
"""
