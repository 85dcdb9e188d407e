"""Heads: splitting features into heads, merging them back, and the per-head weights.

"Attention Is All You Need" writes multi-head attention per head,
``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``, then
``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O``. Implementations
instead keep one fused matrix per projection and reshape. :class:`HeadWeights`
holds the weights in the paper's per-head form, in the paper's row-vector
orientation (``Q_i = X W_i^Q + b_i^Q``), and :func:`multi_head_attention`
computes the paper's equations from it directly.

See also
--------
The chapter :doc:`heads` (book/heads.ipynb).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from qkv._validation import (
    InitScheme,
    require_init,
    require_multi_head_inputs,
    require_positive_int,
    require_same_dtype_and_device,
    require_size,
    require_tensor,
    resolve_head_sizes,
    resolve_kv_heads,
    shape_str,
)
from qkv.attention import explicit_attention

__all__ = ["HeadWeights", "merge_heads", "multi_head_attention", "split_heads"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Split features into heads: ``(B, L, h·d) -> (B, h, L, d)``.

    Head ``i`` receives the feature slice ``[i·d, (i+1)·d)``. This is
    ``x.view(B, L, h, d).transpose(1, 2)``; the transpose matters (a bare
    ``view(B, h, L, d)`` mixes positions into heads).

    Parameters
    ----------
    x : Tensor, shape (B, L, h·d)
    num_heads : int
        h; must divide the last dimension.

    Returns
    -------
    Tensor, shape (B, h, L, d)
        A view of ``x`` (no copy).

    See Also
    --------
    merge_heads : the inverse.
    :doc:`heads` : which features land in which head, "Mistake 2".

    Examples
    --------
    >>> import torch, qkv
    >>> qkv.split_heads(torch.zeros(2, 5, 12), 3).shape
    torch.Size([2, 3, 5, 4])
    """
    require_tensor("x", x, ndim=3, layout="(B, L, h·d)", floating=False)
    require_positive_int("num_heads", num_heads)
    features = x.shape[-1]
    if features % num_heads:
        raise ValueError(
            f"x has {features} features, which num_heads={num_heads} does not divide "
            f"(x has shape {shape_str(x.shape)})"
        )
    return split_heads_unchecked(x, num_heads)


def split_heads_unchecked(x: Tensor, num_heads: int) -> Tensor:
    """:func:`split_heads` without argument checks (for qkv's own modules)."""
    batch, length, features = x.shape
    return x.view(batch, length, num_heads, features // num_heads).transpose(1, 2)  # (B, h, L, d)


def expand_kv_heads(x: Tensor, num_heads: int) -> Tensor:
    """Copy each K or V head to every query head of its group: (B, h_kv, S, d) -> (B, h, S, d).

    Grouped-query attention gives K/V head ``j`` to query heads
    ``j·g, ..., j·g + g - 1`` with ``g = h / h_kv``: the order of
    ``repeat_interleave``, as in ``F.scaled_dot_product_attention(enable_gqa=True)``
    and Hugging Face's ``repeat_kv``. No arguments are checked (for qkv's own code).
    """
    groups = num_heads // x.shape[-3]
    if groups == 1:
        return x
    batch, kv_heads, length, dim = x.shape
    expanded = x[:, :, None].expand(batch, kv_heads, groups, length, dim)  # (B, h_kv, g, S, d)
    return expanded.reshape(batch, num_heads, length, dim)  # (B, h, S, d)


def merge_heads(x: Tensor) -> Tensor:
    """Concatenate heads back into features: ``(B, h, L, d) -> (B, L, h·d)``.

    The inverse of :func:`split_heads`: ``Concat(head_1, ..., head_h)`` along
    the feature axis.

    Parameters
    ----------
    x : Tensor, shape (B, h, L, d)

    Returns
    -------
    Tensor, shape (B, L, h·d)

    See Also
    --------
    split_heads
    :doc:`heads/merge` : the heads concatenated, then mixed by the output projection.

    Examples
    --------
    >>> import torch, qkv
    >>> x = torch.randn(2, 5, 12)
    >>> torch.equal(qkv.merge_heads(qkv.split_heads(x, 3)), x)
    True
    """
    require_tensor("x", x, ndim=4, layout="(B, h, L, d)", floating=False)
    return merge_heads_unchecked(x)


def merge_heads_unchecked(x: Tensor) -> Tensor:
    """:func:`merge_heads` without argument checks (for qkv's own modules)."""
    batch, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * dim)  # (B, L, h·d)


