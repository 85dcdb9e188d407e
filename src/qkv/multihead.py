"""Multi-head attention modules: fused projections, and one projection per head.

:class:`MultiHeadAttention` is what libraries do: one ``nn.Linear`` per
projection, then a reshape into heads. :class:`PerHeadMultiHeadAttention` is
what the paper writes: h heads, each with its own small W_i^Q, W_i^K, W_i^V.
They compute the same function; :meth:`~MultiHeadAttention.to_heads` and
:meth:`~MultiHeadAttention.from_heads` move weights between them (and, through
:mod:`qkv.interop`, to and from other libraries).

Both are meant to stand in for ``torch.nn.MultiheadAttention`` without
surprises: ``forward`` always returns ``(output, weights)`` (``weights`` is None
unless asked for), takes torch's ``attn_mask``, ``key_padding_mask``,
``is_causal``, ``average_attn_weights``, unbatched (T, E) input and a
sequence-first layout (``batch_first=False``), and sits inside
``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer``.
Where qkv differs from torch it says so: its own ``mask`` is True where a query
*may* attend, ``is_causal`` aligns to the bottom right, the default layout is batch
first, and attention weights are per head unless averaged. TorchScript is not
supported (use ``torch.compile``, or ``torch.export`` for a deployable graph).

See also
--------
The chapter :doc:`heads` (book/heads.ipynb).
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as module_hooks

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover - torch itself depends on typing_extensions
    from typing_extensions import Self

from qkv._validation import (
    InitScheme,
    add_batch_axis,
    require_attention_masks,
    require_bool,
    require_causal_sizes,
    require_dropout,
    require_init,
    require_multi_head_inputs,
    require_positive_int,
    require_size,
    require_tensor,
    resolve_head_sizes,
    resolve_kv_heads,
    shape_str,
)
from qkv.attention import SDPA_HAS_GQA, explicit_attention, fused_attention_unchecked
from qkv.cache import KeyValue, KVCache
from qkv.heads import HeadWeights, expand_kv_heads, merge_heads_unchecked, split_heads_unchecked
from qkv.interop import heads_from_torch_tensors, torch_parameter_shapes
from qkv.masks import key_padding_to_mask, merge_masks
from qkv.rotary import RotaryEmbedding, rotate_unchecked

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
        parameters = layer._parameters  # what layer.weight reads, without Module.__getattr__
        return F.linear(x, cast(Tensor, parameters["weight"]), parameters["bias"])
    output: Tensor = layer(x)
    return output


# Entries of a torch.nn.MultiheadAttention state dict that qkv's own layout does not have.
TORCH_ONLY_KEYS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                   "bias_k", "bias_v")  # fmt: skip


def _autocast_enabled(device: torch.device) -> bool:
    try:
        return torch.is_autocast_enabled(device.type)
    except RuntimeError:  # a device type autocast does not know, such as meta
        return False
    except TypeError:  # torch < 2.4 takes no device type
        if device.type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return device.type == "cuda" and bool(torch.is_autocast_enabled())


def _autocast_dtype(device: torch.device) -> torch.dtype:
    """The dtype autocast computes in on ``device`` (where it is enabled)."""
    try:
        return torch.get_autocast_dtype(device.type)
    except (TypeError, AttributeError):  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if device.type == "cpu" else torch.get_autocast_gpu_dtype()


class _MultiHeadBase(nn.Module):
    """What the two multi-head modules share: sizes, the forward contract, conversions."""

    # Whether the module computes from K/V heads of its own (grouped-query attention,
    # a cache, precomputed keys and values): MultiHeadAttention does, the per-head module not.
    _inference_features = False

    # torch's transformer layers read nn.MultiheadAttention's _qkv_same_embed_dim and
    # in_proj_bias in eval mode, to decide whether to bypass the module for a fused kernel
    # of their own that takes a packed in_proj_weight. qkv has no packed weight (as torch's
    # module has none when kdim or vdim differ), so they call forward, which runs qkv's
    # projections (a hook, a subclass such as LoRA) and qkv's masks.
    _qkv_same_embed_dim = False

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
        init: InitScheme = "linear",
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        sizes = resolve_head_sizes(embed_dim, num_heads, kdim, vdim, d_k, d_v)
        self.embed_dim, self.num_heads, self.kdim, self.vdim, self.d_k, self.d_v = sizes
        self.num_kv_heads = resolve_kv_heads(self.num_heads, num_kv_heads)
        self.bias = require_bool("bias", bias)
        self.dropout = require_dropout("dropout", dropout)
        self.batch_first = require_bool("batch_first", batch_first)
        self.init = require_init(init)

    @property
    def in_proj_bias(self) -> Tensor | None:
        """The Q, K and V biases end to end, (h·d_k + h_kv·d_k + h_kv·d_v,), or None without bias.

        ``torch.nn.MultiheadAttention``'s name for them: torch's transformer layers
        read it (a new tensor each time; the parameters are the projections' biases).
        """
        return torch.cat(self._projection_biases()) if self.bias else None  # (h·d_k + h_kv·d_k + h_kv·d_v,)

    def _projection_biases(self) -> list[Tensor]:
        """The Q, K and V projections' biases, in that order (the module has biases)."""
        raise NotImplementedError

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A module pickled whole before grouped-query attention existed has no num_kv_heads.
        state.setdefault("num_kv_heads", state.get("num_heads"))
        super().__setstate__(state)  # type: ignore[no-untyped-call]

    def extra_repr(self) -> str:
        sizes = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
        if self.num_kv_heads != self.num_heads:
            sizes += f", num_kv_heads={self.num_kv_heads}"
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
        >>> mha.q_proj.weight.abs().max().item() <= bound
        True
        >>> mha.q_proj.bias.abs().max().item()
        0.0
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
                    num_kv_heads=self.num_kv_heads,
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
        attn_mask: Tensor | None = ...,
        need_weights: Literal[False] = ...,
        average_attn_weights: bool = ...,
        is_causal: bool = ...,
        cache: KVCache | None = ...,
        key_value: KeyValue | None = ...,
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
        attn_mask: Tensor | None = ...,
        need_weights: Literal[True],
        average_attn_weights: bool = ...,
        is_causal: bool = ...,
        cache: KVCache | None = ...,
        key_value: KeyValue | None = ...,
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
        attn_mask: Tensor | None = ...,
        need_weights: bool,
        average_attn_weights: bool = ...,
        is_causal: bool = ...,
        cache: KVCache | None = ...,
        key_value: KeyValue | None = ...,
    ) -> tuple[Tensor, Tensor | None]: ...

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *positional: object,
        mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        average_attn_weights: bool = False,
        is_causal: bool = False,
        cache: KVCache | None = None,
        key_value: KeyValue | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``; always returns ``(output, weights)``.

        Everything after ``value`` is keyword-only, so that torch's positional
        order (``key_padding_mask`` fourth) cannot slip in with another meaning.

        Two conventions for masks, each under its own name:

        ================================  ==================  ==========================
        argument                          boolean True means  shape
        ================================  ==================  ==========================
        ``mask`` (qkv's)                  may attend          broadcasts to (B, h, T, S)
        ``attn_mask`` (torch's)           blocked             (T, S) or (B·h, T, S)
        ``key_padding_mask`` (torch's)    padding (blocked)   (B, S)
        ================================  ==================  ==========================

        :func:`qkv.padding_mask` gives ``mask``'s form, (B, 1, 1, S) and True for
        a real key: passed as ``key_padding_mask`` it is refused. A floating mask
        of any of the three is added to the scores (``-inf`` blocks), and one
        holding only 0s and 1s is refused, since it would block nothing.

        Parameters
        ----------
        query : Tensor, shape (B, T, embed_dim)
            (T, B, embed_dim) when the module has ``batch_first=False``; likewise
            for ``key`` and ``value`` and the output. Unbatched, (T, embed_dim),
            as torch takes it: then ``key`` (S, kdim), ``value`` (S, vdim),
            ``key_padding_mask`` (S,), ``attn_mask`` (T, S) or (h, T, S), and
            the output and weights lose their batch axis.
        key : Tensor, shape (B, S, kdim), optional
            Defaults to ``query`` (self-attention).
        value : Tensor, shape (B, S, vdim), optional
            Defaults to ``key``.
        mask : Tensor, optional, broadcastable to (B, h, T, S)
            **qkv's meaning**: boolean True means "may attend", as in
            ``F.scaled_dot_product_attention``. Floating, of the query's dtype:
            added to the scaled scores (``-inf`` blocks). (T, S) for one mask for
            all (e.g. :func:`qkv.causal_mask`), (B, 1, 1, S) for padding
            (:func:`qkv.padding_mask`), (B, 1, T, S) per sequence. A 2-D mask is
            always read as (T, S); a 3-D mask is refused as ambiguous.
        key_padding_mask : Tensor, shape (B, S), optional
            **torch's meaning**: boolean True marks a padding key to ignore
            (floating: added to the scores). Combined with ``mask`` or
            ``attn_mask``. Hugging Face's ``attention_mask`` (1 = real token)
            becomes ``attention_mask == 0``.
        attn_mask : Tensor, shape (T, S) or (B·h, T, S), optional
            **torch's meaning**, exactly as ``nn.MultiheadAttention`` reads it:
            boolean True means *blocked*; floating, of the query's dtype, is
            added to the scores; row ``b·h + i`` of a 3-D mask is sequence b's,
            head i's. Instead of ``mask``, not beside it (that is an error).
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
            With a ``cache``, S counts the cached keys too, so the new tokens see
            every earlier one: a chunk (prefill) and single steps alike.
        cache : KVCache, optional
            (:class:`MultiHeadAttention` only.) Keys and values of earlier tokens,
            one cache per layer: the new ones (from ``key`` and ``value``, by
            default the query) are projected, appended to it, and the query attends
            to all of them. Pass ``is_causal=True`` too, or a chunk of several new
            tokens also attends to its own later tokens. Masks then cover S =
            ``cache.length`` before the call + the new keys; for a left-padded batch,
            pass the growing ``key_padding_mask`` at every call. See
            :class:`KVCache` and :meth:`MultiHeadAttention.new_cache`.
        key_value : KeyValue, optional
            (:class:`MultiHeadAttention` only.) Keys and values already projected,
            from :meth:`MultiHeadAttention.project_key_value`, used instead of
            ``key`` and ``value`` (which must then be None): cross-attention's K and
            V, computed once per source.

        Returns
        -------
        output : Tensor, shape (B, T, embed_dim)
            (T, B, embed_dim) when ``batch_first=False``; (T, embed_dim) unbatched.
        weights : Tensor, shape (B, h, T, S) or (B, T, S), or None
            With ``need_weights`` only; rows sum to 1 (0 for a query with no
            allowed key, where torch gives NaN). These are the weights before
            dropout. Batch first in either layout, as in torch; without the batch
            axis for an unbatched query.

        See Also
        --------
        qkv.from_torch_mask : torch's boolean mask in qkv's convention.
        :doc:`masks/libraries` : each library's mask convention.

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

        torch's ``attn_mask``, True where blocked, on one unbatched sequence (T, E):

        >>> blocked = torch.ones(5, 5, dtype=torch.bool).triu(1)  # torch's causal mask
        >>> out, weights = mha(x[0], attn_mask=blocked, need_weights=True)
        >>> out.shape, weights.shape, weights[:, 0, 1:].abs().max().item()
        (torch.Size([5, 12]), torch.Size([3, 5, 5]), 0.0)
        """
        if positional:  # named here, rather than in Python's words about a base class
            raise TypeError(
                f"{type(self).__name__}.forward takes query, key and value by position and the rest by "
                f"name, got {3 + len(positional)} positional arguments: torch's fourth, key_padding_mask "
                "(True = padding), goes as key_padding_mask=, and so do need_weights=, attn_mask= and "
                "the others"
            )
        unbatched = isinstance(query, Tensor) and not query.is_nested and query.dim() == 2
        if unbatched:  # torch's (T, E) input: a batch of one, taken off again at the end
            query, key, value, key_padding_mask = add_batch_axis(
                query, key, value, key_padding_mask, embed_dim=self.embed_dim, kdim=self.kdim,
                vdim=self.vdim, batch_first=self.batch_first,
            )  # fmt: skip
        q, k, v, m = self._check_forward(
            query, key, value, mask, key_padding_mask, need_weights, average_attn_weights, is_causal,
            cache, key_value, attn_mask,
        )  # fmt: skip
        dropout_p = self.dropout if self.training else 0.0
        try:
            output, weights = self._attend(q, k, v, m, need_weights, dropout_p, is_causal, cache, key_value)
        except RuntimeError as error:
            self._explain_failure(q, k, v)
            raise error
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # (B, T, S)
        if unbatched:
            return output[0], None if weights is None else weights[0]  # (T, E), (h, T, S) or (T, S)
        if not self.batch_first:
            output = output.transpose(0, 1)  # (T, B, embed_dim)
        return output, weights

    if TYPE_CHECKING:  # so that a type checker sees forward's overloads at mha(...)
        __call__ = forward

    def _attend(
        self, query: Tensor, key: Tensor | None, value: Tensor | None, mask: Tensor | None,
        need_weights: bool, dropout_p: float, is_causal: bool, cache: KVCache | None,
        key_value: KeyValue | None,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """The computation on checked, batch-first inputs: (B, T, E) and (B, h, T, S) or None.

        ``key`` and ``value`` are None exactly when ``key_value`` is given.
        """
        raise NotImplementedError

    def _check_forward(
        self,
        query: object,
        key: object | None,
        value: object | None,
        mask: object | None,
        key_padding_mask: object | None,
        need_weights: object,
        average_attn_weights: object,
        is_causal: object,
        cache: object | None = None,
        key_value: object | None = None,
        attn_mask: object | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """Validate forward's arguments once, at the boundary; one mask, batch-first inputs."""
        if (cache is not None or key_value is not None) and not self._inference_features:
            name = "cache" if cache is not None else "key_value"
            raise TypeError(
                f"{type(self).__name__} does not take {name}: its heads project keys and values "
                "each on their own; use MultiHeadAttention (qkv.MultiHeadAttention.from_heads("
                "module.to_heads()) holds the same weights)"
            )
        k: Tensor | None
        v: Tensor | None
        if key_value is not None:
            if key is not None or value is not None:
                raise ValueError(
                    "pass key_value (keys and values already projected) or key and value, not both"
                )
            if cache is not None:
                raise ValueError(
                    "cache and key_value do not combine: a cache grows with the tokens it is given, "
                    "key_value is fixed (e.g. an encoder's keys and values)"
                )
            q = self._check_query(query)
            keys = self._check_key_value(key_value, q)
            S = keys.shape[2]
            m, padding = require_attention_masks(
                mask, key_padding_mask, q, S, self.num_heads, attn_mask=attn_mask
            )
            k = v = None
        else:
            key = query if key is None else key
            value = key if value is None else value
            past = 0
            if cache is not None:
                if not isinstance(cache, KVCache):
                    raise TypeError(f"cache must be a qkv.KVCache, got {type(cache).__name__}")
                past = cache._length
            q, k, v, m, padding = require_multi_head_inputs(
                query, key, value, mask, num_heads=self.num_heads, embed_dim=self.embed_dim,
                kdim=self.kdim, vdim=self.vdim, batch_first=self.batch_first,
                key_padding_mask=key_padding_mask, past=past, attn_mask=attn_mask,
            )  # fmt: skip
            if cache is not None:
                self._check_cache(cache, q, k)
            S = past + k.shape[1]
        flags_are_bools = type(need_weights) is bool and type(average_attn_weights) is bool
        if not (flags_are_bools and type(is_causal) is bool):
            require_bool("need_weights", need_weights)
            require_bool("average_attn_weights", average_attn_weights)
            require_bool("is_causal", is_causal)
        if is_causal:
            require_causal_sizes(q.shape[1], S)
        if padding is not None:
            m = merge_masks(m, key_padding_to_mask(padding), q.dtype)  # (B, h or 1, T or 1, S)
        return q, k, v, m

    def _check_query(self, query: object) -> Tensor:
        """The query alone, (B, T, embed_dim) batch first (for ``key_value``)."""
        lead = "(B, T" if self.batch_first else "(T, B"
        q = require_tensor("query", query, ndim=3, layout=f"{lead}, embed_dim)")
        require_size("query", q, 2, self.embed_dim, "features", "embed_dim")
        return q if self.batch_first else q.transpose(0, 1)  # (B, T, embed_dim)

    def _check_key_value(self, key_value: object, query: Tensor) -> Tensor:
        """Precomputed (keys, values) against this module and the (batch-first) query; returns keys."""
        if not (
            isinstance(key_value, tuple)
            and len(key_value) == 2
            and all(isinstance(x, Tensor) for x in key_value)
        ):
            raise TypeError(
                "key_value must be a KeyValue (keys, values) of tensors, as "
                f"MultiHeadAttention.project_key_value returns, got {type(key_value).__name__}"
            )
        keys, values = cast("tuple[Tensor, Tensor]", key_value)
        batch, h_kv = query.shape[0], self.num_kv_heads
        for name, x, dim, d in (("keys", keys, "d_k", self.d_k), ("values", values, "d_v", self.d_v)):
            if x.dim() != 4 or (x.shape[0], x.shape[1], x.shape[3]) != (batch, h_kv, d):
                raise ValueError(
                    f"key_value.{name} must have shape (B, h_kv, S, {dim}) = ({batch}, {h_kv}, S, {d}) "
                    f"for this module and a batch of {batch}, got {shape_str(x.shape)}"
                )
            if not x.is_floating_point():
                raise TypeError(f"key_value.{name} must be a floating-point tensor, got dtype {x.dtype}")
            if x.device != query.device:
                raise ValueError(f"key_value.{name} is on {x.device}, but query is on {query.device}")
            if x.dtype != query.dtype and not _autocast_enabled(query.device):
                raise TypeError(f"key_value.{name} has dtype {x.dtype}, but query has dtype {query.dtype}")
        if keys.shape[2] != values.shape[2]:
            raise ValueError(
                f"key_value.keys have {keys.shape[2]} positions, but key_value.values have "
                f"{values.shape[2]}: keys and values come in pairs"
            )
        return keys

    def _check_cache(self, cache: KVCache, query: Tensor, key: Tensor) -> None:
        """A cache that fits this module, the (checked, batch-first) inputs and the new tokens."""
        needed = (query.shape[0], self.num_kv_heads, self.d_k, self.d_v)
        if cache._sizes != needed:
            names = ("batch_size", "num_kv_heads", "d_k", "d_v")
            i = next(i for i in range(4) if cache._sizes[i] != needed[i])
            whose = "the batch" if i == 0 else "this module"
            raise ValueError(
                f"cache has {names[i]}={cache._sizes[i]}, but {whose} needs {needed[i]}: the cache was "
                "made for another module or batch (module.new_cache(batch_size, max_length) makes one "
                "that fits)"
            )
        if cache._device != query.device:
            raise ValueError(f"cache is on {cache._device}, but query is on {query.device}")
        owner = cache._owner
        if owner is not None and owner() is not self:
            raise ValueError(
                "cache holds the keys and values of another module: give each attention layer its "
                "own cache (module.new_cache), or reset() this one first"
            )
        if cache._length + key.shape[1] > cache.max_length:
            cache.require_room(key.shape[1])  # raises, with the numbers

    def _explain_failure(
        self, query: Tensor, key: Tensor | None, value: Tensor | None, first: str = "query"
    ) -> None:
        """After torch failed inside forward: if a parameter does not match the inputs, say which.

        Checked only on failure, so that the happy path costs nothing and autocast,
        which runs float32 weights on lower-precision inputs, keeps working. ``first``
        names the input passed as ``query`` (``"key"`` for :meth:`project_key_value`).
        """
        autocast = _autocast_enabled(query.device)
        # Key and value against the query first, so that a key of another dtype is blamed on the key.
        for name, x in (("key", key), ("value", value)):
            if x is None:
                continue
            if x.device != query.device:
                raise ValueError(f"{name} is on {x.device}, but {first} is on {query.device}") from None
            if x.dtype != query.dtype and not autocast:
                raise TypeError(f"{name} has dtype {x.dtype}, but {first} has dtype {query.dtype}") from None
        for name, parameter in self.named_parameters():
            if parameter.device != query.device:
                raise ValueError(
                    f"{first} is on {query.device}, but the module's parameter {name} is on "
                    f"{parameter.device}; move one of them with .to()"
                ) from None
            if parameter.dtype != query.dtype and not autocast:
                raise TypeError(
                    f"{first} has dtype {query.dtype}, but the module's parameter {name} has "
                    f"dtype {parameter.dtype}; convert one of them with .to()"
                ) from None

    def _check_heads(self, weights: HeadWeights) -> None:
        if not isinstance(weights, HeadWeights):
            raise TypeError(f"weights must be a HeadWeights, got {type(weights).__name__}")
        self._check_kv_heads_supported(weights)
        expected = (self.num_heads, self.num_kv_heads, self.embed_dim, self.kdim, self.vdim,
                    self.d_k, self.d_v)  # fmt: skip
        got = (weights.num_heads, weights.num_kv_heads, weights.embed_dim, weights.kdim, weights.vdim,
               weights.d_k, weights.d_v)  # fmt: skip
        if got != expected or weights.bias != self.bias:
            names = "num_heads, num_kv_heads, embed_dim, kdim, vdim, d_k, d_v"
            raise ValueError(
                f"weights have ({names}) = {got} and bias={weights.bias}, "
                f"but this module has {expected} and bias={self.bias}"
            )

    @classmethod
    def _check_kv_heads_supported(cls, weights: HeadWeights) -> None:
        if weights.num_kv_heads != weights.num_heads and not cls._inference_features:
            raise ValueError(
                f"weights have {weights.num_kv_heads} K/V heads for {weights.num_heads} query heads "
                f"(grouped-query attention), but {cls.__name__} has one K/V head per query head: use "
                "MultiHeadAttention, or weights.expand_kv_heads() for the same layer with every K/V "
                "head copied into its group"
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
        cls._check_kv_heads_supported(weights)
        grouped: dict[str, Any] = {"num_kv_heads": weights.num_kv_heads} if cls._inference_features else {}
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
            **grouped,
        ).to(dtype=weights.w_q.dtype, device=weights.w_q.device)
        module.load_heads(weights)
        return module

    @torch.no_grad()
    def load_heads(self, weights: HeadWeights) -> None:
        """Copy per-head weights into this module's parameters (in place).

        ``nn.Linear`` stores W transposed: head i's W_i^Q (d_model, d_k) becomes rows
        ``[i·d_k, (i+1)·d_k)`` of :class:`MultiHeadAttention`'s ``q_proj.weight``, and
        ``heads[i].q_proj.weight`` of :class:`PerHeadMultiHeadAttention`'s.
        """
        self._check_heads(weights)
        for name, tensor in self._state_from_heads(weights).items():
            self.get_parameter(name).copy_(tensor)

    def _state_from_heads(self, weights: HeadWeights) -> dict[str, Tensor]:
        """Per-head weights (checked against the module) as this module's state-dict entries."""
        raise NotImplementedError

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # load_state_dict calls this for every module, before its children: torch's layout
        # becomes this module's own here, and the projections then load it as usual.
        if any(prefix + name in state_dict for name in TORCH_ONLY_KEYS):
            self._read_torch_state(state_dict, prefix)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _read_torch_state(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Replace ``torch.nn.MultiheadAttention``'s entries under ``prefix`` by this module's (in place)."""
        where = f"state_dict (at {prefix!r})" if prefix else "state_dict"
        if prefix + "bias_k" in state_dict or prefix + "bias_v" in state_dict:
            raise ValueError(
                f"{where} holds bias_k and bias_v, from torch.nn.MultiheadAttention(add_bias_kv=True), "
                "which adds a learned key and value to every sequence; qkv's modules have no such position"
            )
        h, sizes = self.num_heads, (self.num_kv_heads, self.d_k, self.d_v)
        if sizes != (h, self.embed_dim // h, self.embed_dim // h) or self.embed_dim % h:
            raise ValueError(
                f"{where} holds torch.nn.MultiheadAttention's weights, which have one K/V head per "
                "query head and d_k = d_v = embed_dim / num_heads, but this module has "
                f"num_kv_heads={self.num_kv_heads} for num_heads={h}, d_k={self.d_k}, d_v={self.d_v} "
                f"and embed_dim={self.embed_dim}: build it with num_kv_heads, d_k and d_v left at "
                "their defaults"
            )
        names = (*TORCH_ONLY_KEYS, "out_proj.weight", "out_proj.bias")
        found = {name: state_dict[prefix + name] for name in names if prefix + name in state_dict}
        expected = torch_parameter_shapes(self.embed_dim, self.kdim, self.vdim, self.bias)
        if {name: tuple(tensor.shape) for name, tensor in found.items()} != expected:
            got = ", ".join(f"{name} {shape_str(tensor.shape)}" for name, tensor in found.items())
            wanted = ", ".join(f"{name} {shape_str(shape)}" for name, shape in expected.items())
            raise ValueError(
                f"{where} holds torch.nn.MultiheadAttention's weights {got}, but this module "
                f"(embed_dim={self.embed_dim}, kdim={self.kdim}, vdim={self.vdim}, bias={self.bias}) "
                f"takes {wanted} in that layout"
            )
        weights = heads_from_torch_tensors(found, h)
        for name in found:
            del state_dict[prefix + name]
        state_dict.update({prefix + name: tensor for name, tensor in self._state_from_heads(weights).items()})

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

    Checkpoints move both ways: ``load_state_dict`` takes an
    ``nn.MultiheadAttention`` state dict as it is (``in_proj_weight``, or
    ``q/k/v_proj_weight`` when kdim or vdim differ, ``in_proj_bias``,
    ``out_proj.*``), alone or inside a model's, and
    :func:`qkv.interop.to_torch_state_dict` writes one that torch's module loads.

    For inference it keeps keys and values: a :class:`KVCache` for decoding
    (``forward(..., cache=...)``), keys and values projected once for
    cross-attention (:meth:`project_key_value`, ``forward(..., key_value=...)``),
    and grouped-query attention (``num_kv_heads``), as in Llama and Mistral.

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
    num_kv_heads : int, optional
        h_kv, the number of K/V heads; it must divide ``num_heads``, and query head
        i uses K/V head ``i // (num_heads / num_kv_heads)``. 1 is multi-query
        attention; the default, ``num_heads``, is multi-head attention.
    rotary : RotaryEmbedding, optional
        Rotary position embeddings (RoPE) for this module's ``d_k``: each head's
        queries and keys are rotated by their positions after the projections and
        before K/V heads are shared; values are not. Positions count from 0, or from
        ``cache.length`` with a cache, which therefore holds rotated keys and raw
        values. Not with ``key_value``. Settable later as ``module.rotary``.
    device, dtype : optional
        Where and in which dtype to create the parameters, as for ``nn.Linear``
        (``device="meta"`` creates them without memory; then ``to_empty`` and
        :meth:`reset_parameters`).

    Attributes
    ----------
    q_proj : nn.Linear, embed_dim -> h·d_k
    k_proj : nn.Linear, kdim -> h_kv·d_k
    v_proj : nn.Linear, vdim -> h_kv·d_v
    out_proj : nn.Linear, h·d_v -> embed_dim

    See Also
    --------
    PerHeadMultiHeadAttention : the same maths, one projection per head.
    qkv.interop.to_torch : convert to ``torch.nn.MultiheadAttention``.
    :doc:`heads/ladder` : the fused layer beside the paper's form.

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

    torch's checkpoint, loaded as it is:

    >>> sizes = {"kdim": 10, "vdim": 7}
    >>> reference = torch.nn.MultiheadAttention(12, 3, batch_first=True, **sizes)
    >>> mha = qkv.MultiHeadAttention(12, 3, **sizes)
    >>> mha.load_state_dict(reference.state_dict())
    <All keys matched successfully>
    >>> v = torch.randn(2, 6, 7)
    >>> torch.allclose(mha(x, memory, v)[0], reference(x, memory, v)[0], atol=1e-6)
    True

    Grouped-query attention: 8 query heads share 2 K/V heads, so K and V are a
    quarter of the size:

    >>> gqa = qkv.MultiHeadAttention(32, 8, num_kv_heads=2)
    >>> gqa.q_proj.out_features, gqa.k_proj.out_features
    (32, 8)
    """

    _inference_features = True
    _rotary: RotaryEmbedding | None = None  # a class default, so that modules pickled before it load

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
        init: InitScheme = "linear",
        num_kv_heads: int | None = None,
        rotary: RotaryEmbedding | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=vdim, d_k=d_k, d_v=d_v, bias=bias, dropout=dropout,
            batch_first=batch_first, init=init, num_kv_heads=num_kv_heads,
        )  # fmt: skip
        self.rotary = rotary
        h, h_kv = self.num_heads, self.num_kv_heads
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(self.embed_dim, h * self.d_k, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, h_kv * self.d_k, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, h_kv * self.d_v, bias=bias, **factory)
        self.out_proj = nn.Linear(h * self.d_v, self.embed_dim, bias=bias, **factory)
        if init != "linear":
            self.reset_parameters()

    def _projection_biases(self) -> list[Tensor]:
        return [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]  # (h·d_k,), (h_kv·d_k,), (h_kv·d_v,)

    def _attend(
        self, query: Tensor, key: Tensor | None, value: Tensor | None, mask: Tensor | None,
        need_weights: bool, dropout_p: float, is_causal: bool, cache: KVCache | None,
        key_value: KeyValue | None,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        h, h_kv = self.num_heads, self.num_kv_heads
        # The projections without Module.__getattr__: a decoding step counts microseconds.
        modules = cast("dict[str, nn.Module]", self._modules)
        q = split_heads_unchecked(project(modules["q_proj"], query), h)  # (B, h, T, d_k)
        if key_value is not None:
            if self._rotary is not None:
                raise ValueError("a module with rotary embeddings takes key and value, not key_value")
            k, v = key_value  # (B, h_kv, S, d_k), (B, h_kv, S, d_v)
        else:
            assert key is not None and value is not None  # given whenever key_value is not
            k = split_heads_unchecked(project(modules["k_proj"], key), h_kv)  # (B, h_kv, S_new, d_k)
            v = split_heads_unchecked(project(modules["v_proj"], value), h_kv)  # (B, h_kv, S_new, d_v)
            if self._rotary is not None:  # RoPE: rotate at absolute positions, before the cache and GQA
                q, k = self._rotate(q, k, 0 if cache is None else cache._length)
            if cache is not None:
                # Recording when anything attention saves for backward requires grad, the query included.
                needs_grad = q.requires_grad or k.requires_grad or v.requires_grad
                recording = needs_grad and torch.is_grad_enabled()
                k, v = cache._append_unchecked(k, v, recording)  # (B, h_kv, S, d_k), (B, h_kv, S, d_v)
                if cache._owner is None:
                    cache._owner = weakref.ref(self)  # one cache, one layer
        weights = None
        grouped = h_kv != h
        if need_weights:
            if grouped:
                k, v = expand_kv_heads(k, h), expand_kv_heads(v, h)  # (B, h, S, d_k), (B, h, S, d_v)
            heads, weights = explicit_attention(q, k, v, mask, None, dropout_p, is_causal)  # (B, h, T, d_v)
        else:
            if grouped and not SDPA_HAS_GQA:
                k, v = expand_kv_heads(k, h), expand_kv_heads(v, h)  # (B, h, S, d_k), (B, h, S, d_v)
            heads = fused_attention_unchecked(
                q, k, v, mask, None, dropout_p, is_causal, grouped and SDPA_HAS_GQA
            )  # (B, h, T, d_v)
        output = project(modules["out_proj"], merge_heads_unchecked(heads))  # (B, T, embed_dim)
        return output, weights

    @property
    def rotary(self) -> RotaryEmbedding | None:
        """The rotary position embeddings applied to queries and keys, or None."""
        return self._rotary

    @rotary.setter
    def rotary(self, rotary: RotaryEmbedding | None) -> None:
        if rotary is not None:
            if not isinstance(rotary, RotaryEmbedding):
                raise TypeError(f"rotary must be a qkv.RotaryEmbedding or None, got {type(rotary).__name__}")
            if rotary.d_k != self.d_k:
                raise ValueError(
                    f"rotary is for d_k={rotary.d_k}, but this module's heads have d_k={self.d_k}"
                )
        self._rotary = rotary

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self._rotary is None else f", rotary={self._rotary!r}")

    def _rotate(self, q: Tensor, k: Tensor, past: int) -> tuple[Tensor, Tensor]:
        """Queries (B, h, T, d_k) and new keys (B, h_kv, S_new, d_k) rotated at past, past + 1, ..."""
        rotary = cast(RotaryEmbedding, self._rotary)
        length = max(q.shape[2], k.shape[2])
        positions = torch.arange(past, past + length, device=q.device)  # (max(T, S_new),)
        angles = rotary.angles(positions)  # (max(T, S_new), r/2)
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)  # (max(T, S_new), r/2) each
        q = rotate_unchecked(q, cos[: q.shape[2]], sin[: q.shape[2]], rotary.pairing)  # (B, h, T, d_k)
        k = rotate_unchecked(k, cos[: k.shape[2]], sin[: k.shape[2]], rotary.pairing)  # (B, h_kv, S_new, d_k)
        return q, k

    def _project_key_value_unchecked(self, key: Tensor, value: Tensor) -> KeyValue:
        """Batch-first key (B, S, kdim) and value (B, S, vdim) through W^K and W^V, split into h_kv heads."""
        h_kv = self.num_kv_heads
        keys = split_heads_unchecked(project(self.k_proj, key), h_kv)  # (B, h_kv, S, d_k)
        values = split_heads_unchecked(project(self.v_proj, value), h_kv)  # (B, h_kv, S, d_v)
        return KeyValue(keys, values)

    def project_key_value(self, key: Tensor, value: Tensor | None = None) -> KeyValue:
        """Project keys and values once, split into heads, for ``forward(query, key_value=...)``.

        Cross-attention's K and V come from the encoder's output, which does not
        change while the decoder generates: compute them once per source and
        pass them at every step; ``forward`` then applies only W^Q and W^O.

        Parameters
        ----------
        key : Tensor, shape (B, S, kdim)
            (S, B, kdim) when the module has ``batch_first=False``.
        value : Tensor, shape (B, S, vdim), optional
            Defaults to ``key`` (as for cross-attention over an encoder's output).

        Returns
        -------
        KeyValue
            ``keys`` (B, h_kv, S, d_k) = key · W^K + b^K and ``values``
            (B, h_kv, S, d_v) = value · W^V + b^V, split into K/V heads; batch first
            in either layout.

        Examples
        --------
        >>> import torch, qkv
        >>> cross = qkv.MultiHeadAttention(12, 3, kdim=10, vdim=10)
        >>> memory, y = torch.randn(2, 6, 10), torch.randn(2, 4, 12)
        >>> kv = cross.project_key_value(memory)  # once per source
        >>> kv.keys.shape, kv.values.shape
        (torch.Size([2, 3, 6, 4]), torch.Size([2, 3, 6, 4]))
        >>> out, _ = cross(y, key_value=kv)  # at every step: only W^Q and W^O run
        >>> torch.allclose(out, cross(y, memory)[0], atol=1e-6)
        True
        """
        value = key if value is None else value
        lead = "(B, S" if self.batch_first else "(S, B"
        k = require_tensor("key", key, ndim=3, layout=f"{lead}, kdim)")
        v = require_tensor("value", value, ndim=3, layout=f"{lead}, vdim)")
        require_size("key", k, 2, self.kdim, "features", "kdim")
        require_size("value", v, 2, self.vdim, "features", "vdim")
        if k.shape[:2] != v.shape[:2]:
            raise ValueError(
                f"key and value must agree on batch and length, got key {shape_str(k.shape)} and "
                f"value {shape_str(v.shape)}"
            )
        if not self.batch_first:
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # (B, S, kdim), (B, S, vdim)
        try:
            return self._project_key_value_unchecked(k, v)
        except RuntimeError as error:
            self._explain_failure(k, None, v, first="key")
            raise error

    def new_cache(
        self,
        batch_size: int,
        max_length: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """An empty :class:`KVCache` that fits this module: its K/V heads, d_k and d_v.

        Parameters
        ----------
        batch_size : int
            B, the number of sequences decoded together.
        max_length : int
            The most tokens it will hold (prompt and generated), allocated now.
        dtype, device : optional
            Default: the device of the module's parameters, and their dtype, or the
            autocast dtype when called inside an autocast region for that device
            (autocast leaves float64 alone).

        Returns
        -------
        KVCache

        Examples
        --------
        >>> import qkv
        >>> mha = qkv.MultiHeadAttention(64, 8, num_kv_heads=2)
        >>> cache = mha.new_cache(batch_size=4, max_length=100)
        >>> cache.num_kv_heads, cache.d_k, cache.length, cache.max_length, cache.dtype
        (2, 8, 0, 100, torch.float32)
        """
        parameter = self.q_proj.weight
        if dtype is None:
            dtype = parameter.dtype
            if dtype != torch.float64 and _autocast_enabled(parameter.device):
                dtype = _autocast_dtype(parameter.device)  # what the projections will compute in
        return KVCache(
            batch_size,
            self.num_kv_heads,
            self.d_k,
            self.d_v,
            max_length=max_length,
            dtype=dtype,
            device=parameter.device if device is None else device,
        )

    def _state_from_heads(self, weights: HeadWeights) -> dict[str, Tensor]:
        w = weights
        state = {
            "q_proj.weight": w.w_q.transpose(1, 2).reshape(-1, self.embed_dim),  # (h·d_k, d_model)
            "k_proj.weight": w.w_k.transpose(1, 2).reshape(-1, self.kdim),  # (h_kv·d_k, kdim)
            "v_proj.weight": w.w_v.transpose(1, 2).reshape(-1, self.vdim),  # (h_kv·d_v, vdim)
            "out_proj.weight": w.w_o.T.contiguous(),  # (d_model, h·d_v)
        }
        if w.biases is not None:
            b_q, b_k, b_v, b_o = w.biases
            state["q_proj.bias"] = b_q.reshape(-1)  # (h·d_k,)
            state["k_proj.bias"] = b_k.reshape(-1)  # (h_kv·d_k,)
            state["v_proj.bias"] = b_v.reshape(-1)  # (h_kv·d_v,)
            state["out_proj.bias"] = b_o  # (d_model,)
        return state

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
        >>> # head 1 is rows 4..7 of q_proj.weight, transposed:
        >>> torch.equal(hw.w_q[1], mha.q_proj.weight[4:8].T)
        True
        """
        def per_head(linear: nn.Linear, size: int) -> Tensor:
            weight = linear.weight.detach()  # (heads·size, in)
            return weight.view(-1, size, weight.shape[1]).transpose(1, 2).clone()  # (heads, in, size)

        def bias_of(linear: nn.Linear, size: int) -> Tensor | None:
            return None if linear.bias is None else linear.bias.detach().view(-1, size).clone()

        return HeadWeights(
            w_q=per_head(self.q_proj, self.d_k),  # (h, d_model, d_k)
            w_k=per_head(self.k_proj, self.d_k),  # (h_kv, kdim, d_k)
            w_v=per_head(self.v_proj, self.d_v),  # (h_kv, vdim, d_v)
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
    parameter count and same function as :class:`MultiHeadAttention`. It runs h
    separate projections, score products, softmaxes and weighted sums where the fused
    module runs one of each, and is slower for it (measured in
    :doc:`heads/cost`).

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
    :doc:`heads/ladder` : the paper's form as a module, the ladder's first rung.

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
        init: InitScheme = "linear",
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

    def _projection_biases(self) -> list[Tensor]:
        heads = [cast(AttentionHead, head) for head in self.heads]
        return [getattr(head, name).bias for name in ("q_proj", "k_proj", "v_proj") for head in heads]

    def _attend(
        self, query: Tensor, key: Tensor | None, value: Tensor | None, mask: Tensor | None,
        need_weights: bool, dropout_p: float, is_causal: bool, cache: KVCache | None,
        key_value: KeyValue | None,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        assert key is not None and value is not None  # no cache or key_value: _check_forward refuses them
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

    def _state_from_heads(self, weights: HeadWeights) -> dict[str, Tensor]:
        w = weights
        state = {}
        for i in range(self.num_heads):
            state[f"heads.{i}.q_proj.weight"] = w.w_q[i].T  # (d_k, d_model)
            state[f"heads.{i}.k_proj.weight"] = w.w_k[i].T  # (d_k, kdim)
            state[f"heads.{i}.v_proj.weight"] = w.w_v[i].T  # (d_v, vdim)
            if w.biases is not None:
                for role, bias in zip("qkv", w.biases[:3], strict=True):
                    state[f"heads.{i}.{role}_proj.bias"] = bias[i]  # (d_k,) or (d_v,)
        state["out_proj.weight"] = w.w_o.T  # (d_model, h·d_v)
        if w.biases is not None:
            state["out_proj.bias"] = w.biases[3]  # (d_model,)
        return state

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
