"""Model wing: `ModelConfig` and its validation, `build_model`, checkpoints. Imports only `archsweep.variants`."""
