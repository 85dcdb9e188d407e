"""Models: small networks built from qkv's own attention modules, for the book's experiments.

See also
--------
The chapters :doc:`cross_attention` (book/cross_attention.ipynb) and
:doc:`training` (book/training.ipynb).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from qkv._validation import require_positive_int, require_size, require_tensor, shape_str
from qkv.cache import KeyValue
from qkv.masks import causal_mask, padding_mask
from qkv.multihead import MultiHeadAttention

__all__: list[str] = [
    "DecoderLayer",
    "EncoderDecoderConfig",
    "EncoderLayer",
    "PreviousTokenModel",
    "RecallModel",
    "TinyEncoderDecoder",
]


class RecallModel(nn.Module):
    """A one-layer attention model for :class:`qkv.data.AssociativeRecall`.

    Each position's input is the sum of its name's and its number's embeddings
    (no positions: the match is by content). One :class:`qkv.MultiHeadAttention`
    layer, without biases, in which no position attends to itself (unless
    ``mask_self=False``); a linear
    readout of the query position's output gives the logits over numbers.
    Nothing tells the layer where to attend: only the answer's loss trains it.

    Parameters
    ----------
    num_names, num_numbers : int
        The task's vocabularies (the number embedding has one more row, for the blank).
    embed_dim : int
        d_model.
    num_heads : int
        h.
    mask_self : bool
        Mask each position's score with itself (the default). With ``False``
        every position may attend to itself as well.

    Attributes
    ----------
    name_embedding : nn.Embedding, num_names -> embed_dim
    number_embedding : nn.Embedding, num_numbers + 1 -> embed_dim
    attention : qkv.MultiHeadAttention, bias=False
    readout : nn.Linear, embed_dim -> num_numbers

    See Also
    --------
    qkv.data.AssociativeRecall
    :doc:`training/recall` : trained without attention labels.
    """

    def __init__(
        self,
        num_names: int,
        num_numbers: int,
        embed_dim: int = 32,
        num_heads: int = 1,
        *,
        mask_self: bool = True,
    ) -> None:
        super().__init__()
        self.mask_self = mask_self
        self.num_names = require_positive_int("num_names", num_names)
        self.num_numbers = require_positive_int("num_numbers", num_numbers)
        self.name_embedding = nn.Embedding(num_names, embed_dim)
        self.number_embedding = nn.Embedding(num_numbers + 1, embed_dim)
        self.attention = MultiHeadAttention(embed_dim, num_heads, bias=False)
        self.readout = nn.Linear(embed_dim, num_numbers)

    def forward(
        self, names: Tensor, numbers: Tensor, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits for the queried name's number.

        Parameters
        ----------
        names, numbers : LongTensor, shape (B, L)
            As made by :meth:`qkv.data.AssociativeRecall.sample`; the last
            position is the query.
        need_weights : bool
            Also return the attention weights.

        Returns
        -------
        logits : Tensor, shape (B, num_numbers)
        weights : Tensor, shape (B, h, L, L)
            Only with ``need_weights``; row L - 1 is the query's.
        """
        require_tensor("names", names, ndim=2, layout="(B, L)", floating=False)
        require_tensor("numbers", numbers, ndim=2, layout="(B, L)", floating=False)
        if names.shape != numbers.shape:
            raise ValueError(
                f"names and numbers must have one shape (B, L), got {shape_str(names.shape)} "
                f"and {shape_str(numbers.shape)}"
            )
        x = self.name_embedding(names) + self.number_embedding(numbers)  # (B, L, d_model)
        length = x.shape[1]
        mask = ~torch.eye(length, dtype=torch.bool, device=x.device) if self.mask_self else None  # (L, L)
        output, weights = self.attention(x, mask=mask, need_weights=True)  # (B, L, d_model)
        logits = self.readout(output[:, -1])  # (B, num_numbers)
        return (logits, weights) if need_weights else logits


