"""`vit` (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words"): the encoder stack over an image's patches.
The image is cut into P x P patches, each projected to D (`PatchEmbedding`), a class token is prepended
(`pooling=cls`) and the stack's positional encoding, norm placement, attention kind and FFN apply as to any
sequence; the class token (or, with `pooling=mean`, the mean over the patch tokens, as in Beyer et al. 2022)
after the final norm goes through the head: the paper's pre-training MLP (dense + tanh, `head_hidden` wide) then
a linear layer, or one linear layer (`head_hidden=null`, the fine-tuning head and Hugging Face's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from archsweep.variants.blocks import Stack
from archsweep.variants.flops import Shape, forward_flops
from archsweep.variants.model import IMAGE, KIND
from archsweep.variants.model.base import ModelKind, Parts
from archsweep.variants.patches import PatchEmbedding, image_hw, patch_grid
from archsweep.variants.plugins.base import OutputPlugins
from archsweep.variants.roles import HEAD

POOLINGS = ("cls", "mean")  # the class token, or the mean over the patch tokens (no class token)


@KIND.register("vit")
class VisionTransformer(ModelKind):
    form = IMAGE
    own_fields = ("image_size", "patch_size", "in_channels", "head_hidden")

    def __init__(self, embed: PatchEmbedding, encoder: Stack, d_model: int, n_classes: int,
                 head_hidden: int | None, grid: tuple[int, int], plugins: OutputPlugins | None = None) -> None:
        super().__init__()
        self.embed, self.encoder = embed, encoder
        self.patch_grid = grid  # (H / P, W / P)
        width = head_hidden or d_model
        self.pre_logits = nn.Sequential(nn.Linear(d_model, width), nn.Tanh()) if head_hidden else nn.Identity()
        self.classifier = nn.Linear(width, n_classes)
        self.plugins = plugins if plugins is not None else OutputPlugins()  # on the class logits

    def roles(self) -> dict[str, str]:
        return {"classifier.weight": HEAD}

    @classmethod
    def assemble(cls, parts: Parts) -> VisionTransformer:
        s = parts.sizes
        embed = PatchEmbedding(s["in_channels"], s["patch_size"], s["d_model"], class_token=s["pooling"] == "cls")
        encoder = parts.stack("encoder", nn.Identity(), s["n_layers"], causal=False, cross=False)
        return cls(embed, encoder, s["d_model"], s["n_classes"], s["head_hidden"],
                   patch_grid(s["image_size"], s["patch_size"]), parts.output_plugins())

    @property
    def n_prefix(self) -> int:
        """Tokens before the patches in the stack's sequence (1: the class token; 0 with mean pooling)."""
        return self.embed.n_prefix

    @classmethod
    def n_tokens(cls, sizes: Mapping[str, Any]) -> int:
        """Length of the sequence the stack reads: N = (H / P)(W / P) patches, plus the class token."""
        gh, gw = patch_grid(sizes["image_size"], sizes["patch_size"])
        return gh * gw + (sizes["pooling"] == "cls")

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        size, p = sizes["image_size"], sizes["patch_size"]
        if sizes["pooling"] not in POOLINGS:
            raise ValueError(f"pooling={sizes['pooling']!r} is not a known option for kind=vit; valid options: "
                             f"{', '.join(POOLINGS)}")
        ok_size = isinstance(size, int) and size > 0 or isinstance(size, (list, tuple)) and len(size) == 2 and all(
            isinstance(v, int) and v > 0 for v in size)
        if not ok_size:
            raise ValueError(f"image_size={size!r} must be the image's [height, width] (or one int for a square); "
                             f"an image task sets it (leave model.image_size=null)")
        for name in ("in_channels", "patch_size"):
            if not isinstance(sizes[name], int) or sizes[name] < 1:
                raise ValueError(f"{name}={sizes[name]!r} must be a positive integer")
        h, w = image_hw(size)
        if h % p or w % p:
            divisors = [d for d in range(1, min(h, w) + 1) if h % d == 0 and w % d == 0]
            raise ValueError(f"patch_size={p} must divide the image size {h}x{w}; choose patch_size among "
                             f"{', '.join(map(str, divisors))}")
        if sizes["head_hidden"] is not None and (not isinstance(sizes["head_hidden"], int) or sizes["head_hidden"] < 1):
            raise ValueError(f"head_hidden={sizes['head_hidden']!r} must be a positive width (the MLP head's hidden "
                             f"layer) or null (one linear layer)")

    @classmethod
    def doc_mask_refusal(cls, options: Mapping[str, Any]) -> str | None:
        return "it reads images, not token documents packed into one row"

    def encode(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> hidden states (B, N (+ 1), D) after the final norm."""
        return self.encoder(self.embed(images))

    def forward(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> class logits (B, n_classes)."""
        hidden = self.encode(images)  # (B, T, D)
        pooled = hidden[:, 0] if self.embed.cls_token is not None else hidden.mean(dim=1)  # (B, D)
        return self.plugins(self.classifier(self.pre_logits(pooled)))

    def flops(self, shape: Shape) -> float:
        """Per image: the patch projection, the stack over N (+ 1) tokens, the head once (`shape.length` is
        ignored: the image size fixes it)."""
        gh, gw = self.patch_grid
        tokens = Shape(shape.batch, gh * gw + self.n_prefix)
        once = Shape(shape.batch, 1)
        return (self.embed.flops(Shape(shape.batch, gh * gw)) + forward_flops(self.encoder, tokens)
                + forward_flops(self.pre_logits, once) + forward_flops(self.classifier, once))
