"""Time decoding with qkv.KVCache, and measure the cache's memory with grouped-query attention.

Three measurements, all inference (``torch.inference_mode()``), h = 8 heads,
embed_dim = 256, one sequence (B = 1):

1. **Decoding n tokens, cache vs recompute**, n = 128, 512, 2048. "recompute" is
   what a model without a cache does: at step t it runs the module on the whole
   prefix ``x[:, :t+1]`` with ``is_causal=True`` and keeps the last position's
   output. "cache" runs ``mha(x[:, t:t+1], cache=cache)`` on a cache allocated for
   n tokens (allocated before the clock starts). Every one of the n steps is run
   and timed, no step is sampled: one sample is one whole decode, the two
   contenders interleaved round by round. Before timing, the outputs of both are
   compared at every step (n = 128) or at a few steps (larger n); every timed
   decode's outputs are compared again afterwards. Reported: per-token time
   (a decode's time / n), median over rounds, and the speed-up recompute / cache,
   which should grow with n (recompute's step t costs O(t), the cache's O(1) in
   projections and O(t) only in the attention itself). The script says whether it
   does.
2. **Cache memory with GQA/MQA**: ``cache.nbytes`` (the storage of its key and
   value tensors) of a cache for 2048 tokens filled by a prefill, for
   num_kv_heads = 8 (multi-head), 2 (grouped-query) and 1 (multi-query); each
   ratio to the multi-head cache must be exactly num_kv_heads / num_heads.
3. **One decoding step (T = 1), qkv vs bare SDPA**, with a prefix of 128 and of 1024
   tokens already cached. "bare SDPA" writes the step by hand on the same weights,
   fetched once beforehand (the fastest way to read them): ``F.linear`` for q, k and
   v, heads by ``view``/``transpose``, k and v written by slice assignment into
   pre-allocated (B, h, max_len, d) tensors, ``F.scaled_dot_product_attention`` over
   the first L + 1 positions, heads merged, ``F.linear`` out. "qkv" is ``mha(x_t,
   cache=cache)``. How a sample is timed: both caches hold the same prefix of L
   tokens (filled once); outside the clock, each is cut back to it (qkv:
   ``cache.crop(L)``, which keeps the memory and the owner, as between the steps of
   a real decode; bare: its length set back to L), then 5 calls are timed, one new
   token each (the same 5 tokens for both), so that both caches grow L -> L + 5
   identically within the sample. Each round takes one sample of every contender, in
   a new random order. Reported: median microseconds per call and qkv / bare SDPA.
   For information, timed alongside: the same bare step reading the weights from the
   module at each call (``mha.q_proj.weight``, as attention_speed.py's bare SDPA
   does), and the same qkv call with ``is_causal=True`` (as a model passes when one
   code path serves prefill and decoding). And, in the same samples, under
   ``torch.compile`` (``fullgraph=True``, default mode): a step function that calls
   qkv's module (``torch.compile(lambda x_t, cache: mha(x_t, cache=cache)[0])``, as
   a model's compiled step inlines its layers) against ``torch.compile`` of the
   hand-written step (its own K/V tensors, restored the same way); and, for
   information, ``torch.compile(mha)``, the module object compiled, which adds
   torch's compiled-module call. They are compiled before the clock starts, at two
   lengths never timed (the second makes the cache's length dynamic), so that every
   timed call runs one graph, as the steps of a decode do; then warmed up (30
   samples), and their outputs are checked like the others'. A fall-back to eager
   (the recompile limit) and a compile during the timed calls are errors. The caches
   have one slot more than the samples fill. Then, to show where the compiled time
   goes, the two compiled steps are timed again (the same number of samples) under
   ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``, which skips the
   guards (the checks of a call's Python values and tensor metadata that pick a
   compiled graph): torch's setting for a steady decoding loop.

Run it from the repository root::

    .venv/bin/python benchmarks/kv_cache.py              # about 3 minutes on 2 CPU cores
    .venv/bin/python benchmarks/kv_cache.py --quick      # fewer rounds
    .venv/bin/python benchmarks/kv_cache.py --step-only  # measurement 3 alone, eager and compiled

Add ``--device cuda`` (the default is ``qkv.get_device()``) to run on a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from collections.abc import Callable, Iterable

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import Tensor
from torch._dynamo.utils import counters

import qkv

H, E, B = 8, 256, 1
DECODE_LENGTHS = (128, 512, 2048)
MEMORY_LENGTH = 2048
KV_HEADS = (8, 2, 1)
STEP_PREFIXES = (128, 1024)
CALLS_PER_SAMPLE = 5


def assert_same(actual: Tensor, expected: Tensor) -> None:
    """Equal up to float32 rounding: the contenders sum in different orders."""
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build(num_kv_heads: int, device: torch.device) -> qkv.MultiHeadAttention:
    torch.manual_seed(0)
    return qkv.MultiHeadAttention(E, H, num_kv_heads=num_kv_heads, device=device).eval()


# 1. Decoding n tokens: cache vs recompute ------------------------------------------------------------


def decode_recompute(mha: qkv.MultiHeadAttention, x: Tensor, steps: Iterable[int]) -> Tensor:
    """At each step t, the whole prefix x[:, :t+1] through the module; the last position's output.

    The last position is copied out, so that each step's (B, t+1, E) output is freed at once (a
    view ``[:, -1:]`` would keep them all alive: about 2 GiB at n = 2048).
    """
    steps = list(steps)
    outputs = torch.empty(x.shape[0], len(steps), x.shape[2], device=x.device)  # (B, steps, E)
    for i, t in enumerate(steps):
        outputs[:, i] = mha(x[:, : t + 1], is_causal=True)[0][:, -1]  # (B, E) of (B, t+1, E)
    return outputs


def decode_cache(mha: qkv.MultiHeadAttention, x: Tensor, cache: qkv.KVCache) -> Tensor:
    """One token at a time into ``cache`` (empty, room for all of x): only the new token is projected."""
    outputs = torch.empty_like(x)  # (B, n, E)
    for t in range(x.shape[1]):
        outputs[:, t] = mha(x[:, t : t + 1], cache=cache)[0][:, 0]  # (B, E) of (B, 1, E)
    return outputs


def time_decode(n: int, rounds: int, device: torch.device) -> dict[str, float]:
    """Median seconds per token of a whole n-token decode, cache and recompute interleaved."""
    mha = build(H, device)
    torch.manual_seed(1)
    x = torch.randn(B, n, E, device=device)  # (B, n, E)
    # Check first: every step at the smallest n, else steps 0, 1, n // 2 and n - 1.
    checked = list(range(n)) if n <= DECODE_LENGTHS[0] else [0, 1, n // 2, n - 1]
    cached = decode_cache(mha, x, mha.new_cache(B, n))  # (B, n, E); also the cache's warm-up
    assert_same(cached[:, checked], decode_recompute(mha, x, checked))
    decode_recompute(mha, x, range(min(n, 64)))  # warm up recompute's short prefixes
    samples: dict[str, list[float]] = {"cache": [], "recompute": []}
    for _ in range(rounds):
        cache = mha.new_cache(B, n)  # allocated outside the clock
        synchronize(device)
        start = time.perf_counter()
        by_cache = decode_cache(mha, x, cache)  # (B, n, E)
        synchronize(device)
        samples["cache"].append((time.perf_counter() - start) / n)
        start = time.perf_counter()
        by_recompute = decode_recompute(mha, x, range(n))  # (B, n, E)
        synchronize(device)
        samples["recompute"].append((time.perf_counter() - start) / n)
        assert_same(by_cache, by_recompute)  # all n steps, outside the clock
    return {name: statistics.median(s) for name, s in samples.items()}


# 2. Cache memory with GQA/MQA -----------------------------------------------------------------------


def cache_bytes(num_kv_heads: int, device: torch.device) -> int:
    """``cache.nbytes`` of a cache for MEMORY_LENGTH tokens, filled by one causal prefill."""
    mha = build(num_kv_heads, device)
    torch.manual_seed(1)
    x = torch.randn(B, MEMORY_LENGTH, E, device=device)  # (B, M, E)
    cache = mha.new_cache(B, MEMORY_LENGTH)
    prefilled, _ = mha(x, cache=cache, is_causal=True)  # (B, M, E)
    assert_same(prefilled, mha(x, is_causal=True)[0])
    assert cache.length == MEMORY_LENGTH
    assert tuple(cache.keys.shape) == (B, num_kv_heads, MEMORY_LENGTH, mha.d_k)  # (B, h_kv, M, d_k)
    expected = B * num_kv_heads * MEMORY_LENGTH * (mha.d_k + mha.d_v) * cache.keys.element_size()
    assert cache.nbytes == expected, (cache.nbytes, expected)
    return cache.nbytes


# 3. One decoding step: qkv vs bare SDPA --------------------------------------------------------------


class BareStep:
    """One decoding step written with bare torch, on ``mha``'s weights and its own K/V tensors."""

    def __init__(self, mha: qkv.MultiHeadAttention, max_length: int, prefetch: bool) -> None:
        self.mha = mha
        self.d = E // H
        # prefetch: the weights fetched once, as plain attributes, the fastest a hand-written step
        # reads them; otherwise read from the module at each call (mha.q_proj.weight), as the bare
        # SDPA of attention_speed.py does.
        self.weights = (
            [(layer.weight, layer.bias) for layer in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj)]
            if prefetch
            else None
        )
        device = mha.q_proj.weight.device
        self.keys = torch.zeros(B, H, max_length, self.d, device=device)  # (B, h, max_len, d)
        self.values = torch.zeros(B, H, max_length, self.d, device=device)  # (B, h, max_len, d)
        self.length = 0

    def restore(self, keys: Tensor, values: Tensor) -> None:
        """Hold exactly ``keys`` and ``values`` (B, h, L, d), as qkv's reset() + append() do."""
        length = keys.shape[2]
        self.keys[:, :, :length] = keys  # (B, h, L, d)
        self.values[:, :, :length] = values  # (B, h, L, d)
        self.length = length

    def __call__(self, x: Tensor) -> Tensor:
        d, end, m = self.d, self.length + 1, self.mha
        if self.weights is None:
            weights = [(layer.weight, layer.bias) for layer in (m.q_proj, m.k_proj, m.v_proj, m.out_proj)]
        else:
            weights = self.weights
        (w_q, b_q), (w_k, b_k), (w_v, b_v), (w_o, b_o) = weights
        q = F.linear(x, w_q, b_q).view(B, 1, H, d).transpose(1, 2)  # (B, h, 1, d)
        k = F.linear(x, w_k, b_k).view(B, 1, H, d).transpose(1, 2)  # (B, h, 1, d)
        v = F.linear(x, w_v, b_v).view(B, 1, H, d).transpose(1, 2)  # (B, h, 1, d)
        self.keys[:, :, self.length : end] = k  # into (B, h, max_len, d)
        self.values[:, :, self.length : end] = v  # into (B, h, max_len, d)
        self.length = end
        heads = F.scaled_dot_product_attention(
            q, self.keys[:, :, :end], self.values[:, :, :end]
        )  # (B, h, 1, d)
        return F.linear(heads.transpose(1, 2).reshape(B, 1, E), w_o, b_o)  # (B, 1, E)


