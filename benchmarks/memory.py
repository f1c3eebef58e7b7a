"""Peak memory of one rollout and one training step of NOVA-0.6B and Harmon-1.5B at their
published resolution (512 px, 1024 tokens), and the largest batch that fits on an 80 GB GPU.

    .venv/bin/python benchmarks/memory.py       # both models, mar_grpo and grpo, checkpointing on and off
    .venv/bin/python benchmarks/memory.py --model nova --method mar_grpo --checkpointing on --batch 32

A full-size run does not fit this machine (NOVA's fixed training state alone is 17 GiB,
Harmon's 41 GiB), nor would its compute on two CPU cores, so the peak
is assembled from parts, each either counted exactly or measured on the CPU:

- fixed bytes, counted: every parameter and buffer of the published architectures built on
  the meta device (NOVA: transformer, Phi-2 text encoder in model.llm_dtype, SD VAE; Harmon:
  Qwen2-1.5B, MAR-H, projections, KL-16 VAE), and for training the float32 gradient, the two
  AdamW moments and the KL reference copy of every trained parameter (the method's groups).
- the batch record, measured: the bytes of the Batch that Trainer.collect returns (rollout
  record, images, token plans) at the published token grid, AR schedule and head steps,
  rolled out by a narrow policy of the same grid (the record's shapes do not depend on
  width or depth); the text conditioning is counted at the real width.
- activations, measured: the live bytes (tensors allocated by PyTorch ops and still
  referenced) at their peak, with the trainer's own code: Trainer.compute_grads on one loss
  AR step (the last, where the transformer reads the most known tokens, and the middle one),
  and for the rollout the text encoder, one AR step's transformer pass and head chain
  (recompute_log_probs at no grad: the rollout's code path) and the VAE decode. These run at
  full width and published resolution with 1-2 transformer blocks per stack (1 layer of
  Phi-2 / Qwen2), at batches 2 and 4; a block's activations are proportional to the batch,
  so the peak is linear in batch x depth, fitted on those runs and evaluated at full depth.

What this leaves out: the CUDA context and cuBLAS / attention workspaces (~1 GB) and the
caching allocator's fragmentation; the batch that "fits" therefore keeps 10 % of the card
free (--budget-gib, default 0.9 x 79.1 GiB, what an 80 GB H100 reports).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tiny tokenizer / VAE builders of the adapter tests

GIB = 2**30
# microsoft/phi-2 config.json: NOVA's text encoder.
PHI2 = dict(vocab_size=51200, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32,
            partial_rotary_factor=0.4, max_position_embeddings=2048)
# The SD VAE (diffusers AutoencoderKL defaults of SD 1.x / 2.x): NOVA's stride-8, 4-channel VAE.
SD_VAE = dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
              block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4, norm_num_groups=32,
              sample_size=512)
# Published sampling (docs/models.md): AR steps, head steps, CFG.
SAMPLING = {"nova": (64, 25, 5.0), "harmon": (64, 100, 3.0)}
PROMPTS = ["a photo of a red circle left of a blue square", "two green triangles above a striped star"]


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that PyTorch ops allocate inside the context and that are still
    referenced (a CPU stand-in for torch.cuda.memory_allocated); `peak` is their maximum."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def _free(self, key: int, n: int) -> None:
        self._seen.discard(key)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view or an in-place result: no new storage (e.g. weight.t() of a parameter)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                s = t.untyped_storage()
                key = s._cdata
                if key not in self._seen:
                    self._seen.add(key)
                    self.live += s.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(s, self._free, key, s.nbytes())
        return out


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def manifest(kind: str) -> dict:
    """The published config (tests/data: the manifests written from the official code)."""
    return json.loads((REPO / "tests" / "data" / f"{kind}_manifest.json").read_text())["config"]


# ---- policies -----------------------------------------------------------------------
def nova_policy(video_depth: int, image_depth: int, width: int, head: str, text: dict, vae: dict, tokenizer, dtype):
    from diffusers import AutoencoderKL
    from transformers import PhiConfig, PhiModel

    from margrpo.models.nova import NOVAPolicy, NOVATransformer

    heads = max(width // 64, 2)
    cfg = dict(manifest("nova"), text_token_dim=text["hidden_size"],
               arch=[f"vit_d{video_depth}w{width}h{heads}", f"vit_d{image_depth}w{width}h{heads}", head])
    encoder = PhiModel(PhiConfig(**text)).to(dtype).eval()
    s = SAMPLING["nova"]
    return NOVAPolicy(NOVATransformer(**cfg), encoder, tokenizer, AutoencoderKL(**vae).eval(), num_ar_steps=s[0],
                      head_steps=s[1], cfg_scale=s[2])


def harmon_policy(mar_depth: int, llm_layers: int, mar_width: int, llm: dict, head: tuple[int, int], vae: dict,
                  tokenizer):
    from margrpo.models.harmon import build_harmon

    mar = dict(manifest("harmon")["mar"], type="custom", encoder_embed_dim=mar_width, encoder_depth=mar_depth,
               encoder_num_heads=max(mar_width // 80, 2), diffloss_d=head[0], diffloss_w=head[1])
    llm_cfg = dict(manifest("harmon")["llm"], **llm, num_hidden_layers=llm_layers)
    s = SAMPLING["harmon"]
    return build_harmon({"llm": llm_cfg, "mar": mar, "vae": vae}, tokenizer, image_size=512, num_ar_steps=s[0],
                        head_steps=s[1], cfg_scale=s[2])


def measuring_policy(kind: str, depth: tuple[int, int], tokenizer, llm_dtype):
    """Full width, published resolution, `depth` blocks (NOVA: video / image units of 1 + 2;
    Harmon: MAR encoder = decoder blocks, Qwen2 layers)."""
    if kind == "nova":
        text = dict(PHI2, num_hidden_layers=1)
        return nova_policy(depth[0], 2 * depth[0], 1024, "mlp_d3w1280", text, SD_VAE, tokenizer, llm_dtype)
    return harmon_policy(depth[0], depth[1], 1280, {}, (12, 1536), {}, tokenizer)


def narrow_policy(kind: str, tokenizer):
    """Same token grid, token dim, schedule and head steps; tiny widths (records the batch)."""
    small_vae = dict(SD_VAE, block_out_channels=(32,) * 4, layers_per_block=1)
    if kind == "nova":
        text = dict(PHI2, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
        return nova_policy(1, 2, 32, "mlp_d1w32", text, small_vae, tokenizer, torch.float32)
    llm = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, vocab_size=1000)
    return harmon_policy(1, 1, 32, llm, (1, 32), {"ch": 32, "ch_mult": [1] * 5}, tokenizer)


def full_policy(kind: str, llm_dtype):
    """The published architecture on the meta device (shapes and dtypes, no storage)."""
    with torch.device("meta"):
        if kind == "nova":
            from diffusers import AutoencoderKL
            from transformers import PhiConfig, PhiModel

            from margrpo.models.nova import NOVAPolicy, NOVATransformer

            return NOVAPolicy(NOVATransformer(**manifest("nova")), PhiModel(PhiConfig(**PHI2)).to(llm_dtype), None,
                              AutoencoderKL(**SD_VAE))
        from margrpo.models.harmon import build_harmon

        return build_harmon(manifest("harmon"), None, image_size=512)


# ---- the parts ------------------------------------------------------------------------
class Brightness:
    name = "brightness"

    def __call__(self, images, prompts, metadata):
        return images.mean(dim=(1, 2, 3))


def trainer_for(policy, kind: str, method: str, batch: int, checkpointing: bool):
    from margrpo.config import load_params
    from margrpo.training.trainer import Trainer
    from margrpo.world.prompts import make_prompt_set

    s = SAMPLING[kind]
    params = load_params(REPO / "params.yaml", {
        "model.kind": kind, "model.weights": "unused", "runtime.device": "cpu", "runtime.nproc": 1,
        "sampling.num_ar_steps": s[0], "sampling.head_steps": s[1], "sampling.cfg_scale": s[2],
        "train.prompts_per_step": batch // 2, "train.group_size": 2, "train.grad_probe_every": 0,
        "train.loss_head_window": min(s[1], 8)})
    policy.apply_options(gradient_checkpointing=checkpointing)
    return Trainer.from_params(params, method, 0, make_prompt_set("train", 2, seed=0), policy=policy,
                               reward=Brightness())


def cond_bytes(cond: dict) -> int:
    return nbytes(v for v in cond.values() if isinstance(v, torch.Tensor))


def record(kind: str, method: str, batch: int, tokenizer):
    """(Batch of one collect at `batch` images, its bytes) from the narrow policy."""
    tr = trainer_for(narrow_policy(kind, tokenizer), kind, method, batch, False)
    with LiveBytes() as lb:
        b = tr.collect()
    return b, lb.live - cond_bytes(b.rollout.cond)


def step_activations(policy, kind: str, method: str, batch, checkpointing: bool, ar_steps) -> int:
    """Peak live bytes of Trainer.compute_grads on each loss AR step in `ar_steps` (max),
    gradients already allocated (as from the second AR step of a real step on)."""
    tr = trainer_for(policy, kind, method, len(batch.adv), checkpointing)
    with torch.no_grad():  # the conditioning of this policy's text encoder (the record's is narrow)
        batch.rollout.cond = policy.prepare_cond(batch.rollout.prompts)
    for p in tr.trained:
        p.grad = torch.zeros_like(p)
    tr.opt.zero_grad = lambda set_to_none=True: None  # keep them: count activations only
    by_index = {p.index: p for p in batch.plans}
    peak = 0
    for i in ar_steps:
        with LiveBytes() as lb:
            tr.compute_grads(batch, plans=[by_index[i]])
        peak = max(peak, lb.peak)
    return peak


def rollout_transients(policy, batch) -> tuple[int, int]:
    """(text encoder + one AR step's transformer pass and head chains, VAE decode of one
    image): peak live bytes at no grad, on the rollout's own code path."""
    from margrpo.models.chains import recompute_log_probs

    ro = batch.rollout
    with torch.no_grad(), LiveBytes() as lb:
        ro.cond = policy.prepare_cond(ro.prompts)
        recompute_log_probs(policy, ro, [len(ro.steps) - 1])
    step = lb.peak
    with torch.no_grad(), LiveBytes() as lb:
        policy.decode_tokens(ro.tokens[:1])
    return step, lb.peak


