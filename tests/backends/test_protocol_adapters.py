"""The transformers adapters of the protocols on tiny random models: OWL-ViT zero-shot
detection -> Detections in pixel coordinates, BLIP-VQA P(yes), CLIP colour choice."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from .conftest import NEED_TRANSFORMERS, need, tiny_clip_dir

WORDS = ["a", "red", "car", "green", "bench", "yes", "no", "?", "what", "photo", "of", "dog"]


@pytest.fixture(scope="module")
def tf():
    need("transformers", NEED_TRANSFORMERS)
    import transformers

    return transformers


def test_owlvit_detector(tf, tmp_path):
    from margrpo.eval.protocols.adapters import ZeroShotDetector

    clip = tiny_clip_dir(tmp_path)
    tok = tf.CLIPTokenizer.from_pretrained(str(clip))
    proc = tf.OwlViTProcessor(image_processor=tf.OwlViTImageProcessor(
        size={"height": 32, "width": 32}, crop_size={"height": 32, "width": 32}), tokenizer=tok)
    torch.manual_seed(0)
    cfg = tf.OwlViTConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=8),
        projection_dim=32)  # OWL-ViT heads assume projection_dim == text width
    out = tmp_path / "owl"
    tf.OwlViTForObjectDetection(cfg).save_pretrained(out)
    proc.save_pretrained(out)
    det = ZeroShotDetector(str(out), min_score=0.0)
    img = Image.new("RGB", (80, 60), (200, 30, 30))
    dets = det.detect(img, ["car", "dog"])
    assert len(dets) == (32 // 8) ** 2  # one box per patch, labelled with its best query
    assert {d.label for d in dets} <= {"car", "dog"}
    for d in dets:
        x0, y0, x1, y1 = d.box
        assert 0 <= x0 <= x1 <= 80 and 0 <= y0 <= y1 <= 60 and 0 <= d.score <= 1


def test_blip_vqa_p_yes(tf, tmp_path):
    from margrpo.eval.protocols.adapters import BlipVQA

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    tok = tf.BertTokenizer(str(tmp_path / "vocab.txt"))
    proc = tf.BlipProcessor(image_processor=tf.BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok)
    torch.manual_seed(0)
    cfg = tf.BlipConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, encoder_hidden_size=32, bos_token_id=2, pad_token_id=0,
                         sep_token_id=3, max_position_embeddings=32),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=8))
    out = tmp_path / "blip"
    tf.BlipForQuestionAnswering(cfg).save_pretrained(out)
    proc.save_pretrained(out)
    vqa = BlipVQA(str(out))
    img = Image.new("RGB", (40, 40), (0, 200, 0))
    p = vqa.p_yes(img, ["a red car?", "a green bench?"])
    assert len(p) == 2 and all(0 < x < 1 for x in p) and p[0] != p[1]
    # independent: the same numbers from the first decoder step of the model's own layers
    m = vqa.model
    inp = vqa.processor(images=[img], text=["a red car?"], return_tensors="pt")
    with torch.no_grad():
        emb = m.vision_model(pixel_values=inp["pixel_values"])[0]
        q = m.text_encoder(input_ids=inp["input_ids"], attention_mask=inp["attention_mask"],
                           encoder_hidden_states=emb)[0]
        logits = m.text_decoder(input_ids=torch.tensor([[2]]), encoder_hidden_states=q).logits[0, -1]
    yes, no = tok.convert_tokens_to_ids(["yes", "no"])
    assert p[0] == pytest.approx(float(torch.softmax(logits[[yes, no]], -1)[0]), abs=1e-5)


def test_clip_colour_classifier(tf, tmp_path):
    from margrpo.eval.protocols.adapters import ClipAttributeScorer
    from margrpo.eval.protocols.geneval_protocol import COLORS

    scorer = ClipAttributeScorer(str(tiny_clip_dir(tmp_path)))
    value, conf = scorer.classify(Image.new("RGB", (20, 30), (250, 0, 0)), "car", COLORS)
    assert value in COLORS and 1 / len(COLORS) <= conf <= 1
    assert -1 <= scorer.cosine(Image.new("RGB", (20, 30)), "a red car") <= 1
