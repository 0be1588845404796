"""Decode from a train.py checkpoint (README: Decoding).

    python generate.py ckpt=<checkpoint or run dir> prompt="3 1 4 1 5"
    python generate.py ckpt=... prompt="..." decoding=beam decoding.beam_size=4 decoding.n_best=2
    python generate.py ckpt=... prompt="ROMEO:" decoding=sample decoding.temperature=0.8 decoding.top_p=0.9
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    from src.core.inference import run_generate

    try:
        run_generate(cfg)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
