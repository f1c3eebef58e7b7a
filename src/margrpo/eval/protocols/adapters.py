"""Pluggable real-model backends of the benchmark protocols, on transformers with local
weights (never downloaded). Each is a small protocol so tests and other detectors plug in:

  Detector:        detect(pil_image, class_names) -> list[Detection] (label = class name)
  AttributeScorer: classify(pil_crop, cls, values) -> (value, confidence)  (GenEval colour)
  VQA:             p_yes(pil_image, questions) -> list[float]               (BLIP-VQA)
  TextImageSim:    cosine(pil_image, text) -> float                         (CLIP ViT-B/32)
  DepthMap:        depth(pil_image) -> np.ndarray [H, W] in [0, 1], 1 = nearest (DPT)

Install: `pip install -e '.[transformers]'` (core env, transformers 5, no torchvision).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from margrpo.eval.detections import Detection
from margrpo.rewards.clip_common import pick_device, require_module, require_paths, set_offline

EXTRA = "pip install -e '.[transformers]'"


class Detector(Protocol):
    def detect(self, image, class_names: list[str]) -> list[Detection]: ...


class AttributeScorer(Protocol):
    def classify(self, crop, cls: str, values: list[str]) -> tuple[str, float]: ...


class VQA(Protocol):
    def p_yes(self, image, questions: list[str]) -> list[float]: ...


class DepthMap(Protocol):
    def depth(self, image) -> "np.ndarray": ...


def load_hf_pair(name: str, param: str, model_path: str, device: str, processor_cls: str, model_cls: str):
    """(device, processor, model) of a transformers model in a local folder, offline, in
    eval mode: the start-up shared by every adapter below. param names the params key that
    points at the folder (it appears in the missing-path error)."""
    path = require_paths(name, EXTRA, **{param: model_path})[param]
    set_offline()
    tf = require_module("transformers", name, EXTRA)
    dev = pick_device(device)
    processor = getattr(tf, processor_cls).from_pretrained(str(path), local_files_only=True)
    model = getattr(tf, model_cls).from_pretrained(str(path), local_files_only=True).to(dev).eval()
    return dev, processor, model


class ZeroShotDetector:
    """OWL-ViT / OWLv2 zero-shot detection through transformers'
    AutoModelForZeroShotObjectDetection; queries are "a photo of a {class}" and labels come
    back as query indices (Grounding-DINO's text-span labels would need another mapping)."""

    def __init__(self, model_path: str, min_score: float = 0.05, device: str = "auto",
                 template: str = "a photo of a {}"):
        self.device, self.processor, self.model = load_hf_pair(
            "detector", "detector_path", model_path, device, "AutoProcessor", "AutoModelForZeroShotObjectDetection")
        self.min_score, self.template = float(min_score), template

    @torch.no_grad()
    def detect(self, image, class_names: list[str]) -> list[Detection]:
        queries = [self.template.format(c) for c in class_names]
        inputs = self.processor(text=[queries], images=image, return_tensors="pt").to(self.device)
        out = self.model(**inputs)
        # target size (H, W) in pixels so boxes come back in image coordinates
        sizes = torch.tensor([[image.height, image.width]])
        post = getattr(self.processor, "post_process_grounded_object_detection", None)
        if post is None:  # transformers 4.x OWL processors
            post = self.processor.image_processor.post_process_object_detection
        res = post(out, threshold=self.min_score, target_sizes=sizes)[0]
        # boxes may overhang the image; clip to it so centres and sizes stay meaningful
        lim = torch.tensor([image.width, image.height, image.width, image.height], dtype=torch.float32)
        boxes = torch.minimum(res["boxes"].float().clamp_min(0), lim)
        return [Detection(label=class_names[int(l)], score=float(s), box=tuple(float(v) for v in b))
                for s, l, b in zip(res["scores"], res["labels"], boxes)]


class ClipAttributeScorer:
    """CLIP zero-shot choice of an attribute value on a crop, GenEval's colour classifier:
    texts "a photo of a {value} {cls}", softmax over values of the scaled cosines."""

    def __init__(self, model_path: str, device: str = "auto", template: str = "a photo of a {} {}"):
        from margrpo.rewards.clipscore import HFClip

        self.clip = HFClip("clip-attribute", model_path, None, device, "fp32", model_param="clip_path")
        self.template = template

    @torch.no_grad()
    def classify(self, crop, cls: str, values: list[str]) -> tuple[str, float]:
        img = torch.nn.functional.normalize(self.clip.image_embeds([crop]), dim=-1)
        txt = torch.nn.functional.normalize(
            self.clip.text_embeds([self.template.format(v, cls) for v in values]), dim=-1)
        probs = (self.clip.model.logit_scale.exp().float().cpu() * img.cpu() @ txt.cpu().T).softmax(-1)[0]
        i = int(probs.argmax())
        return values[i], float(probs[i])

    @torch.no_grad()
    def cosine(self, image, text: str) -> float:
        img = torch.nn.functional.normalize(self.clip.image_embeds([image]), dim=-1)
        txt = torch.nn.functional.normalize(self.clip.text_embeds([text]), dim=-1)
        return float((img * txt).sum())


class BlipVQA:
    """P(yes) of BLIP VQA (BlipForQuestionAnswering) for each question, normalised over the
    two candidate answers "yes" / "no" from the decoder's first answer token (both answers
    are one token, so this equals ranking the answer list ["yes", "no"])."""

    def __init__(self, model_path: str, device: str = "auto"):
        self.device, self.processor, self.model = load_hf_pair(
            "blip-vqa", "vqa_path", model_path, device, "BlipProcessor", "BlipForQuestionAnswering")
        tok = self.processor.tokenizer
        self.answer_ids = [tok(a, add_special_tokens=False)["input_ids"][0] for a in ("yes", "no")]

    @torch.no_grad()
    def p_yes(self, image, questions: list[str]) -> list[float]:
        if not questions:
            return []
        inputs = self.processor(images=[image] * len(questions), text=questions,
                                return_tensors="pt", padding=True).to(self.device)
        m = self.model
        image_embeds = m.vision_model(pixel_values=inputs["pixel_values"])[0]
        image_mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=self.device)
        q = m.text_encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                           encoder_hidden_states=image_embeds, encoder_attention_mask=image_mask)[0]
        bos = torch.full((len(questions), 1), m.decoder_start_token_id, dtype=torch.long,
                         device=self.device)
        logits = m.text_decoder(input_ids=bos, encoder_hidden_states=q,
                                encoder_attention_mask=inputs["attention_mask"]).logits[:, -1]
        pair = logits[:, self.answer_ids].float().softmax(-1)
        return pair[:, 0].cpu().tolist()


