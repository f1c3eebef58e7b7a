"""Build Harmon from its published config and load a published folder (wusize/Harmon-1_5B:
config.json with `llm` (Qwen2) and `mar` sections, model safetensors, Qwen2 tokenizer).

Every file is checked and the stored tensor names and shapes are compared with the ones
the config builds before any weight is read.
"""
from __future__ import annotations

from pathlib import Path

import torch

from margrpo.models.adapters_common import parameter_manifest
from margrpo.models.harmon.mar import MAR, MAR_SIZES
from margrpo.models.harmon.policy import HarmonPolicy
from margrpo.models.harmon.vae import KLVAE
from margrpo.models.published import WeightsError, check_tensors, load_tensors, read_json, require_layout, weight_files

HARMON_LAYOUT = {
    "config.json": "HarmonConfig: `llm` (Qwen2 config) and `mar` (type, img_size, buffer_size, diffloss_d/w, ...)",
    "model.safetensors": "all weights: vae.*, llm.*, mar.*, proj_in.*, proj_out.*",
    "tokenizer_config.json": "Qwen2 tokenizer (with its vocab/merges or tokenizer.json)",
}


def build_mar(mar: dict) -> MAR:
    kind = mar.get("type", "mar_huge")
    custom = ("encoder_embed_dim", "encoder_depth", "encoder_num_heads")
    if kind in MAR_SIZES:
        width, depth, heads = MAR_SIZES[kind]
    elif all(k in mar for k in custom):  # reduced sizes (tests, parity); decoder = encoder size
        width, depth, heads = (mar[k] for k in custom)
    else:
        raise WeightsError(f"config.json mar.type={kind!r} is not one of {sorted(MAR_SIZES)} "
                           f"(or give {', '.join(custom)})")
    if mar.get("patch_size", 1) != 1:
        raise WeightsError("only Harmon's patch_size 1 (one token per KL-16 latent position) is supported")
    return MAR(width, depth, heads, token_dim=mar.get("vae_embed_dim", 16), img_size=mar.get("img_size", 256),
               vae_stride=mar.get("vae_stride", 16), buffer_size=mar.get("buffer_size", 64),
               class_num=mar.get("class_num", 1000), diffloss_d=mar.get("diffloss_d", 12),
               diffloss_w=mar.get("diffloss_w", 1536))


def build_harmon(config: dict, tokenizer, **sampling) -> HarmonPolicy:
    """A HarmonPolicy with random weights from a HarmonConfig dict (`llm`, `mar`). The VAE
    is Harmon's fixed KL-16 (ch 128, ch_mult 1 1 2 2 4); an optional `vae` section
    {ch, ch_mult} (not in published configs) sizes it for tiny test models."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    llm = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in config["llm"].items() if k != "architectures"}))
    vae_cfg = config.get("vae", {})
    vae = KLVAE(config["mar"].get("vae_embed_dim", 16), tuple(vae_cfg.get("ch_mult", (1, 1, 2, 2, 4))),
                vae_cfg.get("ch", 128))
    return HarmonPolicy(llm.eval(), build_mar(config["mar"]), vae, tokenizer, **sampling)


def expected_tensors(policy: HarmonPolicy) -> dict[str, list[int]]:
    """The checkpoint layout: the state dict minus a tied LM head (stored once)."""
    shapes = parameter_manifest(policy)
    if policy.llm.config.tie_word_embeddings:
        shapes.pop("llm.lm_head.weight", None)
    return shapes


def load_harmon(root: str | Path, *, image_size: int = 512, num_ar_steps: int = 64, head_steps: int = 100,
                cfg_scale: float = 3.0, temperature: float = 1.0, device: str | torch.device = "cpu",
                llm_dtype: torch.dtype = torch.float32) -> HarmonPolicy:
    """Every part built on `device`. llm_dtype: storage dtype of the Qwen2 LLM's weights;
    bfloat16 only where they stay frozen (LoRA trains float32 factors on top of them), since
    AdamW steps on bfloat16 weights round small updates away."""
    from transformers import AutoTokenizer

    root = Path(root)
    require_layout(root, "Harmon", HARMON_LAYOUT)
    config = read_json(root / "config.json")
    if "llm" not in config or "mar" not in config:
        raise WeightsError(f"{root / 'config.json'} has no `llm` / `mar` sections; expected a HarmonConfig")
    files = weight_files(root, "model")
    sampling = dict(image_size=image_size, num_ar_steps=num_ar_steps, head_steps=head_steps, cfg_scale=cfg_scale,
                    temperature=temperature)
    with torch.device("meta"):
        check_tensors(files, expected_tensors(build_harmon(config, None, **sampling)), "Harmon model")
    with torch.device(device):
        policy = build_harmon(config, AutoTokenizer.from_pretrained(root), **sampling)
    policy.llm.to(llm_dtype)  # load_state_dict below casts the stored weights to it
    missing, unexpected = policy.load_state_dict(load_tensors(files), strict=False)
    if unexpected or set(missing) - {"llm.lm_head.weight"}:
        raise WeightsError(f"loading {root} left missing {missing[:3]} / unexpected {unexpected[:3]} tensors")
    policy.llm.tie_weights()
    return policy.eval()
