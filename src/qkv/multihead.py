"""Multi-head attention modules: fused projections, and one projection per head.

:class:`MultiHeadAttention` is what libraries do: one ``nn.Linear`` per
projection, then a reshape into heads. :class:`PerHeadMultiHeadAttention` is
what the paper writes: h heads, each with its own small W_i^Q, W_i^K, W_i^V.
They compute the same function; :meth:`~MultiHeadAttention.to_heads` and
:meth:`~MultiHeadAttention.from_heads` move weights between them (and, through
:mod:`qkv.interop`, to and from other libraries).

Both are meant to stand in for ``torch.nn.MultiheadAttention`` without
surprises: ``forward`` always returns ``(output, weights)`` (``weights`` is None
unless asked for), takes torch's ``key_padding_mask``, ``is_causal``,
``average_attn_weights`` and a sequence-first layout (``batch_first=False``).
Where qkv differs from torch it says so: masks are True where a query *may*
attend, ``is_causal`` aligns to the bottom right, the default layout is batch
first, and attention weights are per head unless averaged. TorchScript is not
supported (use ``torch.compile``, or ``torch.export`` for a deployable graph).

See also
--------
The chapter "One big W^Q or one per head?" (book/heads.ipynb).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Literal, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as module_hooks

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover - torch itself depends on typing_extensions
    from typing_extensions import Self

from qkv._validation import (
    require_bool,
    require_causal_sizes,
    require_dropout,
    require_multi_head_inputs,
    require_positive_int,
    resolve_head_sizes,
)
from qkv.attention import explicit_attention, fused_attention_unchecked
from qkv.heads import HeadWeights, merge_heads_unchecked, split_heads_unchecked
from qkv.masks import key_padding_to_mask, merge_masks

__all__ = ["AttentionHead", "MultiHeadAttention", "PerHeadMultiHeadAttention"]


def project(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)``: for a plain ``nn.Linear`` with no hooks, ``F.linear`` directly.

    ``nn.Module.__call__`` costs microseconds, a few percent of one decoding step. The
    shortcut is taken only where the call would do nothing more (the test of torch's own
    ``Module._call_impl``): the exact class ``nn.Linear``, no hooks on it and none registered
    globally. A subclass, a replacement (LoRA, a quantised layer, parametrisations) or a
    hook makes it a module call as usual.
    """
    if type(layer) is nn.Linear and not (
        layer._forward_hooks
        or layer._forward_pre_hooks
        or layer._backward_hooks
        or layer._backward_pre_hooks
        or module_hooks._global_forward_hooks
        or module_hooks._global_forward_pre_hooks
        or module_hooks._global_backward_hooks
        or module_hooks._global_backward_pre_hooks
    ):
        return F.linear(x, layer.weight, layer.bias)
    output: Tensor = layer(x)
    return output


INITS = ("linear", "torch")


