"""The model kinds, one file per option, each assembled from the same parts (`base.py`: the base class and
the data forms).

A new kind is one file here with `@KIND.register("<name>")` on its class, and `conf/model/<name>.yaml`."""

from archsweep.variants.registry import Registry

KIND: Registry = Registry("kind", __name__, default="encoder_decoder")

# how a kind reads data (its class's `form`; see base.py)
SOURCE_TARGET = "source_target"  # an encoder reads the source, a decoder predicts the target
CAUSAL = "causal"  # one causal stack over one sequence (a pair packed as a prefix LM)
BIDIRECTIONAL = "bidirectional"  # one bidirectional stack over one sequence (tagging, masked tokens, classes)
FORMS = (SOURCE_TARGET, CAUSAL, BIDIRECTIONAL)  # the token-sequence forms (what a task feeds by default)
IMAGE = "image"  # one bidirectional stack over an image's patches, classifying the image (ViT)
ALL_FORMS = (*FORMS, IMAGE)


def form_of(kind: str) -> str:
    """How the model kind named `kind` reads data (one of ALL_FORMS): its class's `form`."""
    return KIND.get(kind).form


def kinds_of(forms: tuple[str, ...]) -> list[str]:
    """The kinds that read data in one of `forms`."""
    return [k for k in KIND.names() if form_of(k) in forms]
