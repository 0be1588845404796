"""Train a Transformer variant from the command line (README: The first hour); same as `archsweep-train`.

    python train.py                              # defaults: encoder_decoder, post-norm, sinusoidal, relu, reverse
    python train.py model=decoder_only norm=pre  # any group=option, any field=value
    python train.py -m norm=pre,post seed=0,1    # a sweep; each job in its own directory

The config is composed and checked before Lightning is imported, so --help and refused configs answer fast.
"""

import time

START = time.time()

from archsweep.cli import train  # noqa: E402

if __name__ == "__main__":
    train(START)
