"""The one place where public entry points check their arguments.

Every message names the argument, what was expected and what arrived, with
the numbers, so that a mistake is found at the call that made it rather than
deep inside a matrix product.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import Literal, SupportsIndex, cast, get_args

import numpy as np
import torch
from torch import Tensor


def shape_str(shape: Sequence[int]) -> str:
    """Format a shape as ``(2, 3, 4)``."""
    return "(" + ", ".join(str(int(n)) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def as_numpy(name: str, x: object) -> np.ndarray:
    """A tensor (any device, bfloat16 too) or a NumPy array, as a NumPy array; anything else raises."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.is_floating_point() else x).numpy()  # NumPy has no bfloat16
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{name} must be a torch.Tensor or a NumPy array, got {type(x).__name__}")


def require_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int if it is a positive integer (NumPy's too), else raise."""
    if isinstance(value, bool) or isinstance(value, float):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    try:
        number = operator.index(cast(SupportsIndex, value))  # int, numpy.int64, 0-d integer tensors
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if number <= 0:
        raise ValueError(f"{name} must be positive, got {number}")
    return number


#: How a multi-head layer's weights start: ``nn.Linear``'s default, or ``torch.nn.MultiheadAttention``'s.
InitScheme = Literal["linear", "torch"]


def require_init(value: object) -> InitScheme:
    """Return ``value`` if it is one of :data:`InitScheme`'s choices, else raise."""
    choices = get_args(InitScheme)
    if value not in choices:
        named = " or ".join(f'"{choice}"' for choice in choices)
        raise ValueError(f"init must be {named}, got {value!r}")
    return cast(InitScheme, value)


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
    require_not_nested(name, x)
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


def require_not_nested(name: str, x: Tensor) -> None:
    """Refuse a nested tensor (``torch.nested``): qkv's shapes, masks and kernels are for regular ones."""
    if x.is_nested:
        raise TypeError(
            f"{name} is a nested tensor (torch.nested), which qkv does not take: pad the sequences "
            f"to one length (torch.nn.utils.rnn.pad_sequence(list({name}.unbind()), batch_first=True)) "
            "and pass which keys are padding "
            "(key_padding_mask, or mask=qkv.padding_mask(lengths))"
        )


# What to pass instead of a floating mask of 0s and 1s, for each argument that takes one.
ZERO_ONE_ADVICE = {
    "mask": "if 1 means 'may attend' (Hugging Face's attention_mask), pass mask.bool(); an additive "
    "mask blocks with -inf (qkv.additive_mask)",
    "key_padding_mask": "for 1 = padding pass key_padding_mask.bool(); for Hugging Face's "
    "attention_mask (1 = real token) pass attention_mask == 0",
    "attn_mask": "torch's boolean attn_mask is True where blocked: for 1 = blocked pass "
    "attn_mask.bool(), for 1 = may attend pass attn_mask == 0 (or mask=attn_mask.bool(), qkv's "
    "convention)",
}


def require_not_zero_one(name: str, values: Tensor | np.ndarray) -> None:
    """Refuse a floating mask that holds only 0 and 1 (at least one 1): it reads as "1 = attend".

    A floating mask is added to the scores, so such a mask blocks nothing: almost
    always a boolean mask converted with ``.float()``. Real additive masks (0 and
    ``-inf``, ``finfo.min``, any bias) pass, and so does a mask of zeros. Not checked
    while ``torch.compile`` or ``torch.export`` traces, where reading a tensor's
    values would break the graph: an eager call checks the same mask.
    """
    if isinstance(values, Tensor) and torch.compiler.is_compiling():
        return
    ones = values == 1
    if bool(ones.any()) and bool((ones | (values == 0)).all()):
        raise TypeError(
            f"{name} holds only 0 and 1 as floats: added to the scores, it would block nothing; "
            + ZERO_ONE_ADVICE.get(name, ZERO_ONE_ADVICE["mask"])
        )


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


def broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without enlarging it."""
    if len(shape) > len(target):
        return False
    trailing = tuple(target)[len(target) - len(shape) :]  # broadcasting aligns the last axes
    for n, t in zip(shape, trailing, strict=True):
        if n != 1 and n != t:
            return False
    return True


def require_bool_mask(name: str, mask: object) -> Tensor:
    """Check that ``mask`` is a boolean tensor (any shape)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a boolean torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be boolean, got dtype {mask.dtype}; for a 0/1 mask use {name}.bool()")
    return mask


def require_mask(
    mask: object,
    target: Sequence[int],
    layout: str,
    device: torch.device | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Check an attention mask against the scores' shape.

    A mask is boolean (True = may attend) or floating (added to the scaled
    scores, ``-inf`` blocks), with at least two dimensions (..., T, S), and
    broadcasts to the scores; a floating one of only 0s and 1s is refused (it
    would block nothing). Every entry point and both paths use this one check.

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
    dtype : torch.dtype, optional
        The query's dtype, which a floating mask must share (as in
        ``F.scaled_dot_product_attention``).
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor (boolean or floating), got {type(mask).__name__}")
    require_not_nested("mask", mask)
    floating = mask.dtype is not torch.bool
    if floating and not mask.is_floating_point():
        raise TypeError(
            f"mask must be boolean (True = may attend) or floating (added to the scores), got dtype "
            f"{mask.dtype}; for a 0/1 mask use mask.bool()"
        )
    shape = mask.shape
    if len(shape) < 2:
        raise ValueError(
            f"mask must have at least 2 dimensions (..., T, S), got shape {shape_str(shape)}; "
            "a mask over the keys alone is mask[None, :], of shape (1, S)"
        )
    if not broadcasts_to(shape, target):
        raise ValueError(
            f"mask of shape {shape_str(shape)} does not broadcast to the attention "
            f"scores' shape {layout} = {shape_str(target)}; a padding mask over keys has "
            "shape (B, 1, 1, S) (see qkv.padding_mask), a causal mask (T, S)"
        )
    if floating and dtype is not None and mask.dtype != dtype:
        raise TypeError(
            f"mask has dtype {mask.dtype}, but query has dtype {dtype}: a floating mask is added "
            "to the scores and must have the query's dtype; convert it with mask.to(query.dtype)"
        )
    if device is not None and mask.device != device:
        raise ValueError(f"mask is on {mask.device}, but query is on {device}")
    if floating:
        require_not_zero_one("mask", mask)
    return mask


def require_dropout(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a probability in [0, 1) (NumPy's floats too), else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    probability = float(value)
    if not 0.0 <= probability < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return probability


def require_scale(scale: object) -> float | None:
    """Return ``scale`` as a float if it is None or a finite positive number, else raise."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    factor = float(scale)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"scale must be a finite positive number, got {scale}")
    return factor


def require_causal_sizes(T: int, S: int) -> None:
    """``is_causal`` aligns the mask to the bottom right, which needs S >= T."""
    if S < T:
        raise ValueError(
            f"is_causal=True needs at least as many keys as queries, got T={T} queries and S={S} keys "
            "(qkv aligns the causal mask to the bottom right: the queries are the last T positions)"
        )


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
    batch_first: bool = True,
    key_padding_mask: object | None = None,
    past: int = 0,
    attn_mask: object | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """Check the inputs of a multi-head attention layer and its masks.

    ``query`` (B, T, embed_dim), ``key`` (B, S, kdim), ``value`` (B, S, vdim),
    floating point, or sequence first, (T, B, embed_dim) and so on, when
    ``batch_first`` is False; one batch size; keys and values of one length; a
    mask broadcastable to (B, h, T, S), boolean or of the query's dtype; a key
    padding mask of shape (B, S); or torch's ``attn_mask`` instead of ``mask``. With
    ``past`` keys already cached, the masks cover S = past + the key's length. Dtypes
    and devices of the weights are the caller's to check.

    Returns
    -------
    query, key, value, mask, key_padding_mask
        The inputs, batch first (a transposed view when ``batch_first`` is False);
        ``mask`` in qkv's convention, from ``mask`` or from ``attn_mask``.
    """
    first, second = (0, 1) if batch_first else (1, 0)  # the batch axis, the position axis
    # The usual case in one pass (a layer runs once per token when decoding); only when it
    # fails do the checks below, one by one, find what is wrong and say it.
    if not _multi_head_shapes_fit(query, key, value, (embed_dim, kdim, vdim), first, second):
        lead = ("(B, T", "(B, S") if batch_first else ("(T, B", "(S, B")  # the caller's axis names
        q = require_tensor("query", query, ndim=3, layout=f"{lead[0]}, {embed_name})")
        k = require_tensor("key", key, ndim=3, layout=f"{lead[1]}, kdim)")
        v = require_tensor("value", value, ndim=3, layout=f"{lead[1]}, vdim)")
        require_size("query", q, 2, embed_dim, "features", embed_name)
        require_size("key", k, 2, kdim, "features", "kdim")
        require_size("value", v, 2, vdim, "features", "vdim")
        require_size("value", v, second, k.shape[second], "positions", "the key's length S")
        require_size("key", k, first, q.shape[first], "sequences in the batch", "the query's batch size")
        require_size("value", v, first, q.shape[first], "sequences in the batch", "the query's batch size")
    q, k, v = cast(Tensor, query), cast(Tensor, key), cast(Tensor, value)
    if not batch_first:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (B, T, ·), (B, S, ·)
    m, padding = require_attention_masks(
        mask, key_padding_mask, q, past + k.shape[1], num_heads, past, attn_mask=attn_mask
    )
    return q, k, v, m, padding


def require_attention_masks(
    mask: object | None,
    key_padding_mask: object | None,
    query: Tensor,
    S: int,
    num_heads: int,
    past: int = 0,
    *,
    attn_mask: object | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """Check a layer's ``mask`` against (B, h, T, S) and its ``key_padding_mask`` against (B, S).

    ``query`` is batch first, (B, T, features); S counts every key attended to,
    the ``past`` ones already in a cache included. ``attn_mask``, torch's mask (see
    :func:`require_torch_attn_mask`), may stand in for ``mask``, not beside it.

    Returns
    -------
    mask, key_padding_mask
        ``mask`` in qkv's convention (True = may attend, or additive), broadcastable
        to (B, h, T, S); ``key_padding_mask`` as given (torch's convention).
    """
    if mask is None and key_padding_mask is None and attn_mask is None:
        return None, None
    q = query
    batch, T = q.shape[0], q.shape[1]
    m = None
    if attn_mask is not None:
        if mask is not None:
            raise ValueError(
                "pass mask= (qkv's convention: True = may attend) or attn_mask= (torch's: True = "
                "blocked), not both; combine them into one, e.g. mask & ~attn_mask for boolean ones"
            )
        m = require_torch_attn_mask(attn_mask, batch, num_heads, T, S, q, past)
    elif mask is not None:
        if isinstance(mask, Tensor) and not mask.is_nested and mask.dim() == 3:
            # (B, T, S) per sequence, as Keras takes it, or (h, T, S) per head? Both
            # broadcast when B == h, with different meanings: refuse to guess.
            raise ValueError(
                f"mask has 3 dimensions {shape_str(mask.shape)}, which is ambiguous: for one "
                "mask per sequence (B, T, S) pass mask[:, None] (B, 1, T, S); for one per head "
                "(h, T, S) pass mask[None] (1, h, T, S)"
            )
        layout = f"(B, h, T, S = {past} cached + {S - past} new)" if past else "(B, h, T, S)"
        m = require_mask(mask, (batch, num_heads, T, S), layout, q.device, dtype=q.dtype)
    padding = None
    if key_padding_mask is not None:
        padding = require_key_padding_mask(key_padding_mask, batch, S, q, past)
    return m, padding


def require_torch_attn_mask(
    attn_mask: object, batch: int, num_heads: int, T: int, S: int, query: Tensor, past: int = 0
) -> Tensor:
    """Check ``torch.nn.MultiheadAttention``'s ``attn_mask`` and return it as a qkv mask.

    torch's meaning exactly: boolean True means *blocked*; floating is added to the
    scores; (T, S) for every sequence and head, or (B·h, T, S), row ``b·h + i`` for
    sequence b and head i (torch's order). (h, T, S) for an unbatched query, which
    the caller has made a batch of one.

    Returns
    -------
    Tensor, shape (T, S) or (B, h, T, S)
        True where attention is allowed (boolean), or the same additive mask.
    """
    name = "attn_mask"
    if not isinstance(attn_mask, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor (boolean, True = blocked, or floating, added to the "
            f"scores), got {type(attn_mask).__name__}"
        )
    require_not_nested(name, attn_mask)
    blocked = attn_mask
    if blocked.dtype != torch.bool and not blocked.is_floating_point():
        raise TypeError(
            f"{name} must be boolean (True = blocked, torch's convention) or floating (added to the "
            f"scores), got dtype {blocked.dtype}; for a 0/1 mask with 1 = blocked use {name}.bool()"
        )
    two_d, three_d = (T, S), (batch * num_heads, T, S)
    if tuple(blocked.shape) not in (two_d, three_d):
        cached = f", with S = {past} cached + {S - past} new keys" if past else ""
        raise ValueError(
            f"{name} must have shape (T, S) = {shape_str(two_d)} or (B·h, T, S) = "
            f"{shape_str(three_d)}{cached}, as torch.nn.MultiheadAttention takes it, got "
            f"{shape_str(blocked.shape)}"
        )
    if blocked.is_floating_point() and blocked.dtype != query.dtype:
        raise TypeError(
            f"{name} has dtype {blocked.dtype}, but query has dtype {query.dtype}: a floating mask is "
            f"added to the scores and must have the query's dtype; convert it with {name}.to(query.dtype)"
        )
    if blocked.device != query.device:
        raise ValueError(f"{name} is on {blocked.device}, but query is on {query.device}")
    if blocked.is_floating_point():
        require_not_zero_one(name, blocked)
    mask = ~blocked if blocked.dtype == torch.bool else blocked  # (T, S) or (B·h, T, S)
    return mask.view(batch, num_heads, T, S) if mask.dim() == 3 else mask  # (T, S) or (B, h, T, S)


def add_batch_axis(
    query: Tensor,
    key: object | None,
    value: object | None,
    key_padding_mask: object | None,
    *,
    embed_dim: int,
    kdim: int,
    vdim: int,
    batch_first: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """An unbatched (T, embed_dim) query, and its key, value and key padding mask, as a batch of one.

    As ``torch.nn.MultiheadAttention`` takes it: key (S, kdim) and value (S, vdim)
    unbatched too, ``key_padding_mask`` (S,). The batch axis goes where the layout
    has it (first, or second when ``batch_first`` is False); the features are
    checked here, so that a message shows the shapes as they were passed.
    """
    axis = 0 if batch_first else 1
    require_size("query", query, 1, embed_dim, "features", "embed_dim")
    tensors: list[Tensor | None] = []
    for name, x, features, against in (("key", key, kdim, "kdim"), ("value", value, vdim, "vdim")):
        if x is None:
            tensors.append(None)
            continue
        layout = f"(S, {against}), as the query is unbatched ({shape_str(query.shape)} = (T, embed_dim))"
        tensor = require_tensor(name, x, ndim=2, layout=layout)
        require_size(name, tensor, 1, features, "features", against)
        tensors.append(tensor.unsqueeze(axis))  # (1, S, ·) or (S, 1, ·)
    padding = key_padding_mask
    if isinstance(padding, Tensor) and not padding.is_nested:
        if padding.dim() != 1:
            got = shape_str(padding.shape)
            raise ValueError(f"key_padding_mask must have shape (S,) for an unbatched query, got {got}")
        padding = padding[None]  # (1, S)
    return query.unsqueeze(axis), tensors[0], tensors[1], cast("Tensor | None", padding)


def _multi_head_shapes_fit(
    query: object, key: object, value: object, features: tuple[int, int, int], first: int, second: int
) -> bool:
    """True when query, key and value are floating 3-D tensors whose sizes agree (see the caller)."""
    if not (isinstance(query, Tensor) and isinstance(key, Tensor) and isinstance(value, Tensor)):
        return False
    if query.is_nested or key.is_nested or value.is_nested:  # a strided one has no .shape
        return False
    if key is query and value is query:  # self-attention, the usual case: one tensor to look at
        shape = query.shape
        return len(shape) == 3 and features == (shape[2],) * 3 and query.is_floating_point()
    q, k, v = query.shape, key.shape, value.shape
    return (
        len(q) == len(k) == len(v) == 3
        and (q[2], k[2], v[2]) == features
        and k[second] == v[second]
        and q[first] == k[first] == v[first]
        and query.is_floating_point()
        and key.is_floating_point()
        and value.is_floating_point()
    )


def require_key_padding_mask(
    key_padding_mask: object, batch: int, S: int, query: Tensor, past: int = 0
) -> Tensor:
    """Check a key padding mask of shape (B, S): True (or -inf) marks padding, as in torch.

    The opposite of :func:`qkv.padding_mask` (B, 1, 1, S), True for a real key: given
    that one, the message points to ``mask=``.
    """
    name = "key_padding_mask"
    if not isinstance(key_padding_mask, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape (B, S), got {type(key_padding_mask).__name__}"
        )
    pad = key_padding_mask
    require_not_nested(name, pad)
    if pad.dtype != torch.bool and not pad.is_floating_point():
        raise TypeError(
            f"{name} must be boolean (True = padding, ignored) or floating (added to the scores), "
            f"got dtype {pad.dtype}; for a 0/1 tensor with 1 for padding use {name}.bool(), for "
            "Hugging Face's attention_mask (1 = real token) use attention_mask == 0"
        )
    if tuple(pad.shape) != (batch, S):
        cached = f", with S = {past} cached + {S - past} new keys" if past else ""
        expected = f"{name} must have shape (B, S) = {shape_str((batch, S))}{cached}"
        if pad.dim() == 4 and pad.shape[1] == pad.shape[2] == 1:
            # qkv.padding_mask's shape, and its meaning is the opposite: True for a real key.
            raise ValueError(
                f"{expected}, got {shape_str(pad.shape)}, the shape of qkv.padding_mask(lengths), "
                "which is True for the real keys: pass it as mask= (qkv's convention, True = may "
                f"attend), or its inverse ~mask[:, 0, 0] as {name} (torch's, True = padding)"
            )
        raise ValueError(f"{expected}, got {shape_str(pad.shape)}")
    if pad.is_floating_point() and pad.dtype != query.dtype:
        raise TypeError(
            f"{name} has dtype {pad.dtype}, but query has dtype {query.dtype}; convert it with .to()"
        )
    if pad.device != query.device:
        raise ValueError(f"{name} is on {pad.device}, but query is on {query.device}")
    if pad.is_floating_point():
        require_not_zero_one(name, pad)
    return pad


def resolve_kv_heads(num_heads: int, num_kv_heads: object | None) -> int:
    """Check ``num_kv_heads`` (h_kv) against ``num_heads``; default ``num_heads``."""
    if num_kv_heads is None:
        return num_heads
    h_kv = require_positive_int("num_kv_heads", num_kv_heads)
    if num_heads % h_kv:
        raise ValueError(
            f"num_kv_heads={h_kv} does not divide num_heads={num_heads}: each K/V head serves "
            f"num_heads / num_kv_heads query heads (1 K/V head is multi-query attention, "
            f"{num_heads} is multi-head attention)"
        )
    return h_kv


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
