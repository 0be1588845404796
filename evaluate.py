"""Test-set metrics of a train.py checkpoint, overall and by source length, into a file beside it (README:
Decoding).

    python evaluate.py ckpt=<checkpoint or run dir>
    python evaluate.py ckpt=... decoding=beam decoding.beam_size=4 task.long_max_len=40
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from src.core.inference import run_evaluate

    try:
        run_evaluate(cfg)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
