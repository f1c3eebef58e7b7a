"""Tiny random NOVA and Harmon adapters, built offline in seconds (tests, parity script).

Text encoders, tokenizers and VAEs are small random configs of the same classes the
published folders use (Phi / Qwen2 from transformers, diffusers' AutoencoderKL for NOVA,
Harmon's KL-16 layout); the tokenizer is a word-level `tokenizers` model.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from margrpo.models.harmon.loading import build_harmon
from margrpo.models.nova import NOVAPolicy, NOVATransformer

SPECIAL = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
WORDS = ("a an the one two three red green blue yellow purple orange circle circles square squares triangle "
         "triangles star stars left right of above below and striped solid big small photo image Generate "
         "user assistant : . , \n").split(" ")


def word_tokenizer(words=WORDS):
    """A word-level fast tokenizer (no merges), unknown words -> <unk>, pad = <pad>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + sorted({w for w in words if w.strip()}))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<|endoftext|>", additional_special_tokens=SPECIAL[2:4])


TINY_NOVA = dict(image_dim=4, image_size=64, image_stride=8, text_token_dim=32, text_token_len=8,
                 image_base_size=[4, 4], video_base_size=[1, 2, 2],
                 arch=["vit_d2w32h2", "vit_d2w32h2", "mlp_d2w32"])


def tiny_phi(vocab_size: int, hidden: int = 32):
    from transformers import PhiConfig, PhiModel

    cfg = PhiConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                    num_attention_heads=2, max_position_embeddings=64, partial_rotary_factor=0.5)
    return PhiModel(cfg).eval()


def tiny_sd_vae(latent_channels: int = 4, width: int = 32):
    """diffusers AutoencoderKL, stride 8 (4 levels), 32 channels."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         block_out_channels=(width,) * 4, layers_per_block=1, latent_channels=latent_channels,
                         norm_num_groups=32, sample_size=64).eval()


def tiny_nova(seed: int = 0, **sampling) -> NOVAPolicy:
    torch.manual_seed(seed)
    tok = word_tokenizer()
    policy = NOVAPolicy(NOVATransformer(**TINY_NOVA), tiny_phi(len(tok)), tok, tiny_sd_vae(), **sampling)
    return policy.eval()


def tiny_harmon_config(vocab_size: int) -> dict:
    llm = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True,
               rms_norm_eps=1e-6, rope_theta=10000.0)
    mar = dict(type="custom", encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=2, img_size=64,
               vae_stride=16, buffer_size=4, diffloss_d=2, diffloss_w=32, vae_embed_dim=4, class_num=10)
    return {"llm": llm, "mar": mar, "vae": {"ch": 32, "ch_mult": [1] * 5}}


def tiny_harmon(seed: int = 0, **sampling):
    torch.manual_seed(seed)
    tok = word_tokenizer()
    return build_harmon(tiny_harmon_config(len(tok)), tok, image_size=64, **sampling).eval()


def save_published_nova(policy, root: Path) -> None:
    """Write a tiny policy in the layout of a published NOVA folder."""
    (root / "transformer").mkdir(parents=True)
    (root / "transformer" / "config.json").write_text(json.dumps(TINY_NOVA))
    save_file(policy.transformer.state_dict(), str(root / "transformer" / "diffusion_pytorch_model.safetensors"))
    policy.text_encoder.save_pretrained(root / "text_encoder")
    policy.tokenizer.save_pretrained(root / "tokenizer")
    policy.vae.save_pretrained(root / "vae")
    (root / "scheduler").mkdir()
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps({"shift": 1.0}))
    (root / "model_index.json").write_text("{}")


def save_published_harmon(policy, root: Path) -> None:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(tiny_harmon_config(len(policy.tokenizer))))
    state = {k: v for k, v in policy.state_dict().items() if k != "llm.lm_head.weight"}  # tied, stored once
    save_file({k: v.contiguous() for k, v in state.items()}, str(root / "model.safetensors"))
    policy.tokenizer.save_pretrained(root)


class Brightness:
    """Mean pixel value of the image: a dense reward that needs no world."""

    name = "brightness"

    def __call__(self, images, prompts, metadata):
        return images.mean(dim=(1, 2, 3))
