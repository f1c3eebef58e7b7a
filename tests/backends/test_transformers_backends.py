"""PickScore, CLIPScore and the aesthetic predictor on tiny random transformers CLIPs."""
from __future__ import annotations

import pytest
import torch

from margrpo.rewards.base import build_reward, build_weighted_reward

from .conftest import NEED_TRANSFORMERS, need, random_images, tiny_clip_dir

PROMPTS = ["a red cube", "two dogs on a bench", "a photo of a cat"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    need("transformers", NEED_TRANSFORMERS)
    return tiny_clip_dir(tmp_path_factory.mktemp("clip"))


def test_clipscore_matches_manual_cosine(clip_dir):
    import transformers

    reward = build_reward("clipscore", model_path=str(clip_dir), batch_size=2)
    images = random_images(3)
    scores = reward(images, PROMPTS, [{}] * 3)
    assert scores.shape == (3,) and torch.isfinite(scores).all()
    # Independent recomputation with the stock transformers API on the same files.
    model = transformers.CLIPModel.from_pretrained(clip_dir).eval()
    proc = transformers.CLIPProcessor.from_pretrained(clip_dir)
    from margrpo.rewards.clip_common import to_pil

    with torch.no_grad():
        out = model(**proc(text=PROMPTS, images=to_pil(images), return_tensors="pt", padding=True))
    img = torch.nn.functional.normalize(out.image_embeds, dim=-1)
    txt = torch.nn.functional.normalize(out.text_embeds, dim=-1)
    expected = 2.5 * (img * txt).sum(-1).clamp_min(0)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-4)


def test_pickscore_uses_logit_scale_and_depends_on_prompt(clip_dir):
    reward = build_reward("pickscore", model_path=str(clip_dir), processor_path=str(clip_dir))
    clip = build_reward("clipscore", model_path=str(clip_dir), weight_w=1.0)
    images = random_images(3)
    a = reward(images, PROMPTS, [{}] * 3)
    assert reward.scale == pytest.approx(float(torch.tensor(2.6592).exp()), rel=1e-3)
    cos = clip.clip.cosine(images, PROMPTS, 8)
    torch.testing.assert_close(a, reward.scale * cos, atol=1e-4, rtol=1e-4)
    b = reward(images, list(reversed(PROMPTS)), [{}] * 3)
    assert not torch.allclose(a, b)


def test_aesthetic_head_loads_strictly_and_scores(clip_dir, tmp_path):
    from margrpo.rewards.aesthetic import AestheticHead

    torch.manual_seed(1)
    head = tmp_path / "head.pth"
    torch.save(AestheticHead(16).state_dict(), head)
    reward = build_reward("aesthetic", clip_path=str(clip_dir), head_path=str(head), batch_size=2)
    s = reward(random_images(4), ["x"] * 4, [{}] * 4)
    assert s.shape == (4,) and torch.isfinite(s).all() and s.std() > 0


def test_weighted_multi_reward_from_params(clip_dir):
    specs = [{"name": "clipscore", "weight": 2.0, "model_path": str(clip_dir)},
             {"name": "pickscore", "weight": -0.5, "model_path": str(clip_dir)}]
    total = build_weighted_reward(specs)
    images = random_images(3)
    out = total(images, PROMPTS, [{}] * 3)
    comp = total.last_components
    torch.testing.assert_close(out, 2.0 * comp["clipscore"] - 0.5 * comp["pickscore"])


def test_clip_bpe_from_gz_gives_openai_ids(tmp_path):
    need("transformers", NEED_TRANSFORMERS)
    import transformers

    from margrpo.rewards.clip_common import find_clip_bpe_gz, write_clip_tokenizer_files

    gz = find_clip_bpe_gz()
    if gz is None:
        pytest.skip("no bpe_simple_vocab_16e6.txt.gz: build .venvs/openclip or set MARGRPO_CLIP_BPE")
    assert write_clip_tokenizer_files(tmp_path, gz) == 49408
    tok = transformers.CLIPTokenizer.from_pretrained(str(tmp_path))
    # The ids open_clip's own SimpleTokenizer gives for these words (checked in .venvs/openclip).
    assert tok("a red cube")["input_ids"] == [49406, 320, 736, 11353, 49407]
