"""qkv: attention, heads and multi-head attention, checked against real libraries.

The package behind the book *Queries, Keys and Values*. Every public name is
importable from the top level::

    import qkv
    output, weights = qkv.attention(query, key, value, mask=qkv.causal_mask(T))
"""

from qkv.notebook import get_device, seed_everything, setup

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "get_device",
    "seed_everything",
    "setup",
]
