"""Build and load the embedded TinyMAR from params, with checks that name mismatches."""
from __future__ import annotations

import copy
from pathlib import Path

from margrpo.config import ModelConfig, Params, SamplingConfig
from margrpo.models.mar import TinyMAR

# params.model keys that must equal the checkpoint's config (the rest are paths).
_ARCH_KEYS = ("patch_size", "width", "depth", "heads", "cond_dim", "head_width", "head_depth", "sampler", "flow_shift", "max_prompt_len")


def new_model(params: Params) -> TinyMAR:
    from margrpo.world.grammar import VOCAB

    m, s = params.model, params.sampling
    return TinyMAR(
        vocab=list(VOCAB),
        image_size=params.world.image_size,
        **{k: getattr(m, k) for k in _ARCH_KEYS},
        num_ar_steps=s.num_ar_steps,
        head_steps=s.head_steps,
        cfg_scale=s.cfg_scale,
        temperature=s.temperature,
    )


def check_checkpoint(model: TinyMAR, mcfg: ModelConfig, image_size: int, path: Path) -> None:
    c = model.config
    wrong = [(k, getattr(mcfg, k), c[k]) for k in _ARCH_KEYS if getattr(mcfg, k) != c[k]]
    if c["image_size"] != image_size:
        wrong.append(("world.image_size", image_size, c["image_size"]))
    if wrong:
        detail = "; ".join(f"{k}: params.yaml says {want!r}, checkpoint has {have!r}" for k, want, have in wrong)
        raise ValueError(
            f"checkpoint {path} does not match params.yaml ({detail}). Set these keys to the "
            "checkpoint's values, or retrain the base model (dvc repro pretrain_base)."
        )


def save_base(model: TinyMAR, path: str | Path) -> None:
    """Save a base checkpoint with float16 parameters (6.5 MB instead of 13 MB for the
    3.3 M-parameter default, which is committed to git). The state dict holds parameters only
    (noise tables are rebuilt from the config), and from_pretrained casts them back into the
    float32 model, so training and sampling stay float32; rounding moves a weight by at most
    2**-11 of its magnitude."""
    copy.deepcopy(model).half().save_pretrained(Path(path))


def load_model(path: str | Path, params: Params) -> TinyMAR:
    """Load a TinyMAR folder (save_pretrained) and apply params.sampling."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"no model at {path} (config.json missing); run `dvc repro pretrain_base` or set model.checkpoint"
        )
    model = TinyMAR.from_pretrained(path)
    check_checkpoint(model, params.model, params.world.image_size, path)
    configure(model, params.sampling)
    return model.eval()


def configure(model: TinyMAR, s: SamplingConfig) -> None:
    model.configure_sampling(s.num_ar_steps, s.head_steps, s.cfg_scale, s.temperature)
