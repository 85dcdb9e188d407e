"""Diagrams drawn from the code: the data flow of attention, to scale, from real objects.

Every function takes the tensors, weights or modules a chapter uses and draws
them with the sizes and names read from those objects, so a picture cannot
disagree with the code. One colour per role across the book (X grey, Q blue,
K vermillion, V green, W^O purple; colour-blind safe) and one per head. Each
returns a ``matplotlib.figure.Figure`` and prints nothing. matplotlib is needed:
``pip install qkv[plot]``.
"""

from qkv.diagrams._draw import (
    HEAD_COLOURS,
    MASKED_COLOUR,
    ROLE_COLOURS,
    Cells,
    cells,
    matrix_names,
    patches_by_gid,
    texts_of,
)
from qkv.diagrams.backward import backward_paths
from qkv.diagrams.einsum import cross_attention_shapes, memory_fan_out
from qkv.diagrams.equation import (
    causal_leak,
    empty_rows,
    largest_weight_curves,
    mask_conventions,
    mask_routes,
    output_hull,
    softmax_axes,
    softmax_rows,
    weighted_sum,
)
from qkv.diagrams.flow import projection
from qkv.diagrams.heads import (
    heads_from_one_matrix,
    multi_head,
    packed_layouts,
    reshape,
    weight_storage,
    wide_head,
)
from qkv.diagrams.inference import (
    attention_map,
    bytes_per_step,
    cache_growth,
    cross_attention,
    decoding_step,
    kv_sharing,
)
from qkv.diagrams.roles import data_flow, tied_preference
from qkv.diagrams.rotary import pairings, position_flow, position_gaps, position_scores, rotation, value_shift
from qkv.diagrams.training import one_loss, step_changes, training_curves

__all__ = [
    "HEAD_COLOURS",
    "MASKED_COLOUR",
    "ROLE_COLOURS",
    "Cells",
    "attention_map",
    "backward_paths",
    "bytes_per_step",
    "cache_growth",
    "causal_leak",
    "cells",
    "cross_attention",
    "cross_attention_shapes",
    "data_flow",
    "decoding_step",
    "empty_rows",
    "heads_from_one_matrix",
    "kv_sharing",
    "largest_weight_curves",
    "mask_conventions",
    "mask_routes",
    "matrix_names",
    "memory_fan_out",
    "multi_head",
    "one_loss",
    "output_hull",
    "packed_layouts",
    "pairings",
    "patches_by_gid",
    "position_flow",
    "position_gaps",
    "position_scores",
    "projection",
    "reshape",
    "rotation",
    "softmax_axes",
    "softmax_rows",
    "step_changes",
    "texts_of",
    "tied_preference",
    "training_curves",
    "value_shift",
    "weight_storage",
    "weighted_sum",
    "wide_head",
]