class DepthEstimator:
    """Monocular depth through transformers' AutoModelForDepthEstimation (T2I-CompBench++ uses
    DPT-hybrid MiDaS: transformers' DPTForDepthEstimation, e.g. a local Intel/dpt-hybrid-midas
    folder). Returns the prediction resized to the image (bilinear, corners aligned as the
    official script), min-max normalised per image to [0, 1] with 1 = nearest: MiDaS / DPT
    predict relative inverse depth already; for a model predicting distance (larger =
    farther, e.g. metric ZoeDepth) set larger_is_nearer=False and the map is flipped."""

    def __init__(self, model_path: str, device: str = "auto", larger_is_nearer: bool = True):
        self.device, self.processor, self.model = load_hf_pair(
            "depth", "depth_path", model_path, device, "AutoImageProcessor", "AutoModelForDepthEstimation")
        self.larger_is_nearer = bool(larger_is_nearer)

    @torch.no_grad()
    def depth(self, image) -> np.ndarray:
        inputs = self.processor(images=image, return_tensors="pt").to(self.device)
        pred = self.model(**inputs).predicted_depth.float()  # [1, h, w] at the model's size
        pred = torch.nn.functional.interpolate(pred[:, None], size=(image.height, image.width),
                                               mode="bilinear", align_corners=True)[0, 0]
        lo, hi = pred.min(), pred.max()
        # a constant map carries no order: all zeros, so every depth comparison fails
        d = (pred - lo) / (hi - lo) if hi > lo else torch.zeros_like(pred)
        if not self.larger_is_nearer:
            d = 1.0 - d
        return d.cpu().numpy()  # [H, W] float32
