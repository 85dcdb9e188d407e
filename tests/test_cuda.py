"""qkv on a GPU: the same results as on the CPU, and the same clear errors.

Every test here needs CUDA and is skipped without it (CI has no GPU); run them on a
machine with one: ``pytest tests/test_cuda.py``. The CPU runs of the same module, in
float64, are the reference.
"""

from __future__ import annotations

import contextlib
import io

import matplotlib
import pytest
import torch
from torch import nn

import qkv
from qkv import interop

matplotlib.use("Agg")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
F64 = torch.float64
E, H = 16, 4
# Tolerances of a float32 GPU kernel against the float64 CPU reference.
F32_TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def pair(num_kv_heads: int = H, rotary: bool = False, **kwargs: object) -> tuple[nn.Module, nn.Module]:
    """The same module twice: float64 on the CPU, float32 on the GPU."""
    torch.manual_seed(0)
    rope = qkv.RotaryEmbedding(E // H) if rotary else None
    cpu = qkv.MultiHeadAttention(E, H, num_kv_heads=num_kv_heads, rotary=rope, dtype=F64, **kwargs).eval()  # type: ignore[arg-type]
    gpu = qkv.MultiHeadAttention(E, H, num_kv_heads=num_kv_heads, rotary=rope, device=CUDA, **kwargs).eval()  # type: ignore[arg-type]
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu


def padding() -> torch.Tensor:
    """Key padding (True = padded) with the second sequence padded after 3 tokens."""
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 3:] = True
    return pad


