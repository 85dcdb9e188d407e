"""Rotary position embeddings (RoPE): queries and keys rotated by their positions.

RoFormer (Su et al.) puts position into attention by rotating each query and key
before their dot product: the query at position t by R_t, the key at position s by
R_s, where R_t turns each pair of dimensions j by the angle t·θ_j with
θ_j = base^(-2j/d). Since rotations compose, (R_t q)·(R_s k) = q·(R_{s-t} k): the
score sees the positions only through their difference. Values are not rotated.

Two pairings are in use, and they are not interchangeable:

=================  ===============================  =====================================
``pairing``        which dimensions turn together   used by
=================  ===============================  =====================================
``"half"``         j and j + d/2                    Hugging Face Llama, GPT-NeoX
``"interleaved"``  2j and 2j + 1                    Meta's Llama reference, GPT-J, RoFormer
=================  ===============================  =====================================

:func:`interleaved_to_half` and :func:`half_to_interleaved` move W^Q and W^K between
them (Hugging Face's Llama conversion script permutes those rows; W^V is untouched).

See also
--------
The page :doc:`rotary` (book/rotary.ipynb).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from qkv._validation import require_positive_int, require_tensor, shape_str

__all__ = ["PAIRINGS", "RotaryEmbedding", "apply_rotary", "half_to_interleaved", "interleaved_to_half"]

PAIRINGS = ("half", "interleaved")


def _rotary_dim(d_k: int, fraction: float) -> int:
    """The number of rotated dimensions, ``int(d_k · fraction)`` as GPT-NeoX, checked even."""
    rotary_dim = int(d_k * fraction)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"fraction={fraction} of d_k={d_k} rotates int({d_k} * {fraction}) = {rotary_dim} dimensions; "
            "rotation turns dimensions in pairs, so that must be an even number, at least 2"
        )
    return rotary_dim


@dataclass(frozen=True)
class RotaryEmbedding:
    """The rotation of RoPE for one head size: angles, their matrix, and applying it.

    Dimension pair j (of ``rotary_dim / 2``) of a query or key at position t turns
    by the angle ``t · θ_j``, with ``θ_j = base ** (-2j / rotary_dim)``: pair 0 by one
    radian per position, the last pair slowest, a wavelength of 2π / θ_j positions.

    Parameters
    ----------
    d_k : int
        The size of each query and key head; even when ``fraction`` is 1.
    base : float
        θ in the papers' notation, ``rope_theta`` in Hugging Face's configurations:
        10,000 in RoFormer and Llama 2, 500,000 in Llama 3.
    pairing : {"half", "interleaved"}
        ``"half"``: dimension j turns with j + rotary_dim/2 (Hugging Face Llama,
        GPT-NeoX). ``"interleaved"``: 2j with 2j + 1 (Meta's Llama reference, GPT-J).
    fraction : float
        The share of each head that is rotated, the first ``int(d_k · fraction)``
        dimensions (GPT-NeoX's ``rotary_pct``, Hugging Face's
        ``partial_rotary_factor``); the rest pass unchanged. That number must be even.
    max_positions : int, optional
        When given, a position at or past it is an error (a model trained on
        shorter sequences); by default any position is rotated.
    angle_dtype : torch.dtype
        The dtype in which the angles ``t · θ_j`` and their cos and sin are computed,
        before they are cast to the input's dtype. float32 is what Hugging Face,
        GPT-NeoX and Meta's reference do, so outputs equal theirs; float64 gives
        angles exact to float64 (long positions, proofs in float64).

    Attributes
    ----------
    rotary_dim : int
        The number of rotated dimensions, ``int(d_k · fraction)``.

    See Also
    --------
    apply_rotary : the same rotation as one function call.
    :doc:`rotary` : why queries and keys are rotated and values are not.

    Examples
    --------
    >>> import torch, qkv
    >>> rope = qkv.RotaryEmbedding(8, angle_dtype=torch.float64)
    >>> q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    >>> def score(t, s):  # the query at position t, the key at position s
    ...     return rope(q[None], torch.tensor([t])) @ rope(k[None], torch.tensor([s])).T
    >>> torch.allclose(score(7, 3), score(104, 100))  # only t - s matters
    True
    >>> R = rope.matrix(5)  # (d_k, d_k): rotating is R q, for q a column
    >>> torch.allclose(rope(q[None], torch.tensor([5]))[0], R @ q)
    True

    Half the dimensions rotated, as GPT-NeoX's ``rotary_pct=0.5``:

    >>> qkv.RotaryEmbedding(64, base=500_000.0, fraction=0.5)
    RotaryEmbedding(d_k=64, base=500000.0, pairing='half', fraction=0.5, rotary_dim=32)
    """

    d_k: int
    base: float = 10_000.0
    pairing: str = "half"
    fraction: float = 1.0
    max_positions: int | None = None
    angle_dtype: torch.dtype = torch.float32
    rotary_dim: int = field(init=False)

    def __post_init__(self) -> None:
        d_k = require_positive_int("d_k", self.d_k)
        if self.pairing not in PAIRINGS:
            raise ValueError(f'pairing must be "half" or "interleaved", got {self.pairing!r}')
        base = self.base
        number = isinstance(base, (int, float)) and not isinstance(base, bool)
        if not number or not (math.isfinite(base) and base > 1):
            raise ValueError(f"base must be a finite number above 1, got {base!r}")
        fraction = self.fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
        if fraction == 1 and d_k % 2:
            raise ValueError(
                f"d_k must be even to rotate its dimensions in pairs, got d_k={d_k} (rotate an even part "
                "of it with fraction=, as GPT-NeoX's rotary_pct)"
            )
        if self.max_positions is not None:
            require_positive_int("max_positions", self.max_positions)
        if not (isinstance(self.angle_dtype, torch.dtype) and self.angle_dtype.is_floating_point):
            raise TypeError(f"angle_dtype must be a floating-point torch.dtype, got {self.angle_dtype!r}")
        object.__setattr__(self, "base", float(base))
        object.__setattr__(self, "fraction", float(fraction))
        object.__setattr__(self, "rotary_dim", _rotary_dim(d_k, fraction))

    def __repr__(self) -> str:
        text = f"RotaryEmbedding(d_k={self.d_k}, base={self.base}, pairing={self.pairing!r}"
        text += f", fraction={self.fraction}, rotary_dim={self.rotary_dim}"
        if self.max_positions is not None:
            text += f", max_positions={self.max_positions}"
        if self.angle_dtype != torch.float32:
            text += f", angle_dtype={self.angle_dtype}"
        return text + ")"

    def frequencies(self, device: torch.device | str | None = None) -> Tensor:
        """θ_j = base^(-2j / rotary_dim), one per pair, as Hugging Face computes them.

        Returns
        -------
        Tensor, shape (rotary_dim / 2,)
            In ``angle_dtype``; pair j turns by θ_j radians per position, a
            wavelength of 2π / θ_j positions.
        """
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=self.angle_dtype, device=device)  # (r/2,)
        return 1.0 / (self.base ** (exponents / self.rotary_dim))  # (r/2,)

    def angles(self, positions: Tensor) -> Tensor:
        """The angle of every pair at every position: ``positions[..., None] · θ``.

        Parameters
        ----------
        positions : Tensor of integers, shape (..., T)

        Returns
        -------
        Tensor, shape (..., T, rotary_dim / 2), in ``angle_dtype``
        """
        positions = self._check_positions(positions)
        theta = self.frequencies(positions.device)  # (r/2,)
        return positions[..., None].to(self.angle_dtype) * theta  # (..., T, r/2)

    def matrix(self, position: int) -> Tensor:
        """R_t, the (d_k, d_k) rotation of position ``position``, in ``angle_dtype``.

        Rotating a query or key q (a column) is ``R_t @ q``; for rows, ``x @ R_t.T``.
        It is orthogonal, and ``R_t.T @ R_s`` is ``R_(s - t)``.
        """
        eye = torch.eye(self.d_k, dtype=self.angle_dtype)  # (d_k, d_k): the basis vectors as rows
        rotated = self(eye, torch.full((self.d_k,), int(position)))  # (d_k, d_k): row m is R_t e_m
        return rotated.T  # (d_k, d_k): column m is R_t e_m

    def __call__(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate ``x`` (queries or keys) by the positions of its rows.

        Parameters
        ----------
        x : Tensor, shape (..., T, d_k)
            One query or key per row, e.g. (B, h, T, d_k) or (B, h_kv, S, d_k).
        positions : Tensor of integers, shape (T,) or broadcastable to (..., T), optional
            Each row's absolute position; default ``0, 1, ..., T - 1``. A cached
            decoding step passes the new token's own position (the cache's length).
            On any device: they are moved to x's, as an index would be.

        Returns
        -------
        Tensor, shape (..., T, d_k), of x's dtype
            The first ``rotary_dim`` dimensions of each row rotated pair by pair; the
            others as they were.
        """
        x = require_tensor("x", x, min_ndim=2, layout="(..., T, d_k)")
        if x.shape[-1] != self.d_k:
            raise ValueError(
                f"x has {x.shape[-1]} features per row, but this RotaryEmbedding is for d_k={self.d_k} "
                f"(x {shape_str(x.shape)})"
            )
        length = x.shape[-2]
        if positions is None:
            positions = torch.arange(length, device=x.device)  # (T,)
        elif not isinstance(positions, Tensor) or positions.dim() == 0 or positions.shape[-1] != length:
            got = shape_str(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
            raise ValueError(
                f"positions must give one position per row of x, shape (..., {length}), got {got} "
                f"(x {shape_str(x.shape)})"
            )
        angles = self.angles(positions.to(x.device))  # (..., T, r/2)
        return rotate_unchecked(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype), self.pairing)

    def _check_positions(self, positions: object) -> Tensor:
        if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.is_complex():
            what = f"dtype {positions.dtype}" if isinstance(positions, Tensor) else type(positions).__name__
            raise TypeError(f"positions must be a tensor of integers, got {what}")
        limit = self.max_positions
        if limit is not None and positions.numel() and int(positions.max()) >= limit:
            raise ValueError(
                f"positions go up to {int(positions.max())}, past max_positions={self.max_positions} that "
                "this RotaryEmbedding was built for"
            )
        return positions


def rotate_unchecked(x: Tensor, cos: Tensor, sin: Tensor, pairing: str) -> Tensor:
    """Rotate the first ``2 · cos.shape[-1]`` features of ``x`` (..., T, d) by the angles of cos and sin.

    ``cos`` and ``sin`` are (..., T, r/2), one per pair, broadcastable against x's
    leading dimensions; no checks (for qkv's own modules).
    """
    half = cos.shape[-1]
    rotated, rest = x[..., : 2 * half], x[..., 2 * half :]  # (..., T, r), (..., T, d - r)
    if pairing == "half":
        first, second = rotated[..., :half], rotated[..., half:]  # (..., T, r/2) each: j and j + r/2
        turned = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)  # (..., T, r)
    else:
        pairs = rotated.unflatten(-1, (half, 2))  # (..., T, r/2, 2): 2j and 2j + 1
        first, second = pairs[..., 0], pairs[..., 1]  # (..., T, r/2) each
        turned = torch.stack((first * cos - second * sin, second * cos + first * sin), dim=-1).flatten(-2)
    return turned if rest.shape[-1] == 0 else torch.cat((turned, rest), dim=-1)  # (..., T, d)


