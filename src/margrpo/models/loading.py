"""Build and load the embedded TinyMAR from params, with checks that name mismatches."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import torch

from margrpo.checkfiles import check_model_dir
from margrpo.config import ARCH_KEYS, CHECKPOINT_FIX, ModelConfig, Params, SamplingConfig
from margrpo.models.device import DTYPES, place, resolve_device
from margrpo.models.mar import TinyMAR


def tiny_config(params: Params, vocab: Sequence[str]) -> dict:
    """TinyMAR's constructor arguments from params (architecture, image size, sampling)."""
    s = params.sampling
    arch = {k: getattr(params.model, k) for k in ARCH_KEYS}
    return dict(vocab=list(vocab), image_size=params.world.image_size, **arch, num_ar_steps=s.num_ar_steps,
                head_steps=s.head_steps, cfg_scale=s.cfg_scale, temperature=s.temperature)


def new_model(params: Params, vocab: Sequence[str]) -> TinyMAR:
    """An untrained TinyMAR of params' architecture; vocab: [pad, null, word, ...], the prompt
    words it will be trained on (the embedded study: margrpo.world.grammar.VOCAB)."""
    return TinyMAR(**tiny_config(params, vocab))


def check_checkpoint(model: TinyMAR, mcfg: ModelConfig, image_size: int, path: Path) -> None:
    c = model.config
    wrong = [(k, getattr(mcfg, k), c[k]) for k in ARCH_KEYS if getattr(mcfg, k) != c[k]]
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
    copy.deepcopy(model).cpu().half().save_pretrained(Path(path))


def load_model(path: str | Path, params: Params) -> TinyMAR:
    """Load the policy params.model describes, with params.sampling applied, placed on
    params.runtime's device and precision (models/device.place).

    kind tiny: the TinyMAR folder at `path` (save_pretrained). kind nova / harmon: the
    published folder at model.weights, plus the fine-tuned state saved in `path` when it
    holds one (adapter_state.safetensors, written by the adapter's save_pretrained)."""
    if params.model.kind != "tiny":
        return load_adapter(params, path)
    path = Path(path)
    check_model_dir(path, CHECKPOINT_FIX.format(path=path))  # names a missing or truncated file
    model = TinyMAR.from_pretrained(path)
    check_checkpoint(model, params.model, params.world.image_size, path)
    configure(model, params.sampling)
    return place(model, params.runtime.device, params.runtime.dtype).eval()


def configure(model: TinyMAR, s: SamplingConfig) -> None:
    model.configure_sampling(s.num_ar_steps, s.head_steps, s.cfg_scale, s.temperature)


def load_adapter(params: Params, state_dir: str | Path | None = None):
    """NOVA / Harmon from model.weights (missing or mismatched files raise WeightsError,
    naming the file and the expected layout, before any weight is read), built on
    runtime.device with the language model stored in model.llm_dtype where it is frozen,
    then placed (runtime.dtype) like the TinyMAR."""
    m, s, r = params.model, params.sampling, params.runtime
    sampling = dict(num_ar_steps=s.num_ar_steps, head_steps=s.head_steps, cfg_scale=s.cfg_scale, temperature=s.temperature)
    device = resolve_device(r.device)
    if m.kind == "nova":
        from margrpo.models.nova import load_nova

        # Phi-2 is frozen unless model.train_text_encoder: only then does it need float32.
        text_dtype = torch.float32 if m.train_text_encoder else DTYPES[m.llm_dtype]
        policy = load_nova(m.weights, device=device, text_dtype=text_dtype, **sampling)
    elif m.kind == "harmon":
        from margrpo.models.harmon import load_harmon

        # Qwen2 trains with the MAR transformer unless LoRA freezes its base weights.
        llm_dtype = DTYPES[m.llm_dtype] if m.lora_rank and not m.train_text_encoder else torch.float32
        policy = load_harmon(m.weights, image_size=m.image_size or 512, device=device, llm_dtype=llm_dtype, **sampling)
    else:
        raise ValueError(f"model.kind={m.kind!r} is not an adapter (nova | harmon)")
    policy.apply_options(gradient_checkpointing=m.gradient_checkpointing, transformer_dtype=m.transformer_dtype,
                         lora_rank=m.lora_rank, lora_alpha=m.lora_alpha, train_text_encoder=m.train_text_encoder)
    place(policy, r.device, r.dtype)
    state = Path(state_dir) / "adapter_state.safetensors" if state_dir is not None else None
    if state is not None and state.exists():
        from safetensors.torch import load_file

        _, unexpected = policy.load_state_dict(load_file(str(state)), strict=False)
        if unexpected:
            raise ValueError(f"{state} holds tensors this {m.kind} policy does not have, e.g. {unexpected[:3]}; "
                             "was it saved with other model.lora_rank / model.weights?")
    return policy.eval()
