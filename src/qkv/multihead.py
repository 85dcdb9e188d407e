"""Multi-head attention modules: fused projections, and one projection per head.

:class:`MultiHeadAttention` is what libraries do: one ``nn.Linear`` per
projection, then a reshape into heads. :class:`PerHeadMultiHeadAttention` is
what the paper writes: h heads, each with its own small W_i^Q, W_i^K, W_i^V.
They compute the same function; :meth:`~MultiHeadAttention.to_heads` and
:meth:`~MultiHeadAttention.from_heads` move weights between them (and, through
:mod:`qkv.interop`, to and from other libraries).

See also
--------
The chapter "One big W^Q or one per head?" (book/heads.ipynb).
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover - torch itself depends on typing_extensions
    from typing_extensions import Self

from qkv._validation import (
    require_bool,
    require_multi_head_inputs,
    require_positive_int,
    resolve_head_sizes,
)
from qkv.attention import explicit_attention, fused_attention_unchecked
from qkv.heads import HeadWeights, merge_heads_unchecked, split_heads_unchecked

__all__ = ["AttentionHead", "MultiHeadAttention", "PerHeadMultiHeadAttention"]


class _MultiHeadBase(nn.Module):
    """What the two multi-head modules share: sizes, argument checks, conversions."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        sizes = resolve_head_sizes(embed_dim, num_heads, kdim, vdim, d_k, d_v)
        self.embed_dim, self.num_heads, self.kdim, self.vdim, self.d_k, self.d_v = sizes
        self.bias = require_bool("bias", bias)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"dropout must be a float, got {type(dropout).__name__}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dropout = float(dropout)

    def extra_repr(self) -> str:
        sizes = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
        if (self.kdim, self.vdim) != (self.embed_dim, self.embed_dim):
            sizes += f", kdim={self.kdim}, vdim={self.vdim}"
        sizes += f", d_k={self.d_k}, d_v={self.d_v}"
        if not self.bias:
            sizes += ", bias=False"
        if self.dropout:
            sizes += f", dropout={self.dropout}"
        return sizes

    def _check_forward(
        self, query: object, key: object, value: object, mask: object | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Validate forward's arguments once, at the boundary."""
        q, k, v, m = require_multi_head_inputs(
            query, key, value, mask, num_heads=self.num_heads, embed_dim=self.embed_dim,
            kdim=self.kdim, vdim=self.vdim,
        )  # fmt: skip
        parameter = next(self.parameters())
        for name, x in (("query", q), ("key", k), ("value", v)):
            if x.dtype != parameter.dtype:
                raise TypeError(
                    f"{name} has dtype {x.dtype}, but the module's parameters are "
                    f"{parameter.dtype}; convert one of them with .to()"
                )
            if x.device != parameter.device:
                raise ValueError(
                    f"{name} is on {x.device}, but the module's parameters are on "
                    f"{parameter.device}; move one of them with .to()"
                )
        return q, k, v, m

    def _check_heads(self, weights: HeadWeights) -> None:
        if not isinstance(weights, HeadWeights):
            raise TypeError(f"weights must be a HeadWeights, got {type(weights).__name__}")
        expected = (self.num_heads, self.embed_dim, self.kdim, self.vdim, self.d_k, self.d_v)
        got = (weights.num_heads, weights.embed_dim, weights.kdim, weights.vdim,
               weights.d_k, weights.d_v)  # fmt: skip
        if got != expected or weights.bias != self.bias:
            names = "num_heads, embed_dim, kdim, vdim, d_k, d_v"
            raise ValueError(
                f"weights have ({names}) = {got} and bias={weights.bias}, "
                f"but this module has {expected} and bias={self.bias}"
            )

    @classmethod
    def from_heads(cls, weights: HeadWeights, *, dropout: float = 0.0) -> Self:
        """Build a module holding ``weights`` (copied), on their dtype and device.

        Parameters
        ----------
        weights : HeadWeights
            Per-head weights in the paper's orientation.
        dropout : float
            Dropout on the attention weights during training.

        Returns
        -------
        The module, with every size taken from ``weights``.

        Examples
        --------
        >>> import qkv
        >>> hw = qkv.HeadWeights.random(12, 3, kdim=10)
        >>> qkv.PerHeadMultiHeadAttention.from_heads(hw).heads[0].k_proj
        Linear(in_features=10, out_features=4, bias=True)
        """
        if not isinstance(weights, HeadWeights):
            raise TypeError(f"weights must be a HeadWeights, got {type(weights).__name__}")
        module = cls(
            weights.embed_dim,
            weights.num_heads,
            kdim=weights.kdim,
            vdim=weights.vdim,
            d_k=weights.d_k,
            d_v=weights.d_v,
            bias=weights.bias,
            dropout=dropout,
        ).to(dtype=weights.w_q.dtype, device=weights.w_q.device)
        module.load_heads(weights)
        return module

    def load_heads(self, weights: HeadWeights) -> None:
        """Copy per-head weights into this module's parameters (in place)."""
        raise NotImplementedError

    def to_heads(self) -> HeadWeights:
        """The module's weights in the paper's per-head form (detached copies)."""
        raise NotImplementedError


class MultiHeadAttention(_MultiHeadBase):
    """Multi-head attention with fused projections, batch first.

    ``q_proj``, ``k_proj`` and ``v_proj`` are each one ``nn.Linear`` holding
    every head's weights side by side; :func:`qkv.split_heads` cuts the
    projections into heads. Without ``need_weights`` the forward pass runs
    ``F.scaled_dot_product_attention`` (fast, no (T, S) weights kept); with it,
    the explicit computation. Both give the same output.

    Parameters
    ----------
    embed_dim : int
        d_model: the query's feature size, and the output's.
    num_heads : int
        h.
    kdim, vdim : int, optional
        Feature sizes of the key and value inputs (e.g. an encoder's width in
        cross-attention); default ``embed_dim``.
    d_k, d_v : int, optional
        Per-head sizes of queries/keys and of values; default
        ``embed_dim // num_heads``, which must then divide evenly.
    bias : bool
        Whether the four projections have biases.
    dropout : float
        Dropout probability on the attention weights, in training mode only.

    Attributes
    ----------
    q_proj : nn.Linear, embed_dim -> h·d_k
    k_proj : nn.Linear, kdim -> h·d_k
    v_proj : nn.Linear, vdim -> h·d_v
    out_proj : nn.Linear, h·d_v -> embed_dim

    See Also
    --------
    PerHeadMultiHeadAttention : the same maths, one projection per head.
    qkv.interop.to_torch : convert to ``torch.nn.MultiheadAttention``.
    :doc:`heads` : the chapter "One big W^Q or one per head?".

    Examples
    --------
    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(12, 3, kdim=10, vdim=7)
    >>> x, memory = torch.randn(2, 4, 12), torch.randn(2, 6, 10)
    >>> out, w = mha(x, memory, torch.randn(2, 6, 7), need_weights=True)
    >>> out.shape, w.shape
    (torch.Size([2, 4, 12]), torch.Size([2, 3, 4, 6]))
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=vdim, d_k=d_k, d_v=d_v, bias=bias, dropout=dropout
        )
        h = self.num_heads
        self.q_proj = nn.Linear(self.embed_dim, h * self.d_k, bias=bias)
        self.k_proj = nn.Linear(self.kdim, h * self.d_k, bias=bias)
        self.v_proj = nn.Linear(self.vdim, h * self.d_v, bias=bias)
        self.out_proj = nn.Linear(h * self.d_v, self.embed_dim, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Parameters
        ----------
        query : Tensor, shape (B, T, embed_dim)
        key : Tensor, shape (B, S, kdim), optional
            Defaults to ``query`` (self-attention).
        value : Tensor, shape (B, S, vdim), optional
            Defaults to ``key``.
        mask : BoolTensor, optional, broadcastable to (B, h, T, S)
            True means "may attend". (T, S) for one mask for all (e.g.
            :func:`qkv.causal_mask`), (B, 1, 1, S) for padding (:func:`qkv.padding_mask`),
            (B, 1, T, S) per sequence. A 2-D mask is always read as (T, S), and a 3-D
            mask is refused as ambiguous.
        need_weights : bool
            Also return the per-head attention weights (explicit path).

        Returns
        -------
        output : Tensor, shape (B, T, embed_dim)
        weights : Tensor, shape (B, h, T, S)
            Only when ``need_weights`` is True; rows sum to 1 (0 for a query
            with no allowed key). These are the weights before dropout.

        Examples
        --------
        >>> import torch, qkv
        >>> mha = qkv.MultiHeadAttention(12, 3)
        >>> x = torch.randn(2, 5, 12)
        >>> mha(x, mask=qkv.causal_mask(5)).shape  # self-attention, fast path
        torch.Size([2, 5, 12])
        >>> output, weights = mha(x, need_weights=True)
        >>> weights.shape, weights.sum(-1).allclose(torch.ones(2, 3, 5))
        (torch.Size([2, 3, 5, 5]), True)
        """
        key = query if key is None else key
        value = key if value is None else value
        query, key, value, mask = self._check_forward(query, key, value, mask)
        require_bool("need_weights", need_weights)
        h = self.num_heads
        q = split_heads_unchecked(self.q_proj(query), h)  # (B, h, T, d_k)
        k = split_heads_unchecked(self.k_proj(key), h)  # (B, h, S, d_k)
        v = split_heads_unchecked(self.v_proj(value), h)  # (B, h, S, d_v)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            heads, weights = explicit_attention(q, k, v, mask, dropout_p=dropout_p)  # (B, h, T, d_v)
        else:
            heads = fused_attention_unchecked(q, k, v, mask, dropout_p=dropout_p)  # (B, h, T, d_v)
        output = self.out_proj(merge_heads_unchecked(heads))  # (B, T, embed_dim)
        return (output, weights) if need_weights else output

    @torch.no_grad()
    def load_heads(self, weights: HeadWeights) -> None:
        """Copy per-head weights into the fused projections (in place).

        ``nn.Linear`` stores W transposed, so head i's W_i^Q (d_model, d_k)
        becomes rows ``[i·d_k, (i+1)·d_k)`` of ``q_proj.weight``.
        """
        self._check_heads(weights)
        w = weights
        self.q_proj.weight.copy_(w.w_q.transpose(1, 2).reshape(-1, self.embed_dim))  # (h·d_k, d_model)
        self.k_proj.weight.copy_(w.w_k.transpose(1, 2).reshape(-1, self.kdim))  # (h·d_k, kdim)
        self.v_proj.weight.copy_(w.w_v.transpose(1, 2).reshape(-1, self.vdim))  # (h·d_v, vdim)
        self.out_proj.weight.copy_(w.w_o.T)  # (d_model, h·d_v)
        if w.bias:
            self.q_proj.bias.copy_(w.b_q.reshape(-1))  # (h·d_k,)
            self.k_proj.bias.copy_(w.b_k.reshape(-1))  # (h·d_k,)
            self.v_proj.bias.copy_(w.b_v.reshape(-1))  # (h·d_v,)
            self.out_proj.bias.copy_(w.b_o)  # (d_model,)

    def to_heads(self) -> HeadWeights:
        """The fused weights cut into the paper's per-head form (detached copies).

        Returns
        -------
        HeadWeights
            ``w_q[i]`` is the column block ``[i·d_k, (i+1)·d_k)`` of
            W^Q = ``q_proj.weight.T``; likewise for K and V.

        Examples
        --------
        >>> import torch, qkv
        >>> mha = qkv.MultiHeadAttention(12, 3)
        >>> hw = mha.to_heads()
        >>> torch.equal(hw.w_q[1], mha.q_proj.weight[4:8].T)  # head 1: rows 4..7, transposed
        True
        """
        h = self.num_heads

        def per_head(linear: nn.Linear, size: int) -> Tensor:
            weight = linear.weight.detach()  # (h·size, in)
            return weight.view(h, size, -1).transpose(1, 2).clone()  # (h, in, size)

        def bias_of(linear: nn.Linear, size: int) -> Tensor | None:
            return None if linear.bias is None else linear.bias.detach().view(h, size).clone()

        return HeadWeights(
            w_q=per_head(self.q_proj, self.d_k),
            w_k=per_head(self.k_proj, self.d_k),
            w_v=per_head(self.v_proj, self.d_v),
            w_o=self.out_proj.weight.detach().T.clone(),  # (h·d_v, d_model)
            b_q=bias_of(self.q_proj, self.d_k),
            b_k=bias_of(self.k_proj, self.d_k),
            b_v=bias_of(self.v_proj, self.d_v),
            b_o=None if self.out_proj.bias is None else self.out_proj.bias.detach().clone(),
        )


class AttentionHead(nn.Module):
    """One attention head with its own projections: ``softmax(Q_i K_iᵀ / sqrt(d_k)) V_i``.

    Parameters
    ----------
    embed_dim : int
        d_model, the query's feature size.
    d_k : int
        Size of this head's queries and keys.
    d_v : int, optional
        Size of this head's values; default ``d_k``.
    kdim, vdim : int, optional
        Feature sizes of the key and value inputs; default ``embed_dim``.
    bias : bool
        Whether the projections have biases.

    Attributes
    ----------
    q_proj : nn.Linear, embed_dim -> d_k
        W_i^Q (stored transposed, as ``nn.Linear`` does).
    k_proj : nn.Linear, kdim -> d_k
    v_proj : nn.Linear, vdim -> d_v

    Examples
    --------
    >>> import torch, qkv
    >>> head = qkv.AttentionHead(embed_dim=12, d_k=4)
    >>> x = torch.randn(2, 5, 12)
    >>> output, weights = head(x, x, x)
    >>> output.shape, weights.shape
    (torch.Size([2, 5, 4]), torch.Size([2, 5, 5]))
    """

    def __init__(
        self,
        embed_dim: int,
        d_k: int,
        d_v: int | None = None,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        embed_dim = require_positive_int("embed_dim", embed_dim)
        d_k = require_positive_int("d_k", d_k)
        d_v = d_k if d_v is None else require_positive_int("d_v", d_v)
        kdim = embed_dim if kdim is None else require_positive_int("kdim", kdim)
        vdim = embed_dim if vdim is None else require_positive_int("vdim", vdim)
        self.q_proj = nn.Linear(embed_dim, d_k, bias=bias)
        self.k_proj = nn.Linear(kdim, d_k, bias=bias)
        self.v_proj = nn.Linear(vdim, d_v, bias=bias)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
    ) -> tuple[Tensor, Tensor]:
        """One head's output (B, T, d_v) and weights (B, T, S); inputs are not re-checked."""
        q = self.q_proj(query)  # (B, T, d_k)
        k = self.k_proj(key)  # (B, S, d_k)
        v = self.v_proj(value)  # (B, S, d_v)
        return explicit_attention(q, k, v, mask, dropout_p=dropout_p)


class PerHeadMultiHeadAttention(_MultiHeadBase):
    """Multi-head attention as the paper writes it: h heads, each with its own weights.

    Each head is an :class:`AttentionHead` with its own ``Linear(d_model, d_k)``
    for Q and K and ``Linear(vdim, d_v)`` for V; the heads' outputs are
    concatenated and projected by ``out_proj`` (W^O). Same interface, same
    parameter count and same function as :class:`MultiHeadAttention`, only
    slower: h small products instead of one large one.

    Parameters
    ----------
    embed_dim, num_heads, kdim, vdim, d_k, d_v, bias, dropout
        As for :class:`MultiHeadAttention`.

    Attributes
    ----------
    heads : nn.ModuleList of AttentionHead
    out_proj : nn.Linear, h·d_v -> embed_dim

    See Also
    --------
    MultiHeadAttention
    :doc:`heads` : the chapter "One big W^Q or one per head?".

    Examples
    --------
    >>> import torch, qkv
    >>> fused = qkv.MultiHeadAttention(12, 3)
    >>> per_head = qkv.PerHeadMultiHeadAttention.from_heads(fused.to_heads())
    >>> x = torch.randn(2, 5, 12)
    >>> torch.allclose(per_head(x), fused(x), atol=1e-6)
    True
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=vdim, d_k=d_k, d_v=d_v, bias=bias, dropout=dropout
        )
        self.heads = nn.ModuleList(
            AttentionHead(self.embed_dim, self.d_k, self.d_v, kdim=self.kdim, vdim=self.vdim, bias=bias)
            for _ in range(self.num_heads)
        )
        self.out_proj = nn.Linear(self.num_heads * self.d_v, self.embed_dim, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``; arguments as :meth:`MultiHeadAttention.forward`."""
        key = query if key is None else key
        value = key if value is None else value
        query, key, value, mask = self._check_forward(query, key, value, mask)
        require_bool("need_weights", need_weights)
        if mask is not None:
            batch, length, source = query.shape[0], query.shape[1], key.shape[1]
            mask = mask.expand(batch, self.num_heads, length, source)  # (B, h, T, S)
        dropout_p = self.dropout if self.training else 0.0
        outputs, weights = [], []
        for i, head in enumerate(self.heads):
            head_mask = None if mask is None else mask[:, i]  # (B, T, S)
            out, w = head(query, key, value, head_mask, dropout_p)  # (B, T, d_v), (B, T, S)
            outputs.append(out)
            weights.append(w)
        output = self.out_proj(torch.cat(outputs, dim=-1))  # (B, T, embed_dim)
        return (output, torch.stack(weights, dim=1)) if need_weights else output

    @torch.no_grad()
    def load_heads(self, weights: HeadWeights) -> None:
        """Copy per-head weights into the heads (in place)."""
        self._check_heads(weights)
        w = weights
        for i, head in enumerate(self.heads):
            head.q_proj.weight.copy_(w.w_q[i].T)  # (d_k, d_model)
            head.k_proj.weight.copy_(w.w_k[i].T)  # (d_k, kdim)
            head.v_proj.weight.copy_(w.w_v[i].T)  # (d_v, vdim)
            if w.bias:
                head.q_proj.bias.copy_(w.b_q[i])
                head.k_proj.bias.copy_(w.b_k[i])
                head.v_proj.bias.copy_(w.b_v[i])
        self.out_proj.weight.copy_(w.w_o.T)  # (d_model, h·d_v)
        if w.bias:
            self.out_proj.bias.copy_(w.b_o)

    def to_heads(self) -> HeadWeights:
        """The heads' weights in the paper's orientation (detached copies)."""

        def stack(get: str, attr: str) -> Tensor:
            return torch.stack([getattr(getattr(head, get), attr).detach() for head in self.heads])

        bias = self.bias
        return HeadWeights(
            w_q=stack("q_proj", "weight").transpose(1, 2),  # (h, d_model, d_k)
            w_k=stack("k_proj", "weight").transpose(1, 2),  # (h, kdim, d_k)
            w_v=stack("v_proj", "weight").transpose(1, 2),  # (h, vdim, d_v)
            w_o=self.out_proj.weight.detach().T.clone(),  # (h·d_v, d_model)
            b_q=stack("q_proj", "bias") if bias else None,  # (h, d_k)
            b_k=stack("k_proj", "bias") if bias else None,  # (h, d_k)
            b_v=stack("v_proj", "bias") if bias else None,  # (h, d_v)
            b_o=self.out_proj.bias.detach().clone() if bias else None,  # (d_model,)
        )
