"""An interactive attention view: point at a query token and see where it looks.

:class:`AttentionView` shows attention weights of one or more layers and heads as
lines from query tokens to key tokens, made for the static book, Jupyter and Colab. It
is one HTML fragment, with the weights inside it and its own small script; nothing is
loaded from anywhere (no CDN). The book's browser check runs it offline, in a frame
sandboxed to scripts only, and with several views on one page.

See also
--------
The chapters' views: a model before and after training in :doc:`training`, and a
trained decoder's cross-attention in :doc:`cross_attention/abacus`.
"""

from __future__ import annotations

import base64
import hashlib
import html
import itertools
import json
import operator
import zlib
from collections.abc import Sequence
from importlib import resources

import numpy as np
import torch

from qkv._validation import as_numpy, shape_str
from qkv.masks import allowed_cells

__all__ = ["AttentionView"]

#: Weights are stored as integers out of this, each row's adding up to it within 2.
SCALE = 255
#: The largest number of weights one view holds (layers x heads x queries x keys): BERT-base's
#: 12 x 12 heads on 85 tokens. A larger view is refused rather than left slow to draw.
MAX_CELLS = 1 << 20
# How far a weight may stray from [0, 1], and a row's sum from 1, in float32 and float64;
# float16 and bfloat16 get four of their own rounding steps.
_TOLERANCE = 1e-3
_LAYOUTS = {2: "(T, S)", 3: "(h, T, S)", 4: "(layers, h, T, S)"}
_SERIAL = itertools.count()


def _asset(name: str) -> str:
    return resources.files("qkv").joinpath(name).read_text(encoding="utf-8")


def _tokens(name: str, tokens: object, size: int, what: str) -> list[str]:
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise TypeError(f"{name} must be a list of tokens (str), one per {what}, got {type(tokens).__name__}")
    if not all(isinstance(token, str) for token in tokens):
        kinds = sorted({type(token).__name__ for token in tokens if not isinstance(token, str)})
        raise TypeError(f"{name} must hold str tokens, got {', '.join(kinds)} (convert them with str)")
    if len(tokens) != size:
        raise ValueError(f"{name} has {len(tokens)} tokens, but the weights have {size} {what} positions")
    return list(tokens)


def _tolerance(weights: object) -> float:
    """How far a row of these weights may add up from 1: more for float16 and bfloat16."""
    first = weights[0] if isinstance(weights, (list, tuple)) and weights else weights
    if isinstance(first, torch.Tensor) and first.is_floating_point():
        return max(_TOLERANCE, 4 * torch.finfo(first.dtype).eps)
    if isinstance(first, np.ndarray) and np.issubdtype(first.dtype, np.floating):
        return max(_TOLERANCE, 4 * float(np.finfo(first.dtype).eps))
    return _TOLERANCE


def _stack(weights: object, sequence: int | None) -> np.ndarray:
    """The weights as one array; a list of layers (Hugging Face's ``attentions``) is stacked."""
    if weights is None:
        raise TypeError(
            "weights is None: a Hugging Face model returns its attentions only with "
            'output_attentions=True (and attn_implementation="eager")'
        )
    if isinstance(weights, (list, tuple)):
        if not weights:
            raise ValueError(
                "weights is an empty list: pass one (h, T, S) or (B, h, T, S) array per layer (a Hugging "
                "Face model returns its attentions only with output_attentions=True and "
                'attn_implementation="eager")'
            )
        layers = [as_numpy(f"weights[{i}]", layer) for i, layer in enumerate(weights)]
        shapes = {layer.shape for layer in layers}
        if len(shapes) > 1:
            raise ValueError(
                f"the layers in weights have different shapes: {', '.join(map(shape_str, sorted(shapes)))}"
            )
        ndim = layers[0].ndim
        if ndim not in (3, 4):
            raise ValueError(
                "each layer in weights must be (h, T, S) or (B, h, T, S), got shape "
                f"{shape_str(layers[0].shape)}"
            )
        array = np.stack(layers)  # (layers, h, T, S) or (layers, B, h, T, S)
    else:
        array = as_numpy("weights", weights)
    if array.ndim == 5:  # (layers, B, h, T, S)
        batch = array.shape[1]
        if sequence is None and batch != 1:
            raise ValueError(
                f"weights of shape {shape_str(array.shape)} hold {batch} sequences: pick one with sequence=b"
            )
        index = 0 if sequence is None else sequence
        if not 0 <= index < batch:
            raise ValueError(f"sequence={index} is out of range: weights hold {batch} sequences")
        return array[:, index]
    if sequence is not None:
        raise ValueError(
            f"sequence={sequence} was given, but weights of shape {shape_str(array.shape)} have no batch "
            "axis: one tensor of 4 dimensions reads as (layers, h, T, S). A batch comes as a list of "
            "(B, h, T, S) layers or as (layers, B, h, T, S); for one layer's (B, h, T, S) weights, pass "
            "weights[b] (or [weights] with sequence=b)"
        )
    return array