def time_step(prefix: int, rounds: int, device: torch.device, compiled: bool = True) -> dict[str, float]:
    """Median seconds per decoding step after ``prefix`` cached tokens; see the module docstring."""
    torch._dynamo.reset()  # each prefix compiles afresh: no recompile limit carried over
    mha = build(H, device)
    torch.manual_seed(1)
    x = torch.randn(B, prefix + CALLS_PER_SAMPLE, E, device=device)  # (B, L + 5, E)
    prefix_kv = mha.project_key_value(x[:, :prefix])  # (B, h, L, d) each
    tokens = [x[:, prefix + i : prefix + i + 1] for i in range(CALLS_PER_SAMPLE)]  # each (B, 1, E)
    max_length = prefix + CALLS_PER_SAMPLE + 1  # a slot to spare: no step fills the cache exactly
    cache = mha.new_cache(B, max_length)
    cache.append(*prefix_kv)
    mha(tokens[0], cache=cache)  # the cache's first step makes mha its owner, as a prefill would
    cache.crop(prefix)
    kinds = ("fetched", "module", "compiled")  # the module's weights fetched once, or read at each call
    bares = {kind: BareStep(mha, max_length, prefetch=kind != "module") for kind in kinds}
    for bare in bares.values():
        bare.restore(*prefix_kv)

    def restore_qkv() -> None:
        cache.crop(prefix)  # back to the L prefix tokens: later slots are overwritten

    def restore_bare(bare: BareStep) -> Callable[[], None]:
        return lambda: setattr(bare, "length", prefix)

    contenders: dict[str, tuple[Callable[[], None], Callable[[Tensor], Tensor]]] = {
        "qkv": (restore_qkv, lambda x_t: mha(x_t, cache=cache)[0]),
        "bare SDPA": (restore_bare(bares["fetched"]), bares["fetched"]),
        "bare SDPA, module weights": (restore_bare(bares["module"]), bares["module"]),
        "qkv is_causal": (restore_qkv, lambda x_t: mha(x_t, cache=cache, is_causal=True)[0]),
    }
    if compiled:
        # Under torch.compile (fullgraph: a graph break is an error, not a slower measurement): a
        # decoding step that calls qkv's module, as a model's compiled step inlines it; the module
        # itself, torch.compile(mha); and the hand-written step.
        qkv_step = torch.compile(lambda x_t, c: mha(x_t, cache=c)[0], fullgraph=True)
        compiled_mha = torch.compile(mha, fullgraph=True)
        compiled_bare = torch.compile(bares["compiled"], fullgraph=True)
        contenders["qkv compiled"] = (restore_qkv, lambda x_t: qkv_step(x_t, cache))
        contenders["torch.compile(mha)"] = (restore_qkv, lambda x_t: compiled_mha(x_t, cache=cache)[0])
        contenders["bare SDPA compiled"] = (restore_bare(bares["compiled"]), compiled_bare)
        # Compile at two lengths that are never timed: the first call compiles for its length
        # alone, the second makes the cache's length dynamic. Every timed call then runs that one
        # graph, as every step of a decode does, with no other compiled entry tried before it.
        for length in (prefix - 2, prefix - 1):
            for name in ("qkv compiled", "torch.compile(mha)"):
                cache.crop(length)
                contenders[name][1](tokens[0])
            bares["compiled"].length = length
            compiled_bare(tokens[0])
        cache.crop(prefix - 2)
        cache.append(prefix_kv.keys[:, :, -2:], prefix_kv.values[:, :, -2:])  # the prefix again
        bares["compiled"].restore(*prefix_kv)
    outputs: dict[str, Tensor] = {}
    for name, (restore, fn) in contenders.items():  # same outputs at all 5 steps
        restore()
        outputs[name] = torch.cat([fn(x_t) for x_t in tokens], dim=1)  # (B, 5, E)
    for name in contenders:
        assert_same(outputs[name], outputs["bare SDPA"])
    for _ in range(30 if compiled else 10):  # warm up
        for restore, fn in contenders.values():
            restore()
            for x_t in tokens:
                fn(x_t)
    graphs = counters["stats"]["unique_graphs"]
    medians = time_samples(contenders, tokens, rounds, device)
    if compiled and hasattr(torch.compiler, "set_stance"):
        # Where the compiled steps' time goes: the same two again, without evaluating the guards
        # that decide whether a compiled graph fits the call (torch's stance for steady decoding).
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            unguarded = {"qkv unguarded": contenders["qkv compiled"]}
            unguarded["bare SDPA unguarded"] = contenders["bare SDPA compiled"]
            medians |= time_samples(unguarded, tokens, rounds, device)
    assert counters["stats"]["unique_graphs"] == graphs, "a timed call compiled a new graph"
    return medians