@dataclass(eq=False)
class HeadWeights:
    """The weights of multi-head attention in the paper's per-head form.

    Row-vector orientation, as in "Attention Is All You Need":
    ``Q_i = X W_i^Q + b_i^Q``, ``K_i = X W_i^K + b_i^K``, ``V_i = X W_i^V + b_i^V``,
    ``output = Concat(head_1, ..., head_h) W^O + b^O``. (``nn.Linear`` stores the
    transpose: its ``weight`` has shape (out, in).)

    Grouped-query attention has fewer K/V heads than query heads: ``w_k`` and
    ``w_v`` hold ``h_kv`` heads, h_kv dividing h, and query head ``i`` uses K/V
    head ``i // (h / h_kv)``. ``h_kv = 1`` is multi-query attention; ``h_kv = h``
    is the paper's multi-head attention.

    Attributes
    ----------
    w_q : Tensor, shape (h, d_model, d_k)
    w_k : Tensor, shape (h_kv, kdim, d_k)
    w_v : Tensor, shape (h_kv, vdim, d_v)
    w_o : Tensor, shape (h·d_v, d_model)
    b_q : Tensor, shape (h, d_k), or None when the layer has no bias
    b_k : Tensor, shape (h_kv, d_k), or None
    b_v : Tensor, shape (h_kv, d_v), or None
    b_o : Tensor, shape (d_model,), or None

    See Also
    --------
    multi_head_attention : the paper's equations computed from these weights.
    MultiHeadAttention.from_heads, MultiHeadAttention.to_heads
    qkv.interop.from_torch, qkv.interop.from_bert, qkv.interop.from_keras
    :doc:`heads` : the per-head form beside the fused one.

    Examples
    --------
    >>> import qkv
    >>> hw = qkv.HeadWeights.random(embed_dim=12, num_heads=3, kdim=10, vdim=7)
    >>> hw.w_q.shape, hw.w_k.shape, hw.w_v.shape
    (torch.Size([3, 12, 4]), torch.Size([3, 10, 4]), torch.Size([3, 7, 4]))
    >>> hw.w_o.shape
    torch.Size([12, 12])

    Grouped-query attention, 4 query heads sharing 2 K/V heads:

    >>> hw = qkv.HeadWeights.random(embed_dim=16, num_heads=4, num_kv_heads=2)
    >>> hw.w_q.shape, hw.w_k.shape, hw.num_kv_heads
    (torch.Size([4, 16, 4]), torch.Size([2, 16, 4]), 2)
    """

    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    w_o: Tensor
    b_q: Tensor | None = None
    b_k: Tensor | None = None
    b_v: Tensor | None = None
    b_o: Tensor | None = None

    def __post_init__(self) -> None:
        w_q = require_tensor("w_q", self.w_q, ndim=3, layout="(h, d_model, d_k)")
        w_k = require_tensor("w_k", self.w_k, ndim=3, layout="(h, kdim, d_k)")
        w_v = require_tensor("w_v", self.w_v, ndim=3, layout="(h, vdim, d_v)")
        w_o = require_tensor("w_o", self.w_o, ndim=2, layout="(h·d_v, d_model)")
        require_same_dtype_and_device({"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o})
        h, d_model, d_k = w_q.shape
        h_kv, d_v = w_k.shape[0], w_v.shape[2]
        for name, w in (("w_q", w_q), ("w_k", w_k)):
            if w.shape[0] == 0:
                raise ValueError(f"{name} has no heads: its first axis is empty (shape {shape_str(w.shape)})")
        if h % h_kv:
            raise ValueError(
                f"w_k has {h_kv} heads, which does not divide the {h} query heads of w_q: each "
                f"K/V head serves h / h_kv query heads (w_q {shape_str(w_q.shape)}, "
                f"w_k {shape_str(w_k.shape)})"
            )
        require_size("w_v", w_v, 0, h_kv, "heads", "the number of heads in w_k")
        require_size("w_k", w_k, 2, d_k, "features per head", "d_k from w_q")
        require_size("w_o", w_o, 0, h * d_v, "rows", "h·d_v")
        require_size("w_o", w_o, 1, d_model, "columns", "d_model from w_q")
        biases = {"b_q": (h, d_k), "b_k": (h_kv, d_k), "b_v": (h_kv, d_v), "b_o": (d_model,)}
        present = [name for name in biases if getattr(self, name) is not None]
        if present and len(present) != len(biases):
            missing = [name for name in biases if name not in present]
            raise ValueError(
                f"either all biases or none: got {', '.join(present)} but not {', '.join(missing)}"
            )
        for name in present:
            b = require_tensor(name, getattr(self, name), ndim=len(biases[name]))
            if tuple(b.shape) != biases[name]:
                raise ValueError(
                    f"{name} must have shape {shape_str(biases[name])}, got {shape_str(b.shape)}"
                )
            require_same_dtype_and_device({"w_q": w_q, name: b})

    @property
    def num_heads(self) -> int:
        """h, the number of heads."""
        return self.w_q.shape[0]

    @property
    def num_kv_heads(self) -> int:
        """h_kv, the number of K/V heads (h_kv < h for grouped-query attention)."""
        return self.w_k.shape[0]

    @property
    def embed_dim(self) -> int:
        """d_model, the query's (and the output's) feature size."""
        return self.w_q.shape[1]

    @property
    def kdim(self) -> int:
        """The key input's feature size."""
        return self.w_k.shape[1]

    @property
    def vdim(self) -> int:
        """The value input's feature size."""
        return self.w_v.shape[1]

    @property
    def d_k(self) -> int:
        """The size of each head's queries and keys."""
        return self.w_q.shape[2]

    @property
    def d_v(self) -> int:
        """The size of each head's values."""
        return self.w_v.shape[2]

    @property
    def bias(self) -> bool:
        """Whether the layer has biases."""
        return self.b_q is not None

    @property
    def biases(self) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """``(b_q, b_k, b_v, b_o)``, or None when the layer has no bias (all or none)."""
        if self.b_q is None or self.b_k is None or self.b_v is None or self.b_o is None:
            return None
        return self.b_q, self.b_k, self.b_v, self.b_o

    def _map(self, function: Callable[[Tensor], Tensor]) -> HeadWeights:
        """A copy with ``function`` applied to every tensor."""
        tensors: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        changed: dict[str, Any] = {name: None if t is None else function(t) for name, t in tensors.items()}
        return replace(self, **changed)

    def expand_kv_heads(self) -> HeadWeights:
        """The same layer with one K/V head per query head: each shared head copied into its group.

        Grouped-query attention computes exactly what multi-head attention computes
        with these weights, at ``h / h_kv`` times the K/V projection and cache; the
        form that ``torch.nn.MultiheadAttention`` and
        :class:`PerHeadMultiHeadAttention` can hold. ``w_q``, ``w_o`` and their
        biases are the same tensors; the K/V ones are new (``repeat_interleave``,
        through which gradients flow back to the shared heads).

        Examples
        --------
        >>> import torch, qkv
        >>> hw = qkv.HeadWeights.random(16, 4, num_kv_heads=2)
        >>> full = hw.expand_kv_heads()
        >>> full.w_k.shape
        torch.Size([4, 16, 4])
        >>> torch.equal(full.w_k[1], hw.w_k[0]), torch.equal(full.w_k[2], hw.w_k[1])
        (True, True)
        """
        groups = self.num_heads // self.num_kv_heads

        def expand(x: Tensor) -> Tensor:
            return x.repeat_interleave(groups, dim=0)  # (h, ...)

        return replace(
            self, w_k=expand(self.w_k), w_v=expand(self.w_v),
            b_k=None if self.b_k is None else expand(self.b_k),
            b_v=None if self.b_v is None else expand(self.b_v),
        )  # fmt: skip

    def mean_pool_kv_heads(self, num_kv_heads: int) -> HeadWeights:
        """Fewer K/V heads, each the mean of the K/V heads it replaces: a multi-head layer to grouped-query.

        Ainslie et al. (2023) convert a multi-head checkpoint to grouped-query
        attention this way before up-training it: the W^K (and W^V, and their biases)
        of each group of ``h_kv / num_kv_heads`` consecutive K/V heads are averaged
        into one. Unlike :meth:`expand_kv_heads`, this changes what the layer
        computes, unless the heads of each group were equal. ``w_q``, ``w_o`` and
        their biases are the same tensors.

        Parameters
        ----------
        num_kv_heads : int
            The K/V heads to keep; it must divide the current ``h_kv``.

        Returns
        -------
        HeadWeights
            ``w_k`` shaped ``(num_kv_heads, kdim, d_k)``, ``w_v`` shaped
            ``(num_kv_heads, vdim, d_v)``.

        See Also
        --------
        expand_kv_heads : the other way, exact: each K/V head copied into its group.
        :doc:`inference` : what grouped-query attention loses and saves.

        Examples
        --------
        >>> import torch, qkv
        >>> hw = qkv.HeadWeights.random(16, 4)
        >>> pooled = hw.mean_pool_kv_heads(2)
        >>> pooled.w_k.shape, pooled.num_kv_heads
        (torch.Size([2, 16, 4]), 2)
        >>> torch.allclose(pooled.w_k[0], (hw.w_k[0] + hw.w_k[1]) / 2)
        True
        """
        kept = require_positive_int("num_kv_heads", num_kv_heads)
        if self.num_kv_heads % kept:
            raise ValueError(
                f"num_kv_heads must divide the layer's {self.num_kv_heads} K/V heads "
                f"(w_k shaped {shape_str(self.w_k.shape)}), got {kept}"
            )
        group = self.num_kv_heads // kept

        def pool(x: Tensor) -> Tensor:
            return x.reshape(kept, group, *x.shape[1:]).mean(dim=1)  # (num_kv_heads, ...)

        return replace(
            self, w_k=pool(self.w_k), w_v=pool(self.w_v),
            b_k=None if self.b_k is None else pool(self.b_k),
            b_v=None if self.b_v is None else pool(self.b_v),
        )  # fmt: skip

    def to(self, *args: Any, **kwargs: Any) -> HeadWeights:
        """Return a copy with every tensor moved by ``Tensor.to(*args, **kwargs)``."""
        return self._map(lambda t: t.to(*args, **kwargs))

    def detach(self) -> HeadWeights:
        """Return a copy whose tensors are detached clones."""
        return self._map(lambda t: t.detach().clone())

    @classmethod
    def random(
        cls,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        num_kv_heads: int | None = None,
        bias: bool = True,
        init: InitScheme = "linear",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> HeadWeights:
        """Random weights as a fresh layer has them.

        ``init="linear"`` gives every projection the scale of a fresh ``nn.Linear``
        (uniform in ±1/sqrt(fan_in), biases too), as qkv's modules start.
        ``init="torch"`` follows ``torch.nn.MultiheadAttention``: W^Q, W^K, W^V
        Xavier-uniform, over the packed (3·h·d_k, d_model) matrix when
        ``kdim == vdim == embed_dim`` and ``d_k == d_v`` (as torch packs them), over
        each projection's matrix otherwise; W^O as ``nn.Linear``; all biases zero.

        Parameters
        ----------
        embed_dim : int
            d_model.
        num_heads : int
            h.
        kdim, vdim : int, optional
            Feature sizes of the key and value inputs; default ``embed_dim``.
        d_k, d_v : int, optional
            Per-head sizes; default ``embed_dim // num_heads`` (which must then divide).
        num_kv_heads : int, optional
            h_kv, the number of K/V heads, dividing ``num_heads``; default ``num_heads``.
        bias : bool
            Whether to include biases.
        init : {"linear", "torch"}
            The initialisation scheme (above).
        dtype, device, generator
            Passed to ``torch.rand``.

        Returns
        -------
        HeadWeights

        Examples
        --------
        >>> import torch, qkv
        >>> g = torch.Generator().manual_seed(0)
        >>> hw = qkv.HeadWeights.random(12, 3, d_v=2, bias=False, generator=g)
        >>> hw.w_v.shape, hw.w_o.shape, hw.bias
        (torch.Size([3, 12, 2]), torch.Size([6, 12]), False)
        """
        embed_dim, num_heads, kdim, vdim, d_k, d_v = resolve_head_sizes(
            embed_dim, num_heads, kdim, vdim, d_k, d_v
        )
        h_kv = resolve_kv_heads(num_heads, num_kv_heads)
        init = require_init(init)

        def uniform(shape: tuple[int, ...], divisor: float) -> Tensor:
            """Uniform in ±1/divisor."""
            u = torch.rand(shape, dtype=dtype, device=device, generator=generator)
            return (2 * u - 1) / divisor

        h = num_heads
        fan_in = {"q": embed_dim, "k": kdim, "v": vdim}
        # The bound is 1/divisor: nn.Linear's 1/sqrt(fan_in), or Xavier's sqrt(6/(fan_in + fan_out)).
        if init == "linear":
            divisors = {name: n**0.5 for name, n in fan_in.items()}
        elif kdim == vdim == embed_dim and d_k == d_v and h_kv == h:  # torch's packed in_proj_weight
            divisors = dict.fromkeys(fan_in, ((embed_dim + 3 * h * d_k) / 6) ** 0.5)
        else:  # torch's separate q_proj_weight, k_proj_weight, v_proj_weight
            fan_out = {"q": h * d_k, "k": h_kv * d_k, "v": h_kv * d_v}
            divisors = {name: ((n + fan_out[name]) / 6) ** 0.5 for name, n in fan_in.items()}

        def bias_of(shape: tuple[int, ...], fan_in: int) -> Tensor | None:
            if not bias:
                return None
            if init == "torch":
                return torch.zeros(shape, dtype=dtype, device=device)
            return uniform(shape, fan_in**0.5)

        return cls(
            w_q=uniform((h, embed_dim, d_k), divisors["q"]),
            w_k=uniform((h_kv, kdim, d_k), divisors["k"]),
            w_v=uniform((h_kv, vdim, d_v), divisors["v"]),
            w_o=uniform((h * d_v, embed_dim), (h * d_v) ** 0.5),
            b_q=bias_of((h, d_k), embed_dim),
            b_k=bias_of((h_kv, d_k), kdim),
            b_v=bias_of((h_kv, d_v), vdim),
            b_o=bias_of((embed_dim,), h * d_v),
        )


def check_multi_head_args(
    query: object, key: object, value: object, weights: object, mask: object | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Validate the arguments of :func:`multi_head_attention` (and of its backward pass)."""
    if not isinstance(weights, HeadWeights):
        raise TypeError(f"weights must be a HeadWeights, got {type(weights).__name__}")
    q, k, v, m, _ = require_multi_head_inputs(
        query, key, value, mask, num_heads=weights.num_heads, embed_dim=weights.embed_dim,
        kdim=weights.kdim, vdim=weights.vdim, embed_name="d_model",
    )  # fmt: skip
    require_same_dtype_and_device({"weights.w_q": weights.w_q, "query": q, "key": k, "value": v})
    return q, k, v, m


def multi_head_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    weights: HeadWeights,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Multi-head attention written as the paper writes it, from per-head weights.

    ``head_i = softmax(Q_i K_iᵀ / sqrt(d_k)) V_i`` with ``Q_i = query W_i^Q + b_i^Q``
    (and likewise K_i, V_i), then ``Concat(head_1, ..., head_h) W^O + b^O``.
    A reference implementation: clear rather than fast. With grouped-query
    weights (``weights.num_kv_heads < num_heads``), head i uses K/V head
    ``i // (h / h_kv)``.

    Parameters
    ----------
    query : Tensor, shape (B, T, d_model)
    key : Tensor, shape (B, S, kdim)
    value : Tensor, shape (B, S, vdim)
    weights : HeadWeights
    mask : Tensor, optional, broadcastable to (B, h, T, S)
        Boolean (True means "may attend") or floating (added to the scores), as
        for :func:`qkv.attention`.

    Returns
    -------
    output : Tensor, shape (B, T, d_model)
    attention_weights : Tensor, shape (B, h, T, S)

    See Also
    --------
    MultiHeadAttention : the same maths with fused projections.
    :doc:`heads/ladder` : the paper's form as the first rung.

    Examples
    --------
    >>> import torch, qkv
    >>> hw = qkv.HeadWeights.random(embed_dim=12, num_heads=3, kdim=10, vdim=10)
    >>> decoder, encoder = torch.randn(2, 4, 12), torch.randn(2, 6, 10)
    >>> output, weights = qkv.multi_head_attention(decoder, encoder, encoder, hw)
    >>> output.shape, weights.shape
    (torch.Size([2, 4, 12]), torch.Size([2, 3, 4, 6]))
    """
    q, k, v, mask = check_multi_head_args(query, key, value, weights, mask)
    parts = multi_head_forward_unchecked(q, k, v, weights, mask)
    return parts.output, parts.weights


def project_heads(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """Every head's projection ``x W_i + b_i`` at once: (B, L, m), (h, m, d) -> (B, h, L, d)."""
    out = torch.einsum("blm,hmd->bhld", x, w)  # (B, h, L, d)
    return out if b is None else out + b[None, :, None, :]  # (B, h, L, d)


class MultiHeadParts(NamedTuple):
    """The paper's forward pass, step by step (what the backward pass reuses)."""

    output: Tensor  # (B, T, d_model)
    weights: Tensor  # (B, h, T, S)
    q_heads: Tensor  # (B, h, T, d_k): Q_i = query W_i^Q + b_i^Q
    k_heads: Tensor  # (B, h_kv, S, d_k), one per K/V head
    v_heads: Tensor  # (B, h_kv, S, d_v)
    concat: Tensor  # (B, T, h·d_v): Concat(head_1, ..., head_h)


def multi_head_forward_unchecked(
    query: Tensor, key: Tensor, value: Tensor, w: HeadWeights, mask: Tensor | None
) -> MultiHeadParts:
    """:func:`multi_head_attention` without argument checks, keeping every step."""
    q_heads = project_heads(query, w.w_q, w.b_q)  # (B, h, T, d_k)
    k_heads = project_heads(key, w.w_k, w.b_k)  # (B, h_kv, S, d_k)
    v_heads = project_heads(value, w.w_v, w.b_v)  # (B, h_kv, S, d_v)
    h = w.num_heads
    heads, weights = explicit_attention(
        q_heads, expand_kv_heads(k_heads, h), expand_kv_heads(v_heads, h), mask
    )  # (B, h, T, d_v)
    concat = merge_heads_unchecked(heads)  # (B, T, h·d_v)
    output = concat @ w.w_o  # (B, T, d_model)
    if w.b_o is not None:
        output = output + w.b_o  # (B, T, d_model)
    return MultiHeadParts(output, weights, q_heads, k_heads, v_heads, concat)
