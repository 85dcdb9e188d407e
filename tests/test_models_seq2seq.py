"""The cross-attention chapter's encoder-decoder: masks, cached keys and values, and that it learns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.data import AbacusSpellingTask
from qkv.models import DecoderLayer, EncoderDecoderConfig, EncoderLayer, TinyEncoderDecoder
from qkv.training import train

TASK = AbacusSpellingTask(min_digits=2, max_digits=6)


def make_model(**sizes) -> TinyEncoderDecoder:
    torch.manual_seed(0)
    config = EncoderDecoderConfig(TASK.source_vocab_size, TASK.target_vocab_size, **sizes)
    return TinyEncoderDecoder(config).eval()


def test_shapes_and_cross_attention_weights():
    model = make_model(encoder_dim=12, decoder_dim=18, num_heads=3, decoder_layers=2)
    batch = TASK.batch(5, generator=torch.Generator().manual_seed(0))
    (B, S), T = batch.source.shape, batch.target_in.shape[1]
    logits, weights = model(batch.source, batch.source_lengths, batch.target_in, need_weights=True)
    assert logits.shape == (B, T, TASK.target_vocab_size)
    assert len(weights) == 2
    for w in weights:
        assert w.shape == (B, 3, T, S)
        torch.testing.assert_close(w.sum(-1), torch.ones(B, 3, T))
        padded = torch.arange(S)[None, :] >= batch.source_lengths[:, None]  # (B, S)
        assert w.masked_select(padded[:, None, None, :]).abs().max() == 0
    torch.testing.assert_close(model(batch.source, batch.source_lengths, batch.target_in), logits)


def test_cross_attention_has_kdim_and_vdim_of_the_encoder():
    model = make_model(encoder_dim=12, decoder_dim=18, num_heads=3)
    cross = model.decoder[0].cross_attn
    assert (cross.embed_dim, cross.kdim, cross.vdim) == (18, 12, 12)
    assert cross.k_proj.weight.shape == (18, 12) and cross.q_proj.weight.shape == (18, 18)


def test_padded_source_content_does_not_change_the_output():
    model = make_model()
    batch = TASK.batch(6, generator=torch.Generator().manual_seed(1))
    padded = torch.arange(batch.source.shape[1])[None, :] >= batch.source_lengths[:, None]
    assert padded.any()
    scrambled = batch.source.masked_fill(padded, 4)
    before = model(batch.source, batch.source_lengths, batch.target_in)
    after = model(scrambled, batch.source_lengths, batch.target_in)
    torch.testing.assert_close(after, before)


def test_decoder_is_causal():
    model = make_model()
    batch = TASK.batch(4, generator=torch.Generator().manual_seed(2))
    logits = model(batch.source, batch.source_lengths, batch.target_in)
    changed = batch.target_in.clone()
    changed[:, 3:] = 5
    later = model(batch.source, batch.source_lengths, changed)
    torch.testing.assert_close(later[:, :3], logits[:, :3])
    assert not torch.allclose(later[:, 3:], logits[:, 3:])


def test_keys_and_values_computed_once_equal_recomputed():
    model = make_model(encoder_dim=12, decoder_dim=18, num_heads=3, decoder_layers=2)
    batch = TASK.batch(4, generator=torch.Generator().manual_seed(3))
    memory = model.encode(batch.source, batch.source_lengths)
    mask = model.source_mask(batch.source, batch.source_lengths)
    cached = model.memory_keys_values(memory)
    assert [k.shape for k, _ in cached] == [(4, 3, batch.source.shape[1], 6)] * 2
    fresh, w_fresh = model.decode(batch.target_in, mask, memory=memory, need_weights=True)
    reused, w_reused = model.decode(batch.target_in, mask, memory_keys_values=cached, need_weights=True)
    torch.testing.assert_close(reused, fresh)
    for a, b in zip(w_reused, w_fresh, strict=True):
        torch.testing.assert_close(a, b)
    # The fused path (no weights) agrees too.
    torch.testing.assert_close(model.decode(batch.target_in, mask, memory_keys_values=cached), fresh)
    once = model.generate(batch.source, batch.source_lengths, bos_id=TASK.bos_id, max_length=9)
    every_step = model.generate(
        batch.source, batch.source_lengths, bos_id=TASK.bos_id, max_length=9, reuse_keys_values=False
    )
    assert once.shape == (4, 9) and torch.equal(once, every_step)


def test_layers_keep_their_widths():
    x, memory = torch.randn(2, 5, 8), torch.randn(2, 7, 6)
    assert EncoderLayer(6, 2, 12)(memory).shape == (2, 7, 6)
    layer = DecoderLayer(8, 2, 16, memory_dim=6)
    y, weights = layer(x, memory, need_weights=True)
    assert y.shape == (2, 5, 8) and weights.shape == (2, 2, 5, 7)
    torch.testing.assert_close(layer(x, memory_keys_values=layer.memory_keys_values(memory)), y)


def test_it_learns_to_spell():
    model = make_model().train()
    generator = torch.Generator().manual_seed(4)
    held = TASK.batch(128, generator=torch.Generator().manual_seed(5))

    def loss(model, batch):
        logits = model(batch.source, batch.source_lengths, batch.target_in)
        return F.cross_entropy(logits.flatten(0, 1), batch.target_out.flatten(), ignore_index=TASK.pad_id)

    def evaluate(model):
        logits = model(held.source, held.source_lengths, held.target_in)
        real = held.target_out != TASK.pad_id
        return {"accuracy": (logits.argmax(-1) == held.target_out)[real].float().mean()}

    log = train(model, lambda step: TASK.batch(32, generator=generator), loss, steps=80, lr=5e-3,
                warmup=20, log_every=40, evaluate=evaluate)  # fmt: skip
    assert log.loss[-1] < log.loss[0]
    assert log.last("accuracy") > 0.8


def test_bad_arguments_are_named():
    model = make_model()
    source, lengths, target = torch.randint(1, 11, (2, 4)), torch.tensor([4, 2]), torch.ones(2, 3).long()
    with pytest.raises(TypeError, match="config must be an EncoderDecoderConfig"):
        TinyEncoderDecoder({"source_vocab_size": 11})
    with pytest.raises(TypeError, match=r"source must hold token ids \(torch.long\)"):
        model(source.int(), lengths, target)
    with pytest.raises(ValueError, match=r"target_in holds ids from 99 to 99, outside \[0, 9\)"):
        model(source, lengths, target * 99)
    with pytest.raises(ValueError, match="source_lengths has 3 entries, but the source's batch size is 2"):
        model(source, torch.tensor([4, 2, 1]), target)
    memory = model.encode(source, lengths)
    with pytest.raises(ValueError, match="exactly one of memory and memory_keys_values"):
        model.decode(target, model.source_mask(source, lengths))
    with pytest.raises(ValueError, match=r"config\.max_length=32"):
        model.generate(source, lengths, bos_id=1, max_length=40)
    with pytest.raises(ValueError, match=r"memory has 5 features, but config\.encoder_dim is 32"):
        model.memory_keys_values(memory[..., :5])
