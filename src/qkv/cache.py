"""Keys and values kept for later: a KV cache for decoding, and precomputed K and V.

A decoder generates one token at a time. Its new query attends to the keys and
values of every earlier token, and those do not change: a token's K and V depend
on that token only (and on the layers below it). :class:`KVCache` keeps them, so
each step projects only the new token. Queries are not kept: each is used once,
by the step that made it.

For cross-attention the keys and values come from the encoder's output, which is
fixed for the whole generation: :meth:`qkv.MultiHeadAttention.project_key_value`
computes them once as a :class:`KeyValue`, which ``forward`` then takes instead of
``key`` and ``value``.

See also
--------
The page :doc:`cross_attention/computed-once` (book/cross_attention/computed-once.ipynb) for K and V
computed once per source.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch import Tensor

from qkv._validation import require_positive_int, require_tensor, shape_str

__all__ = ["KVCache", "KeyValue"]


class KeyValue(NamedTuple):
    """Keys and values already projected and split into heads, as attention reads them.

    What :meth:`qkv.MultiHeadAttention.project_key_value` returns and what
    ``forward(query, key_value=...)`` takes. Always batch first and heads first,
    whatever the module's ``batch_first``.

    Attributes
    ----------
    keys : Tensor, shape (B, h_kv, S, d_k)
        ``key · W_j^K + b_j^K`` for each K/V head j.
    values : Tensor, shape (B, h_kv, S, d_v)
    """

    keys: Tensor
    values: Tensor


class KVCache:
    """The keys and values of every token so far, for decoding one token (or chunk) at a time.

    Pass it to :meth:`qkv.MultiHeadAttention.forward` as ``cache=``: the module
    projects only the new tokens, appends their keys and values (already split
    into heads) here, and attends from the new queries to everything cached. The
    memory for ``max_length`` tokens is allocated once, at construction; a call
    that would go past it raises ``ValueError`` and leaves the cache as it was.

    Pass ``is_causal=True`` at every call: a chunk of several new tokens (the
    prompt, say) then attends causally, within itself and to the cache; for a
    single new token, which sees every cached one anyway, it costs nothing.

    A batch of prompts of different lengths is **left padded**: every prompt ends
    at the same position, so each step appends one token per sequence in the
    same slot. Pass ``key_padding_mask`` of shape (B, length + new tokens), True
    at the padding (torch's meaning), at every call. Hugging Face's growing
    ``attention_mask`` has the opposite meaning, 1 for a real token: pass
    ``attention_mask == 0``.

    Parameters
    ----------
    batch_size : int
        B.
    num_kv_heads : int
        h_kv, the module's number of K/V heads (``num_heads`` unless grouped-query).
    d_k : int
        The size of each key.
    d_v : int, optional
        The size of each value; default ``d_k``.
    max_length : int
        The most tokens the cache can hold.
    dtype, device : optional
        Of the stored keys and values; default torch's default dtype, on the CPU.
        :meth:`qkv.MultiHeadAttention.new_cache` takes them from the module.

    Notes
    -----
    With autograd recording (a query, key or value that requires grad), an append
    writes into a copy of the memory instead of in place, so that gradients flow
    back through every step (training-style prefill). Every later append copies
    too, even under ``torch.no_grad()``, so that those earlier outputs can still be
    back-propagated, until :meth:`reset`, which then allocates fresh memory. Under
    ``torch.no_grad()`` or ``torch.inference_mode()`` from the start, as in
    generation, nothing is re-allocated.

    One cache per attention layer: a cache holds the keys and values of the
    module that first wrote into it, and another module is refused (until
    :meth:`reset`).

    Examples
    --------
    Decode five tokens one at a time; the result is one causal pass over all five:

    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(16, 4, num_kv_heads=2)
    >>> x = torch.randn(1, 5, 16)
    >>> cache = mha.new_cache(batch_size=1, max_length=8)
    >>> with torch.no_grad():
    ...     steps = [
    ...         mha(x[:, t : t + 1], cache=cache, is_causal=True)[0] for t in range(5)
    ...     ]
    ...     full, _ = mha(x, is_causal=True)
    >>> torch.allclose(torch.cat(steps, dim=1), full, atol=1e-6)
    True
    >>> cache.length, tuple(cache.keys.shape)  # (B, h_kv, length, d_k)
    (5, (1, 2, 5, 4))
    >>> mha(torch.randn(1, 4, 16), cache=cache, is_causal=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: cache is full: it holds 5 of max_length=8 tokens and cannot take 4 ...
    """

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        d_k: int,
        d_v: int | None = None,
        *,
        max_length: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        batch_size = require_positive_int("batch_size", batch_size)
        num_kv_heads = require_positive_int("num_kv_heads", num_kv_heads)
        d_k = require_positive_int("d_k", d_k)
        d_v = d_k if d_v is None else require_positive_int("d_v", d_v)
        max_length = require_positive_int("max_length", max_length)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self._keys = torch.zeros(
            batch_size, num_kv_heads, max_length, d_k, dtype=dtype, device=device
        )  # (B, h_kv, M, d_k)
        self._values = torch.zeros(
            batch_size, num_kv_heads, max_length, d_v, dtype=dtype, device=device
        )  # (B, h_kv, M, d_v)
        self._length = 0
        # Fixed at construction; kept as plain attributes so that a decoding step's checks are cheap.
        self._sizes = (batch_size, num_kv_heads, d_k, d_v)
        self._dtype, self._device = self._keys.dtype, self._keys.device
        # The module whose keys and values it holds (a weak reference), set by the first forward.
        self._owner: weakref.ref[torch.nn.Module] | None = None
        # Whether a recorded step may have saved this memory for backward: then appends copy.
        self._in_graph = False

    @property
    def batch_size(self) -> int:
        """B, the number of sequences."""
        return self._keys.shape[0]

    @property
    def num_kv_heads(self) -> int:
        """h_kv, the number of K/V heads stored."""
        return self._keys.shape[1]

    @property
    def max_length(self) -> int:
        """The most tokens the cache can hold."""
        return self._keys.shape[2]

    @property
    def d_k(self) -> int:
        """The size of each key."""
        return self._keys.shape[3]

    @property
    def d_v(self) -> int:
        """The size of each value."""
        return self._values.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the stored keys and values."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """The device of the stored keys and values."""
        return self._device

    @property
    def length(self) -> int:
        """How many tokens are cached."""
        return self._length

    @property
    def keys(self) -> Tensor:
        """The cached keys, (B, h_kv, length, d_k): a view of the cache's memory.

        Later calls overwrite that memory after :meth:`reset`: clone what you keep.
        """
        return self._keys[:, :, : self._length]

    @property
    def values(self) -> Tensor:
        """The cached values, (B, h_kv, length, d_v): a view of the cache's memory."""
        return self._values[:, :, : self._length]

    @property
    def nbytes(self) -> int:
        """The bytes the cache occupies: the memory of its key and value tensors, all of ``max_length``."""
        return self._keys.untyped_storage().nbytes() + self._values.untyped_storage().nbytes()

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_owner"] = None  # a weak reference does not pickle; a copy is nobody's yet
        return state

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (
            f"KVCache(batch_size={self.batch_size}, num_kv_heads={self.num_kv_heads}, d_k={self.d_k}, "
            f"d_v={self.d_v}, length={self._length}, max_length={self.max_length}, dtype={self.dtype}, "
            f"device={self.device})"
        )

    def reset(self) -> None:
        """Forget every token, e.g. before the next prompt; the cache can then serve another layer.

        The memory stays allocated, unless a step recorded gradients into it: then
        fresh memory is allocated, so that the earlier outputs can still be
        back-propagated.
        """
        self.crop(0)

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` tokens, e.g. to go back to a shared prompt.

        Nothing is copied: later tokens are overwritten by the next append.

        Examples
        --------
        >>> import torch, qkv
        >>> cache = qkv.KVCache(batch_size=1, num_kv_heads=2, d_k=4, max_length=10)
        >>> _ = cache.append(torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4))
        >>> cache.crop(5)
        >>> cache.length, cache.keys.shape
        (5, torch.Size([1, 2, 5, 4]))
        """
        if isinstance(length, bool) or not isinstance(length, int):
            raise TypeError(f"length must be an int, got {type(length).__name__}")
        if not 0 <= length <= self._length:
            raise ValueError(f"length must be between 0 and the cache's length {self._length}, got {length}")
        self._length = length
        if length == 0:
            self._owner = None
            # Fresh memory when earlier outputs' graphs may have saved this one, or when it is an
            # inference tensor (copied under inference_mode) that could not be written outside it.
            stale = self._keys.is_inference() and not torch.is_inference_mode_enabled()
            if self._in_graph or stale:
                self._keys = torch.zeros(self._keys.shape, dtype=self._dtype, device=self._device)
                self._values = torch.zeros(self._values.shape, dtype=self._dtype, device=self._device)
                self._in_graph = False

    def append(self, keys: Tensor, values: Tensor) -> KeyValue:
        """Add the keys and values of new tokens; return everything cached.

        :meth:`qkv.MultiHeadAttention.forward` calls this for you with
        ``cache=``; call it yourself to fill a cache from your own projections.

        Parameters
        ----------
        keys : Tensor, shape (B, h_kv, T, d_k)
        values : Tensor, shape (B, h_kv, T, d_v)

        Returns
        -------
        KeyValue
            The cached keys (B, h_kv, length, d_k) and values (B, h_kv, length, d_v),
            the new ones last.

        Examples
        --------
        >>> import torch, qkv
        >>> cache = qkv.KVCache(batch_size=2, num_kv_heads=3, d_k=4, max_length=10)
        >>> k, v = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
        >>> keys, values = cache.append(k, v)
        >>> keys.shape, torch.equal(values, v), cache.length
        (torch.Size([2, 3, 6, 4]), True, 6)
        """
        expected = {
            "keys": (self.batch_size, self.num_kv_heads, self.d_k),
            "values": (self.batch_size, self.num_kv_heads, self.d_v),
        }
        checked = {}
        for name, x in (("keys", keys), ("values", values)):
            tensor = require_tensor(name, x, ndim=4, layout="(B, h_kv, T, d)")
            batch, heads, dim = expected[name]
            got = (tensor.shape[0], tensor.shape[1], tensor.shape[3])
            if got != (batch, heads, dim):
                raise ValueError(
                    f"{name} must have shape (B, h_kv, T, d) = ({batch}, {heads}, T, {dim}) to fit this "
                    f"cache, got {shape_str(tensor.shape)}"
                )
            if tensor.device != self.device:
                raise ValueError(f"{name} is on {tensor.device}, but the cache is on {self.device}")
            checked[name] = tensor
        if checked["keys"].shape[2] != checked["values"].shape[2]:
            raise ValueError(
                f"keys have {keys.shape[2]} positions, but values have {values.shape[2]}: they come in pairs"
            )
        self.require_room(keys.shape[2])
        recording = torch.is_grad_enabled() and (keys.requires_grad or values.requires_grad)
        return self._append_unchecked(keys, values, recording)

    def require_room(self, new: int) -> None:
        """Raise ``ValueError`` unless ``new`` more tokens fit (qkv checks before projecting)."""
        if self._length + new > self.max_length:
            raise ValueError(
                f"cache is full: it holds {self._length} of max_length={self.max_length} tokens and "
                f"cannot take {new} more; create it with a larger max_length, or reset() it"
            )

    def _append_unchecked(self, keys: Tensor, values: Tensor, recording: bool) -> KeyValue:
        """:meth:`append` after the caller's checks; the dtype is checked here, where it is known.

        ``recording``: autograd records this step (anything that attention over the cache
        saves for backward requires grad), so the memory it reads must not be overwritten.
        """
        if keys.dtype is not self._dtype or values.dtype is not self._dtype:  # dtypes are singletons
            name, x = ("keys", keys) if keys.dtype != self._dtype else ("values", values)
            raise TypeError(
                f"the new {name} have dtype {x.dtype}, but the cache holds {self._dtype}; create the "
                f"cache with dtype={x.dtype}, e.g. module.new_cache(..., dtype={x.dtype})"
            )
        start, end = self._length, self._length + keys.shape[2]
        stored_keys, stored_values = self._keys, self._values
        if recording or self._in_graph:
            # Out of place from a recorded step on (until reset): an in-place write would change
            # what earlier steps saved for backward, even a write under torch.no_grad().
            self._in_graph = True
            stored_keys = stored_keys.slice_scatter(keys, 2, start, end)  # (B, h_kv, M, d_k)
            stored_values = stored_values.slice_scatter(values, 2, start, end)  # (B, h_kv, M, d_v)
            self._keys, self._values = stored_keys, stored_values
        else:
            try:
                stored_keys[:, :, start:end] = keys  # (B, h_kv, T, d_k) into (B, h_kv, M, d_k)
                stored_values[:, :, start:end] = values  # (B, h_kv, T, d_v) into (B, h_kv, M, d_v)
            except RuntimeError as error:
                if stored_keys.is_inference() and not torch.is_inference_mode_enabled():
                    raise RuntimeError(
                        "the cache's memory was allocated under torch.inference_mode(), and can be "
                        "written only there: decode inside torch.inference_mode() too, or create the "
                        "cache outside it"
                    ) from None
                raise error
        self._length = end
        return KeyValue(stored_keys[:, :, :end], stored_values[:, :, :end])  # (B, h_kv, length, d)
