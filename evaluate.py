"""Test-set metrics of a train.py checkpoint, overall and by source length, into a file beside it (docs/decoding.md);
same as `archsweep-evaluate`.

    python evaluate.py ckpt=<checkpoint or run dir>
    python evaluate.py ckpt=... decoding=beam decoding.beam_size=4 task.long_max_len=40
"""

from archsweep.cli import evaluate

if __name__ == "__main__":
    evaluate()