def _why_rows(full: np.ndarray, tolerance: float) -> str:
    """The likeliest cause of rows that do not add up to 1, for the error message."""
    if np.allclose(full.sum(-2), 1, atol=tolerance):  # the columns, (layers, h, S)
        return "the columns do: a softmax over the query axis, or weights transposed to (S, T)?"
    return "weights after dropout, in training mode? Take them after model.eval()"


def _quantise(weights: np.ndarray) -> np.ndarray:
    """Integers out of ``SCALE`` that read as the weights do to two decimals, rows adding up to ``SCALE``.

    ``weights``: rows that add up to 1, or all zero. Each weight's two-decimal step,
    [b - 0.005, b + 0.005), holds two or three multiples of 1/255 (never one on its
    edge); the nearest is taken, then each row's sum is brought to ``SCALE`` by moving
    units within those steps where the remainders are largest. A row whose steps
    cannot add up to ``SCALE`` keeps every reading if it is one or two units away;
    further (long, even rows), it moves units beyond the steps, so some of its
    weights read 0.01 off. Exact zeros stay zero.
    """
    scaled = weights * SCALE  # (..., S)
    hundredths = np.floor(weights * 100 + 0.5)  # the two-decimal step of each weight
    low = np.maximum(np.ceil((hundredths - 0.5) * SCALE / 100), 0)
    high = np.minimum(np.floor((hundredths + 0.5) * SCALE / 100), SCALE)
    high = np.where(weights == 0, 0, high)  # masked, or no weight at all: nothing to show
    counts = np.clip(np.rint(scaled), low, high)  # (..., S)
    target = np.where(weights.sum(-1) > 0.5, SCALE, 0)  # (...,)
    deficit = target - counts.sum(-1)  # (...,): a few units, up or down
    for row in map(tuple, np.argwhere(deficit != 0)):
        remainder = scaled[row] - counts[row]  # (S,): how far each count is below its weight
        step = 1 if deficit[row] > 0 else -1
        while deficit[row] != 0:
            room = counts[row] < high[row] if step > 0 else counts[row] > low[row]
            if not room.any() and abs(int(deficit[row])) <= 2:
                break  # the steps cannot add up, by a unit or two: keep every reading
            if not room.any():  # far from adding up (long, even rows): move beyond the steps
                # (a weight of 0.005 or more keeps a unit: at most 200 of them in a row)
                high[row], low[row] = np.where(weights[row] > 0, SCALE, 0), weights[row] >= 0.005
                continue
            order = np.argsort(-step * remainder[room], kind="stable")
            moved = np.flatnonzero(room)[order[: abs(int(deficit[row]))]]
            counts[row][moved] += step
            remainder[moved] -= step
            deficit[row] -= step * len(moved)
    quantised: np.ndarray = counts.astype(np.uint8)
    return quantised


def _pack(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 6)).decode("ascii")