def apply_rotary(
    x: Tensor,
    positions: Tensor | None = None,
    *,
    base: float = 10_000.0,
    pairing: str = "half",
    fraction: float = 1.0,
    angle_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Rotate queries or keys by their positions (RoPE), as one function call.

    ``apply_rotary(x, positions, ...)`` is ``RotaryEmbedding(x.shape[-1], ...)(x, positions)``.

    Parameters
    ----------
    x : Tensor, shape (..., T, d_k)
        Queries or keys, one per row.
    positions : Tensor of integers, shape (T,) or broadcastable to (..., T), optional
        Default ``0, 1, ..., T - 1``.
    base, pairing, fraction, angle_dtype
        As for :class:`RotaryEmbedding`.

    Returns
    -------
    Tensor, shape (..., T, d_k)

    See Also
    --------
    RotaryEmbedding
    :doc:`rotary` : where position enters attention.

    Examples
    --------
    Rotation keeps lengths, and turns nothing at position 0:

    >>> import torch, qkv
    >>> k = torch.randn(2, 3, 5, 8)  # (B, h, S, d_k)
    >>> rotated = qkv.apply_rotary(k, torch.tensor([0, 1, 2, 3, 40]))
    >>> torch.allclose(rotated.norm(dim=-1), k.norm(dim=-1), atol=1e-6)
    True
    >>> torch.equal(rotated[..., 0, :], k[..., 0, :])
    True
    """
    x = require_tensor("x", x, min_ndim=2, layout="(..., T, d_k)")
    rope = RotaryEmbedding(
        x.shape[-1], base=base, pairing=pairing, fraction=fraction, angle_dtype=angle_dtype
    )
    return rope(x, positions)


def _pair_permutation(
    weight: object, num_heads: object, head_dim: object, rotary_dim: int | None, name: str
) -> tuple[Tensor, int, int, int]:
    """Validate a W^Q or W^K (or bias) for a pairing permutation; return it, h, d_k and rotary_dim."""
    tensor = require_tensor(name, weight, min_ndim=1, layout="(h·d_k, ...)")
    h = require_positive_int("num_heads", num_heads)
    d_k = require_positive_int("head_dim", head_dim)
    rows = tensor.shape[0]
    if rows != h * d_k:
        raise ValueError(
            f"{name} has shape {shape_str(tensor.shape)}: num_heads={h} heads of head_dim={d_k} "
            f"need {h * d_k} rows, got {rows} (a k_proj holds num_key_value_heads heads, "
            "a q_proj num_attention_heads)"
        )
    r = d_k if rotary_dim is None else require_positive_int("rotary_dim", rotary_dim)
    if r % 2 or r > d_k:
        raise ValueError(
            f"rotary_dim must be even and at most d_k={d_k} ({name} {shape_str(tensor.shape)} holds "
            f"{h} heads), got {r}"
        )
    return tensor, h, d_k, r


def interleaved_to_half(
    weight: Tensor, num_heads: int, *, head_dim: int, rotary_dim: int | None = None
) -> Tensor:
    """Reorder the rows of W^Q or W^K so that half-split RoPE computes what interleaved did.

    Meta's Llama reference rotates pairs (2j, 2j + 1) of each head; Hugging Face's
    Llama rotates (j, j + d_k/2). Its conversion script therefore permutes the rows of
    ``wq`` and ``wk`` within each head: the even rows first, then the odd ones. With
    the permuted weights, the half-split model's queries and keys are the interleaved
    model's, their features reordered the same way, so every score and output is the
    same. W^V and W^O are not permuted (values are not rotated).

    Parameters
    ----------
    weight : Tensor, shape (h·d_k, ...)
        ``q_proj.weight`` (h·d_k, d_model) or ``k_proj.weight`` (h_kv·d_k, d_model),
        as ``nn.Linear`` stores them (output features first), or their bias (h·d_k,).
    num_heads : int
        The number of heads in ``weight``: h for W^Q, h_kv for W^K.
    head_dim : int
        d_k, the rows per head (keyword only, required). ``weight`` must have
        ``num_heads * head_dim`` rows, or a ValueError names both: without it, a head
        count that divides the rows but is wrong (h for a grouped-query ``k_proj``,
        which holds h_kv heads) would be taken as heads of another size, and the rows
        scrambled without an error.
    rotary_dim : int, optional
        Only the first ``rotary_dim`` rows of each head are rotated, and reordered;
        default d_k.

    Returns
    -------
    Tensor, shape (h·d_k, ...)
        A new tensor, each head's rows in the order 0, 2, 4, ..., 1, 3, 5, ...

    Raises
    ------
    ValueError
        When ``weight`` does not have ``num_heads * head_dim`` rows, or ``rotary_dim``
        is odd or larger than d_k.

    See Also
    --------
    half_to_interleaved : the inverse.
    :doc:`rotary/pairings` : the two pairings, and the silent bug of mixing them.

    Examples
    --------
    >>> import torch
    >>> from qkv import interleaved_to_half
    >>> # 2 heads of d_k 4, rows numbered 0 to 7
    >>> interleaved_to_half(torch.arange(8.0), 2, head_dim=4).tolist()
    [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
    """
    tensor, h, d_k, r = _pair_permutation(weight, num_heads, head_dim, rotary_dim, "weight")
    heads = tensor.reshape(h, d_k, *tensor.shape[1:])  # (h, d_k, ...)
    pairs = heads[:, :r].reshape(h, r // 2, 2, *tensor.shape[1:])  # (h, r/2, 2, ...): rows 2j, 2j + 1
    reordered = torch.cat((pairs.transpose(1, 2).reshape(h, r, *tensor.shape[1:]), heads[:, r:]), dim=1)
    return reordered.reshape(tensor.shape).clone()  # (h·d_k, ...)


def half_to_interleaved(
    weight: Tensor, num_heads: int, *, head_dim: int, rotary_dim: int | None = None
) -> Tensor:
    """The inverse of :func:`interleaved_to_half`: rows for half-split RoPE back to interleaved.

    Parameters
    ----------
    weight : Tensor, shape (h·d_k, ...)
        W^Q or W^K as ``nn.Linear`` stores it (or its bias), for half-split rotation.
    num_heads : int
        The number of heads in ``weight``: h for W^Q, h_kv for W^K.
    head_dim : int
        d_k, the rows per head (keyword only, required): a wrong ``num_heads`` raises
        a ValueError, as for :func:`interleaved_to_half`.
    rotary_dim : int, optional
        As for :func:`interleaved_to_half`.

    Returns
    -------
    Tensor, shape (h·d_k, ...)
        Each head's rows in the order 0, r/2, 1, r/2 + 1, ...

    Raises
    ------
    ValueError
        As :func:`interleaved_to_half` does.

    See Also
    --------
    interleaved_to_half : the inverse.

    Examples
    --------
    >>> import torch
    >>> from qkv import half_to_interleaved, interleaved_to_half
    >>> w = torch.randn(12, 5)  # 3 heads of d_k 4
    >>> back = half_to_interleaved(interleaved_to_half(w, 3, head_dim=4), 3, head_dim=4)
    >>> torch.equal(back, w)
    True
    >>> k_proj = torch.randn(16, 5)  # 2 key heads of d_k 8, passed the 4 query heads
    >>> half_to_interleaved(k_proj, 4, head_dim=8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: weight has shape (16, 5): num_heads=4 heads of head_dim=8 need 32...
    """
    tensor, h, d_k, r = _pair_permutation(weight, num_heads, head_dim, rotary_dim, "weight")
    heads = tensor.reshape(h, d_k, *tensor.shape[1:])  # (h, d_k, ...)
    halves = heads[:, :r].reshape(h, 2, r // 2, *tensor.shape[1:])  # (h, 2, r/2, ...): rows j, j + r/2
    reordered = torch.cat((halves.transpose(1, 2).reshape(h, r, *tensor.shape[1:]), heads[:, r:]), dim=1)
    return reordered.reshape(tensor.shape).clone()  # (h·d_k, ...)
