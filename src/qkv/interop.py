"""Interop: the same attention weights as PyTorch, Hugging Face and Keras lay them out.

Every function converts to or from :class:`qkv.HeadWeights`, the paper's
per-head form. The optional libraries (transformers, keras) are imported only
inside the functions that need them; install them with ``pip install qkv[interop]``.

=====================  ==================================  =====================================
paper                  ``torch.nn.MultiheadAttention``     shape there
=====================  ==================================  =====================================
W^Q, W^K, W^V          ``in_proj_weight`` rows Q; K; V     (3·d_model, d_model), each W transposed
W^Q, W^K, W^V          ``q/k/v_proj_weight`` (kdim/vdim)   (d_model, d_model/kdim/vdim)
W^O                    ``out_proj.weight``                 (d_model, d_model), transposed
=====================  ==================================  =====================================

See also
--------
The page :doc:`heads/packed-layouts` (book/heads/packed-layouts.ipynb).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from qkv._validation import require_positive_int, require_tensor, shape_str
from qkv.heads import HeadWeights
from qkv.rotary import RotaryEmbedding

__all__ = [
    "from_bert",
    "from_keras",
    "from_llama",
    "from_torch",
    "interleaved_to_stacked",
    "rotary_from_llama",
    "stacked_to_interleaved",
    "to_torch",
    "to_torch_state_dict",
]


def _cut_rows(weight: Tensor, num_heads: int) -> Tensor:
    """An ``nn.Linear`` weight (h·d, in) as per-head matrices (h, in, d), detached."""
    out_features, in_features = weight.shape
    d = out_features // num_heads
    return weight.detach().view(num_heads, d, in_features).transpose(1, 2).clone()  # (h, in, d)


def _cut_bias(bias: Tensor | None, num_heads: int) -> Tensor | None:
    return None if bias is None else bias.detach().view(num_heads, -1).clone()  # (h, d)


def _from_linears(
    query: Any, key: Any, value: Any, output: Any, num_heads: int, num_kv_heads: int, bias: bool
) -> HeadWeights:
    """Per-head weights from four ``nn.Linear`` projections (BERT's and Llama's layout).

    The query rows are cut into ``num_heads`` heads, the key and value rows into
    ``num_kv_heads``; the output weight is transposed whole. ``bias``: read the biases.
    """
    return HeadWeights(
        w_q=_cut_rows(query.weight, num_heads),  # (h, in, d_k)
        w_k=_cut_rows(key.weight, num_kv_heads),  # (h_kv, in, d_k)
        w_v=_cut_rows(value.weight, num_kv_heads),  # (h_kv, in, d_v)
        w_o=output.weight.detach().T.clone(),  # (h·d_v, out)
        b_q=_cut_bias(query.bias, num_heads) if bias else None,
        b_k=_cut_bias(key.bias, num_kv_heads) if bias else None,
        b_v=_cut_bias(value.bias, num_kv_heads) if bias else None,
        b_o=output.bias.detach().clone() if bias else None,
    )


def from_torch(module: nn.MultiheadAttention) -> HeadWeights:
    """Read a ``torch.nn.MultiheadAttention``'s weights as per-head weights.

    PyTorch stacks the three projections' weights as rows of one packed
    ``in_proj_weight`` of shape (3·embed_dim, embed_dim), Q then K then V, each
    block being W transposed (``nn.Linear``'s layout). When ``kdim`` or ``vdim``
    differ from ``embed_dim`` it keeps three separate ``q_proj_weight``,
    ``k_proj_weight``, ``v_proj_weight`` instead. Both forms are read.

    Parameters
    ----------
    module : torch.nn.MultiheadAttention
        Without ``add_bias_kv`` or ``add_zero_attn`` (they have no place in the paper's form).

    Returns
    -------
    HeadWeights

    See Also
    --------
    to_torch : the inverse.
    :doc:`heads/packed-layouts` : where each head sits in ``in_proj_weight``.

    Examples
    --------
    >>> import torch, qkv
    >>> mha = torch.nn.MultiheadAttention(12, 3, batch_first=True)
    >>> hw = qkv.interop.from_torch(mha)
    >>> hw.w_q.shape  # (h, d_model, d_k), cut from in_proj_weight's first 12 rows
    torch.Size([3, 12, 4])
    >>> x = torch.randn(2, 5, 12)
    >>> ours = qkv.MultiHeadAttention.from_heads(hw)
    >>> torch.allclose(ours(x)[0], mha(x, x, x)[0], atol=1e-6)
    True
    """
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError(
            "module uses add_bias_kv or add_zero_attn, which extend the keys and values "
            "with extra positions; HeadWeights holds only the paper's projections"
        )
    return heads_from_torch_tensors(dict(module.named_parameters()), module.num_heads)


def torch_parameter_shapes(embed_dim: int, kdim: int, vdim: int, bias: bool) -> dict[str, tuple[int, ...]]:
    """The parameters of a ``torch.nn.MultiheadAttention`` of these sizes: state-dict name -> shape.

    Packed ``in_proj_weight`` when ``kdim == vdim == embed_dim`` (torch's rule), the
    separate ``q/k/v_proj_weight`` otherwise; without ``add_bias_kv``.
    """
    E = embed_dim
    shapes: dict[str, tuple[int, ...]]
    if kdim == vdim == E:
        shapes = {"in_proj_weight": (3 * E, E)}
    else:
        shapes = {"q_proj_weight": (E, E), "k_proj_weight": (E, kdim), "v_proj_weight": (E, vdim)}
    if bias:
        shapes["in_proj_bias"] = (3 * E,)
    shapes["out_proj.weight"] = (E, E)
    if bias:
        shapes["out_proj.bias"] = (E,)
    return shapes


def heads_from_torch_tensors(tensors: Mapping[str, Tensor], num_heads: int) -> HeadWeights:
    """Per-head weights from ``torch.nn.MultiheadAttention``'s parameters, by state-dict name.

    The shapes are the caller's to check (see :func:`torch_parameter_shapes`).
    """
    h = num_heads
    if "in_proj_weight" in tensors:
        w_q, w_k, w_v = tensors["in_proj_weight"].chunk(3, dim=0)  # 3 × (embed_dim, embed_dim)
    else:
        w_q, w_k, w_v = (tensors[f"{role}_proj_weight"] for role in "qkv")  # (embed_dim, in) each
    b_q = b_k = b_v = None
    if "in_proj_bias" in tensors:
        b_q, b_k, b_v = tensors["in_proj_bias"].chunk(3)  # 3 × (embed_dim,)
    out_bias = tensors.get("out_proj.bias")
    return HeadWeights(
        w_q=_cut_rows(w_q, h),  # (h, embed_dim, d_k)
        w_k=_cut_rows(w_k, h),  # (h, kdim, d_k)
        w_v=_cut_rows(w_v, h),  # (h, vdim, d_v)
        w_o=tensors["out_proj.weight"].detach().T.clone(),  # (h·d_v, embed_dim)
        b_q=_cut_bias(b_q, h),
        b_k=_cut_bias(b_k, h),
        b_v=_cut_bias(b_v, h),
        b_o=None if out_bias is None else out_bias.detach().clone(),
    )


def torch_tensors(weights: HeadWeights) -> dict[str, Tensor]:
    """``weights`` as ``torch.nn.MultiheadAttention``'s parameters, by state-dict name.

    Raises ``ValueError`` for what torch's module cannot hold: grouped-query
    attention, or ``d_k``/``d_v`` other than ``embed_dim / num_heads``.
    """
    w = weights
    h, embed_dim = w.num_heads, w.embed_dim
    if w.num_kv_heads != h:
        raise ValueError(
            f"torch.nn.MultiheadAttention has one K/V head per query head, but the weights share "
            f"{w.num_kv_heads} K/V heads among {h} query heads; convert weights.expand_kv_heads() "
            "(for a module: MultiHeadAttention.from_heads(module.to_heads().expand_kv_heads())), "
            "the same layer with each K/V head copied into its group"
        )
    if not (w.d_k == w.d_v and w.d_k * h == embed_dim):
        raise ValueError(
            "torch.nn.MultiheadAttention needs d_k == d_v == embed_dim / num_heads, got "
            f"d_k={w.d_k}, d_v={w.d_v}, embed_dim={embed_dim}, num_heads={h}"
        )

    def fused(per_head: Tensor) -> Tensor:
        return per_head.transpose(1, 2).reshape(h * per_head.shape[2], per_head.shape[1])  # (h·d, in)

    tensors: dict[str, Tensor]
    if w.kdim == w.vdim == embed_dim:
        tensors = {"in_proj_weight": torch.cat([fused(w.w_q), fused(w.w_k), fused(w.w_v)])}  # (3·E, E)
    else:
        tensors = {
            "q_proj_weight": fused(w.w_q),  # (embed_dim, embed_dim)
            "k_proj_weight": fused(w.w_k),  # (embed_dim, kdim)
            "v_proj_weight": fused(w.w_v),  # (embed_dim, vdim)
        }
    if w.biases is not None:
        b_q, b_k, b_v, _ = w.biases
        tensors["in_proj_bias"] = torch.cat([b_q.reshape(-1), b_k.reshape(-1), b_v.reshape(-1)])  # (3·E,)
    tensors["out_proj.weight"] = w.w_o.T.contiguous()  # (embed_dim, h·d_v)
    if w.biases is not None:
        tensors["out_proj.bias"] = w.biases[3]  # (embed_dim,)
    return tensors


def to_torch(weights: HeadWeights, *, batch_first: bool = True) -> nn.MultiheadAttention:
    """Build a ``torch.nn.MultiheadAttention`` holding ``weights``.

    The result uses the packed ``in_proj_weight`` when ``kdim == vdim ==
    embed_dim`` and the separate ``q/k/v_proj_weight`` otherwise, on the
    weights' dtype and device. Note its mask convention: in
    ``nn.MultiheadAttention`` a True in ``attn_mask`` means *blocked*
    (see :func:`qkv.from_torch_mask`).

    Parameters
    ----------
    weights : HeadWeights
        PyTorch requires ``d_k == d_v == embed_dim / num_heads``.
    batch_first : bool
        The module's input layout; qkv's modules are batch first.

    Returns
    -------
    torch.nn.MultiheadAttention

    See Also
    --------
    from_torch : the inverse.
    :doc:`heads/ladder` : the same layer rebuilt in PyTorch, rung 4.

    Examples
    --------
    >>> import qkv
    >>> mha = qkv.interop.to_torch(qkv.HeadWeights.random(12, 3, kdim=10, vdim=7))
    >>> # separate weights, since kdim != embed_dim:
    >>> mha.in_proj_weight is None, mha.k_proj_weight.shape
    (True, torch.Size([12, 10]))
    """
    if not isinstance(weights, HeadWeights):
        raise TypeError(f"weights must be a HeadWeights, got {type(weights).__name__}")
    tensors = torch_tensors(weights)
    w = weights
    module = nn.MultiheadAttention(
        w.embed_dim, w.num_heads, bias=w.bias, kdim=w.kdim, vdim=w.vdim, batch_first=batch_first,
        device=w.w_q.device, dtype=w.w_q.dtype,
    )  # fmt: skip
    module.load_state_dict(tensors)
    return module


def to_torch_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module.state_dict()`` with every qkv attention module in ``torch.nn.MultiheadAttention``'s layout.

    What a model built with ``nn.MultiheadAttention`` in those places loads with
    ``load_state_dict``: each :class:`qkv.MultiHeadAttention` or
    :class:`qkv.PerHeadMultiHeadAttention` inside ``module`` (``module`` itself
    included) gives ``in_proj_weight`` (or ``q/k/v_proj_weight`` when kdim or vdim
    differ from embed_dim), ``in_proj_bias`` and ``out_proj.*`` under its own
    prefix; every other entry is ``module.state_dict()``'s. The other way needs no
    function: ``qkv.MultiHeadAttention.load_state_dict`` reads torch's layout too.

    Parameters
    ----------
    module : nn.Module
        A qkv attention module, or a model that holds some.

    Returns
    -------
    dict of str to Tensor
        Detached tensors (copies for the attention modules' entries).

    Raises
    ------
    ValueError
        For an attention module that torch's cannot hold: grouped-query attention
        (``num_kv_heads < num_heads``; expand it first with
        :meth:`qkv.HeadWeights.expand_kv_heads`), or ``d_k``/``d_v`` other than
        ``embed_dim / num_heads``. The message names the module.

    See Also
    --------
    to_torch : a ``torch.nn.MultiheadAttention`` built from per-head weights.
    qkv.MultiHeadAttention : its ``load_state_dict`` takes torch's layout as it is.

    Examples
    --------
    A qkv layer as ``nn.TransformerEncoderLayer``'s self-attention, saved for torch's own:

    >>> import torch, qkv
    >>> layer = torch.nn.TransformerEncoderLayer(12, 3, batch_first=True)
    >>> layer.self_attn = qkv.MultiHeadAttention(12, 3)
    >>> state = qkv.interop.to_torch_state_dict(layer)
    >>> state["self_attn.in_proj_weight"].shape  # W^Q, W^K, W^V rows, packed
    torch.Size([36, 12])
    >>> torchs = torch.nn.TransformerEncoderLayer(12, 3, batch_first=True)
    >>> torchs.load_state_dict(state)
    <All keys matched successfully>
    """
    from qkv.multihead import _MultiHeadBase  # qkv.multihead imports this module

    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    state: dict[str, Tensor] = module.state_dict()
    for name, attention in module.named_modules():
        if not isinstance(attention, _MultiHeadBase):
            continue
        prefix = f"{name}." if name else ""
        for key in attention.state_dict():
            del state[prefix + key]
        try:
            tensors = torch_tensors(attention.to_heads())
        except ValueError as error:
            where = f"module.{name}" if name else "module"
            raise ValueError(f"{where} ({type(attention).__name__}): {error}") from None
        state.update({prefix + key: tensor for key, tensor in tensors.items()})
    return state


def from_bert(module: Any) -> HeadWeights:
    """Read a Hugging Face BERT attention block's weights as per-head weights.

    ``BertAttention`` holds ``self.query``, ``self.key`` and ``self.value``
    (``nn.Linear``: these are operations whose outputs are Q, K and V) and
    ``output.dense``, which plays the part of W^O. Note that the block then
    adds the input back and applies ``output.LayerNorm``:
    ``BertAttention(x) = LayerNorm(x + MultiHead(x, x, x))`` (no dropout in eval mode).

    Parameters
    ----------
    module : transformers.models.bert.modeling_bert.BertAttention
        Or any module with the same layout (``.self.query/key/value``,
        ``.self.num_attention_heads``, ``.output.dense``), e.g. RoBERTa's.

    Returns
    -------
    HeadWeights

    See Also
    --------
    :doc:`terminology/walk-through` : BERT's attention computed by hand, step by step.

    Examples
    --------
    >>> import torch, qkv
    >>> from transformers import BertConfig
    >>> from transformers.models.bert.modeling_bert import BertAttention
    >>> config = BertConfig(
    ...     hidden_size=12, num_attention_heads=3, attn_implementation="eager"
    ... )
    >>> bert = BertAttention(config).eval()
    >>> hw = qkv.interop.from_bert(bert)
    >>> x = torch.randn(2, 5, 12)
    >>> mixed, _ = qkv.MultiHeadAttention.from_heads(hw)(x)
    >>> torch.allclose(bert.output.LayerNorm(x + mixed), bert(x)[0], atol=1e-5)
    True
    """
    inner = getattr(module, "self", None)
    output = getattr(module, "output", None)
    names = ("query", "key", "value", "num_attention_heads")
    if inner is None or output is None or not all(hasattr(inner, n) for n in names):
        hint = ""
        if all(hasattr(module, n) for n in names):
            hint = (
                "; this looks like a BertSelfAttention: pass its parent BertAttention, "
                "whose output.dense is W^O"
            )
        raise TypeError(
            f"module must be a BERT-style attention block with .self.query/key/value and "
            f".output.dense, got {type(module).__name__}{hint}"
        )
    h = int(inner.num_attention_heads)
    bias = inner.query.bias is not None
    return _from_linears(inner.query, inner.key, inner.value, output.dense, h, h, bias)


def from_keras(layer: Any) -> HeadWeights:
    """Read a Keras 3 ``keras.layers.MultiHeadAttention``'s weights as per-head weights.

    Keras keeps the per-head form already: the query kernel has shape
    (d_model, h, d_k), that is (I, H, O), and is applied with the einsum
    ``"...NI,IHO->...NHO"`` (N positions, I input features, H heads, O head size;
    Keras itself writes it ``"abc,cde->abde"``); the output kernel
    has shape (h, d_v, d_model). Works on any backend (torch, JAX, TensorFlow).

    Parameters
    ----------
    layer : keras.layers.MultiHeadAttention
        Built (called once), with the default ``attention_axes`` and
        ``output_shape``.

    Returns
    -------
    HeadWeights
        float32 on the CPU, whatever the backend.

    See Also
    --------
    :doc:`cross_attention/keras-arguments` : Keras's layer read and checked, its argument order.

    Examples
    --------
    >>> import os; os.environ.setdefault("KERAS_BACKEND", "torch")
    'torch'
    >>> import keras, qkv
    >>> layer = keras.layers.MultiHeadAttention(num_heads=3, key_dim=4)
    >>> # the first call builds the kernels:
    >>> _ = layer(keras.ops.ones((1, 5, 12)), keras.ops.ones((1, 6, 10)))
    >>> hw = qkv.interop.from_keras(layer)
    >>> hw.w_q.shape, hw.w_k.shape, hw.w_o.shape
    (torch.Size([3, 12, 4]), torch.Size([3, 10, 4]), torch.Size([12, 12]))
    """
    try:
        import keras
    except ImportError as error:  # pragma: no cover - exercised only without keras
        raise ImportError("from_keras needs keras: pip install 'qkv[interop]'") from error
    if not isinstance(layer, keras.layers.MultiHeadAttention):
        raise TypeError(f"layer must be a keras.layers.MultiHeadAttention, got {type(layer).__name__}")
    if not layer.built:
        raise ValueError("layer is not built yet: call it once on inputs so its kernels exist")
    if layer.attention_axes not in (None, (1,)):
        raise ValueError(
            f"layer attends over axes {layer.attention_axes}; only the sequence axis is supported"
        )

    def tensor(variable: Any) -> Tensor:
        return torch.as_tensor(keras.ops.convert_to_numpy(variable)).float()

    w_o = tensor(layer.output_dense.kernel)  # (h, d_v, d_out)
    d_model = layer.query_dense.kernel.shape[0]
    if w_o.dim() != 3 or w_o.shape[-1] != d_model:
        raise ValueError(
            f"layer has output_shape={tuple(w_o.shape[2:])}, so its output is not the query's "
            f"width ({d_model}); the paper's W^O maps back to d_model: build the layer "
            "without output_shape"
        )
    h, d_v, d_out = w_o.shape
    bias = layer.use_bias
    return HeadWeights(
        w_q=tensor(layer.query_dense.kernel).permute(1, 0, 2).contiguous(),  # (h, d_model, d_k)
        w_k=tensor(layer.key_dense.kernel).permute(1, 0, 2).contiguous(),  # (h, kdim, d_k)
        w_v=tensor(layer.value_dense.kernel).permute(1, 0, 2).contiguous(),  # (h, vdim, d_v)
        w_o=w_o.reshape(h * d_v, d_out),  # (h·d_v, d_model)
        b_q=tensor(layer.query_dense.bias) if bias else None,  # (h, d_k)
        b_k=tensor(layer.key_dense.bias) if bias else None,  # (h, d_k)
        b_v=tensor(layer.value_dense.bias) if bias else None,  # (h, d_v)
        b_o=tensor(layer.output_dense.bias) if bias else None,  # (d_model,)
    )


def from_llama(module: Any) -> HeadWeights:
    """Read a Hugging Face ``LlamaAttention``'s weights as per-head, grouped-query weights.

    Llama shares each K/V head among ``num_attention_heads / num_key_value_heads``
    query heads (grouped-query attention): ``k_proj`` and ``v_proj`` have
    ``num_key_value_heads · head_dim`` outputs, and ``o_proj`` is W^O. The
    result has ``num_kv_heads = num_key_value_heads``, and
    ``qkv.MultiHeadAttention.from_heads`` holds it.

    Llama also rotates Q and K by rotary position embeddings (RoPE) inside its
    forward pass, with the half-split pairing: :func:`rotary_from_llama` reads
    them, and a ``MultiHeadAttention`` given both computes what the Llama layer
    computes, cached decoding included.

    Parameters
    ----------
    module : transformers.models.llama.modeling_llama.LlamaAttention
        Or any module with the same layout (``q_proj``, ``k_proj``, ``v_proj``,
        ``o_proj``, ``head_dim``, ``config.num_attention_heads`` and
        ``config.num_key_value_heads``), e.g. Mistral's; biases all or none,
        scaling ``head_dim ** -0.5``.

    Returns
    -------
    HeadWeights
        ``w_q`` (h, hidden, head_dim), ``w_k`` and ``w_v`` (h_kv, hidden, head_dim),
        ``w_o`` (h·head_dim, hidden).

    Examples
    --------
    >>> import torch, qkv
    >>> from transformers import LlamaConfig
    >>> from transformers.models.llama.modeling_llama import LlamaAttention
    >>> config = LlamaConfig(
    ...     hidden_size=16, num_attention_heads=4, num_key_value_heads=2
    ... )
    >>> config._attn_implementation = "eager"
    >>> llama = LlamaAttention(config, layer_idx=0).eval()
    >>> hw = qkv.interop.from_llama(llama)
    >>> hw.num_heads, hw.num_kv_heads, hw.d_k
    (4, 2, 4)
    >>> from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    >>> x = torch.randn(2, 5, 16)
    >>> rotation = LlamaRotaryEmbedding(config)(x, torch.arange(5)[None])  # cos, sin
    >>> # a mask added to the scores, (1, 1, T, T):
    >>> causal = torch.full((5, 5), float("-inf")).triu(1)[None, None]
    >>> expected, _ = llama(x, position_embeddings=rotation, attention_mask=causal)
    >>> mha = qkv.MultiHeadAttention.from_heads(hw)
    >>> mha.rotary = qkv.interop.rotary_from_llama(llama)
    >>> output, _ = mha(x, is_causal=True)
    >>> torch.allclose(output, expected, atol=1e-6)
    True
    """
    config = getattr(module, "config", None)
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")
    if config is None or not all(hasattr(module, n) for n in names):
        raise TypeError(
            "module must be a Llama-style attention layer with q_proj, k_proj, v_proj, o_proj, "
            f"head_dim and config, got {type(module).__name__}"
        )
    h, h_kv = int(config.num_attention_heads), int(config.num_key_value_heads)
    head_dim = int(module.head_dim)
    scaling = getattr(module, "scaling", head_dim**-0.5)
    if abs(scaling - head_dim**-0.5) > 1e-12 * head_dim**-0.5:
        raise ValueError(
            f"module scales its scores by {scaling}, not 1/sqrt(head_dim) = {head_dim**-0.5}; "
            "qkv's modules scale by 1/sqrt(d_k)"
        )
    projections = [module.q_proj, module.k_proj, module.v_proj, module.o_proj]
    with_bias = [p.bias is not None for p in projections]
    if any(with_bias) and not all(with_bias):
        present = [n for n, b in zip(("q_proj", "k_proj", "v_proj", "o_proj"), with_bias, strict=True) if b]
        raise ValueError(
            f"only {', '.join(present)} of the four projections have a bias; HeadWeights holds all or none"
        )
    bias = all(with_bias)
    return _from_linears(module.q_proj, module.k_proj, module.v_proj, module.o_proj, h, h_kv, bias)


def rotary_from_llama(module: Any) -> RotaryEmbedding:
    """The rotary position embeddings of a Hugging Face Llama layer, model or configuration.

    Hugging Face's Llama rotates each head's queries and keys with the half-split
    pairing (dimension j with j + head_dim/2; its conversion script permutes the
    rows of Meta's W^Q and W^K for it, see :func:`qkv.interleaved_to_half`), at the
    frequencies ``rope_theta ** (-2j / head_dim)``, computing the angles in float32.
    This returns the :class:`qkv.RotaryEmbedding` that does the same, for
    ``MultiHeadAttention(..., rotary=...)`` or ``module.rotary = ...``.

    Parameters
    ----------
    module : LlamaAttention, LlamaForCausalLM or LlamaConfig
        Anything with a Llama ``config`` (or the configuration itself): its
        ``rope_parameters`` (``rope_type`` "default" and ``rope_theta``), ``head_dim``
        and ``max_position_embeddings`` are read.

    Returns
    -------
    RotaryEmbedding
        ``pairing="half"``, ``base=rope_theta``, ``angle_dtype=torch.float32``.

    Raises
    ------
    ValueError
        For a scaled rotation (``rope_type`` other than "default": linear, dynamic,
        YaRN, Llama 3's), which qkv does not implement.

    See Also
    --------
    from_llama : the layer's weights.
    :doc:`rotary` : where position enters attention.

    Examples
    --------
    >>> from transformers import LlamaConfig
    >>> import qkv
    >>> config = LlamaConfig(hidden_size=64, num_attention_heads=4)
    >>> qkv.interop.rotary_from_llama(config)
    RotaryEmbedding(d_k=16, base=10000.0, pairing='half', fraction=1.0, rotary_dim=16)
    """
    config = getattr(module, "config", module)
    parameters = getattr(config, "rope_parameters", None)
    if parameters is None:  # transformers before 5 kept them at the top of the configuration
        scaling = getattr(config, "rope_scaling", None) or {}
        parameters = {"rope_type": scaling.get("rope_type", scaling.get("type", "default")),
                      "rope_theta": getattr(config, "rope_theta", None)}  # fmt: skip
    if not hasattr(config, "num_attention_heads") or parameters.get("rope_theta") is None:
        raise TypeError(f"module must be a Llama layer, model or configuration, got {type(module).__name__}")
    rope_type = parameters.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(
            f"the configuration scales its rotation (rope_type={rope_type!r}); qkv implements only the "
            "default rotation"
        )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return RotaryEmbedding(int(head_dim), base=float(parameters["rope_theta"]), pairing="half")


def _packed_blocks(name: str, packed: object, num_heads: object) -> tuple[Tensor, int, int]:
    """Validate a packed Q/K/V weight or bias; return it, h and d (the features per head)."""
    tensor = require_tensor(name, packed, min_ndim=1, layout="(3·h·d, ...)")
    h = require_positive_int("num_heads", num_heads)
    rows = tensor.shape[0]
    if rows % (3 * h):
        raise ValueError(
            f"{name} has shape {shape_str(tensor.shape)}: its first axis ({rows}) must hold Q, K and V "
            f"for {h} heads, a multiple of 3 · num_heads = {3 * h}"
        )
    return tensor, h, rows // (3 * h)


def interleaved_to_stacked(packed: Tensor, num_heads: int) -> Tensor:
    """Reorder a packed Q/K/V projection from per-head interleaved to stacked Q; K; V.

    A packed projection ``nn.Linear(d_in, 3·h·d)`` makes Q, K and V in one
    product; libraries disagree on the order of its 3·h·d output features.
    PyTorch's ``in_proj_weight`` and nanoGPT's ``c_attn`` *stack* them: all of
    Q (h·d features, head by head), then all of K, then all of V, and the code
    cuts the output with ``chunk(3, dim=-1)``. Other code (the UvA deep
    learning tutorial's ``qkv_proj``) *interleaves* them per head: head 0's q,
    k, v (d features each), then head 1's, and cuts with
    ``reshape(B, T, h, 3·d)`` then ``chunk(3, dim=-1)``. Loading one layout
    into code written for the other raises nothing, every shape being the
    same, and computes another function. This returns the stacked order.

    Parameters
    ----------
    packed : Tensor, shape (3·h·d, ...)
        The weight of the packed ``nn.Linear``, (3·h·d, d_in), or its bias,
        (3·h·d,): the output features come first, as ``nn.Linear`` stores them.
    num_heads : int
        h.

    Returns
    -------
    Tensor, shape (3·h·d, ...)
        A new tensor with the same rows, in the order Q (heads 0..h-1), K, V.

    See Also
    --------
    stacked_to_interleaved : the inverse.
    :doc:`heads/packed-layouts` : the two packed layouts, and the silent bug of mixing them.

    Examples
    --------
    >>> import torch
    >>> from qkv.interop import interleaved_to_stacked
    >>> # 2 heads of 1 feature: rows q0 k0 v0 q1 k1 v1, labelled 0..5
    >>> interleaved_to_stacked(torch.arange(6.0), 2).tolist()
    [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    """
    tensor, h, d = _packed_blocks("packed", packed, num_heads)
    rest = tensor.shape[1:]
    by_head = tensor.reshape(h, 3, d, *rest)  # (h, 3, d, ...): head, then q/k/v
    return by_head.transpose(0, 1).reshape(tensor.shape).clone()  # (3·h·d, ...)


def stacked_to_interleaved(packed: Tensor, num_heads: int) -> Tensor:
    """Reorder a packed Q/K/V projection from stacked Q; K; V to per-head interleaved.

    The inverse of :func:`interleaved_to_stacked`: from PyTorch's and nanoGPT's
    order (all of Q, then K, then V) to one where each head's q, k and v are
    next to each other (head 0's q, k, v, then head 1's, ...).

    Parameters
    ----------
    packed : Tensor, shape (3·h·d, ...)
        A packed weight (3·h·d, d_in) or bias (3·h·d,) in the stacked order.
    num_heads : int
        h.

    Returns
    -------
    Tensor, shape (3·h·d, ...)
        A new tensor with the same rows, head by head, q, k, v within each head.

    See Also
    --------
    interleaved_to_stacked : the inverse.
    :doc:`heads/packed-layouts` : the two packed layouts.

    Examples
    --------
    >>> import torch
    >>> from qkv.interop import stacked_to_interleaved
    >>> # 2 heads of 1 feature: rows q0 q1 k0 k1 v0 v1, labelled 0..5
    >>> stacked_to_interleaved(torch.arange(6.0), 2).tolist()
    [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]
    """
    tensor, h, d = _packed_blocks("packed", packed, num_heads)
    rest = tensor.shape[1:]
    by_role = tensor.reshape(3, h, d, *rest)  # (3, h, d, ...): q/k/v, then head
    return by_role.transpose(0, 1).reshape(tensor.shape).clone()  # (3·h·d, ...)
