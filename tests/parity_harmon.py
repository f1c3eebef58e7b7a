"""Harmon half of probes/official_parity.py (run it through that script)."""
from __future__ import annotations

from functools import partial

import numpy as np
import torch
from torch import nn

from parity_common import ReplayedNoise, max_diff, write_manifest

# Harmon-1.5B (configs/models/qwen2_5_1_5b_kl16_mar_h.py): Qwen2.5-1.5B-Instruct + MAR-H.
# The LLM config is Qwen2.5-1.5B-Instruct's published config.json (values written out: no
# model hub here).
QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu")
MAR_H = dict(type="mar_huge", img_size=256, vae_stride=16, patch_size=1, vae_embed_dim=16, mask_ratio_min=0.7,
             label_drop_prob=0.1, class_num=1000, attn_dropout=0.1, proj_dropout=0.1, buffer_size=64,
             diffloss_d=12, diffloss_w=1536, num_sampling_steps="100", diffusion_batch_mul=4, grad_checkpointing=True)
SMALL_LLM = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                 tie_word_embeddings=True)
SMALL_MAR = dict(img_size=128, vae_stride=16, patch_size=1, vae_embed_dim=16, buffer_size=8, class_num=10,
                 diffloss_d=2, diffloss_w=64, encoder_embed_dim=64, encoder_depth=2, encoder_num_heads=4)
PROMPTS = ["a red circle left of a blue square", "two green stars"]
IMAGE_SIZE = 256  # 16 x 16 tokens: the position embeddings (8 x 8) are resized, as at 512 px


def official_harmon(llm_cfg: dict, mar_kwargs: dict, tokenizer, mar_fn):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from src.models.harmon import Harmon
    from src.models.mar.vae import AutoencoderKL

    template = dict(INSTRUCTION="<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n")
    return Harmon(vae=dict(type=AutoencoderKL, embed_dim=16, ch_mult=(1, 1, 2, 2, 4)), vae_scale=0.2325,
                  llm=dict(type=lambda **kw: Qwen2ForCausalLM(Qwen2Config(**kw)), **llm_cfg),
                  mar=dict(type=mar_fn, **mar_kwargs), tokenizer=dict(type=lambda: tokenizer),
                  prompt_template=template)


