"""Time qkv.MultiHeadAttention against torch.nn.MultiheadAttention and a bare SDPA composition.

One run measures every variant on the same weights and inputs, interleaving
them round by round so that drift in the machine's speed affects all alike,
and prints times and ratios. Peak memory of the fast path at the long length
is measured in a fresh subprocess per variant (CPU on Linux: the resident set's
high-water mark; CUDA: torch.cuda.max_memory_allocated).

Run it from the repository root::

    .venv/bin/python benchmarks/attention_speed.py            # both cases
    .venv/bin/python benchmarks/attention_speed.py --quick    # fewer rounds

See benchmarks/README.md for the figures measured on the project's machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import qkv
from qkv.interop import from_torch

H, E = 8, 256
CASES = {"short": {"B": 8, "T": 256}, "long": {"B": 1, "T": 2048}}
# Small inputs, where the per-call overhead shows: one decoding step (one query against 128
# remembered positions, cross-attention style) and a small batch of short sequences.
SMALL_CASES = {"step": {"B": 1, "T": 1, "S": 128}, "small": {"B": 4, "T": 16, "S": 16}}


def build(B: int, T: int, device: torch.device) -> dict[str, object]:
    """The three contenders, holding the same weights, and one input."""
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(E, H, batch_first=True, device=device)
    ours = qkv.MultiHeadAttention.from_heads(from_torch(reference))
    x = torch.randn(B, T, E, device=device)  # (B, T, embed_dim)
    d = E // H

    def bare_sdpa(x: Tensor) -> Tensor:
        q = F.linear(x, ours.q_proj.weight, ours.q_proj.bias).view(B, T, H, d).transpose(1, 2)  # (B, h, T, d)
        k = F.linear(x, ours.k_proj.weight, ours.k_proj.bias).view(B, T, H, d).transpose(1, 2)  # (B, h, T, d)
        v = F.linear(x, ours.v_proj.weight, ours.v_proj.bias).view(B, T, H, d).transpose(1, 2)  # (B, h, T, d)
        heads = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
        return F.linear(heads.transpose(1, 2).reshape(B, T, E), ours.out_proj.weight, ours.out_proj.bias)

    return {
        "x": x,
        "qkv": lambda x: ours(x)[0],
        "torch": lambda x: reference(x, x, x, need_weights=False)[0],
        "bare SDPA": bare_sdpa,
        "qkv weights": lambda x: ours(x, need_weights=True)[0],
        "torch weights": lambda x: reference(x, x, x, need_weights=True, average_attn_weights=False)[0],
    }


def build_small(
    B: int, T: int, S: int, masked: bool, device: torch.device
) -> dict[str, Callable[[], Tensor]]:
    """qkv and the bare SDPA composition on a small input, with or without a mask.

    The mask is a key padding mask (B, 1, 1, S) for the decoding step (the last 3 of 128
    positions are padding) and the causal mask (T, S) for the small batch.
    """
    torch.manual_seed(0)
    ours = qkv.MultiHeadAttention(E, H, device=device).eval()
    x = torch.randn(B, T, E, device=device)  # (B, T, embed_dim)
    memory = torch.randn(B, S, E, device=device)  # (B, S, embed_dim)
    mask = None
    if masked:
        mask = (
            qkv.padding_mask([S - 3] * B, S, device=device)
            if T == 1
            else qkv.causal_mask(T, S, device=device)
        )
    d = E // H

    def bare_sdpa() -> Tensor:
        q = F.linear(x, ours.q_proj.weight, ours.q_proj.bias).view(B, T, H, d).transpose(1, 2)  # (B, h, T, d)
        k = F.linear(memory, ours.k_proj.weight, ours.k_proj.bias).view(B, S, H, d).transpose(1, 2)
        v = F.linear(memory, ours.v_proj.weight, ours.v_proj.bias).view(B, S, H, d).transpose(1, 2)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, h, T, d)
        return F.linear(heads.transpose(1, 2).reshape(B, T, E), ours.out_proj.weight, ours.out_proj.bias)

    return {"qkv": lambda: ours(x, memory, mask=mask)[0], "bare SDPA": bare_sdpa}


def time_small(case: str, masked: bool, rounds: int, device: torch.device) -> dict[str, float]:
    """Median seconds per inference call; each sample averages 5 calls, variants interleaved."""
    sizes = SMALL_CASES[case]
    built = build_small(sizes["B"], sizes["T"], sizes["S"], masked, device)
    samples: dict[str, list[float]] = {name: [] for name in built}
    with torch.inference_mode():
        for _ in range(50):  # warm up
            for fn in built.values():
                fn()
        for _ in range(rounds):
            for name, fn in built.items():
                synchronize(device)
                start = time.perf_counter()
                for _ in range(5):
                    fn()
                synchronize(device)
                samples[name].append((time.perf_counter() - start) / 5)
    return {name: statistics.median(s) for name, s in samples.items()}


def step(fn: Callable[[Tensor], Tensor], x: Tensor, backward: bool) -> None:
    if backward:
        fn(x.requires_grad_()).sum().backward()
    else:
        with torch.inference_mode():
            fn(x)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_all(case: str, rounds: int, device: torch.device) -> dict[str, dict[str, float]]:
    """Median seconds per call for each variant, forward+backward and inference."""
    sizes = CASES[case]
    built = build(sizes["B"], sizes["T"], device)
    x = built.pop("x")
    results: dict[str, dict[str, float]] = {}
    for mode, backward in (("forward+backward", True), ("inference", False)):
        samples: dict[str, list[float]] = {name: [] for name in built}
        for fn in built.values():  # warm up
            step(fn, x.detach().clone(), backward)
        for _ in range(rounds):
            for name, fn in built.items():
                inp = x.detach().clone()
                synchronize(device)
                start = time.perf_counter()
                step(fn, inp, backward)
                synchronize(device)
                samples[name].append(time.perf_counter() - start)
        results[mode] = {name: statistics.median(s) for name, s in samples.items()}
    return results


def peak_memory(variant: str, device: str) -> float:
    """Peak extra memory (MiB) of one forward+backward at the long length, in a fresh process.

    CUDA: ``torch.cuda.max_memory_allocated``. CPU (Linux): the resident set's
    high-water mark, reset just before the (first, un-warmed) step by writing 5
    to ``/proc/self/clear_refs``, minus the resident set before it.
    """
    code = f"""
