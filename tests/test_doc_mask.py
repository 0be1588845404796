"""Document masking (issue 27): with `doc_ids` a token attends only within its document and positions restart at
each document; the KV cache keeps the documents; kinds that cannot mask refuse. The options come from conf/, so a
new yaml is covered without editing this file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from archsweep.core.data.tasks.forward import forward_tokens
from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.model.config import check_doc_mask
from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.layers import capture_attention
from archsweep.variants.blocks import document_positions
from archsweep.variants.cache import KVCache
from archsweep.variants.model import KIND
from archsweep.variants.pos import POS

CONF = Path(__file__).resolve().parents[1] / "conf"
VOCAB, PAD = 23, 0


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def attention_refusal(name: str) -> str | None:
    return ATTENTION.get(name).doc_mask_refusal(ModelConfig(attention=name).options("attention"))


KINDS = [k for k in options("model") if KIND.get(k).doc_mask_refusal({}) is None]
REFUSING_KINDS = [k for k in options("model") if k not in KINDS]
ATTENTIONS = [a for a in options("attention") if attention_refusal(a) is None]
REFUSING_ATTENTIONS = [a for a in options("attention") if a not in ATTENTIONS]
SEQUENCE_POS = [p for p in options("pos") if not POS.get(p).image_only]


def accepted(**fields) -> bool:
    """Whether a decoder with these fields validates (an attention kind may refuse an encoding or grouped heads)."""
    try:
        ModelConfig(kind="decoder_only", vocab_size=VOCAB, d_model=32, n_heads=4, **fields).validate()
    except ValueError:
        return False
    return True


def attention_spec(name: str | dict) -> str | dict:
    """A small window where the kind has one, so documents and the band both matter at these lengths."""
    if isinstance(name, dict):
        return name
    return {"name": name, "window": 3} if "window" in ModelConfig(attention=name).options("attention") else name


ATTENTION_POS = [(a, p) for a in ATTENTIONS for p in SEQUENCE_POS if accepted(attention=attention_spec(a), pos=p)]


def tiny(kind: str, pos: str = "rotary", attention: str | dict = "full", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(kind=kind, vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=64,
               dropout=0.0, pos=pos, norm="pre", attention=attention_spec(attention))
    cfg.update(overrides)
    return build_model(ModelConfig(**cfg)).eval()


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def docs(*lengths_per_row: list[int], first: int = 0) -> torch.Tensor:
    """(B, T) doc ids from document lengths per row; ids count up from `first`."""
    rows = [sum(([first + i] * n for i, n in enumerate(lengths)), []) for lengths in lengths_per_row]
    return torch.tensor(rows)


def changed(x: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    return torch.where(where, x % (VOCAB - 1) + 1, x)


def test_the_options_are_found():
    assert KINDS and ATTENTIONS and len(SEQUENCE_POS) > 1


def test_document_positions_restart_at_each_document():
    ids = torch.tensor([[5, 5, 7, 7, 7, 9], [0, 0, 0, 0, 1, 1]])
    assert document_positions(ids).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 0, 1]]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_a_document_never_sees_another(kind, attention):
    model = tiny(kind, attention=attention)
    x = tokens(2, 40)
    ids = docs([15, 25], [6, 20, 14], first=2)
    with torch.no_grad():
        base = model(x, doc_ids=ids)
        for doc in ids.unique():
            inside = ids == doc
            out = model(changed(x, inside), doc_ids=ids)
            torch.testing.assert_close(out[~inside], base[~inside])  # earlier and later documents alike
            assert not torch.allclose(out[inside], base[inside])
        # without doc_ids the first document's change reaches the second: the masking above is what held
        first = ids == ids[:, :1]
        assert not torch.allclose(model(changed(x, first))[~first], model(x)[~first])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_attention_probabilities_stay_inside_the_document(kind, attention):
    model = tiny(kind, attention=attention)
    ids = docs([4, 5, 3], [9, 3])
    with torch.no_grad(), capture_attention(model) as maps:
        model(tokens(2, 12), doc_ids=ids)
    other = (ids[:, :, None] != ids[:, None, :])[:, None]  # (B, 1, Tq, Tk)
    for probs in (p for per_layer in maps.values() for p in per_layer):
        assert probs.masked_select(other.expand_as(probs)).abs().max() == 0
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attention, pos", ATTENTION_POS)
def test_a_document_after_another_equals_it_alone(kind, attention, pos):
    """Absolute and rotary encodings restart at the document; bias encodings see index distances, which equal
    position distances inside a document, so masking is enough for them."""
    model = tiny(kind, pos, attention)
    before, doc, after = tokens(1, 20, seed=6), tokens(1, 11, seed=5), tokens(1, 5, seed=7)
    row = torch.cat([before, doc, after], dim=1)  # 36 tokens: the windowed kind takes its blocked form
    with torch.no_grad():
        alone = model(doc)
        packed = model(row, doc_ids=docs([20, 11, 5]))[:, 20:31]
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_positions_a_caller_gives_are_used_as_given():
    model = tiny("decoder_only", "learned")
    x, ids = tokens(1, 12), docs([5, 7])
    with torch.no_grad():
        restarted = model(x, doc_ids=ids)
        consecutive = model(x, positions=torch.arange(12)[None], doc_ids=ids)
    torch.testing.assert_close(restarted[:, :5], consecutive[:, :5])
    assert not torch.allclose(restarted[:, 5:], consecutive[:, 5:])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pos", SEQUENCE_POS)
def test_one_document_per_row_equals_no_doc_ids(kind, pos):
    model = tiny(kind, pos)
    x = tokens(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(model(x, doc_ids=torch.full((2, 10), 3)), model(x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_padding_with_documents(kind, attention):
    """Right padding (pads in the last document) and left padding (pads in a document of their own) leave the
    real tokens' outputs as without padding."""
    model = tiny(kind, "learned", attention)
    x, ids = tokens(2, 12), docs([5, 7], [8, 4], first=1)
    pads = torch.full((2, 4), PAD)
    right, right_ids = torch.cat([x, pads], 1), torch.cat([ids, ids[:, -1:].expand(2, 4)], 1)
    left, left_ids = torch.cat([pads, x], 1), torch.cat([torch.zeros(2, 4, dtype=torch.long), ids], 1)
    with torch.no_grad():
        base = model(x, doc_ids=ids)
        torch.testing.assert_close(model(right, right != PAD, doc_ids=right_ids)[:, :12], base, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(left, left != PAD, doc_ids=left_ids)[:, 4:], base, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("window, length", [(4, 8), (4, 20)])  # the band mask over all keys; the blocked form
def test_a_key_inside_the_window_but_in_another_document_is_not_seen(kind, window, length):
    name = next(a for a in ATTENTIONS if "window" in ModelConfig(attention=a).options("attention"))
    model = tiny(kind, attention={"name": name, "window": window})
    x, ids = tokens(1, length), docs([length // 2, length - length // 2])
    near = torch.zeros_like(ids, dtype=torch.bool)
    near[:, length // 2 - 2:length // 2] = True  # the first document's last two tokens: inside the second's window
    seen = ids == 1
    with torch.no_grad():
        torch.testing.assert_close(model(changed(x, near), doc_ids=ids)[seen], model(x, doc_ids=ids)[seen])
        assert not torch.allclose(model(changed(x, near))[seen], model(x)[seen])  # the window alone would see them


def decode(model, x: torch.Tensor, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    cache, out, start = KVCache(max_len=x.shape[1]), [], 0
    for size in chunks:
        out.append(model(x[:, start:start + size], cache=cache, doc_ids=ids[:, start:start + size]))
        start += size
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("attention, pos", ATTENTION_POS)
def test_cached_decoding_with_documents_equals_the_full_forward(attention, pos):
    grouped = {"n_kv_heads": 2} if accepted(attention=attention_spec(attention), n_kv_heads=2) else {}
    model = tiny("decoder_only", pos, attention, **grouped)
    x = tokens(2, 16)
    ids = docs([3, 4, 9], [9, 3, 4])  # the prompt holds several documents; decoding starts new ones
    with torch.no_grad():
        full = model(x, doc_ids=ids)
        torch.testing.assert_close(decode(model, x, ids, [6] + [1] * 10), full, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(decode(model, x, ids, [2, 5, 1, 4, 4]), full, atol=1e-5, rtol=1e-5)


def test_reordered_cache_keeps_each_rows_documents():
    model = tiny("decoder_only", "learned")
    x, ids = tokens(2, 9), docs([3, 6], [6, 3])
    swap = torch.tensor([1, 0])
    with torch.no_grad():
        full = model(x[swap], doc_ids=ids[swap])
        cache = KVCache(max_len=9)
        model(x[:, :5], cache=cache, doc_ids=ids[:, :5])
        cache.reorder(swap)  # beam search keeps rows in another order
        rest = model(x[swap, 5:], cache=cache, doc_ids=ids[swap, 5:])
    torch.testing.assert_close(rest, full[:, 5:], atol=1e-5, rtol=1e-5)


def test_forward_tokens_passes_doc_ids_only_when_the_batch_has_them():
    model = tiny("decoder_only")
    x = tokens(2, 10)
    batch = {"tokens": x, "pad_mask": torch.ones_like(x, dtype=torch.bool), "labels": x}
    ids = docs([4, 6], [7, 3])
    with torch.no_grad():
        torch.testing.assert_close(forward_tokens(model, {**batch, "doc_ids": ids}), model(x, doc_ids=ids))
        torch.testing.assert_close(forward_tokens(model, batch), model(x))
        assert not torch.allclose(forward_tokens(model, {**batch, "doc_ids": ids}), forward_tokens(model, batch))


@pytest.mark.parametrize("attention", REFUSING_ATTENTIONS)
def test_attention_kinds_without_a_score_matrix_refuse(attention):
    with pytest.raises(ValueError, match=rf"task\.doc_mask=true .*attention={attention}: .*task\.doc_mask=false "
                                         rf"or choose attention=.*{ATTENTIONS[0]}"):
        check_doc_mask(ModelConfig(kind=KINDS[0], attention=attention))
    model = tiny(KINDS[0], "none", attention)
    with pytest.raises(ValueError, match=rf"doc_ids were given, but attention={attention} cannot keep documents"):
        model(tokens(1, 6), doc_ids=docs([3, 3]))


@pytest.mark.parametrize("kind", REFUSING_KINDS)
def test_kinds_other_than_one_token_stack_refuse(kind):
    with pytest.raises(ValueError, match=rf"task\.doc_mask=true .*model={kind}: .*task\.doc_mask=false or choose "
                                         rf"model=.*{KINDS[0]}"):
        check_doc_mask(ModelConfig(kind=kind))


def test_encoder_decoder_says_why():
    with pytest.raises(ValueError, match="a target document can have no source tokens"):
        check_doc_mask(ModelConfig(kind="encoder_decoder"))


def test_the_flex_backend_refuses_documents():
    spec = {"name": "sliding_window", "window": 3, "backend": "flex"}
    with pytest.raises(ValueError, match=r"task\.doc_mask=true .*attention=sliding_window: .*backend=flex"):
        check_doc_mask(ModelConfig(kind="decoder_only", attention=spec))
    model = tiny("decoder_only", attention=spec)
    with pytest.raises(ValueError, match="doc_ids were given, but attention=sliding_window .*backend=flex"):
        model(tokens(1, 8), doc_ids=docs([4, 4]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_supported_choices_pass_the_check(kind, attention):
    assert check_doc_mask(ModelConfig(kind=kind, attention=attention)) is None


def test_bad_doc_ids_are_refused():
    model = tiny("decoder_only")
    with pytest.raises(ValueError, match=r"doc_ids has shape \(2, 5\) .*must be an integer tensor shaped like the "
                                         r"new tokens \(batch, tokens\) = \(2, 6\)"):
        model(tokens(2, 6), doc_ids=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="doc_ids has shape .* dtype torch.float32"):
        model(tokens(2, 6), doc_ids=torch.zeros(2, 6))
    with pytest.raises(ValueError, match="doc_ids are on meta but the tokens on cpu"):
        model(tokens(2, 6), doc_ids=torch.zeros(2, 6, dtype=torch.long, device="meta"))
    cache = KVCache(max_len=8)
    model(tokens(1, 3), cache=cache)
    with pytest.raises(ValueError, match="the KV cache holds 3 tokens decoded without them"):
        model(tokens(1, 1), cache=cache, doc_ids=torch.zeros(1, 1, dtype=torch.long))
    cache = KVCache(max_len=8)
    model(tokens(1, 3), cache=cache, doc_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="doc_ids=None, but the KV cache was filled with doc_ids"):
        model(tokens(1, 1), cache=cache)
