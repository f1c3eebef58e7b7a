"""VQAScore through t2v-metrics 1.2's own CLIP-FlanT5 code on a tiny random model
(tests/backends/vqa_fixture.py): start-up checks (any env), scoring in process
(.venvs/legacy, where t2v-metrics lives) checked against P("Yes", "</s>") recomputed here from
the model's modules and logits, and scoring from the core env through the loopback server
started in .venvs/legacy. Tests needing t2v-metrics or the legacy venv skip with the reason."""
from __future__ import annotations

import json
import subprocess

import pytest
import torch

from margrpo.rewards.base import build_reward

from .conftest import LEGACY_PY, legacy_fixture, random_images

PROMPTS = ["a red cube", "two dogs on a bench", "a photo of a cat"]
# the package's 't5_chat' prompt, written out here so the reference does not reuse its code
SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant "
          "gives helpful, detailed, and polite answers to the user's questions.")


def reference_score(model, tok, processor, image, prompt: str) -> float:
    """exp(mean log p) of the answer tokens ("Yes", "</s>") for one PIL image, built from the
    model's parts: padded-square image -> CLIP hidden layer -2 minus CLS -> projector, spliced
    between the embedded text chunks; T5 teacher-forced on the answer. Shapes: pixels
    [1, 3, 32, 32], image tokens [1, 16, 32], logits [1, 2, vocab]."""
    import transformers
    from PIL import Image

    side = max(image.size)
    fill = tuple(int(m * 255) for m in processor.image_mean)
    square = Image.new("RGB", (side, side), fill)
    square.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
    pix = processor(square, return_tensors="pt")["pixel_values"].to(model.dtype)
    hidden = model.vision_tower.vision_tower(pix, output_hidden_states=True).hidden_states[-2][:, 1:]
    img_tokens = model.mm_projector(hidden)
    question = f'Does this figure show "{prompt}"? Please answer yes or no.'
    before, after = f"{SYSTEM} USER: ", f"\n{question} ASSISTANT: "
    # each chunk is tokenised on its own, eos included, as the package's t5 splice does
    ids_before, ids_after = (torch.tensor([tok(t).input_ids]) for t in (before, after))
    embeds = torch.cat([model.shared(ids_before), img_tokens, model.shared(ids_after)], dim=1)
    labels = torch.tensor([tok("Yes").input_ids])
    logits = transformers.T5ForConditionalGeneration.forward(
        model, inputs_embeds=embeds, labels=labels, return_dict=True).logits
    logp = logits.float().log_softmax(-1).gather(-1, labels[..., None]).squeeze(-1)
    return float(logp.mean().exp())


def test_vqascore_in_process_matches_reference(tmp_path, monkeypatch):
    pytest.importorskip("t2v_metrics", reason="t2v-metrics lives in .venvs/legacy (scripts/test_backends.sh)")
    from margrpo.rewards.clip_common import to_pil

    from .vqa_fixture import write

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    reward = build_reward("vqascore", batch_size=2, **write(tmp_path / "w"))
    assert not (tmp_path / "hf_cache").exists()  # the package's default cache dir is not created
    images = random_images(3, 40, 48)  # not square: exercises the padding to a square
    s = reward(images, PROMPTS, [{}] * 3)
    assert s.shape == (3,) and s.dtype == torch.float32 and torch.isfinite(s).all()
    assert ((s > 0) & (s < 1)).all()
    torch.testing.assert_close(reward(images, PROMPTS, [{}] * 3), s, rtol=0, atol=0)
    # the score depends on the image (same prompt, other images) and on the prompt
    same_prompt = reward(images, [PROMPTS[0]] * 3, [{}] * 3)
    assert same_prompt.log().std() > 0.01 and (same_prompt[1:] - s[1:]).abs().max() > 0

    m = reward.scorer.model
    pil = to_pil(images)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = [reference_score(m.model, m.tokenizer, m.image_processor, im, p) for im, p in zip(pil, PROMPTS)]
        wrong_image = reference_score(m.model, m.tokenizer, m.image_processor, pil[1], PROMPTS[0])
        wrong_prompt = reference_score(m.model, m.tokenizer, m.image_processor, pil[0], PROMPTS[1])
    # same bf16 ops on both sides: measured bit-identical here; 1e-4 in log space leaves room
    # for kernel differences while a wrong image (~0.06) or a wrong prompt (~2e-3) fails
    torch.testing.assert_close(s.log(), torch.tensor(ref).log(), rtol=0, atol=1e-4)
    for wrong in (wrong_image, wrong_prompt):
        assert abs(float(s[0].log()) - torch.tensor(wrong).log().item()) > 1e-3


def test_vqascore_through_legacy_env_server(tmp_path):
    params = legacy_fixture("vqa_fixture.py", tmp_path / "w")
    reward = build_reward("vqascore", python=str(LEGACY_PY), workdir=str(tmp_path / "run"),
                          keep_batches=True, batch_size=2, **params)
    images = random_images(3, 40, 48)
    try:
        s = reward(images, PROMPTS, [{}] * 3)
        assert s.shape == (3,) and torch.isfinite(s).all() and ((s > 0) & (s < 1)).all()
        torch.testing.assert_close(reward(images, PROMPTS, [{}] * 3), s, rtol=0, atol=0)
    finally:
        reward.close()
    # the one-shot CLI in the legacy env (the in-process backend) on the kept batch agrees
    batch = sorted((tmp_path / "run" / "batches").iterdir())[0]
    subprocess.run([str(LEGACY_PY), "-m", "margrpo.rewards.server", "score", "--backend", "vqascore",
                    "--kwargs", json.dumps(dict(params, batch_size=3)), "--images", str(batch),
                    "--prompts", str(batch / "prompts.jsonl"), "--out", str(batch / "cli.jsonl")],
                   check=True, capture_output=True, timeout=600, cwd=tmp_path)
    cli = [json.loads(line)["score"] for line in (batch / "cli.jsonl").read_text().splitlines()]
    torch.testing.assert_close(s, torch.tensor(cli, dtype=torch.float32), rtol=1e-2, atol=0)


def test_vision_tower_must_be_local(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"mm_vision_tower": "openai/clip-vit-large-patch14-336"}))
    with pytest.raises(FileNotFoundError, match="mm_vision_tower"):
        build_reward("vqascore", model_path=str(model), tokenizer_path=str(tmp_path),
                     vision_tower_path=str(tmp_path))