def fixed(kind: str, method: str, llm_dtype) -> dict[str, int]:
    from margrpo.config import load_params

    policy = full_policy(kind, llm_dtype)
    m = load_params(REPO / "params.yaml", {"model.kind": kind, "model.weights": "unused"}).method(method)
    trained = list(policy.ar_parameters()) + ([] if m.freeze_head else list(policy.head_parameters()))
    beta = load_params(REPO / "params.yaml").train_for(method).beta_kl
    weights = nbytes(policy.parameters()) + nbytes(policy.buffers())
    n = sum(p.numel() for p in trained)
    return {"weights": weights, "trained": n, "optimizer": 4 * n + 8 * n + (4 * n if beta > 0 else 0)}


def fit(points: list[tuple[tuple[float, ...], float]]) -> torch.Tensor:
    """Least squares coefficients of y on the given feature rows (exact when square)."""
    x = torch.tensor([p[0] for p in points], dtype=torch.float64)
    y = torch.tensor([[p[1]] for p in points], dtype=torch.float64)
    return torch.linalg.lstsq(x, y).solution.squeeze(1)


# ---- assembly -------------------------------------------------------------------------
FULL_DEPTH = {"nova": (16, 32), "harmon": (20, 28)}  # NOVA: video / image blocks; Harmon: MAR, Qwen2 layers
PROBE_DEPTHS = {"nova": [(1, 2), (2, 4)], "harmon": [(1, 1), (2, 1), (1, 2)]}