class _MultiHeadBase(nn.Module):
    """What the two multi-head modules share: sizes, the forward contract, conversions."""

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
        batch_first: bool = True,
        init: str = "linear",
    ) -> None:
        super().__init__()
        sizes = resolve_head_sizes(embed_dim, num_heads, kdim, vdim, d_k, d_v)
        self.embed_dim, self.num_heads, self.kdim, self.vdim, self.d_k, self.d_v = sizes
        self.bias = require_bool("bias", bias)
        self.dropout = require_dropout("dropout", dropout)
        self.batch_first = require_bool("batch_first", batch_first)
        if init not in INITS:
            raise ValueError(f'init must be "linear" or "torch", got {init!r}')
        self.init = init

    def extra_repr(self) -> str:
        sizes = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
        if (self.kdim, self.vdim) != (self.embed_dim, self.embed_dim):
            sizes += f", kdim={self.kdim}, vdim={self.vdim}"
        sizes += f", d_k={self.d_k}, d_v={self.d_v}"
        if not self.bias:
            sizes += ", bias=False"
        if self.dropout:
            sizes += f", dropout={self.dropout}"
        if not self.batch_first:
            sizes += ", batch_first=False"
        if self.init != "linear":
            sizes += f", init={self.init!r}"
        return sizes

    def __prepare_scriptable__(self) -> nn.Module:
        # torch.jit.script calls this on every module it meets: say plainly what to use.
        raise TypeError(
            f"{type(self).__name__} does not support TorchScript (torch.jit.script): its argument "
            "checks are Python. Use torch.compile to speed it up, or torch.export for a graph "
            "to deploy"
        )

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Draw fresh weights with the module's ``init`` scheme (in place).

        ``init="linear"`` re-initialises every ``nn.Linear`` as ``nn.Linear``
        does; ``init="torch"`` follows ``torch.nn.MultiheadAttention`` (see
        :meth:`qkv.HeadWeights.random`). After ``to_empty()`` from the meta
        device, this fills the weights.

        Examples
        --------
        >>> import torch, qkv
        >>> mha = qkv.MultiHeadAttention(12, 3, init="torch", device="meta")
        >>> mha = mha.to_empty(device="cpu")  # memory, not yet weights
        >>> mha.reset_parameters()
        >>> bound = (6 / (12 + 3 * 12)) ** 0.5  # Xavier over torch's packed (36, 12)
        >>> mha.q_proj.weight.abs().max().item() <= bound, mha.q_proj.bias.abs().max().item()
        (True, 0.0)
        """
        if self.init == "torch":
            parameter = next(self.parameters())
            self.load_heads(
                HeadWeights.random(
                    self.embed_dim,
                    self.num_heads,
                    kdim=self.kdim,
                    vdim=self.vdim,
                    d_k=self.d_k,
                    d_v=self.d_v,
                    bias=self.bias,
                    init="torch",
                    dtype=parameter.dtype,
                    device=parameter.device,
                )
            )
        else:
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    module.reset_parameters()

    @overload
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = ...,
        value: Tensor | None = ...,
        *,
        mask: Tensor | None = ...,
        key_padding_mask: Tensor | None = ...,
        need_weights: Literal[False] = ...,
        average_attn_weights: bool = ...,
        is_causal: bool = ...,
    ) -> tuple[Tensor, None]: ...

    @overload
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = ...,
        value: Tensor | None = ...,
        *,
        mask: Tensor | None = ...,
        key_padding_mask: Tensor | None = ...,
        need_weights: Literal[True],
        average_attn_weights: bool = ...,
        is_causal: bool = ...,
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = ...,
        value: Tensor | None = ...,
        *,
        mask: Tensor | None = ...,
        key_padding_mask: Tensor | None = ...,
        need_weights: bool,
        average_attn_weights: bool = ...,
        is_causal: bool = ...,
    ) -> tuple[Tensor, Tensor | None]: ...

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        average_attn_weights: bool = False,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``; always returns ``(output, weights)``.

        Everything after ``value`` is keyword-only, so that torch's positional
        order (``key_padding_mask`` fourth) cannot slip in with another meaning.

        Parameters
        ----------
        query : Tensor, shape (B, T, embed_dim)
            (T, B, embed_dim) when the module has ``batch_first=False``; likewise
            for ``key`` and ``value`` and the output.
        key : Tensor, shape (B, S, kdim), optional
            Defaults to ``query`` (self-attention).
        value : Tensor, shape (B, S, vdim), optional
            Defaults to ``key``.
        mask : Tensor, optional, broadcastable to (B, h, T, S)
            Boolean: True means "may attend" (the opposite of
            ``nn.MultiheadAttention``'s ``attn_mask``; see :func:`qkv.from_torch_mask`).
            Floating, of the query's dtype: added to the scaled scores (``-inf``
            blocks). (T, S) for one mask for all (e.g. :func:`qkv.causal_mask`),
            (B, 1, 1, S) for padding (:func:`qkv.padding_mask`), (B, 1, T, S) per
            sequence. A 2-D mask is always read as (T, S); a 3-D mask is refused
            as ambiguous.
        key_padding_mask : Tensor, shape (B, S), optional
            **torch's meaning**: boolean True marks a padding key to ignore
            (floating: added to the scores). Combined with ``mask``.
        need_weights : bool
            Also return the attention weights (the explicit path); otherwise the
            fused ``F.scaled_dot_product_attention`` runs and ``weights`` is None.
        average_attn_weights : bool
            Return the weights averaged over heads, (B, T, S), as torch does by
            default; qkv's default is per head, (B, h, T, S).
        is_causal : bool
            Add a causal mask aligned to the **bottom right** (query i sees key j
            when ``j <= i + S - T``; see :func:`qkv.attention`). With ``T == S``
            it is the usual lower triangle and the fused kernel's causal mode runs.

        Returns
        -------
        output : Tensor, shape (B, T, embed_dim)
            (T, B, embed_dim) when ``batch_first=False``.
        weights : Tensor, shape (B, h, T, S) or (B, T, S), or None
            With ``need_weights`` only; rows sum to 1 (0 for a query with no
            allowed key). These are the weights before dropout. Batch first in
            either layout, as in torch.

        Examples
        --------
        >>> import torch, qkv
        >>> mha = qkv.MultiHeadAttention(12, 3)
        >>> x = torch.randn(2, 5, 12)
        >>> output, weights = mha(x, is_causal=True)  # the fast path
        >>> output.shape, weights
        (torch.Size([2, 5, 12]), None)
        >>> output, weights = mha(x, need_weights=True)
        >>> weights.shape, weights.sum(-1).allclose(torch.ones(2, 3, 5))
        (torch.Size([2, 3, 5, 5]), True)

        torch's key padding mask, True for the padding position of the first sequence:

        >>> pad = torch.tensor([[False, False, False, False, True], [False] * 5])
        >>> _, weights = mha(
        ...     x, key_padding_mask=pad, need_weights=True, average_attn_weights=True)
        >>> weights.shape, weights[0, :, 4].abs().max().item()
        (torch.Size([2, 5, 5]), 0.0)
        """
        key = query if key is None else key
        value = key if value is None else value
        q, k, v, m = self._check_forward(
            query, key, value, mask, key_padding_mask, need_weights, average_attn_weights, is_causal
        )
        dropout_p = self.dropout if self.training else 0.0
        try:
            output, weights = self._attend(q, k, v, m, need_weights, dropout_p, is_causal)
        except RuntimeError as error:
            self._explain_failure(q, k, v)
            raise error
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # (B, T, S)
        if not self.batch_first:
            output = output.transpose(0, 1)  # (T, B, embed_dim)
        return output, weights

    if TYPE_CHECKING:  # so that a type checker sees forward's overloads at mha(...)
        __call__ = forward

    def _attend(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
        need_weights: bool, dropout_p: float, is_causal: bool,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """The computation on checked, batch-first inputs: (B, T, E) and (B, h, T, S) or None."""
        raise NotImplementedError

    def _check_forward(
        self,
        query: object,
        key: object,
        value: object,
        mask: object | None,
        key_padding_mask: object | None,
        need_weights: object,
        average_attn_weights: object,
        is_causal: object,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Validate forward's arguments once, at the boundary; one mask, batch-first inputs."""
        q, k, v, m, padding = require_multi_head_inputs(
            query, key, value, mask, num_heads=self.num_heads, embed_dim=self.embed_dim,
            kdim=self.kdim, vdim=self.vdim, batch_first=self.batch_first,
            key_padding_mask=key_padding_mask,
        )  # fmt: skip
        flags = (need_weights, average_attn_weights, is_causal)
        if not all(type(flag) is bool for flag in flags):  # the usual case in one test
            require_bool("need_weights", need_weights)
            require_bool("average_attn_weights", average_attn_weights)
            require_bool("is_causal", is_causal)
        if is_causal:
            require_causal_sizes(q.shape[1], k.shape[1])
        if padding is not None:
            m = merge_masks(m, key_padding_to_mask(padding), q.dtype)  # (B, h or 1, T or 1, S)
        return q, k, v, m

    def _explain_failure(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        """After torch failed inside forward: if a parameter does not match the inputs, say which.

        Checked only on failure, so that the happy path costs nothing and autocast,
        which runs float32 weights on lower-precision inputs, keeps working.
        """
        try:
            autocast = torch.is_autocast_enabled(query.device.type)
        except RuntimeError:  # a device type autocast does not know, such as meta
            autocast = False
        # Key and value against the query first, so that a key of another dtype is blamed on the key.
        for name, x in (("key", key), ("value", value)):
            if x.device != query.device:
                raise ValueError(f"{name} is on {x.device}, but query is on {query.device}") from None
            if x.dtype != query.dtype and not autocast:
                raise TypeError(f"{name} has dtype {x.dtype}, but query has dtype {query.dtype}") from None
        for name, parameter in self.named_parameters():
            if parameter.device != query.device:
                raise ValueError(
                    f"query is on {query.device}, but the module's parameter {name} is on "
                    f"{parameter.device}; move one of them with .to()"
                ) from None
            if parameter.dtype != query.dtype and not autocast:
                raise TypeError(
                    f"query has dtype {query.dtype}, but the module's parameter {name} has "
                    f"dtype {parameter.dtype}; convert one of them with .to()"
                ) from None

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
    def from_heads(cls, weights: HeadWeights, *, dropout: float = 0.0, batch_first: bool = True) -> Self:
        """Build a module holding ``weights`` (copied), on their dtype and device.

        Parameters
        ----------
        weights : HeadWeights
            Per-head weights in the paper's orientation.
        dropout : float
            Dropout on the attention weights during training.
        batch_first : bool
            The module's input layout (see the class).

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
            batch_first=batch_first,
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
    """Multi-head attention with fused projections.

    ``q_proj``, ``k_proj`` and ``v_proj`` are each one ``nn.Linear`` holding
    every head's weights side by side; :func:`qkv.split_heads` cuts the
    projections into heads. Without ``need_weights`` the forward pass runs
    ``F.scaled_dot_product_attention`` (fast, no (T, S) weights kept); with it,
    the explicit computation. Both give the same output.

    A stand-in for ``torch.nn.MultiheadAttention`` (see :meth:`forward`), with
    these differences, each on purpose: inputs are **batch first** by default
    (torch's default is ``batch_first=False``); a boolean ``mask`` is True
    where attention is *allowed*; ``is_causal`` aligns to the bottom right;
    weights are per head unless ``average_attn_weights=True``; and each
    projection is an ``nn.Linear`` initialised as ``nn.Linear`` is
    (``init="torch"`` gives torch's Xavier-uniform projections and zero biases).

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
    batch_first : bool
        True (the default): inputs and output are (B, T, features). False:
        (T, B, features), torch's default layout.
    init : {"linear", "torch"}
        How the weights start: ``nn.Linear``'s default (uniform in
        ±1/sqrt(fan_in), biases too), or ``torch.nn.MultiheadAttention``'s.
    device, dtype : optional
        Where and in which dtype to create the parameters, as for ``nn.Linear``
        (``device="meta"`` creates them without memory; then ``to_empty`` and
        :meth:`reset_parameters`).

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

    torch's layout and initialisation, parameters in float64:

    >>> mha = qkv.MultiHeadAttention(
    ...     12, 3, batch_first=False, init="torch", dtype=torch.float64)
    >>> out, _ = mha(torch.randn(4, 2, 12, dtype=torch.float64))  # (T, B, embed_dim)
    >>> out.shape, mha.q_proj.bias.abs().max().item()
    (torch.Size([4, 2, 12]), 0.0)
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
        batch_first: bool = True,
        init: str = "linear",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=vdim, d_k=d_k, d_v=d_v, bias=bias, dropout=dropout,
            batch_first=batch_first, init=init,
        )  # fmt: skip
        h = self.num_heads
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(self.embed_dim, h * self.d_k, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, h * self.d_k, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, h * self.d_v, bias=bias, **factory)
        self.out_proj = nn.Linear(h * self.d_v, self.embed_dim, bias=bias, **factory)
        if init != "linear":
            self.reset_parameters()

    def _attend(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
        need_weights: bool, dropout_p: float, is_causal: bool,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        h = self.num_heads
        q = split_heads_unchecked(project(self.q_proj, query), h)  # (B, h, T, d_k)
        k = split_heads_unchecked(project(self.k_proj, key), h)  # (B, h, S, d_k)
        v = split_heads_unchecked(project(self.v_proj, value), h)  # (B, h, S, d_v)
        weights = None
        if need_weights:
            heads, weights = explicit_attention(q, k, v, mask, None, dropout_p, is_causal)  # (B, h, T, d_v)
        else:
            heads = fused_attention_unchecked(q, k, v, mask, None, dropout_p, is_causal)  # (B, h, T, d_v)
        output = project(self.out_proj, merge_heads_unchecked(heads))  # (B, T, embed_dim)
        return output, weights

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
        if w.biases is not None:
            b_q, b_k, b_v, b_o = w.biases
            self.q_proj.bias.copy_(b_q.reshape(-1))  # (h·d_k,)
            self.k_proj.bias.copy_(b_k.reshape(-1))  # (h·d_k,)
            self.v_proj.bias.copy_(b_v.reshape(-1))  # (h·d_v,)
            self.out_proj.bias.copy_(b_o)  # (d_model,)

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
    device, dtype : optional
        Where and in which dtype to create the parameters, as for ``nn.Linear``.

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
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        embed_dim = require_positive_int("embed_dim", embed_dim)
        d_k = require_positive_int("d_k", d_k)
        d_v = d_k if d_v is None else require_positive_int("d_v", d_v)
        kdim = embed_dim if kdim is None else require_positive_int("kdim", kdim)
        vdim = embed_dim if vdim is None else require_positive_int("vdim", vdim)
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, d_k, bias=bias, **factory)
        self.k_proj = nn.Linear(kdim, d_k, bias=bias, **factory)
        self.v_proj = nn.Linear(vdim, d_v, bias=bias, **factory)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        dropout_p: float = 0.0,
        *,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """One head's output (B, T, d_v) and weights (B, T, S); inputs are not re-checked."""
        q = self.q_proj(query)  # (B, T, d_k)
        k = self.k_proj(key)  # (B, S, d_k)
        v = self.v_proj(value)  # (B, S, d_v)
        return explicit_attention(q, k, v, mask, None, dropout_p, is_causal)


class PerHeadMultiHeadAttention(_MultiHeadBase):
    """Multi-head attention as the paper writes it: h heads, each with its own weights.

    Each head is an :class:`AttentionHead` with its own ``Linear(d_model, d_k)``
    for Q, ``Linear(kdim, d_k)`` for K and ``Linear(vdim, d_v)`` for V; the heads' outputs are
    concatenated and projected by ``out_proj`` (W^O). Same interface, same
    parameter count and same function as :class:`MultiHeadAttention`, only
    slower: h small products instead of one large one.

    Parameters
    ----------
    embed_dim, num_heads, kdim, vdim, d_k, d_v, bias, dropout, batch_first, init, device, dtype
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
    >>> torch.allclose(per_head(x)[0], fused(x)[0], atol=1e-6)
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
        batch_first: bool = True,
        init: str = "linear",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=vdim, d_k=d_k, d_v=d_v, bias=bias, dropout=dropout,
            batch_first=batch_first, init=init,
        )  # fmt: skip
        self.heads = nn.ModuleList(
            AttentionHead(
                self.embed_dim,
                self.d_k,
                self.d_v,
                kdim=self.kdim,
                vdim=self.vdim,
                bias=bias,
                device=device,
                dtype=dtype,
            )
            for _ in range(self.num_heads)
        )
        self.out_proj = nn.Linear(
            self.num_heads * self.d_v, self.embed_dim, bias=bias, device=device, dtype=dtype
        )
        if init != "linear":
            self.reset_parameters()

    def _attend(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
        need_weights: bool, dropout_p: float, is_causal: bool,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        if mask is not None:
            batch, length, source = query.shape[0], query.shape[1], key.shape[1]
            mask = mask.expand(batch, self.num_heads, length, source)  # (B, h, T, S)
        outputs, weights = [], []
        for i, head in enumerate(self.heads):
            head_mask = None if mask is None else mask[:, i]  # (B, T, S)
            out, w = head(
                query, key, value, head_mask, dropout_p, is_causal=is_causal
            )  # (B, T, d_v), (B, T, S)
            outputs.append(out)
            weights.append(w)
        output = self.out_proj(torch.cat(outputs, dim=-1))  # (B, T, embed_dim)
        return output, torch.stack(weights, dim=1) if need_weights else None

    @torch.no_grad()
    def load_heads(self, weights: HeadWeights) -> None:
        """Copy per-head weights into the heads (in place)."""
        self._check_heads(weights)
        w = weights
        for i, module in enumerate(self.heads):
            head = cast(AttentionHead, module)
            head.q_proj.weight.copy_(w.w_q[i].T)  # (d_k, d_model)
            head.k_proj.weight.copy_(w.w_k[i].T)  # (d_k, kdim)
            head.v_proj.weight.copy_(w.w_v[i].T)  # (d_v, vdim)
            if w.biases is not None:
                head.q_proj.bias.copy_(w.biases[0][i])
                head.k_proj.bias.copy_(w.biases[1][i])
                head.v_proj.bias.copy_(w.biases[2][i])
        self.out_proj.weight.copy_(w.w_o.T)  # (d_model, h·d_v)
        if w.biases is not None:
            self.out_proj.bias.copy_(w.biases[3])

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
