"""NOVA half of probes/official_parity.py (run it through that script)."""
from __future__ import annotations

import importlib.util

import numpy as np
import torch

from parity_common import ReplayedNoise, max_diff, write_manifest

# NOVA-0.6B at 512 px (BAAI/nova-d48w1024-sd512). Its config.json could not be fetched here
# (no model hub); these values follow the repo's d48w1024 configs with the SD (stride-8,
# 4-channel) VAE at 512 px, the token grids the pipeline needs (image 32x32, frame 16x16),
# Phi-2 text states (2560 x 256) and the 3-block 1280-wide head of the NOVA paper's 0.6B
# model. The adapter reads arch and sizes from the folder's config.json in any case.
FULL = dict(image_dim=4, image_size=[512, 512], image_stride=8, text_token_dim=2560, text_token_len=256,
            image_base_size=[32, 32], video_base_size=[1, 16, 16], rotary_pos_embed=False,
            arch=["vit_d16w1024", "vit_d32w1024", "mlp_d3w1280"])
SMALL = dict(image_dim=4, image_size=[128, 128], image_stride=8, text_token_dim=32, text_token_len=16,
             image_base_size=[8, 8], video_base_size=[1, 4, 4], rotary_pos_embed=False,
             arch=["vit_d2w64h4", "vit_d4w64h4", "mlp_d2w64"])
PROMPTS = ["a red circle left of a blue square", "two green stars"]


def register_small_arch():
    from diffnext.models.transformers import transformer_nova as tn

    tn.VIDEO_ENCODERS.register("vit_d2w64h4", depth=2, embed_dim=64, num_heads=4)(tn.video_encoder)
    tn.IMAGE_ENCODERS.register("vit_d4w64h4", depth=4, embed_dim=64, num_heads=4)(tn.image_encoder)
    tn.IMAGE_DECODERS.register("mlp_d2w64", depth=2, embed_dim=64)(tn.image_decoder)


def official_pipeline(seed: int):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffnext.models.autoencoders.autoencoder_kl import AutoencoderKL
    from diffnext.models.text_encoders.phi import PhiEncoderModel
    from diffnext.models.transformers.transformer_nova import NOVATransformer3DModel
    from diffnext.pipelines import NOVAPipeline
    from transformers import PhiConfig

    from adapter_fixtures import word_tokenizer

    torch.manual_seed(seed)
    tok = word_tokenizer()
    transformer = NOVATransformer3DModel(**SMALL).eval()
    with torch.no_grad():  # AdaLN projections start at default init; give every tensor a random value
        for p in transformer.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    phi = PhiEncoderModel(PhiConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=2, max_position_embeddings=64, partial_rotary_factor=0.5)).eval()
    rope = getattr(phi.config, "rope_parameters", None) or {}
    for key, default in (("partial_rotary_factor", 0.5), ("rope_theta", 10000.0)):
        if not hasattr(phi.config, key):  # transformers 5 keeps these in rope_parameters; diffnext reads them here
            setattr(phi.config, key, rope.get(key, default))
    vae = AutoencoderKL(block_out_channels=(32, 32, 32, 32), layers_per_block=1, latent_channels=4).eval()
    pipe = NOVAPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0), vae=vae,
                        text_encoder=phi, tokenizer=tok)
    return pipe, tok


def adapter_from(pipe, tok, ar_steps: int, head_steps: int, cfg: float, noise_level: float):
    from diffusers import AutoencoderKL as DiffusersVAE
    from transformers import PhiModel

    from margrpo.models.nova import NOVAPolicy, NOVATransformer

    tr = NOVATransformer(**SMALL)
    tr.load_state_dict(pipe.transformer.state_dict(), strict=True)  # same names and shapes
    phi = PhiModel(pipe.text_encoder.config)
    phi.load_state_dict({k.removeprefix("model."): v for k, v in pipe.text_encoder.state_dict().items()
                         if k.startswith("model.")}, strict=False)
    vae = DiffusersVAE(block_out_channels=(32, 32, 32, 32), down_block_types=("DownEncoderBlock2D",) * 4,
                       up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=1, latent_channels=4)
    vae.load_state_dict(pipe.vae.state_dict(), strict=True)
    return NOVAPolicy(tr, phi.eval(), tok, vae.eval(), flow_shift=1.0, noise_level=noise_level,
                      num_ar_steps=ar_steps, head_steps=head_steps, cfg_scale=cfg)


