"""src/variants stays plain PyTorch: building and running any model imports no framework."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("lightning", "pytorch_lightning", "hydra", "omegaconf", "wandb", "torchmetrics")


def test_variants_and_builder_import_no_framework():
    code = (
        "import sys, torch\n"
        "from archsweep.core.model.build import ModelConfig, build_model\n"
        "import archsweep.variants.model, archsweep.variants.attention, archsweep.variants.cache\n"
        "m = build_model(ModelConfig(kind='decoder_only', vocab_size=10, d_model=16, n_heads=2, n_layers=1))\n"
        "m(torch.ones(1, 3, dtype=torch.long))\n"
        f"print(sorted(k for k in sys.modules if k.split('.')[0] in {FORBIDDEN!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_variant_sources_do_not_mention_framework_imports():
    for path in (ROOT / "src" / "variants").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")):
                assert stripped.split()[1].split(".")[0] not in FORBIDDEN, f"{path}: {stripped}"
