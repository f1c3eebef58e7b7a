"""Counter-based per-image randomness: every draw is a pure function of its coordinates.

A rollout's randomness is addressed, not consumed: the standard-normal draw of image seed
s, stream, AR step i, token position t, head state j and element e is

    normal(s, stream, i, t, j, e) = BoxMuller(mix64(key(s, stream, i) + G * (ctr(t, j, e // 2) + 1)))[e % 2]

with key(s, stream, i) = mix64(mix64(s) + G * (stream * 2**32 + i + 1)),
ctr(t, j, p) = t * 2**40 + j * 2**24 + p, G the golden-ratio increment and mix64 the
splitmix64 finaliser (the splitmix64 generator at counter positions; a bijection on 64-bit
words, so two coordinates of one image never share a word). The token order of an image is
the argsort of mix64(key(s, ORDER, 0) + G * (t + 1)) over its positions t.

Consequences, each tested in tests/test_noise.py:
- an image replays from its recorded seed, and its draws do not depend on the batch it
  sits in (bitwise): there is no generator state, only coordinates;
- one call draws a whole batch's [T+1, B, n, D] noise for an AR step on any device, with
  no Python loop over images;
- CPU and CUDA give the same bits. The hash uses int64 adds, multiplies (wrapping modulo
  2**64 on both), xors and masked shifts; the normal transform uses only operations that
  IEEE 754 rounds correctly, hence identically on both devices, one per tensor call (float32
  +, *, /, sqrt, int -> float, bit views; no fused multiply-add), with polynomial log / sin /
  cos, because the library log / sin / cos of the two devices may differ in the last bit;
- streams are separate counters: speculative-token draws never touch the committed ones.

Bits -> normals (Box-Muller, two per word): the high 32-bit half's 31 magnitude bits give
u = (x + 1) / 2**31 in (0, 1] and the radius sqrt(-2 ln u) <= 6.56 (a Gaussian pair's radius
exceeds that with probability 5e-10), the low half's 31 magnitude bits the angle in
[0, pi/2], the two sign bits the signs.

The API is three functions: `chain_noise`, `token_order`, `draw_seeds`; a NOVA or Harmon
adapter calls the same ones for its own rollout. The method (method/estimators.py) draws its multi-trajectory chains from
`chain_noise` on the streams of `chain_stream`, keyed by the same image seeds.
"""
from __future__ import annotations

import math

import torch

# Streams: independent counters per purpose. New purposes take new numbers; never reuse one.
COMMITTED, SPECULATIVE, ORDER = 0, 1, 2
# Multi-trajectory purposes of the method (M extra head chains per token): the uncertainty map's
# chains, `resample`'s fresh chains and the forward-process chains of `elbo` / `posterior`.
# Each (purpose, chain, draw) is a stream of its own (`chain_stream`).
UNCERTAINTY, RESAMPLE, FORWARD = 3, 4, 5
_PURPOSES, MAX_CHAINS = 8, 2**12  # stream = purpose + 8 (1 + chain + 2**12 draw), below 2**32

_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment (odd)
_MUL1, _MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64 finaliser multipliers
_TOKEN_SHIFT, _STATE_SHIFT = 40, 24  # counter layout: token | head state | element pair
# Field capacities of the counter (token positions are not checked: 2**23 per image is
# beyond any model, and checking would synchronise the device).
MAX_TOKENS, MAX_STATES, MAX_PAIRS = 2**23, 2**16, 2**24
_SEED_RANGE = 2**63 - 1  # seeds drawn by draw_seeds lie in [0, 2**63 - 1)
_CPU_CHUNK_WORDS, _GPU_CHUNK_WORDS = 2**16, 2**26  # words hashed per pass (512 KiB / 512 MiB of int64)


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits (torch integers are signed)."""
    return c - 2**64 if c >= 2**63 else c


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic: mask the sign copies)."""
    return (x >> s).bitwise_and_((1 << (64 - s)) - 1)


