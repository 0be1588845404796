"""Hydra instantiates sweepers only from the `hydra_plugins` namespace: this package holds archsweep's
(`hydra/sweeper=halving`, halving_sweeper.py; `halving_sweeper.register()` makes it known to Hydra)."""