class PreviousTokenModel(nn.Module):
    """A one-layer causal attention model for :class:`qkv.data.PreviousTokenTask`.

    Token and learned position embeddings, one causal :class:`qkv.MultiHeadAttention`
    layer without biases, and a linear readout at every position. With
    ``tie_query_key=True`` the key projection *is* the query projection (one
    shared parameter, W^Q = W^K), which makes every head's scores symmetric.

    Parameters
    ----------
    vocab_size : int
        Number of tokens (inputs and answers).
    length : int
        The longest sequence (number of position embeddings).
    embed_dim : int
        d_model.
    num_heads : int
        h.
    tie_query_key : bool
        Share one weight between ``attention.q_proj`` and ``attention.k_proj``.

    Attributes
    ----------
    token_embedding : nn.Embedding, vocab_size -> embed_dim
    position_embedding : nn.Embedding, length -> embed_dim
    attention : qkv.MultiHeadAttention, bias=False
    readout : nn.Linear, embed_dim -> vocab_size

    See Also
    --------
    qkv.data.PreviousTokenTask
    :doc:`training/tying` : W^Q and W^K started equal, and tied for good, on the previous-token task.
    """

    def __init__(
        self,
        vocab_size: int,
        length: int,
        embed_dim: int = 32,
        num_heads: int = 1,
        *,
        tie_query_key: bool = False,
    ) -> None:
        super().__init__()
        self.length = require_positive_int("length", length)
        self.token_embedding = nn.Embedding(require_positive_int("vocab_size", vocab_size), embed_dim)
        self.position_embedding = nn.Embedding(length, embed_dim)
        self.attention = MultiHeadAttention(embed_dim, num_heads, bias=False)
        self.readout = nn.Linear(embed_dim, vocab_size)
        self.tie_query_key = bool(tie_query_key)
        if self.tie_query_key:
            self.attention.k_proj.weight = self.attention.q_proj.weight  # one parameter, two roles

    def forward(self, tokens: Tensor, need_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits for the previous token, at every position.

        Parameters
        ----------
        tokens : LongTensor, shape (B, T), T <= length
        need_weights : bool
            Also return the attention weights.

        Returns
        -------
        logits : Tensor, shape (B, T, vocab_size)
        weights : Tensor, shape (B, h, T, T)
            Only with ``need_weights``.
        """
        require_tensor("tokens", tokens, ndim=2, layout="(B, T)", floating=False)
        steps = tokens.shape[1]
        if steps > self.length:
            raise ValueError(
                f"tokens has {steps} positions, but the model has {self.length} position embeddings"
            )
        positions = self.position_embedding.weight[:steps]  # (T, d_model)
        x = self.token_embedding(tokens) + positions  # (B, T, d_model)
        mask = causal_mask(steps, device=x.device)  # (T, T)
        output, weights = self.attention(x, mask=mask, need_weights=True)  # (B, T, d_model)
        logits = self.readout(output)  # (B, T, vocab_size)
        return (logits, weights) if need_weights else logits


# --- A tiny encoder-decoder: self-attention in each half, cross-attention between them ---


def _feed_forward(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class EncoderLayer(nn.Module):
    """One pre-norm Transformer encoder layer: self-attention, then a feed-forward network.

    Parameters
    ----------
    dim : int
        The encoder's width.
    num_heads : int
        h.
    hidden : int
        The feed-forward network's hidden size.

    Attributes
    ----------
    self_attn : qkv.MultiHeadAttention
        Queries, keys and values all come from the source.

    See Also
    --------
    DecoderLayer
    :doc:`cross_attention` : the encoder whose output every decoder layer reads.
    """

    def __init__(self, dim: int, num_heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.self_attn = MultiHeadAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.feed_forward = _feed_forward(dim, require_positive_int("hidden", hidden))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Update the source's hidden states.

        Parameters
        ----------
        x : Tensor, shape (B, S, dim)
        mask : BoolTensor, optional, broadcastable to (B, h, S, S)
            True = may attend; a source padding mask (B, 1, 1, S).

        Returns
        -------
        Tensor, shape (B, S, dim)
        """
        x = x + self.self_attn(self.norm1(x), mask=mask)[0]  # (B, S, dim)
        x = x + self.feed_forward(self.norm2(x))  # (B, S, dim)
        return x


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer: causal self-attention, cross-attention, feed-forward.

    The cross-attention's queries come from the decoder (width ``dim``); its
    keys and values are projections of the encoder's output, the *memory*
    (width ``memory_dim``, which may differ: ``kdim = vdim = memory_dim``).

    Parameters
    ----------
    dim : int
        The decoder's width.
    num_heads : int
        h, for both attentions.
    hidden : int
        The feed-forward network's hidden size.
    memory_dim : int
        The encoder's width.

    Attributes
    ----------
    self_attn : qkv.MultiHeadAttention
        Over the target so far (causal mask).
    cross_attn : qkv.MultiHeadAttention
        ``embed_dim=dim, kdim=vdim=memory_dim``: Q = decoder states · W^Q,
        K = memory · W^K, V = memory · W^V.

    See Also
    --------
    EncoderLayer, TinyEncoderDecoder
    :doc:`cross_attention/masks` : its two attentions, and why only the self-attention is causal.
    """

    def __init__(self, dim: int, num_heads: int, hidden: int, memory_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.self_attn = MultiHeadAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = MultiHeadAttention(dim, num_heads, kdim=memory_dim, vdim=memory_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.feed_forward = _feed_forward(dim, require_positive_int("hidden", hidden))

    def memory_keys_values(self, memory: Tensor) -> KeyValue:
        """The cross-attention's keys and values: the memory through W^K and W^V, split into heads.

        They depend on the source only, so a decoder computes them once per
        source and reuses them at every step of generation
        (:meth:`qkv.MultiHeadAttention.project_key_value`).

        Parameters
        ----------
        memory : Tensor, shape (B, S, memory_dim)

        Returns
        -------
        KeyValue
            keys (B, h, S, d_k) and values (B, h, S, d_v).
        """
        return self.cross_attn.project_key_value(memory)

    def forward(
        self,
        y: Tensor,
        memory: Tensor | None = None,
        *,
        memory_mask: Tensor | None = None,
        memory_keys_values: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Update the target's hidden states, reading the source through cross-attention.

        Parameters
        ----------
        y : Tensor, shape (B, T, dim)
            The decoder's hidden states, one row per target position.
        memory : Tensor, shape (B, S, memory_dim), optional
            The encoder's output; cross-attention projects it to K and V.
        memory_mask : BoolTensor, optional, broadcastable to (B, h, T, S)
            True = may attend; the source padding mask (B, 1, 1, S).
        memory_keys_values : (Tensor (B, h, S, d_k), Tensor (B, h, S, d_v)), optional
            Precomputed :meth:`DecoderLayer.memory_keys_values`, used instead of ``memory``.
        need_weights : bool
            Also return the cross-attention weights.

        Returns
        -------
        y : Tensor, shape (B, T, dim)
        weights : Tensor, shape (B, h, T, S)
            The cross-attention weights, only when ``need_weights``.
        """
        T = y.shape[1]
        y = y + self.self_attn(self.norm1(y), mask=causal_mask(T, device=y.device))[0]  # (B, T, dim)
        query = self.norm2(y)  # (B, T, dim)
        if memory_keys_values is not None:
            attended, weights = self.cross_attn(
                query, key_value=KeyValue(*memory_keys_values), mask=memory_mask, need_weights=need_weights
            )  # (B, T, dim), (B, h, T, S) or None: only W^Q and W^O run here
        elif memory is not None:
            attended, weights = self.cross_attn(
                query, memory, memory, mask=memory_mask, need_weights=need_weights
            )  # (B, T, dim), (B, h, T, S) or None
        else:
            raise ValueError("pass memory (the encoder's output) or memory_keys_values")
        y = y + attended  # (B, T, dim)
        y = y + self.feed_forward(self.norm3(y))  # (B, T, dim)
        if not need_weights:
            return y
        assert weights is not None  # both kinds of cross-attention return their weights when asked
        return y, weights


@dataclass
class EncoderDecoderConfig:
    """Sizes of a :class:`TinyEncoderDecoder`.

    ``encoder_dim`` and ``decoder_dim`` may differ: the cross-attention then
    has ``kdim = vdim = encoder_dim`` and ``embed_dim = decoder_dim``.
    """

    source_vocab_size: int
    target_vocab_size: int
    encoder_dim: int = 32
    decoder_dim: int = 48
    num_heads: int = 2
    encoder_layers: int = 1
    decoder_layers: int = 1
    hidden: int = 96
    max_length: int = 32


class TinyEncoderDecoder(nn.Module):
    """A small encoder-decoder Transformer, built from :class:`qkv.MultiHeadAttention`.

    Token and learned position embeddings, pre-norm layers
    (:class:`EncoderLayer`, :class:`DecoderLayer`), a final layer norm on each
    side, and a linear read-out to target logits. The encoder's output (the
    memory) is all the decoder sees of the source: each decoder layer's
    cross-attention projects it to its own K and V.

    Parameters
    ----------
    config : EncoderDecoderConfig

    See Also
    --------
    qkv.data.AbacusSpellingTask, qkv.data.AbacusBeadOrderTask : tasks to train it on.
    :doc:`cross_attention/abacus` : where its trained cross-attention looks.
    :doc:`cross_attention/computed-once` : what its decoder computes once per source.

    Examples
    --------
    >>> import torch
    >>> from qkv.models import EncoderDecoderConfig, TinyEncoderDecoder
    >>> config = EncoderDecoderConfig(source_vocab_size=11, target_vocab_size=13)
    >>> model = TinyEncoderDecoder(config)
    >>> source, lengths = torch.randint(1, 11, (2, 5)), torch.tensor([5, 3])
    >>> logits = model(source, lengths, torch.randint(1, 13, (2, 7)))
    >>> logits.shape
    torch.Size([2, 7, 13])
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderDecoderConfig):
            raise TypeError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
        for name, value in vars(config).items():
            require_positive_int(f"config.{name}", value)
        c = self.config = config
        self.source_embedding = nn.Embedding(c.source_vocab_size, c.encoder_dim)
        self.source_position = nn.Embedding(c.max_length, c.encoder_dim)
        self.encoder = nn.ModuleList(
            EncoderLayer(c.encoder_dim, c.num_heads, c.hidden) for _ in range(c.encoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(c.encoder_dim)
        self.target_embedding = nn.Embedding(c.target_vocab_size, c.decoder_dim)
        self.target_position = nn.Embedding(c.max_length, c.decoder_dim)
        self.decoder = nn.ModuleList(
            DecoderLayer(c.decoder_dim, c.num_heads, c.hidden, c.encoder_dim) for _ in range(c.decoder_layers)
        )
        self.decoder_norm = nn.LayerNorm(c.decoder_dim)
        self.readout = nn.Linear(c.decoder_dim, c.target_vocab_size)

    def _check_tokens(self, name: str, tokens: object, vocab_size: int) -> Tensor:
        tokens = require_tensor(name, tokens, ndim=2, layout="(B, L)", floating=False)
        if tokens.dtype != torch.long:
            raise TypeError(f"{name} must hold token ids (torch.long), got dtype {tokens.dtype}")
        if tokens.shape[1] > self.config.max_length:
            raise ValueError(
                f"{name} has {tokens.shape[1]} positions, but config.max_length is {self.config.max_length}"
            )
        if tokens.numel() and not (0 <= int(tokens.min()) and int(tokens.max()) < vocab_size):
            low, high = int(tokens.min()), int(tokens.max())
            raise ValueError(
                f"{name} holds ids from {low} to {high}, outside [0, {vocab_size}) "
                f"({name} has shape {shape_str(tokens.shape)})"
            )
        return tokens

    def source_mask(self, source: Tensor, source_lengths: Tensor) -> Tensor:
        """The padding mask over source positions, for keys: (B, 1, 1, S), True = real token."""
        source = self._check_tokens("source", source, self.config.source_vocab_size)
        lengths = require_tensor("source_lengths", source_lengths, ndim=1, layout="(B,)", floating=False)
        require_size("source_lengths", lengths, 0, source.shape[0], "entries", "the source's batch size")
        return padding_mask(lengths, source.shape[1], device=source.device)  # (B, 1, 1, S)

    def encode(self, source: Tensor, source_lengths: Tensor) -> Tensor:
        """Run the encoder: the memory that every decoder layer reads.

        Parameters
        ----------
        source : LongTensor, shape (B, S)
        source_lengths : LongTensor, shape (B,)

        Returns
        -------
        Tensor, shape (B, S, encoder_dim)
        """
        mask = self.source_mask(source, source_lengths)  # (B, 1, 1, S)
        positions = torch.arange(source.shape[1], device=source.device)  # (S,)
        x = self.source_embedding(source) + self.source_position(positions)  # (B, S, encoder_dim)
        for layer in self.encoder:
            x = layer(x, mask)  # (B, S, encoder_dim)
        memory: Tensor = self.encoder_norm(x)  # (B, S, encoder_dim)
        return memory

    def memory_keys_values(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's cross-attention keys and values, computed once per source.

        Parameters
        ----------
        memory : Tensor, shape (B, S, encoder_dim)

        Returns
        -------
        list of (Tensor (B, h, S, d_k), Tensor (B, h, S, d_v)), one pair per decoder layer
        """
        memory = require_tensor("memory", memory, ndim=3, layout="(B, S, encoder_dim)")
        require_size("memory", memory, 2, self.config.encoder_dim, "features", "config.encoder_dim")
        return [cast(DecoderLayer, layer).memory_keys_values(memory) for layer in self.decoder]

    def decode(
        self,
        target_in: Tensor,
        memory_mask: Tensor,
        *,
        memory: Tensor | None = None,
        memory_keys_values: list[tuple[Tensor, Tensor]] | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Run the decoder on a target prefix: logits for the next token at each position.

        Parameters
        ----------
        target_in : LongTensor, shape (B, T)
            Starts with the start-of-sequence id.
        memory_mask : BoolTensor, shape (B, 1, 1, S)
            From :meth:`source_mask`.
        memory : Tensor, shape (B, S, encoder_dim), optional
            The encoder's output; each layer projects it to K and V.
        memory_keys_values : list of (keys, values), optional
            From :meth:`memory_keys_values`, instead of ``memory``.
        need_weights : bool
            Also return each layer's cross-attention weights.

        Returns
        -------
        logits : Tensor, shape (B, T, target_vocab_size)
        weights : list of Tensor, shape (B, h, T, S)
            One per decoder layer, only when ``need_weights``.
        """
        target_in = self._check_tokens("target_in", target_in, self.config.target_vocab_size)
        if (memory is None) == (memory_keys_values is None):
            raise ValueError("pass exactly one of memory and memory_keys_values")
        if memory_keys_values is not None and len(memory_keys_values) != len(self.decoder):
            raise ValueError(
                f"memory_keys_values has {len(memory_keys_values)} (keys, values) pairs, "
                f"but the decoder has {len(self.decoder)} layers"
            )
        per_layer: Sequence[tuple[Tensor, Tensor] | None] = memory_keys_values or [None] * len(self.decoder)
        positions = torch.arange(target_in.shape[1], device=target_in.device)  # (T,)
        y = self.target_embedding(target_in) + self.target_position(positions)  # (B, T, decoder_dim)
        all_weights: list[Tensor] = []
        for layer, keys_values in zip(self.decoder, per_layer, strict=True):
            result = layer(
                y, memory, memory_mask=memory_mask, memory_keys_values=keys_values, need_weights=need_weights
            )
            if need_weights:
                y, weights = result  # (B, T, decoder_dim), (B, h, T, S)
                all_weights.append(weights)
            else:
                y = result  # (B, T, decoder_dim)
        logits: Tensor = self.readout(self.decoder_norm(y))  # (B, T, target_vocab_size)
        return (logits, all_weights) if need_weights else logits

    def forward(
        self, source: Tensor, source_lengths: Tensor, target_in: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Teacher-forced logits: encode the source, decode ``target_in``.

        Parameters
        ----------
        source : LongTensor, shape (B, S)
        source_lengths : LongTensor, shape (B,)
        target_in : LongTensor, shape (B, T)
        need_weights : bool
            Also return each decoder layer's cross-attention weights.

        Returns
        -------
        logits : Tensor, shape (B, T, target_vocab_size)
        weights : list of Tensor, shape (B, h, T, S)
            Only when ``need_weights``.
        """
        memory = self.encode(source, source_lengths)  # (B, S, encoder_dim)
        mask = self.source_mask(source, source_lengths)  # (B, 1, 1, S)
        return self.decode(target_in, mask, memory=memory, need_weights=need_weights)

    @torch.no_grad()
    def generate(
        self,
        source: Tensor,
        source_lengths: Tensor,
        *,
        bos_id: int,
        max_length: int,
        reuse_keys_values: bool = True,
    ) -> Tensor:
        """Greedy decoding: feed back the most likely token, ``max_length`` times.

        The encoder runs once. With ``reuse_keys_values`` the cross-attention's
        K and V are also computed once, by :meth:`memory_keys_values`; without
        it, every step projects the memory again (same result, more work).

        Parameters
        ----------
        source : LongTensor, shape (B, S)
        source_lengths : LongTensor, shape (B,)
        bos_id : int
            The start-of-sequence id the decoder reads first.
        max_length : int
            Number of tokens to generate (the end-of-sequence id is not special).

        Returns
        -------
        LongTensor, shape (B, max_length)
            The generated tokens, without the start-of-sequence id.
        """
        max_length = require_positive_int("max_length", max_length)
        if max_length >= self.config.max_length:
            raise ValueError(
                f"max_length must be below config.max_length={self.config.max_length}, got {max_length}"
            )
        memory = self.encode(source, source_lengths)  # (B, S, encoder_dim)
        mask = self.source_mask(source, source_lengths)  # (B, 1, 1, S)
        cached = self.memory_keys_values(memory) if reuse_keys_values else None
        tokens = torch.full((source.shape[0], 1), bos_id, dtype=torch.long, device=source.device)  # (B, 1)
        for _ in range(max_length):
            if cached is not None:
                logits = self.decode(tokens, mask, memory_keys_values=cached)  # (B, t, V)
            else:
                logits = self.decode(tokens, mask, memory=memory)  # (B, t, V)
            assert isinstance(logits, Tensor)  # without need_weights, decode returns the logits alone
            next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            tokens = torch.cat([tokens, next_token], dim=1)  # (B, t + 1)
        return tokens[:, 1:]  # (B, max_length)