def _mix64_(x: torch.Tensor) -> torch.Tensor:
    """mix64 in place (CPU temporaries are the cost here, not arithmetic)."""
    x ^= _shr(x, 30)
    x *= _signed(_MUL1)
    x ^= _shr(x, 27)
    x *= _signed(_MUL2)
    x ^= _shr(x, 31)
    return x


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 words (a bijection of the 64-bit patterns)."""
    return _mix64_(x.clone())


def chain_stream(purpose: int, chain: int, draw: int = 0) -> int:
    """Stream of chain `chain` of a multi-trajectory purpose; `draw` numbers independent
    repeats of the same chains (the gradient probe's second draw). Distinct for every
    (purpose, chain, draw) and never one of the single-chain streams 0.._PURPOSES-1."""
    stream = purpose + _PURPOSES * (1 + chain + MAX_CHAINS * draw)
    if not (UNCERTAINTY <= purpose < _PURPOSES and 0 <= chain < MAX_CHAINS and draw >= 0 and stream < 2**32):
        raise ValueError(f"multi-trajectory stream needs purpose in [{UNCERTAINTY}, {_PURPOSES}), chain in "
                         f"[0, {MAX_CHAINS}) and a draw below {2**32 // (_PURPOSES * MAX_CHAINS) - 1}; "
                         f"got purpose {purpose}, chain {chain}, draw {draw}")
    return stream


def _step_key(seeds: torch.Tensor, stream: int, ar_step: int) -> torch.Tensor:
    """Per-image key [B] of (seed, stream, AR step); seeds [B] int64 on the target device."""
    if not 0 <= ar_step < 2**32 or stream < 0:
        raise ValueError(f"AR step must be in [0, 2**32) and stream >= 0, got step {ar_step}, stream {stream}")
    salt = _signed(((stream * 2**32 + ar_step + 1) * _GOLDEN) % 2**64)
    return mix64(mix64(seeds) + salt)


def _counter_words(key: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """mix64(key + G * (counter + 1)); key and counter broadcast against each other."""
    return mix64(key + (counter + 1) * _signed(_GOLDEN))


def _poly(x: torch.Tensor, coeffs: tuple[float, ...]) -> torch.Tensor:
    """Horner evaluation, highest coefficient first, one rounding per op (no fused ops,
    so CPU and CUDA round alike)."""
    acc = x * coeffs[0]
    for c in coeffs[1:-1]:
        acc += c
        acc *= x
    return acc.add_(coeffs[-1])


# ln(m) = 2 s (1 + s^2/3 + s^4/5 + ...) with s = (m-1)/(m+1); for m in [0.75, 1.5), |s| <= 0.2
# and the first omitted term is below 1e-8 relative. sin / cos Taylor series on [0, pi/2]:
# first omitted terms below 7e-10.
_LOG_C = (1 / 9, 1 / 7, 1 / 5, 1 / 3, 1.0)
_SIN_C = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(6, -1, -1))
_COS_C = tuple((-1) ** k / math.factorial(2 * k) for k in range(7, -1, -1))
_LN2, _HALF_PI = math.log(2.0), math.pi / 2
_LOW31, _SIGN32 = 2**31 - 1, -(2**31)  # int32 masks: magnitude bits, sign bit


def _neg2_log_u(x: torch.Tensor) -> torch.Tensor:
    """-2 ln u for u = (x + 1) / 2**31, x int32 in [0, 2**31): float32, >= 0 (Box-Muller's
    squared radius). Exponent and mantissa are read from the float's bits (exact), so the
    only roundings are those of plain +, *, /. In-place ops: fewer CPU temporaries."""
    bits = x.float().add_(1.0).view(torch.int32)  # x + 1 = m * 2**e, m in [1, 2)
    e = (bits >> 23).sub_(127 + 31).float()  # ln u = e ln 2 + ln m, e <= 0
    m = bits.bitwise_and_(0x7FFFFF).bitwise_or_(0x3F800000).view(torch.float32)
    # Halve m >= 1.5 (exactly: times 1 or 0.5) so that m lies in [0.75, 1.5) and |s| <= 0.2;
    # near u = 1 then m ~ 1, and ln m = 2 s P(s^2) keeps its full relative precision.
    big = (m >= 1.5).float()
    e += big
    m *= big.mul_(-0.5).add_(1.0)
    s = m - 1.0
    s /= m.add_(1.0)
    ln_m = _poly(s * s, _LOG_C).mul_(s).mul_(2.0)
    return e.mul_(_LN2).add_(ln_m).mul_(-2.0)


def normals_from_words(words: torch.Tensor) -> torch.Tensor:
    """Two standard normals per int64 word: [..., P] -> [..., 2P] float32 (Box-Muller).

    Of the word's two 32-bit halves (read through an int32 view; CPU and CUDA are both
    little-endian), the high half's 31 magnitude bits give the radius, the low half's the
    angle in [0, pi/2], and the two sign bits the signs of the pair: a uniform angle on the
    quarter circle with independent signs is a uniform angle on the circle.
    """
    halves = words.contiguous().view(torch.int32).unflatten(-1, (-1, 2))  # [..., P, 2]: (low, high)
    radius = _neg2_log_u(halves[..., 1] & _LOW31).sqrt_()  # [..., P]
    theta = (halves[..., 0] & _LOW31).float().mul_(_HALF_PI / 2**31)  # [..., P] in [0, pi/2]
    t2 = theta * theta
    mag = torch.empty(halves.shape, dtype=torch.float32, device=words.device)  # [..., P, 2]
    mag[..., 0] = _poly(t2, _COS_C)
    mag[..., 1] = _poly(t2, _SIN_C).mul_(theta)
    mag *= radius.unsqueeze(-1)
    mag.view(torch.int32).bitwise_xor_(halves & _SIGN32)  # flip the float sign bit: exact
    return mag.flatten(-2)


def chain_noise(
    seeds: torch.Tensor,
    ar_step: int,
    tokens: torch.Tensor,
    num_states: int,
    dim: int,
    stream: int = COMMITTED,
) -> torch.Tensor:
    """Standard-normal noise of the head chains of one AR step, for a whole batch.

    seeds: [B] int64 image seeds; tokens: [B, n] token positions (in the image, not in the
    generation order); num_states: head states per chain (T + 1: initial noise + T steps);
    dim: token dim D. Returns [num_states, B, n, D] float32 on the device of `tokens`:
    out[j, b, k, e] = normal(seeds[b], stream, ar_step, tokens[b, k], j, e).
    """
    dev = tokens.device
    if tokens.ndim != 2 or seeds.shape != tokens.shape[:1]:
        raise ValueError(f"seeds must be [B] and tokens [B, n]; got {tuple(seeds.shape)} and {tuple(tokens.shape)}")
    pairs = (dim + 1) // 2
    if not 1 <= num_states <= MAX_STATES or not 1 <= pairs <= MAX_PAIRS:
        raise ValueError(f"chain_noise needs 1..{MAX_STATES} states and 1..{2 * MAX_PAIRS} dims, "
                         f"got {num_states} and {dim}")
    g = _signed(_GOLDEN)
    # key + G * (counter + 1) with counter = token | state | pair, summed from broadcast parts
    # (int64 arithmetic wraps modulo 2**64, so the order of the sum does not change a word).
    per_token = _step_key(seeds.to(dev, torch.long), stream, ar_step)[:, None] + ((tokens.long() << _TOKEN_SHIFT) + 1) * g
    per_state = (torch.arange(num_states, device=dev, dtype=torch.long) << _STATE_SHIFT) * g  # [S]
    rows = (per_state[:, None, None] + per_token).reshape(-1)  # [S * B * n]: one row per chain state
    per_pair = torch.arange(pairs, device=dev, dtype=torch.long) * g  # [P]
    out = torch.empty(num_states, *tokens.shape, dim, device=dev)
    flat = out.view(-1, dim)
    # Rows in chunks: on CPU a working set that fits the cache is several times faster than
    # one pass per op over the whole [S, B, n, P] array; on a GPU one chunk is the whole step.
    step = max(1, (_CPU_CHUNK_WORDS if dev.type == "cpu" else _GPU_CHUNK_WORDS) // pairs)
    for r0 in range(0, rows.shape[0], step):
        words = _mix64_(rows[r0 : r0 + step, None] + per_pair)  # [rows, P]
        flat[r0 : r0 + step] = normals_from_words(words)[:, :dim]
    return out


def token_order(seeds: torch.Tensor, num_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Random generation order per image: [B, num_tokens] long, a permutation per row, a pure
    function of the image's seed (on `device`, default the seeds' device)."""
    seeds = seeds.to(device or seeds.device, torch.long)
    key = _step_key(seeds, ORDER, 0)
    words = _counter_words(key[:, None], torch.arange(num_tokens, device=seeds.device))
    return torch.argsort(words, dim=1, stable=True)  # words of one image are distinct


def draw_seeds(generator: torch.Generator | None, n: int) -> torch.Tensor:
    """n fresh image seeds [n] int64 (CPU) from a CPU generator; record them with the images."""
    return torch.randint(0, _SEED_RANGE, (n,), generator=generator, dtype=torch.long)


def resolve_seeds(seeds, batch: int, generator: torch.Generator | None) -> torch.Tensor:
    """The [batch] int64 CPU image seeds of a rollout: the given ones, or fresh draws."""
    seeds = draw_seeds(generator, batch) if seeds is None else torch.as_tensor(seeds, dtype=torch.long).cpu()
    if seeds.shape != (batch,):
        raise ValueError(f"seeds must have shape ({batch},), got {tuple(seeds.shape)}")
    return seeds
