"""Load a published NOVA folder (e.g. BAAI/nova-d48w1024-sd512) into a NOVAPolicy.

Every file is checked, and the transformer's stored tensor names and shapes are compared
with the ones its config.json builds, before any weight is read.
"""
from __future__ import annotations

from pathlib import Path

import torch

from margrpo.models.adapters_common import parameter_manifest
from margrpo.models.nova.policy import NOVAPolicy
from margrpo.models.nova.transformer import NOVATransformer
from margrpo.models.published import check_tensors, load_tensors, read_json, require_layout, weight_files

NOVA_LAYOUT = {
    "model_index.json": "pipeline index (diffnext NOVAPipeline)",
    "transformer/config.json": "NOVATransformer3DModel config (arch, image_size, ...)",
    "transformer/diffusion_pytorch_model.safetensors": "transformer weights",
    "text_encoder/config.json": "Phi text encoder config",
    "text_encoder/model.safetensors": "Phi weights",
    "tokenizer/tokenizer_config.json": "Phi tokenizer",
    "vae/config.json": "AutoencoderKL config",
    "vae/diffusion_pytorch_model.safetensors": "VAE weights",
    "scheduler/scheduler_config.json": "flow-matching scheduler (shift)",
}


def transformer_manifest(config: dict) -> dict[str, list[int]]:
    """Tensor names and shapes the transformer config builds (on the meta device)."""
    with torch.device("meta"):
        return parameter_manifest(NOVATransformer(**config))


def load_nova(root: str | Path, *, num_ar_steps: int = 64, head_steps: int = 25, cfg_scale: float = 5.0,
              temperature: float = 1.0, device: str | torch.device = "cpu",
              text_dtype: torch.dtype = torch.float32) -> NOVAPolicy:
    """Every part built on `device` (the stored weights copied into it). text_dtype: storage
    dtype of the Phi-2 text encoder (frozen unless model.train_text_encoder; bfloat16 halves
    its 2.65 G parameters to 4.9 GiB). The transformer and the VAE stay float32."""
    from diffusers import AutoencoderKL
    from transformers import AutoModel, AutoTokenizer

    root = Path(root)
    require_layout(root, "NOVA", NOVA_LAYOUT)
    config = read_json(root / "transformer" / "config.json")
    files = weight_files(root / "transformer", "diffusion_pytorch_model")
    check_tensors(files, transformer_manifest(config), "NOVA transformer")
    with torch.device(device):
        transformer = NOVATransformer(**config)
    transformer.load_state_dict(load_tensors(files))
    text_encoder = AutoModel.from_pretrained(root / "text_encoder", dtype=text_dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    vae = AutoencoderKL.from_pretrained(root / "vae", torch_dtype=torch.float32).to(device).eval()
    shift = float(read_json(root / "scheduler" / "scheduler_config.json").get("shift", 1.0))
    return NOVAPolicy(transformer, text_encoder, tokenizer, vae, flow_shift=shift, num_ar_steps=num_ar_steps,
                      head_steps=head_steps, cfg_scale=cfg_scale, temperature=temperature).eval()
