"""Train a Transformer variant from the command line (README: Quick start).

    python train.py                              # defaults: encoder_decoder, post-norm, sinusoidal, relu, reverse
    python train.py model=decoder_only norm=pre  # any group=option, any field=value
    python train.py -m norm=pre,post seed=0,1    # a sweep; each job in its own directory

The config is composed and checked before Lightning is imported, so --help and refused configs answer fast.
"""

import time

START = time.time()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    from src.core.job import run_job

    return run_job(cfg, START)


if __name__ == "__main__":
    main()