@pytest.mark.parametrize("num_kv_heads", [H, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
def test_a_module_on_the_gpu_gives_the_cpu_output(num_kv_heads, need_weights, rotary):
    cpu, gpu = pair(num_kv_heads, rotary)
    x = randn(2, 7, E)
    expected, expected_weights = cpu(x, key_padding_mask=padding(), is_causal=True, need_weights=True)
    output, weights = gpu(
        x.float().to(CUDA), key_padding_mask=padding().to(CUDA), is_causal=True, need_weights=need_weights
    )
    assert output.device.type == "cuda"
    torch.testing.assert_close(output.double().cpu(), expected, **F32_TOLERANCE)
    if need_weights:
        torch.testing.assert_close(weights.double().cpu(), expected_weights, **F32_TOLERANCE)


@pytest.mark.parametrize("num_kv_heads", [H, 2, 1])
@pytest.mark.parametrize("rotary", [False, True])
def test_decoding_with_the_cache_on_the_gpu_is_the_full_causal_pass(num_kv_heads, rotary):
    _, gpu = pair(num_kv_heads, rotary)
    x = randn(2, 7, E, dtype=torch.float32).to(CUDA)
    full, _ = gpu(x, is_causal=True)
    cache = gpu.new_cache(2, 7)
    assert cache.keys.device.type == "cuda"
    with torch.no_grad():
        prefill, _ = gpu(x[:, :4], cache=cache, is_causal=True)
        steps = [gpu(x[:, t : t + 1], cache=cache)[0] for t in range(4, 7)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, **F32_TOLERANCE)


def test_rotary_positions_from_the_cpu_turn_gpu_rows():
    rope = qkv.RotaryEmbedding(8, pairing="interleaved")
    x = randn(3, 5, 8, dtype=torch.float32).to(CUDA)
    positions = torch.tensor([4, 0, 9, 2, 7])  # on the CPU, like an index
    turned = rope(x, positions)
    assert turned.device.type == "cuda"
    torch.testing.assert_close(turned, rope(x, positions.to(CUDA)))
    torch.testing.assert_close(turned.cpu(), rope(x.cpu(), positions))
    torch.testing.assert_close(qkv.apply_rotary(x, positions).cpu(), qkv.apply_rotary(x.cpu(), positions))


def sdpa_backends() -> list[object]:
    from torch.nn.attention import SDPBackend

    names = ["MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"]
    return [getattr(SDPBackend, name) for name in names if hasattr(SDPBackend, name)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", sdpa_backends(), ids=str)
@pytest.mark.parametrize("additive", [False, True])
def test_a_row_with_no_allowed_key_gives_zeros_on_every_gpu_kernel(dtype, backend, additive):
    """qkv passes a boolean mask straight to SDPA on CUDA, trusting it to zero empty rows."""
    from torch.nn.attention import sdpa_kernel

    shapes = [(2, 2, 4, 8), (2, 2, 5, 8), (2, 2, 5, 8)]  # (B, h, T or S, d)
    q, k, v = (randn(*shape, seed=s, dtype=dtype).to(CUDA).requires_grad_() for s, shape in enumerate(shapes))
    allowed = torch.rand(2, 1, 4, 5, generator=torch.Generator().manual_seed(3)) < 0.6
    allowed[..., 0] = True
    allowed[0, :, 1] = False  # query 1 of sequence 0 may see no key
    allowed[1] = False  # sequence 1: no query may see any key
    mask = qkv.additive_mask(allowed, dtype) if additive else allowed
    mask = mask.to(CUDA)
    reference = mask.double() if additive else mask
    expected, _ = qkv.attention(*(t.detach().double() for t in (q, k, v)), reference)
    try:
        with sdpa_kernel(backend):
            output = qkv.fused_attention(q, k, v, mask)
    except RuntimeError as error:  # this kernel does not take these inputs: nothing to check
        pytest.skip(f"{backend} does not run here: {str(error).splitlines()[0]}")
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(output.double(), expected, **tolerance)
    assert (output[1] == 0).all() and (output[0, :, 1] == 0).all()
    with sdpa_kernel(backend):
        output.sum().backward()
    for name, tensor in zip("qkv", (q, k, v), strict=True):
        assert torch.isfinite(tensor.grad).all(), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("need_weights", [False, True])
def test_a_fully_padded_sequence_gives_the_output_bias_in_half_precision(dtype, need_weights):
    _, gpu = pair()
    gpu = gpu.to(dtype)
    pad = torch.zeros(2, 7, dtype=torch.bool, device=CUDA)
    pad[1] = True  # sequence 1: padding only, so none of its queries has a key
    output, _ = gpu(randn(2, 7, E, dtype=dtype).to(CUDA), key_padding_mask=pad, need_weights=need_weights)
    torch.testing.assert_close(output[1], gpu.out_proj.bias.expand(7, E), atol=0, rtol=0)
    assert output[0].isfinite().all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_autocast_on_the_gpu_runs_in_bfloat16(need_weights):
    cpu, gpu = pair(2, rotary=True)
    x = randn(2, 7, E)
    expected, _ = cpu(x, key_padding_mask=padding(), is_causal=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        output, _ = gpu(x.float().to(CUDA), key_padding_mask=padding().to(CUDA), is_causal=True,
                        need_weights=need_weights)  # fmt: skip
        cache = gpu.new_cache(2, 7)
        step, _ = gpu(x[:, :1].float().to(CUDA), cache=cache)
    assert output.dtype == torch.bfloat16 and cache.keys.dtype == torch.bfloat16
    torch.testing.assert_close(output.double().cpu(), expected, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(step.double().cpu(), expected[:, :1], atol=5e-2, rtol=5e-2)


def test_tensors_on_two_devices_are_a_clear_error():
    _, gpu = pair()
    x = randn(2, 7, E, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"query is on cpu.*parameter.*cuda"):
        gpu(x)
    with pytest.raises(ValueError, match=r"key is on cpu, but query is on cuda"):
        gpu(x.to(CUDA), x, x.to(CUDA))
    with pytest.raises(ValueError, match=r"key_padding_mask is on cpu, but query is on cuda"):
        gpu(x.to(CUDA), key_padding_mask=padding())
    with pytest.raises(ValueError, match=r"cache is on cpu, but query is on cuda"):
        gpu(x.to(CUDA), cache=gpu.new_cache(2, 7, device="cpu"))
    q = x.view(2, 7, H, E // H).transpose(1, 2)  # (B, h, T, d_k)
    with pytest.raises(ValueError, match=r"cpu.*cuda|cuda.*cpu"):
        qkv.attention(q.to(CUDA), q, q)
    with pytest.raises(ValueError, match=r"mask is on cpu, but query is on cuda"):
        qkv.fused_attention(q.to(CUDA), q.to(CUDA), q.to(CUDA), qkv.causal_mask(7))


def test_torchs_module_on_the_gpu_converts_and_agrees():
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(E, H, batch_first=True, device=CUDA).eval()
    ours = qkv.MultiHeadAttention.from_heads(interop.from_torch(theirs)).eval()
    assert next(ours.parameters()).device.type == "cuda"
    loaded = qkv.MultiHeadAttention(E, H, device=CUDA).eval()
    loaded.load_state_dict(theirs.state_dict())
    x = randn(2, 7, E, dtype=torch.float32).to(CUDA)
    pad = padding().to(CUDA)
    expected, _ = theirs(x, x, x, key_padding_mask=pad, need_weights=False)
    for module in (ours, loaded):
        output, _ = module(x, key_padding_mask=pad)
        torch.testing.assert_close(output, expected, **F32_TOLERANCE)
    back = nn.MultiheadAttention(E, H, batch_first=True, device=CUDA).eval()
    back.load_state_dict(interop.to_torch_state_dict(ours))
    torch.testing.assert_close(back(x, x, x, key_padding_mask=pad)[0], expected, **F32_TOLERANCE)


def test_a_checkpoint_saved_on_the_gpu_loads_on_the_cpu():
    _, gpu = pair(2, rotary=True)
    buffer = io.BytesIO()
    torch.save(gpu.state_dict(), buffer)
    buffer.seek(0)
    restored = qkv.MultiHeadAttention(E, H, num_kv_heads=2, rotary=qkv.RotaryEmbedding(E // H)).eval()
    restored.load_state_dict(torch.load(buffer, map_location="cpu", weights_only=True))
    x = randn(2, 7, E, dtype=torch.float32)
    torch.testing.assert_close(restored(x)[0], gpu(x.to(CUDA))[0].cpu(), **F32_TOLERANCE)


@pytest.mark.parametrize("num_kv_heads", [6, 2])
def test_llama_attention_on_the_gpu_through_qkv(num_kv_heads):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=24, num_attention_heads=6, num_key_value_heads=num_kv_heads, head_dim=4,
        attention_dropout=0.0, rope_theta=100.0,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    llama = LlamaAttention(config, layer_idx=0).to(CUDA).eval()
    mha = qkv.MultiHeadAttention.from_heads(interop.from_llama(llama)).eval()
    mha.rotary = interop.rotary_from_llama(llama)
    x = randn(2, 7, 24, dtype=torch.float32).to(CUDA)
    rotation = LlamaRotaryEmbedding(config).to(CUDA)(x, torch.arange(7, device=CUDA)[None])
    causal = qkv.additive_mask(qkv.causal_mask(7, device=CUDA), torch.float32)
    causal = causal.clamp(min=torch.finfo(torch.float32).min)
    expected, _ = llama(x, position_embeddings=rotation, attention_mask=causal[None, None])
    output, _ = mha(x, is_causal=True)
    torch.testing.assert_close(output, expected, **F32_TOLERANCE)


def test_pictures_take_gpu_tensors_and_modules():
    import matplotlib.pyplot as plt

    _, gpu = pair(2, rotary=True)
    x = randn(2, 7, E, dtype=torch.float32).to(CUDA)
    _, weights = gpu(x, need_weights=True, is_causal=True)  # (B, h, T, T), on the GPU
    weights = weights.detach()
    q = gpu.q_proj(x).detach().view(2, 7, H, E // H).transpose(1, 2)  # (B, h, T, d_k)
    allowed = qkv.causal_mask(7, device=CUDA)
    cache = gpu.new_cache(2, 7)
    with torch.no_grad():
        gpu(x[:, :5], cache=cache, is_causal=True)
    words = list("abcdefg")
    diagrams = qkv.diagrams
    with contextlib.redirect_stdout(io.StringIO()):
        qkv.plot_attention(weights[0, 0], queries=words, keys=words)
        qkv.plot_heads(weights[0], queries=words, keys=words)
        qkv.AttentionView(weights, words, mask=allowed)
        diagrams.attention_map(weights, allowed, queries=words, keys=words, head=1)
        diagrams.wide_head(q, q)
        diagrams.softmax_axes(q[0, 0] @ q[0, 0].mT)
        diagrams.softmax_rows({"row": {"scale 1": weights[0, 0, 3], "scale 2": weights[0, 1, 3]}})
        diagrams.position_scores({"scores": q[0, 0] @ q[0, 0].mT})
        diagrams.mask_conventions(allowed, weights[0, 0])
        diagrams.empty_rows({"causal": allowed})
        diagrams.tied_preference(q[0, 0, :, :2])
        diagrams.output_hull(q[0, 0, :3, :2], {"out": weights[0, 0, 4, :3, None] * q[0, 0, :3, :2]})
        diagrams.rotation(q[0, 0, 0], q[0, 1, 0], gpu.rotary, [(1, 0), (3, 2)])
        diagrams.value_shift(q[0, 0], q[0, 1], q[1, 0], gpu.rotary, 2)
        diagrams.data_flow(x[:1], gpu, attention_weights=True)
        diagrams.projection(x[:1], gpu, heads=True)
        diagrams.heads_from_one_matrix(x[:1], gpu, cut=True)
        diagrams.multi_head(gpu, x[:1])
        diagrams.decoding_step(gpu, cache)
        diagrams.kv_sharing([gpu])
    plt.close("all")
