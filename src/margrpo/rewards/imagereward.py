"""ImageReward (Xu et al. 2023) through the image-reward package's own model code.

Scoring is the package's `ImageReward.score_gard` (BLIP ViT-L image encoder, BERT text
encoder with cross-attention, MLP head, fixed mean/std standardisation), called on whole
batches; the package's `score()` / `inference_rank()` encode one image at a time. Text is
tokenised as the package does (padding to 35 tokens) and images go through its own
torchvision transform, so results match `model.score(prompt, image)`.

Weights (local files, never downloaded):
  checkpoint: ImageReward.pt; med_config: med_config.json (both from the ImageReward
  release); bert_tokenizer: a folder with the bert-base-uncased tokenizer files
  (vocab.txt, tokenizer_config.json). The package hard-codes the hub name
  'bert-base-uncased'; this backend points that one call at the folder instead.
Environment: image-reward 1.5 needs transformers<4.56, clip-anytorch and setuptools<81,
which conflict with the core (diffusers 0.42): build .venvs/legacy with
scripts/setup_backend_env.sh legacy and set `python: .venvs/legacy/bin/python` in the
reward's params, which runs this module in that env behind the loopback scorer.
"""
from __future__ import annotations

from typing import Any

import torch

from margrpo.rewards.clip_common import (batched_scores, pick_device, pick_dtype, require_module,
                                         require_paths, set_offline, to_pil)
from margrpo.rewards.remote import maybe_remote

EXTRA = ("scripts/setup_backend_env.sh legacy, then set rewards[].python: "
         ".venvs/legacy/bin/python (pip install -e '.[imagereward]' into an env of its own)")


class ImageRewardReward:
    name = "imagereward"

    def __init__(self, checkpoint: str, med_config: str, bert_tokenizer: str,
                 batch_size: int = 16, device: str = "auto", dtype: str = "auto"):
        paths = require_paths(self.name, EXTRA, checkpoint=checkpoint, med_config=med_config,
                              bert_tokenizer=bert_tokenizer)
        set_offline()
        ir = require_module("ImageReward.ImageReward", self.name, EXTRA)
        blip_pretrain = require_module("ImageReward.models.BLIP.blip_pretrain", self.name, EXTRA)
        transformers = require_module("transformers", self.name, EXTRA)
        self.device = pick_device(device)
        self.dtype = pick_dtype(self.device, dtype)

        def local_tokenizer():
            # Same special tokens as the package's init_tokenizer, from the local folder.
            tok = transformers.BertTokenizer.from_pretrained(str(paths["bert_tokenizer"]),
                                                             local_files_only=True)
            tok.add_special_tokens({"bos_token": "[DEC]"})
            tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
            tok.enc_token_id = tok.additional_special_tokens_ids[0]
            return tok

        original = blip_pretrain.init_tokenizer
        blip_pretrain.init_tokenizer = local_tokenizer
        try:
            model = ir.ImageReward(device=self.device, med_config=str(paths["med_config"]))
        finally:
            blip_pretrain.init_tokenizer = original
        state = torch.load(str(paths["checkpoint"]), map_location="cpu", weights_only=True)
        result = model.load_state_dict(state, strict=False)
        # The package loads non-strictly; refuse a checkpoint that leaves any part used in
        # scoring (image encoder, text encoder, head) at its random initialisation.
        used = ("blip.visual_encoder.", "blip.text_encoder.", "mlp.")
        missing = [k for k in result.missing_keys if k.startswith(used)]
        if missing:
            raise RuntimeError(f"imagereward: {paths['checkpoint']} (param rewards[].checkpoint) "
                               f"lacks {len(missing)} weights used in scoring, e.g. {missing[:3]}")
        self.model = model.to(self.device, self.dtype).eval()
        self.model.device = self.device
        self.batch_size = int(batch_size)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        def score(sl: slice) -> torch.Tensor:
            pix = torch.stack([self.model.preprocess(im) for im in to_pil(images[sl])])
            tok = self.model.blip.tokenizer(list(prompts[sl]), padding="max_length", truncation=True,
                                            max_length=35, return_tensors="pt").to(self.device)
            r = self.model.score_gard(tok.input_ids, tok.attention_mask, pix.to(self.device, self.dtype))
            return r.float().reshape(-1).cpu()

        return batched_scores(images, prompts, self.batch_size, score)


def build(**kwargs: Any):
    """Table entry "imagereward": in process, or in its own env when `python` / `url` is set."""
    return maybe_remote("imagereward", kwargs) or ImageRewardReward(**kwargs)
