"""qkv: attention, heads and multi-head attention, checked against real libraries.

The package behind the book *Queries, Keys and Values*. Every public name is
importable from the top level::

    import qkv
    output, weights = qkv.attention(query, key, value, mask=qkv.causal_mask(T))

Submodules: :mod:`qkv.diagrams` (pictures of the data flow, drawn from the
objects), :mod:`qkv.interop` (other libraries' layouts), :mod:`qkv.checks`
(property checks for any attention code), :mod:`qkv.gradients` (the backward
pass by hand), :mod:`qkv.data` (synthetic tasks), :mod:`qkv.models` (small
models) and :mod:`qkv.training` (the training loop).
"""

from qkv import checks, data, diagrams, gradients, interop, models, training
from qkv.attention import attention, fused_attention
from qkv.cache import KeyValue, KVCache
from qkv.heads import HeadWeights, merge_heads, multi_head_attention, split_heads
from qkv.masks import additive_mask, causal_mask, from_torch_mask, padding_mask
from qkv.multihead import AttentionHead, MultiHeadAttention, PerHeadMultiHeadAttention
from qkv.notebook import get_device, glue, restart_notice, seed_everything, setup
from qkv.plots import plot_attention, plot_heads
from qkv.rotary import RotaryEmbedding, apply_rotary, half_to_interleaved, interleaved_to_half
from qkv.view import AttentionView

__version__ = "0.1.0"

__all__ = [
    "AttentionHead",
    "AttentionView",
    "HeadWeights",
    "KVCache",
    "KeyValue",
    "MultiHeadAttention",
    "PerHeadMultiHeadAttention",
    "RotaryEmbedding",
    "__version__",
    "additive_mask",
    "apply_rotary",
    "attention",
    "causal_mask",
    "checks",
    "data",
    "diagrams",
    "from_torch_mask",
    "fused_attention",
    "get_device",
    "glue",
    "gradients",
    "half_to_interleaved",
    "interleaved_to_half",
    "interop",
    "merge_heads",
    "models",
    "multi_head_attention",
    "padding_mask",
    "plot_attention",
    "plot_heads",
    "restart_notice",
    "seed_everything",
    "setup",
    "split_heads",
    "training",
]