def time_samples(
    contenders: dict[str, tuple[Callable[[], None], Callable[[Tensor], Tensor]]],
    tokens: list[Tensor],
    rounds: int,
    device: torch.device,
) -> dict[str, float]:
    """Median seconds per call: ``rounds`` samples of each contender, after its restore.

    Each round times every contender once, in a new random order (seeded), so that none
    always follows the same one (a compiled kernel's threads, say).
    """
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            restore, fn = contenders[name]
            restore()  # back to L cached tokens, outside the clock
            synchronize(device)
            start = time.perf_counter()
            for x_t in tokens:
                fn(x_t)
            synchronize(device)
            samples[name].append((time.perf_counter() - start) / len(tokens))
    return {name: statistics.median(s) for name, s in samples.items()}


def versus(times: dict[str, float], ours: str, theirs: str) -> tuple[float, str]:
    """qkv's time over the bare step's, and a line with both in microseconds."""
    ratio = times[ours] / times[theirs]
    line = f"qkv {1e6 * times[ours]:7.1f}  bare SDPA {1e6 * times[theirs]:7.1f}  qkv / bare SDPA {ratio:.3f}"
    return ratio, line


def by_prefix(label: str, ratios: dict[int, float]) -> str:
    """A summary line: ``label: prefix 128 1.234, prefix 1024 1.234``."""
    return f"{label}: " + ", ".join(f"prefix {p} {r:.3f}" for p, r in ratios.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--step-only", action="store_true", help="only measurement 3, the one-step times")
    parser.add_argument("--no-compile", action="store_true", help="measurement 3 without torch.compile")
    parser.add_argument("--device", default=str(qkv.get_device()))
    args = parser.parse_args()
    device = torch.device(args.device)
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, device {device}, threads {threads}, h={H}, embed_dim={E}, B={B}")
    wall = time.perf_counter()
    summary = []

    if not args.step_only:
        decode_rounds = {128: 5, 512: 3, 2048: 1} if args.quick else {128: 15, 512: 5, 2048: 3}
        print("\n1. decoding n tokens, every step timed: cache vs recomputing the prefix (per token, us)")
        speedups: dict[int, float] = {}
        for n in DECODE_LENGTHS:
            started = time.perf_counter()
            times = time_decode(n, decode_rounds[n], device)
            speedups[n] = times["recompute"] / times["cache"]
            print(f"  n={n:<5d} cache {1e6 * times['cache']:9.1f}  recompute {1e6 * times['recompute']:9.1f}"
                  f"  recompute / cache {speedups[n]:7.2f}   (median of {decode_rounds[n]} rounds,"
                  f" {time.perf_counter() - started:.1f} s with checks)")  # fmt: skip
        ordered = [speedups[n] for n in DECODE_LENGTHS]
        grows = all(a < b for a, b in itertools.pairwise(ordered))
        print(f"  speed-up grows with n: {'yes' if grows else 'NO'} ("
              + " < ".join(f"{s:.2f}" for s in ordered) + ")")  # fmt: skip
        summary.append("  1. speed-up of the cache, recompute / cache: "
                       + ", ".join(f"n={n} {s:.2f}" for n, s in speedups.items())
                       + f"; grows with n: {'yes' if grows else 'NO'}")  # fmt: skip

        print(f"\n2. cache memory, max_length={MEMORY_LENGTH}, filled by a prefill (cache.nbytes)")
        memory = {h_kv: cache_bytes(h_kv, device) for h_kv in KV_HEADS}
        for h_kv, nbytes in memory.items():
            kind = "MHA" if h_kv == H else "MQA" if h_kv == 1 else "GQA"
            assert nbytes * H == memory[H] * h_kv, f"{kind}: {nbytes} / {memory[H]} is not {h_kv} / {H}"
            print(f"  num_kv_heads={h_kv} ({kind}) {nbytes:>9d} bytes = {nbytes / 2**20:5.2f} MiB"
                  f"  / MHA {nbytes / memory[H]:.4f} = {h_kv}/{H} exactly")  # fmt: skip
        summary.append("  2. cache memory / MHA: "
                       + ", ".join(f"num_kv_heads={h_kv} {memory[h_kv] / memory[H]:.4f}" for h_kv in KV_HEADS)
                       + " (each exactly num_kv_heads / num_heads)")  # fmt: skip

    step_rounds = 100 if args.quick else 400
    compiled = not args.no_compile
    print(f"\n3. one decoding step, T=1 (median of {step_rounds} samples of {CALLS_PER_SAMPLE} calls, us)")
    steps: dict[int, float] = {}
    compiled_steps: dict[int, float] = {}
    unguarded_steps: dict[int, float] = {}
    for prefix in STEP_PREFIXES:
        started = time.perf_counter()
        times = time_step(prefix, step_rounds, device, compiled)
        steps[prefix], line = versus(times, "qkv", "bare SDPA")
        module_ratio = times["qkv"] / times["bare SDPA, module weights"]
        print(f"  prefix {prefix:<5d} {line}\n"
              f"               bare SDPA reading the module's weights"
              f" {1e6 * times['bare SDPA, module weights']:7.1f}, qkv / it {module_ratio:.3f};"
              f" qkv with is_causal=True {1e6 * times['qkv is_causal']:7.1f},"
              f" / bare SDPA {times['qkv is_causal'] / times['bare SDPA']:.3f}")  # fmt: skip
        if compiled:
            compiled_steps[prefix], line = versus(times, "qkv compiled", "bare SDPA compiled")
            module_compiled = times["torch.compile(mha)"] / times["bare SDPA compiled"]
            print(f"               compiled: {line};"
                  f" torch.compile(mha) {1e6 * times['torch.compile(mha)']:7.1f},"
                  f" / bare SDPA {module_compiled:.3f}"
                  f"   ({time.perf_counter() - started:.0f} s with compiling)")  # fmt: skip
        if "qkv unguarded" in times:
            unguarded_steps[prefix], line = versus(times, "qkv unguarded", "bare SDPA unguarded")
            print(f"               compiled, guards skipped: {line}")
    summary.append(by_prefix("  3. one step, qkv / bare SDPA, eager", steps))
    if compiled:
        summary.append(by_prefix("     one step, qkv / bare SDPA, both under torch.compile (target <= 1.05)",
                                 compiled_steps))  # fmt: skip
    if unguarded_steps:
        summary.append(by_prefix("     the same with the guards skipped", unguarded_steps))

    print("\nsummary")
    print("\n".join(summary))
    print(f"  wall time {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # never time a silent fall-back to eager
    with torch.inference_mode():
        main()
