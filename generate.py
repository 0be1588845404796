"""Decode from a train.py checkpoint (docs/decoding.md); same as `archsweep-generate`.

    python generate.py ckpt=<checkpoint or run dir> prompt="3 1 4 1 5"
    python generate.py ckpt=... prompt="..." decoding=beam decoding.beam_size=4 decoding.n_best=2
    python generate.py ckpt=... prompt="ROMEO:" decoding=sample decoding.temperature=0.8 decoding.top_p=0.9
"""

from archsweep.cli import generate

if __name__ == "__main__":
    generate()
