"""Counter-based noise (models/noise.py): definition, batch independence, statistics,
replay through TinyMAR.rollout, and CPU == CUDA where a GPU is present."""
from __future__ import annotations

import math
import struct

import pytest
import torch

from margrpo.models import noise

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

M64 = 2**64 - 1
EXTREME_SEEDS = [0, 1, 2**63 - 2, -1, -(2**63), 123456789]


# ---- a pure-Python reference of the definition in the module docstring -----------------
def mix64_py(x: int) -> int:
    x &= M64
    x = ((x ^ (x >> 30)) * noise._MUL1) & M64
    x = ((x ^ (x >> 27)) * noise._MUL2) & M64
    return x ^ (x >> 31)


def word_py(seed: int, stream: int, step: int, token: int, state: int, pair: int) -> int:
    key = mix64_py(mix64_py(seed) + noise._GOLDEN * (stream * 2**32 + step + 1))
    return mix64_py(key + noise._GOLDEN * (token * 2**40 + state * 2**24 + pair + 1))


def f32(x: float) -> float:
    """Round to float32 (the module's int -> float conversions round the same way)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def normal_py(seed, stream, step, token, state, element) -> float:
    w = word_py(seed, stream, step, token, state, element // 2)
    lo, hi = w & 0xFFFFFFFF, w >> 32
    u = f32((hi & 0x7FFFFFFF) + 1.0) / 2**31
    theta = f32(lo & 0x7FFFFFFF) * (math.pi / 2 / 2**31)
    r = math.sqrt(-2.0 * math.log(u))
    if element % 2 == 0:  # cos, signed by the low half's sign bit
        return r * math.cos(theta) * (-1.0 if lo >> 31 else 1.0)
    return r * math.sin(theta) * (-1.0 if hi >> 31 else 1.0)


def test_mix64_is_splitmix64_on_int64_words():
    xs = [0, 1, 2**63 - 1, 2**63, M64, 0x0123456789ABCDEF, 0xDEADBEEFCAFEBABE]
    as_int64 = torch.tensor([noise._signed(x) for x in xs], dtype=torch.long)
    got = [v & M64 for v in noise.mix64(as_int64).tolist()]
    assert got == [mix64_py(x) for x in xs]
    # splitmix64's published first output for state 0 (x = 0 + golden): a check on the constants
    assert mix64_py(noise._GOLDEN) == 0xE220A8397B1DCDAF


def test_draws_follow_the_documented_definition():
    """chain_noise at scattered coordinates equals the pure-Python definition (hash bits
    exact; the float32 polynomial log / sin / cos within 2e-6 of float64)."""
    seeds = torch.tensor(EXTREME_SEEDS)
    tokens = torch.tensor([[0, 5], [15, 3], [1, 2], [7, 7], [9, 0], [2**20, 4]])
    for stream, step in [(noise.COMMITTED, 0), (noise.SPECULATIVE, 11)]:
        z = noise.chain_noise(seeds, step, tokens, 21, 192, stream)
        for b in range(len(seeds)):
            for k in range(tokens.shape[1]):
                for j, e in [(0, 0), (0, 1), (20, 191), (7, 64), (13, 33)]:
                    ref = normal_py(int(seeds[b]), stream, step, int(tokens[b, k]), j, e)
                    assert z[j, b, k, e].item() == pytest.approx(ref, abs=2e-6)


def test_vectorised_draws_equal_a_per_image_loop_and_ignore_the_batch():
    seeds = torch.tensor(EXTREME_SEEDS)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.stack([torch.randperm(16, generator=gen)[:5] for _ in seeds])
    batch = noise.chain_noise(seeds, 3, tokens, 9, 30)
    loop = torch.cat([noise.chain_noise(seeds[b : b + 1], 3, tokens[b : b + 1], 9, 30) for b in range(len(seeds))], 1)
    assert torch.equal(batch, loop)
    # Another batch (reversed, other neighbours, one token only): the same image's draws.
    perm = torch.tensor([5, 2, 0])
    assert torch.equal(noise.chain_noise(seeds[perm], 3, tokens[perm], 9, 30), batch[:, perm])
    alone = noise.chain_noise(seeds[:1], 3, tokens[:1, 2:3], 9, 30)
    assert torch.equal(alone, batch[:, :1, 2:3])
    # An odd token dim is a prefix of the even one; chunked passes change nothing.
    assert torch.equal(noise.chain_noise(seeds, 3, tokens, 9, 29), batch[..., :29])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(noise, "_CPU_CHUNK_WORDS", 7)
        assert torch.equal(noise.chain_noise(seeds, 3, tokens, 9, 30), batch)


def test_coordinates_change_the_draws():
    seeds, tokens = torch.tensor([5, 6]), torch.tensor([[1, 2], [1, 2]])
    base = noise.chain_noise(seeds, 2, tokens, 4, 16)
    assert not torch.equal(base[:, 0], base[:, 1])  # adjacent seeds
    for other in (noise.chain_noise(seeds, 3, tokens, 4, 16),  # AR step
                  noise.chain_noise(seeds, 2, tokens, 4, 16, noise.SPECULATIVE),  # stream
                  noise.chain_noise(seeds, 2, tokens + 1, 4, 16)):  # token position
        assert not torch.equal(other, base)
        assert abs(torch.corrcoef(torch.stack([other.flatten(), base.flatten()]))[0, 1]) < 0.2


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="seeds must be \\[B\\] and tokens \\[B, n\\]"):
        noise.chain_noise(torch.tensor([1, 2]), 0, torch.tensor([[0]]), 3, 4)
    with pytest.raises(ValueError, match="states"):
        noise.chain_noise(torch.tensor([1]), 0, torch.tensor([[0]]), 0, 4)
    with pytest.raises(ValueError, match="AR step"):
        noise.chain_noise(torch.tensor([1]), -1, torch.tensor([[0]]), 3, 4)


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1].item()


def test_statistics_of_the_draws():
    """Moments, tails and independence across neighbouring seeds, AR steps, tokens, head
    states and elements. Tolerances are 5 standard errors of each statistic; the last
    assertion shows they would flag a correlation of 0.01."""
    seeds = torch.arange(40, dtype=torch.long)  # adjacent seeds: the hardest case for a hash
    tokens = torch.arange(16).expand(40, 16)
    z = torch.stack([noise.chain_noise(seeds, i, tokens, 8, 192) for i in range(2)])  # [2, 8, 40, 16, 192]
    x = z.double().flatten()
    n = x.numel()  # 1.97 M
    se = 1 / math.sqrt(n)
    assert abs(x.mean()) < 5 * se
    assert abs(x.var() - 1) < 5 * math.sqrt(2) * se
    assert abs(((x - x.mean()) ** 3).mean()) < 5 * math.sqrt(6) * se  # skewness
    assert abs(((x - x.mean()) ** 4).mean() - 3) < 5 * math.sqrt(96) * se  # kurtosis
    for k, p in [(1.0, 0.3173), (2.0, 0.0455), (3.0, 0.0027), (4.0, 6.3e-5)]:
        frac = (x.abs() > k).double().mean().item()
        assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-6, (k, frac)
    pairs = {
        "AR step": (z[0], z[1]),
        "head state": (z[:, :-1], z[:, 1:]),
        "seed": (z[:, :, :-1], z[:, :, 1:]),
        "token": (z[..., :-1, :], z[..., 1:, :]),
        "element in a word": (z[..., 0::2], z[..., 1::2]),
        "element across words": (z[..., 1:-1:2], z[..., 2::2]),
    }
    for name, (a, b) in pairs.items():
        tol = 5 / math.sqrt(a.numel())
        assert abs(_corr(a, b)) < tol, name
        assert abs(_corr(a**2, b**2)) < tol * math.sqrt(2), f"{name} (squares)"  # a shared radius shows here
        assert tol < 0.01


def test_token_order_is_a_uniform_permutation_per_seed():
    seeds = torch.arange(4000, dtype=torch.long)
    order = noise.token_order(seeds, 16)
    assert torch.equal(order.sort(1).values, torch.arange(16).expand(4000, 16))
    assert torch.equal(noise.token_order(seeds[7:9], 16), order[7:9])  # batch-independent
    # Which token goes first: chi-square over 16 cells, 15 dof (99.99th percentile: 44.3).
    counts = torch.bincount(order[:, 0], minlength=16).double()
    chi2 = ((counts - 250) ** 2 / 250).sum().item()
    assert chi2 < 44.3
    assert not torch.equal(order[0], order[1])


def test_rollout_draws_are_the_counter_noise_and_replay(tiny_model):
    """The rollout's initial head states are chain_noise of its recorded seeds; an image's
    draws are bitwise the same in another batch; recording speculative predictions leaves
    the committed images bitwise unchanged."""
    prompts = ["a red circle", "two squares", "a blue triangle left of a circle"]
    ro = tiny_model.rollout(prompts, generator=torch.Generator().manual_seed(1))
    t1, d = tiny_model.sampler.num_steps + 1, tiny_model.token_dim
    assert torch.equal(ro.extras["order"], noise.token_order(ro.seeds, tiny_model.num_tokens))
    for i, step in enumerate(ro.steps):
        assert torch.equal(step.chain[0], noise.chain_noise(ro.seeds, i, step.commit_idx, t1, d)[0])
    alone = tiny_model.rollout(prompts[1:2], seeds=ro.seeds[1:2])
    for a, b in zip(alone.steps, ro.steps):
        assert torch.equal(a.commit_idx[0], b.commit_idx[1]) and torch.equal(a.chain[0, 0], b.chain[0, 1])
    assert (alone.images[0] - ro.images[1]).abs().max() < 1e-3  # only matmul rounding differs
    spec = tiny_model.rollout(prompts, seeds=ro.seeds, speculative_steps=range(tiny_model.num_ar_steps))
    assert torch.equal(spec.images, ro.images)
    assert spec.steps[0].spec_chain is not None


@pytest.mark.cuda
@cuda
def test_cuda_draws_equal_cpu_bitwise():
    gen = torch.Generator().manual_seed(0)
    seeds = torch.cat([torch.tensor(EXTREME_SEEDS), torch.randint(0, 2**62, (58,), generator=gen)])
    tokens = torch.stack([torch.randperm(256, generator=gen)[:12] for _ in seeds])
    for stream in (noise.COMMITTED, noise.SPECULATIVE):
        cpu = noise.chain_noise(seeds, 5, tokens, 21, 192, stream)
        gpu = noise.chain_noise(seeds.cuda(), 5, tokens.cuda(), 21, 192, stream)
        assert gpu.device.type == "cuda"
        assert torch.equal(gpu.cpu().view(torch.int32), cpu.view(torch.int32))  # the same bits
    assert torch.equal(noise.token_order(seeds.cuda(), 256).cpu(), noise.token_order(seeds, 256))