def run(args) -> dict:
    from diffnext.models.transformers.transformer_nova import NOVATransformer3DModel

    register_small_arch()
    with torch.device("meta"):
        full = NOVATransformer3DModel(**FULL)
    manifest = write_manifest("nova", FULL, full, "baaivision/NOVA 2cd254a (diffnext 0.2.0a0)")
    pipe, tok = official_pipeline(args.seed)
    ar_steps, head_steps, cfg, b = 8, 6, 5.0, len(PROMPTS)

    # ---- official run (ODE head, as published), hooks record z and the head's inputs
    zs, head_calls = [], []
    pipe.transformer.image_encoder.register_forward_hook(lambda m, a, out: zs.append(out.clone()))
    pipe.transformer.image_decoder.register_forward_hook(
        lambda m, a, out: head_calls.append([t.clone() if torch.is_tensor(t) else t for t in a] + [out.clone()]))
    g = torch.Generator().manual_seed(args.seed)
    out = pipe(prompt=PROMPTS, num_inference_steps=ar_steps, num_diffusion_steps=head_steps, guidance_scale=cfg,
               generator=g, output_type="latent", disable_progress_bar=True)
    official_latent = out.frames[:, :, 0].float()  # [B, C, H, W]
    official_images = pipe.vae.decode(pipe.vae.unscale_(official_latent.clone())).sample

    # ---- the official draws, replayed: order (uniform argsort), then one full-latent
    # normal per AR step (the ODE draws nothing else)
    policy = adapter_from(pipe, tok, ar_steps, head_steps, cfg, noise_level=0.0)
    n_tok, h = policy.num_tokens, policy.transformer.latent_hw[0]
    g = torch.Generator().manual_seed(args.seed)
    order = torch.empty(b, n_tok, 1).uniform_(generator=g).argsort(1)[..., 0]
    init = [torch.empty(b, 4, h, h).normal_(generator=g) for _ in policy.schedule]
    patchify = pipe.transformer.image_encoder.patch_embed.patchify
    starts = np.cumsum([0] + policy.schedule)

    def step_noise(i):
        idx = order[:, starts[i] : starts[i + 1]]
        first = torch.gather(patchify(init[i]), 1, idx.unsqueeze(-1).expand(-1, -1, policy.token_dim))
        return torch.cat([first.unsqueeze(0), torch.zeros(head_steps, *first.shape)])

    policy.noise = ReplayedNoise(order, step_noise)
    ro = policy.rollout(PROMPTS, seeds=torch.zeros(b, dtype=torch.long))
    h_tok = policy.transformer.latent_hw[0] // policy.transformer.patch
    ours_latent = ro.tokens.view(b, h_tok, h_tok, 2, 2, 4).permute(0, 5, 1, 3, 2, 4).reshape(b, 4, h, h)

    # ---- transformer latents at every AR step, from the recorded canvases
    z_diff = 0.0
    with torch.no_grad():
        for i, step in enumerate(ro.steps):
            zc, zu = policy.encode(ro, i)
            z_diff = max(z_diff, max_diff(torch.cat([zc, zu]), zs[i]))

    # ---- one head step (AR step 1, first transition), Flow-GRPO SDE at noise level 0.7
    x4, t, z2, pred_ids, _ = head_calls[head_steps]  # first head call of AR step 1
    sde = importlib.util.spec_from_file_location(
        "sde", args.mar_grpo / "src/grpo/src/diffnext/schedulers/scheduling_flow_with_logp.py")
    mod = importlib.util.module_from_spec(sde)
    sde.loader.exec_module(mod)
    with torch.no_grad():
        v = pipe.transformer.image_decoder(x4, t, z2, pred_ids)
        cond, uncond = v.chunk(2)
        v = uncond + (cond - uncond) * cfg
        rows = pred_ids[:b, :, 0]  # [B, n]
        v_rows = torch.gather(v, 1, rows.unsqueeze(-1).expand(-1, -1, 16))
        x_rows = torch.gather(patchify(x4[:b]), 1, rows.unsqueeze(-1).expand(-1, -1, 16))
        sched = pipe.scheduler
        sched.set_timesteps(head_steps)
        _, _, mean_off, std_off = mod.sde_step_with_logprob(
            sched, v_rows.reshape(-1, 16, 1, 1), t[:1].expand(x_rows.numel() // 16), x_rows.reshape(-1, 16, 1, 1))
        sde_policy = adapter_from(pipe, tok, ar_steps, head_steps, cfg, noise_level=0.7)
        from margrpo.models.chains import gather_rows, guided_output

        zc, zu = sde_policy.encode(ro, 1)
        idx = ro.steps[1].commit_idx
        assert torch.equal(idx.sort(1).values, rows.sort(1).values), "commit sets differ"
        perm = rows  # official row order; gather ours in the same order
        out = guided_output(sde_policy, x_rows, 0, gather_rows(zc, perm), gather_rows(zu, perm), cfg)
        mean_ours, std_ours = sde_policy.sampler.transition(x_rows, 0, out)
    images_ours = policy.decode_tokens(ro.tokens) * 2 - 1
    return {
        "model": "nova", "manifest_tensors": manifest["num_tensors"], "manifest_elements": manifest["num_elements"],
        "ar_steps": len(ro.steps), "head_steps": head_steps, "cfg": cfg,
        "max_abs_diff": {
            "transformer_z": z_diff,
            "head_velocity": max_diff(out, v_rows),
            "head_step_mean": max_diff(mean_ours, mean_off.reshape(mean_ours.shape)),
            "head_step_std": max_diff(std_ours, std_off.reshape(std_ours.shape)),
            "sample_latents": max_diff(ours_latent, official_latent),
            "sample_images": max_diff(images_ours, official_images.clamp(-1, 1)),
        },
        "scale": {"latents_abs_max": float(official_latent.abs().max()), "z_abs_max": float(zs[-1].abs().max())},
    }