def run(args) -> dict:
    import src.models.mar.diffloss as diffloss_mod
    import src.models.mar.diffusion.gaussian_diffusion as gd
    from src.models.mar.mar import MAR, mar_huge

    from adapter_fixtures import word_tokenizer
    from margrpo.models.chains import gather_rows, guided_output
    from margrpo.models.harmon.loading import build_harmon

    torch.Tensor.cuda = lambda self, *a, **k: self  # the official sampler hard-codes .cuda()
    mar_full = {k: v for k, v in MAR_H.items() if k != "type"}
    with torch.device("meta"):
        full = official_harmon(QWEN25_15B, mar_full, None, mar_huge)
    manifest = write_manifest("harmon", {"llm": QWEN25_15B, "mar": MAR_H}, full,
                              "wusize/Harmon 4eb6087 (configs/models/qwen2_5_1_5b_kl16_mar_h.py)")

    # ---- reduced model with random weights, copied into the adapter
    torch.manual_seed(args.seed)
    tok = word_tokenizer()
    llm_cfg = dict(SMALL_LLM, vocab_size=len(tok))
    width = SMALL_MAR["encoder_embed_dim"]
    small_mar = partial(MAR, encoder_embed_dim=width, encoder_depth=2, encoder_num_heads=4, decoder_embed_dim=width,
                        decoder_depth=2, decoder_num_heads=4, mlp_ratio=4,
                        norm_layer=partial(nn.LayerNorm, eps=1e-6), num_sampling_steps="10")
    mar_kwargs = {k: v for k, v in SMALL_MAR.items() if not k.startswith("encoder_")}
    off = official_harmon(llm_cfg, mar_kwargs, tok, small_mar).eval()
    with torch.no_grad():
        for n, p in off.named_parameters():
            if not n.startswith("vae."):
                p.copy_(torch.randn_like(p) * 0.1)
    ar_steps, head_steps, cfg, b = 8, 10, 3.0, len(PROMPTS)
    ours = build_harmon({"llm": llm_cfg, "mar": dict(SMALL_MAR, type="custom")}, tok, image_size=IMAGE_SIZE,
                        num_ar_steps=ar_steps, head_steps=head_steps, cfg_scale=cfg)
    ours.load_state_dict(off.state_dict(), strict=True)  # same names and shapes
    ours.eval()

    # ---- official run: text2image_hf's batching (prompts then null prompts, right padding)
    tmpl = "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n"
    texts = [tmpl.format(input=f"Generate an image: {p}") for p in PROMPTS] + [tmpl.format(input="Generate an image.")] * b
    enc = tok(texts, add_special_tokens=True, return_tensors="pt", padding=True)
    zs, tokens_out, draws = [], [], []
    off.mar.forward_mae_decoder = _recording(off.mar.forward_mae_decoder, zs)
    off.decode = _recording(off.decode, tokens_out, arg=True)
    real_randn, real_randn_like = torch.randn, torch.randn_like
    torch.randn = _recording(real_randn, draws)  # DiffLoss.sample's initial noise
    gd.th.randn_like = _recording(real_randn_like, draws)  # each p_sample's noise
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    side = IMAGE_SIZE // 16
    with torch.no_grad():
        images_off = off.sample(input_ids=enc.input_ids, attention_mask=enc.attention_mask.bool(), num_iter=ar_steps,
                                cfg=cfg, cfg_schedule="constant", temperature=1.0, image_shape=(side, side))
    torch.randn, gd.th.randn_like = real_randn, real_randn_like
    tokens_off = tokens_out[0].view(2 * b, side * side, -1)[:b]

    # ---- replay the official draws into the adapter: orders (numpy), and per AR step one
    # [R, 16] initial noise plus one [2R, 16] draw per head step (first R rows used; the last
    # step draws but adds no noise)
    np.random.seed(args.seed)
    off_order = torch.tensor(np.array([_shuffled(side * side) for _ in range(2 * b)]))[:b]
    order = off_order.flip(1)  # MAR keeps order[:mask_len] masked: commits from the end
    starts = np.cumsum([0] + ours.schedule)
    per_step = 1 + head_steps

    def step_noise(i):
        idx = order[:, starts[i] : starts[i + 1]]  # [B, n] in our commit order
        n = idx.shape[1]
        first = draws[i * per_step].view(b, n, -1)
        steps = [draws[i * per_step + 1 + k][: b * n].view(b, n, -1) for k in range(head_steps)]
        steps[-1] = torch.zeros_like(steps[-1])  # official: no noise on the t = 0 step
        chain = torch.stack([first] + steps)  # [T+1, B, n, D] in official row order
        pos = torch.argsort(torch.argsort(idx, 1), 1)  # rank of each committed position = its official row
        return chain.gather(2, pos.view(1, b, n, 1).expand(head_steps + 1, -1, -1, chain.shape[-1]))

    ours.noise = ReplayedNoise(order, step_noise)
    ro = ours.rollout(PROMPTS, seeds=torch.zeros(b, dtype=torch.long))

    z_diff = 0.0
    with torch.no_grad():
        for i in range(len(ro.steps)):
            zc, zu = ours.encode(ro, i)
            z_diff = max(z_diff, max_diff(torch.cat([zc, zu]), zs[i]))
        # one head step: official p_mean_variance with forward_with_cfg on AR step 1's rows
        i, idx = 1, ro.steps[1].commit_idx
        rows = idx.sort(1).values
        zc, zu = ours.encode(ro, i)
        zr_c, zr_u = gather_rows(zc, rows).reshape(-1, width), gather_rows(zu, rows).reshape(-1, width)
        x = draws[i * per_step].view(-1, 16)
        diff = off.mar.diffloss.gen_diffusion
        t = torch.full((x.shape[0] * 2,), diff.num_timesteps - 1, dtype=torch.long)
        pmv = diff.p_mean_variance(off.mar.diffloss.net.forward_with_cfg, torch.cat([x, x]), t, clip_denoised=False,
                                   model_kwargs=dict(c=torch.cat([zr_c, zr_u]), cfg_scale=cfg))
        out = guided_output(ours, x, 0, zr_c, zr_u, cfg)
        mean, std = ours.sampler.transition(x, 0, out)
    r = x.shape[0]
    images_ours = ours.decode_tokens(ro.tokens) * 2 - 1
    return {
        "model": "harmon", "manifest_tensors": manifest["num_tensors"], "manifest_elements": manifest["num_elements"],
        "ar_steps": len(ro.steps), "head_steps": head_steps, "cfg": cfg, "image_size": IMAGE_SIZE,
        "max_abs_diff": {
            "transformer_z": z_diff,
            "head_step_mean": max_diff(mean, pmv["mean"][:r]),
            "head_step_std": max_diff(std, torch.exp(0.5 * pmv["log_variance"][:r])),
            "sample_tokens": max_diff(ro.tokens, tokens_off),
            "sample_images": max_diff(images_ours, images_off[:b].clamp(-1, 1)),
        },
        "scale": {"tokens_abs_max": float(tokens_off.abs().max()), "z_abs_max": float(zs[-1].abs().max())},
        "diffloss_module": diffloss_mod.__name__,
    }


def _shuffled(n: int) -> np.ndarray:
    """One order exactly as MAR.sample_orders draws it (np.random.shuffle of range(n))."""
    order = np.array(list(range(n)))
    np.random.shuffle(order)
    return order


def _recording(fn, store, arg=False):
    def wrapper(*a, **k):
        if arg:  # record the input before fn may change it in place
            store.append(a[0].clone())
        out = fn(*a, **k)
        if not arg:
            store.append(out.clone())
        return out

    return wrapper
