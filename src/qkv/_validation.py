"""The one place where public entry points check their arguments.

Every message names the argument, what was expected and what arrived, with
the numbers, so that a mistake is found at the call that made it rather than
deep inside a matrix product.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
from torch import Tensor


def shape_str(shape: Sequence[int]) -> str:
    """Format a shape as ``(2, 3, 4)``."""
    return "(" + ", ".join(str(int(n)) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def require_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int if it is a positive integer (NumPy's too), else raise."""
    if isinstance(value, bool) or isinstance(value, float):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    try:
        number = operator.index(value)  # int, numpy.int64, 0-d integer tensors
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if number <= 0:
        raise ValueError(f"{name} must be positive, got {number}")
    return number


def require_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool, else raise (``"yes"`` is not a flag)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return value


def require_tensor(
    name: str,
    x: object,
    *,
    ndim: int | None = None,
    min_ndim: int | None = None,
    layout: str | None = None,
    floating: bool = True,
) -> Tensor:
    """Check that ``x`` is a tensor of the right kind and rank.

    Parameters
    ----------
    name : str
        The argument's name, used in the message.
    x : object
        What was passed.
    ndim, min_ndim : int, optional
        The exact or the least number of dimensions.
    layout : str, optional
        A description of the expected axes, e.g. ``"(B, T, embed_dim)"``.
    floating : bool
        Require a floating-point dtype.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    where = f" {layout}" if layout else ""
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions{where}, got shape {shape_str(x.shape)}")
    if min_ndim is not None and x.dim() < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions{where}, got shape {shape_str(x.shape)}"
        )
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def require_same_dtype_and_device(named: dict[str, Tensor]) -> None:
    """Check that all tensors share one dtype and one device."""
    items = list(named.items())
    first_name, first = items[0]
    for name, x in items[1:]:
        if x.dtype != first.dtype:
            raise TypeError(
                f"{name} has dtype {x.dtype}, but {first_name} has dtype {first.dtype}; "
                "convert one of them with .to()"
            )
        if x.device != first.device:
            raise ValueError(
                f"{name} is on {x.device}, but {first_name} is on {first.device}; move one of them with .to()"
            )


def require_size(name: str, x: Tensor, dim: int, expected: int, what: str, against: str) -> None:
    """Check one axis, e.g. ``key has 15 features, but kdim is 16``."""
    got = x.shape[dim]
    if got != expected:
        raise ValueError(
            f"{name} has {got} {what}, but {against} is {expected} ({name} has shape {shape_str(x.shape)})"
        )


def require_mask(
    mask: object, target: Sequence[int], layout: str, device: torch.device | None = None
) -> Tensor:
    """Check a boolean attention mask (True = may attend) against the scores' shape.

    Parameters
    ----------
    mask : object
        What was passed as the mask.
    target : sequence of int
        The shape of the attention scores the mask must broadcast to.
    layout : str
        The names of the target's axes, e.g. ``"(B, h, T, S)"``.
    device : torch.device, optional
        The device of the query the mask goes with.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a boolean torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean (True = may attend), got dtype {mask.dtype}; "
            "for a 0/1 mask use mask.bool(), for an additive mask use mask == 0"
        )
    target = tuple(target)
    ok = mask.dim() <= len(target)
    if ok:
        try:
            ok = torch.broadcast_shapes(mask.shape, target) == target
        except RuntimeError:
            ok = False
    if not ok:
        raise ValueError(
            f"mask of shape {shape_str(mask.shape)} does not broadcast to the attention "
            f"scores' shape {layout} = {shape_str(target)}; a padding mask over keys has "
            "shape (B, 1, 1, S) (see qkv.padding_mask), a causal mask (T, S)"
        )
    if device is not None and mask.device != device:
        raise ValueError(f"mask is on {mask.device}, but query is on {device}")
    return mask


def require_multi_head_inputs(
    query: object,
    key: object,
    value: object,
    mask: object | None,
    *,
    num_heads: int,
    embed_dim: int,
    kdim: int,
    vdim: int,
    embed_name: str = "embed_dim",
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Check the batch-first inputs of a multi-head attention layer and its mask.

    ``query`` (B, T, embed_dim), ``key`` (B, S, kdim), ``value`` (B, S, vdim),
    floating point; one batch size; keys and values of one length; a boolean
    mask broadcastable to (B, h, T, S). Dtypes and devices are the caller's to
    check against its weights.
    """
    q = require_tensor("query", query, ndim=3, layout=f"(B, T, {embed_name})")
    k = require_tensor("key", key, ndim=3, layout="(B, S, kdim)")
    v = require_tensor("value", value, ndim=3, layout="(B, S, vdim)")
    require_size("query", q, 2, embed_dim, "features", embed_name)
    require_size("key", k, 2, kdim, "features", "kdim")
    require_size("value", v, 2, vdim, "features", "vdim")
    require_size("value", v, 1, k.shape[1], "positions", "the key's length S")
    require_size("key", k, 0, q.shape[0], "sequences in the batch", "the query's batch size")
    require_size("value", v, 0, q.shape[0], "sequences in the batch", "the query's batch size")
    m = None
    if mask is not None:
        target = (q.shape[0], num_heads, q.shape[1], k.shape[1])
        if isinstance(mask, Tensor) and mask.dim() == 3:
            # (B, T, S) per sequence, as Keras takes it, or (h, T, S) per head? Both
            # broadcast when B == h, with different meanings: refuse to guess.
            raise ValueError(
                f"mask has 3 dimensions {shape_str(mask.shape)}, which is ambiguous: for one "
                "mask per sequence (B, T, S) pass mask[:, None] (B, 1, T, S); for one per head "
                "(h, T, S) pass mask[None] (1, h, T, S)"
            )
        m = require_mask(mask, target, "(B, h, T, S)", q.device)
    return q, k, v, m


def resolve_head_sizes(
    embed_dim: object,
    num_heads: object,
    kdim: object | None = None,
    vdim: object | None = None,
    d_k: object | None = None,
    d_v: object | None = None,
) -> tuple[int, int, int, int, int, int]:
    """Check a multi-head layer's sizes and fill in the defaults.

    ``kdim`` and ``vdim`` default to ``embed_dim``; ``d_k`` to
    ``embed_dim // num_heads``, which must then divide evenly; ``d_v`` to ``d_k``.

    Returns
    -------
    (embed_dim, num_heads, kdim, vdim, d_k, d_v)
    """
    embed_dim = require_positive_int("embed_dim", embed_dim)
    num_heads = require_positive_int("num_heads", num_heads)
    kdim = embed_dim if kdim is None else require_positive_int("kdim", kdim)
    vdim = embed_dim if vdim is None else require_positive_int("vdim", vdim)
    if d_k is None:
        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}: each head "
                "gets embed_dim / num_heads features (or pass d_k explicitly)"
            )
        d_k = embed_dim // num_heads
    d_k = require_positive_int("d_k", d_k)
    d_v = d_k if d_v is None else require_positive_int("d_v", d_v)
    return embed_dim, num_heads, kdim, vdim, d_k, d_v