class AttentionView:
    """Attention weights to explore: point at a query token and see its lines to the keys.

    Displayed in a notebook (its ``_repr_html_``) or anywhere HTML goes
    (:meth:`to_html`): a layer and a head to pick (or all heads at once, one colour
    each, heads beyond the ninth dashed; the view opens on all heads when there are
    at most four, else on head 0), the query tokens on the left, the key tokens on
    the right, and a line from query to key for every weight, thicker and more
    opaque for a larger one (a weight stored as 0 out of 255 gets none; with no
    query picked, a large view draws the 4,000 heaviest and says so).

    Pointing at a query, or selecting it (click or tap it; or Tab to the tokens, where
    Down or Up selects the token in focus and then moves on, and Enter or Space
    selects it or, on the selected token, clears it; Esc, inside the view, or a
    second click also clears), shows that query's lines only. With every head shown,
    each key also gets one cell per head, as strong as that head's weight, since
    lines of several heads can hide each other; clicking a head in the legend shows
    it alone. With one head shown, "attention weights as numbers" writes each key's
    weight to two decimals (:meth:`stored` says when it reads as the weight given
    does). Keys the mask blocks are struck through and read "masked" (with no query
    picked: the keys masked for every query, such as padding).

    The fragment holds the weights (compressed, as integers out of 255, each row
    adding up to 255 within 2, see :meth:`stored`) and its own script; it loads
    nothing. It needs a browser with ``DecompressionStream``
    (Chrome and Edge 80, Firefox 113, Safari 16.4 and later, by MDN's compatibility
    table: https://developer.mozilla.org/en-US/docs/Web/API/DecompressionStream).
    A view holds at most ``MAX_CELLS`` weights (12 layers of 12 heads on 85
    tokens). Jupyter runs
    the script of a stored output only in a trusted notebook (Jupyter's security
    model): run the cell, or trust the notebook.

    Parameters
    ----------
    weights : Tensor or array, or a list of them
        Attention weights, rows summing to 1 (or all zero, a query that the mask
        blocks from every key; float16 and bfloat16 rows may miss 1 by their
        rounding): (T, S) for one head, (h, T, S) for one layer's heads,
        (layers, h, T, S) for several layers. A list or tuple of per-layer
        (h, T, S) or (B, h, T, S) weights is stacked: Hugging Face's
        ``outputs.attentions`` as it comes. The axes cannot be told apart by their
        sizes, so a batch passed whole is misread: a layer's (B, h, T, S) weights
        read as B layers, and ``torch.nn.MultiheadAttention``'s head-averaged
        (B, T, S) as B heads. Pass ``weights[b]`` (and ``mask[b]``).
    queries : list of str
        The query tokens, one per row (T).
    keys : list of str, optional
        The key tokens, one per column (S); default ``queries`` (self-attention).
        Cross-attention needs its own: the source's tokens.
    mask : Tensor or array, optional, broadcastable to the weights
        qkv's convention: boolean True means "may attend" (``qkv.causal_mask(T)``,
        a (S,) key mask, a (B, 1, 1, S) padding mask, taken at ``sequence``), or
        floating and additive: ``-inf`` or -10,000 and below blocks (Hugging Face's
        ``torch.finfo(dtype).min``); a floating 0/1 mask is refused (pass
        ``mask.bool()``). The weights must be 0 where it blocks: a mask in
        ``torch.nn.MultiheadAttention``'s convention (True = blocked) is caught
        here. A query it blocks from every key shows nothing, whatever its row
        holds. Leading axes of size 1 are dropped.
    sequence : int, optional
        Which sequence of a batch: for a list of (B, h, T, S) layers, or
        (layers, B, h, T, S) weights, and of a (B, h or 1, T or 1, S) mask (a
        (B, S) mask reads as (T, S): pass ``mask[b]``). Required when B > 1.
    title : str, optional
        Shown above the view, and its accessible name.

    Attributes
    ----------
    weights : numpy.ndarray, shape (layers, h, T, S)
        The weights as given (float32), with the axes the view adds of size 1, and
        zero in the rows the mask empties.
    allowed : numpy.ndarray of bool, shape (layers, h, T, S)
        Where the mask lets attention go (all True without one).
    queries, keys : list of str
    title : str or None
    id : str
        The HTML element's id, one per view within the Python process (a view shown
        twice shows it twice; each copy still works on its own).

    Raises
    ------
    TypeError
        Weights that are not a tensor or an array of numbers (or are None), tokens that
        are not a list of str, a mask that is neither boolean nor floating or is a
        floating 0/1 mask, a title that is not a str, a sequence that is not an int.
    ValueError
        Weights of the wrong rank, NaN, outside [0, 1] or with rows that do not add up
        to 1 (weights taken in training mode, after dropout, do not); token lists of the
        wrong length; a mask that does not fit or that blocks cells with weight.

    See Also
    --------
    qkv.diagrams.attention_map : the same weights as a static map, with the mask hatched.
    qkv.plot_attention, qkv.plot_heads

    Examples
    --------
    >>> import torch, qkv
    >>> layer = qkv.MultiHeadAttention(12, 3)
    >>> x = torch.randn(1, 5, 12)
    >>> _, weights = layer(x, is_causal=True, need_weights=True)  # (1, 3, 5, 5)
    >>> tokens = ["the", "cat", "sat", "on", "it"]
    >>> view = qkv.AttentionView(weights[0], tokens, mask=qkv.causal_mask(5))
    >>> view
    AttentionView(1 layer, 3 heads, 5 queries, 5 keys)
    >>> "http" in view.to_html()  # nothing to load
    False
    """

    def __init__(
        self,
        weights: object,
        queries: Sequence[str],
        keys: Sequence[str] | None = None,
        *,
        mask: object | None = None,
        sequence: int | None = None,
        title: str | None = None,
    ) -> None:
        if sequence is not None:
            if isinstance(sequence, bool) or not hasattr(sequence, "__index__"):
                raise TypeError(f"sequence must be an int or None, got {type(sequence).__name__}")
            sequence = operator.index(sequence)  # NumPy's integers too
        tolerance = _tolerance(weights)
        array = _stack(weights, sequence)
        if array.ndim not in _LAYOUTS:
            raise ValueError(
                "weights must be (T, S), (h, T, S) or (layers, h, T, S), or a list of per-layer "
                f"(h, T, S) or (B, h, T, S) weights, got shape {shape_str(array.shape)}"
            )
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise TypeError(f"weights must hold numbers, got dtype {array.dtype}")
        layout = _LAYOUTS[array.ndim]
        full: np.ndarray = array.astype(np.float32).reshape((1,) * (4 - array.ndim) + array.shape)
        T, S = int(full.shape[2]), int(full.shape[3])  # full: (layers, h, T, S)
        if min(full.shape) == 0:
            raise ValueError(f"weights {layout} of shape {shape_str(array.shape)} have nothing to show")
        if full.size > MAX_CELLS:
            raise ValueError(
                f"weights of shape {shape_str(array.shape)} hold {full.size:,} weights, more than a view "
                f"holds ({MAX_CELLS:,}): pass fewer layers or tokens"
            )
        self.queries = _tokens("queries", queries, T, "query")
        if keys is None and S != T:
            queries_count = "1 query" if T == 1 else f"{T} queries"
            raise ValueError(
                f"keys is needed: the weights have {S} keys for {queries_count}, so the queries' tokens "
                "cannot label them (cross-attention, or a decoding step with a cache)"
            )
        self.keys = list(self.queries) if keys is None else _tokens("keys", keys, S, "key")
        if title is not None and not isinstance(title, str):
            raise TypeError(f"title must be a str or None, got {type(title).__name__}")
        self.title = title
        if mask is None:
            allowed = np.ones(full.shape, dtype=bool)
        else:
            mask_array = as_numpy("mask", mask)
            if mask_array.ndim == 4 and mask_array.shape[0] > 1:  # (B, h or 1, T or 1, S)
                if sequence is None:
                    raise ValueError(
                        f"mask of shape {shape_str(mask_array.shape)} holds {mask_array.shape[0]} "
                        "sequences: pass sequence=b with the batch's weights, or mask[b]"
                    )
                mask_array = mask_array[sequence]  # the sequence's own
            allowed = np.array(allowed_cells(mask_array, array.shape, layout)).reshape(full.shape)
            # A query the mask blocks from every key has no weights to show, whatever the
            # library left in its row: zeros (qkv), NaN (some torch), uniform (Hugging Face).
            full = np.where(allowed.any(-1, keepdims=True), full, 0.0).astype(np.float32)
        if not np.isfinite(full).all():
            where = tuple(int(i) for i in np.argwhere(~np.isfinite(full))[0])
            raise ValueError(
                f"weights contain NaN or infinity, first at (layer, head, query, key) = {where}: "
                "a query that the mask blocks from every key gives NaN in some versions of torch"
            )
        if full.min() < -tolerance or full.max() > 1 + tolerance:
            raise ValueError(
                f"weights must be probabilities in [0, 1], got values from {full.min():.3g} to "
                f"{full.max():.3g}: scores before the softmax, or weights after dropout, in training mode "
                "(take them after model.eval())?"
            )
        sums = full.sum(-1)  # (layers, h, T)
        bad = (np.abs(sums - 1) > tolerance) & (np.abs(sums) > tolerance)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"each row of weights must add up to 1 (or be all 0), but {int(bad.sum())} of "
                f"{sums.size} rows do not (row sums from {sums.min():.3g} to {sums.max():.3g}; first at "
                f"(layer, head, query) = {where}): {_why_rows(full, tolerance)}"
            )
        if mask is not None:
            leak = np.where(allowed, 0.0, full)  # weight where the mask blocks
            if leak.max() > tolerance:
                where = tuple(int(i) for i in np.unravel_index(int(leak.argmax()), leak.shape))
                raise ValueError(
                    f"the weights put {leak.max():.3g} on a cell that the mask blocks, (layer, head, "
                    f"query, key) = {where}, with a mask of shape {shape_str(mask_array.shape)}: is "
                    "the mask in torch.nn.MultiheadAttention's convention (True = blocked; qkv's True "
                    "means 'may attend', qkv.from_torch_mask converts), or another sequence's?"
                )
        self.weights: np.ndarray = full
        self.allowed = allowed
        self._html: str | None = None
        self._stored: np.ndarray | None = None
        identity = json.dumps([list(full.shape), self.queries, self.keys, title]).encode()
        self.id = f"qkv-view-{hashlib.sha1(identity).hexdigest()[:10]}-{next(_SERIAL)}"

    def _sizes(self) -> tuple[int, int, int, int]:
        shape = self.weights.shape  # (layers, h, T, S)
        return int(shape[0]), int(shape[1]), int(shape[2]), int(shape[3])

    def __repr__(self) -> str:
        layers, heads, T, S = self._sizes()

        def count(n: int, what: str) -> str:
            return f"{n} {what}" + ("" if n == 1 else "s" if what != "query" else "")

        queries = "1 query" if T == 1 else f"{T} queries"
        return (
            f"AttentionView({count(layers, 'layer')}, {count(heads, 'head')}, {queries}, {count(S, 'key')})"
        )

    def stored(self) -> np.ndarray:
        """The weights as the view stores and shows them, shape (layers, h, T, S).

        Multiples of 1/255 (zero where the mask blocks), each within 0.01 of the
        weight given (0.02 in the long, even rows below), after the rounding in its
        row's sum is divided out. To two decimals, what the view writes as numbers,
        each reads as the weight given does, and each row adds up to 1 within 2/255
        (exactly, most often: when its readings can be stored in steps of 1/255
        adding up to 1). Long, even rows are the exception: 150 weights of about
        1/150 each read 0.01 but cannot all be stored as 2/255 or more, so the row
        adds up to 1 exactly and some weights read 0.00 (always within 0.01). A
        weight of 0.005 or more is never stored as 0: it always has a line.
        """
        return self._counts() / SCALE

    def _counts(self) -> np.ndarray:
        """:meth:`stored` as integers out of ``SCALE``, made once."""
        if self._stored is None:
            shown = np.where(self.allowed, self.weights, 0.0).astype(np.float64)  # (layers, h, T, S)
            sums = shown.sum(-1, keepdims=True)  # (layers, h, T, 1): 1 up to rounding, or about 0
            rows = np.abs(sums - 1) < 0.5  # the rows to show; the others are all but zero
            self._stored = _quantise(np.divide(shown, sums, out=np.zeros_like(shown), where=rows))
        return self._stored

    def data(self) -> dict[str, object]:
        """What the view's script reads: tokens, shape, and the weights and mask, packed.

        ``weights`` is base64 of zlib-compressed bytes, one per weight in
        (layers, h, T, S) order, each an integer out of ``scale`` (:meth:`stored`
        times ``scale``); ``masked``, when the mask blocks anything, is base64 of
        zlib-compressed bits (``numpy.packbits``, 1 = blocked), in the same order.
        """
        blocked = ~self.allowed
        return {
            "queries": self.queries,
            "keys": self.keys,
            "shape": list(self.weights.shape),
            "scale": SCALE,
            "weights": _pack(self._counts().tobytes()),
            "masked": _pack(np.packbits(blocked).tobytes()) if blocked.any() else None,
        }

    def to_html(self) -> str:
        """The view as one HTML fragment: its container, style, data and script.

        Put it in any page; it needs nothing else. Two views on one page do not
        interfere. The JSON is escaped for a ``<script>`` block: a token
        ``"</script>"`` stays a token. The fragment is ASCII (other characters are
        escaped), so it can be written in any encoding. Made once, on the first call.
        """
        if self._html is None:
            self._html = self._make_html()
        return self._html

    def _make_html(self) -> str:
        layers, heads, T, S = self._sizes()
        payload = json.dumps(self.data(), ensure_ascii=True, separators=(",", ":"))
        payload = payload.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
        label = self.title or "Attention view"
        fallback = (
            f"Interactive attention view ({layers} × {heads} maps of {T} queries × {S} keys): it needs "
            "JavaScript. In Jupyter, run the cell or trust the notebook."
        )
        title = f'<div class="qkv-av-title">{html.escape(self.title)}</div>' if self.title else ""
        script = _asset("_view.js").replace("__QKV_VIEW_ID__", self.id)
        fragment = (
            f'<div class="qkv-attention-view" id="{self.id}" data-qkv-view="{self.id}" role="group" '
            f'aria-label="{html.escape(label)}">'
            f"<style>{_asset('_view.css')}</style>{title}"
            f'<p class="qkv-av-fallback">{html.escape(fallback)}</p>'
            f'<script type="application/json" class="qkv-av-data">{payload}</script>'
            f"<script>{script}</script></div>"
        )
        # Text outside the scripts (the title, the fallback) as character references; the
        # scripts and the style are ASCII already. A lone surrogate in a title survives too.
        return fragment.encode("ascii", "xmlcharrefreplace").decode("ascii")

    def _repr_html_(self) -> str:
        return self.to_html()
