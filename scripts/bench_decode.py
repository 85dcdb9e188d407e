"""Time one decoding step of an attention layer of Llama 3 8B's sizes, on a GPU.

One ``qkv.MultiHeadAttention`` layer (model width 4096, 32 query heads of 128, no
biases, bfloat16) decodes one new token per sequence against a ``qkv.KVCache``
holding ``length`` tokens, for 32, 8 and 1 K/V heads (multi-head, grouped-query,
multi-query attention), for one sequence and for a batch. It also times the same
step without a cache: the layer run again over all ``length + 1`` tokens.

Each time is the mean of ``--repeat`` steps measured with CUDA events after warm-up
steps; after each step the cache is cropped back to ``length``, so that every step
sees the same cache. The bytes a step must read (the cache, and the layer's
weights) divided by its time give the bandwidth the step reached: near the card's
memory bandwidth, the step is limited by reading memory, not by arithmetic.

    python scripts/bench_decode.py --out decode.json

It needs a CUDA device. book/inference/measured.ipynb quotes one run, on an NVIDIA H200,
whose raw output is scripts/bench_decode_h200.json (tests/test_bench_decode.py checks
that the page's folded table holds the same times).
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Callable
from pathlib import Path

import torch

import qkv

WIDTH, HEADS, HEAD_SIZE = 4096, 32, 128  # Llama 3 8B: hidden size, query heads, head size
KV_HEADS = (32, 8, 1)
DEVICE = "cuda"


def milliseconds(step: Callable[[], object], repeat: int, warmup: int = 5) -> float:
    """The mean time of one call of ``step``, in ms, measured with CUDA events."""
    for _ in range(warmup):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeat):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def layer(num_kv_heads: int) -> qkv.MultiHeadAttention:
    torch.manual_seed(0)
    module = qkv.MultiHeadAttention(WIDTH, HEADS, num_kv_heads=num_kv_heads, bias=False)
    return module.to(device=DEVICE, dtype=torch.bfloat16).eval()


def cached_step(num_kv_heads: int, batch: int, length: int, repeat: int) -> dict[str, float]:
    """One new token per sequence, attending to ``length`` cached tokens."""
    module = layer(num_kv_heads)
    cache = module.new_cache(batch, length + 1)
    shape = (batch, num_kv_heads, length, HEAD_SIZE)
    cache.append(torch.randn(shape, device=DEVICE, dtype=torch.bfloat16),
                 torch.randn(shape, device=DEVICE, dtype=torch.bfloat16))  # fmt: skip
    cache_bytes = cache.nbytes * length // (length + 1)  # what the step reads: `length` tokens
    weight_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    x = torch.randn(batch, 1, WIDTH, device=DEVICE, dtype=torch.bfloat16)

    def step() -> None:
        module(x, cache=cache, is_causal=True)
        cache.crop(length)

    ms = milliseconds(step, repeat)
    return {"ms": ms, "cache_bytes": cache_bytes, "weight_bytes": weight_bytes,
            "gb_per_s": (cache_bytes + weight_bytes) / ms / 1e6}  # fmt: skip


def uncached_step(num_kv_heads: int, batch: int, length: int, repeat: int) -> dict[str, float]:
    """The same step without a cache: the layer over all ``length + 1`` tokens again."""
    module = layer(num_kv_heads)
    x = torch.randn(batch, length + 1, WIDTH, device=DEVICE, dtype=torch.bfloat16)
    ms = milliseconds(lambda: module(x, is_causal=True), repeat, warmup=2)
    torch.cuda.empty_cache()
    return {"ms": ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device: the times are a GPU's")
    rows = []
    with torch.inference_mode():
        for batch in args.batches:
            for length in args.lengths:
                for h_kv in KV_HEADS:
                    row = {"batch": batch, "length": length, "num_kv_heads": h_kv}
                    row |= cached_step(h_kv, batch, length, args.repeat)
                    torch.cuda.empty_cache()  # the cache is freed: room for the next
                    if batch == 1:  # without a cache, one sequence is enough to show it
                        row["uncached_ms"] = uncached_step(h_kv, batch, length, 10)["ms"]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    properties = torch.cuda.get_device_properties(0)
    result = {
        "what": __doc__.split("\n\n")[0],
        "device": properties.name,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "sizes": {"width": WIDTH, "heads": HEADS, "head_size": HEAD_SIZE, "dtype": "bfloat16"},
        "repeat": args.repeat,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