def depth_features(kind: str, depth: tuple[int, int], b: int) -> tuple[float, ...]:
    """Regressors of the activation peak: 1, B, and B x blocks of each stack (NOVA's video
    and image stacks scale together, 1 : 2, as in the published 16 : 32)."""
    if kind == "nova":
        return (1.0, float(b), float(b * depth[0]))
    return (1.0, float(b), float(b * depth[0]), float(b * depth[1]))


def measure(kind: str, method: str, checkpointing: list[bool], llm_dtype, log) -> dict:
    """Fitted coefficients of every measured part (module docstring); acts per checkpointing."""
    from adapter_fixtures import word_tokenizer

    tok = word_tokenizer()
    batches, rec, trans, acts = {}, [], [], {c: [] for c in checkpointing}
    for b in (2, 4):
        batches[b], r = record(kind, method, b, tok)
        rec.append(((1.0, float(b)), float(r)))
        log(f"{kind} {method}: batch record at B={b}: {r / GIB:.3f} GiB")
    k = len(batches[2].rollout.steps)
    probe_steps = sorted({k - 1, k // 2})
    for depth in PROBE_DEPTHS[kind]:
        torch.manual_seed(0)
        policy = measuring_policy(kind, depth, tok, llm_dtype)
        first = depth == PROBE_DEPTHS[kind][0]
        for b in (2, 4) if first else (2,):
            if first:
                step, decode = rollout_transients(policy, batches[b])
                cond = cond_bytes(batches[b].rollout.cond)  # at full text width
                trans.append(((1.0, float(b)), float(step), float(decode), float(cond)))
                log(f"{kind} rollout transients B={b}: AR step {step / GIB:.3f}, decode/image {decode / GIB:.3f}, "
                    f"text cond {cond / GIB:.4f} GiB")
            for c in checkpointing:
                t0 = time.time()
                a = step_activations(policy, kind, method, batches[b], c, probe_steps)
                acts[c].append((depth_features(kind, depth, b), float(a)))
                log(f"{kind} {method} checkpointing={c} depth {depth} B={b}: step activations {a / GIB:.3f} GiB "
                    f"({time.time() - t0:.0f} s)")
    return {"record": fit(rec), "acts": {c: fit(v) for c, v in acts.items()},
            "step": fit([(x, s) for x, s, _, _ in trans]), "cond": fit([(x, c) for x, _, _, c in trans]),
            "decode": max(d for _, _, d, _ in trans)}


def linear(coef: torch.Tensor, *x: float) -> float:
    return float(coef @ torch.tensor(x, dtype=torch.float64))


def predict(kind: str, fx: dict, m: dict, ckpt: bool, b: int) -> tuple[float, float]:
    """(rollout peak, training step peak) in bytes at batch b and full depth."""
    record = linear(m["record"], 1.0, b) + linear(m["cond"], 1.0, b)
    rollout = fx["weights"] + record + max(linear(m["step"], 1.0, b), m["decode"] * b)
    act = linear(m["acts"][ckpt], *depth_features(kind, FULL_DEPTH[kind], b))
    return rollout, fx["weights"] + fx["optimizer"] + record + act


def largest_batch(kind: str, fx: dict, m: dict, ckpt: bool, budget: float) -> int:
    b = 0
    while b < 4096 and max(predict(kind, fx, m, ckpt, b + 1)) <= budget:
        b += 1
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", nargs="+", choices=["nova", "harmon"], default=["nova", "harmon"])
    ap.add_argument("--method", nargs="+", default=["mar_grpo", "grpo"])
    ap.add_argument("--batch", type=int, default=16, help="images per GPU (rank) for the table")
    ap.add_argument("--checkpointing", nargs="+", choices=["on", "off"], default=["on", "off"],
                    help="model.gradient_checkpointing settings to measure")
    ap.add_argument("--llm-dtype", choices=["bfloat16", "float32"], default="bfloat16", help="model.llm_dtype")
    ap.add_argument("--budget-gib", type=float, default=0.9 * 79.1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llm_dtype = getattr(torch, args.llm_dtype)
    ckpts = [c == "on" for c in args.checkpointing]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    rows = []
    for kind in args.model:
        for method in args.method:
            fx = fixed(kind, method, llm_dtype)
            m = measure(kind, method, ckpts, llm_dtype, log)
            for c in ckpts:
                ro, st = predict(kind, fx, m, c, args.batch)
                rows.append(f"| {kind} | {method} | {'on' if c else 'off'} | {fx['weights'] / GIB:.1f} | "
                            f"{fx['trained'] / 1e9:.2f} G: {fx['optimizer'] / GIB:.1f} | {ro / GIB:.1f} | "
                            f"{st / GIB:.1f} | {largest_batch(kind, fx, m, c, args.budget_gib * GIB)} |")
    print(f"512 px, float32 transformer, model.llm_dtype {args.llm_dtype}, {args.batch} images per GPU; "
          f"fits: both peaks <= {args.budget_gib:.1f} GiB")
    print("| model | method | checkpointing | weights GiB | trained parameters: gradient + AdamW + KL reference GiB "
          f"| rollout peak GiB (B={args.batch}) | training step peak GiB (B={args.batch}) | largest B that fits |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