import json, sys, torch
sys.path.insert(0, "benchmarks")
from attention_speed import build, step
device = torch.device({device!r})
built = build(**{CASES["long"]!r}, device=device)
x, fn = built["x"], built[{variant!r}]
def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))
if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    step(fn, x, True); print(json.dumps((torch.cuda.max_memory_allocated() - base) / 2**20))
else:
    # No warm-up: memory freed by an earlier step would be reused without showing in
    # the resident set, so only a first step's peak is the variant's own.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident set
    base = status("VmRSS:")
    step(fn, x, True)
    print(json.dumps((status("VmHWM:") - base) / 1024))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--device", default=str(qkv.get_device()))
    args = parser.parse_args()
    device = torch.device(args.device)
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, device {device}, threads {threads}, h={H}, embed_dim={E}")
    for case, sizes in CASES.items():
        rounds = (5 if args.quick else 15) if case == "short" else (2 if args.quick else 5)
        results = time_all(case, rounds, device)
        print(f"\n{case}: B={sizes['B']}, T=S={sizes['T']} (median of {rounds} rounds, ms)")
        for mode, times in results.items():
            fast = f"qkv / bare SDPA {times['qkv'] / times['bare SDPA']:.3f}"
            vs_torch = f"qkv / torch {times['qkv'] / times['torch']:.3f}"
            bare = f"bare SDPA / torch {times['bare SDPA'] / times['torch']:.3f}"
            weights = f"qkv weights / torch weights {times['qkv weights'] / times['torch weights']:.3f}"
            row = "  ".join(f"{name} {1e3 * t:.2f}" for name, t in times.items())
            print(f"  {mode:17s} {row}\n  {'':17s} {fast}; {vs_torch}; {bare}; {weights}")
    print("\nsmall inputs, inference (median of rounds of 5 calls, us)")
    for case, sizes in SMALL_CASES.items():
        for masked in (False, True):
            times = time_small(case, masked, 100 if args.quick else 400, device)
            label = (
                f"{case}: B={sizes['B']}, T={sizes['T']}, S={sizes['S']}, {'mask' if masked else 'no mask'}"
            )
            print(f"  {label:38s} qkv {1e6 * times['qkv']:.1f}  bare SDPA {1e6 * times['bare SDPA']:.1f}"
                  f"  qkv / bare SDPA {times['qkv'] / times['bare SDPA']:.3f}")  # fmt: skip
    names = ("qkv", "bare SDPA", "torch", "qkv weights", "torch weights")
    memory = {name: peak_memory(name, str(device)) for name in names}
    print(f"\npeak extra memory, forward+backward at T=S={CASES['long']['T']} (MiB): "
          + ", ".join(f"{name} {mib:.1f}" for name, mib in memory.items())
          + f"; qkv / bare SDPA {memory['qkv'] / memory['bare SDPA']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
