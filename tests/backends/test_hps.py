"""HPSv2 on a tiny random OpenCLIP: real open_clip model building, strict checkpoint loading,
hpsv2 preprocessing, the open_clip BPE tokenizer, batched cosine scoring; in process where
open_clip imports (.venvs/openclip) and through the loopback server from the core env."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from margrpo.rewards.base import build_reward

from .conftest import random_images

ROOT = Path(__file__).resolve().parents[2]
OPENCLIP_PY = ROOT / ".venvs" / "openclip" / "bin" / "python"
TINY = {"embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}}
PROMPTS = ["a red cube", "two dogs on a bench", "a photo of a cat", "a blue car"]


def make_tiny_hps(tmp_path: Path, python: str) -> tuple[Path, Path]:
    """Write the tiny config and a random 'HPS checkpoint' ({'state_dict': ...} with DDP
    'module.' prefixes, as the real files have), using the interpreter that has open_clip."""
    cfg = tmp_path / "margrpo-tiny-hps.json"
    cfg.write_text(json.dumps(TINY))
    ckpt = tmp_path / "hps_tiny.pt"
    code = (
        "import open_clip, torch, sys; open_clip.add_model_config(sys.argv[1]); torch.manual_seed(0);"
        "m = open_clip.create_model('margrpo-tiny-hps', pretrained=None);"
        "torch.save({'state_dict': {'module.' + k: v for k, v in m.state_dict().items()}}, sys.argv[2])"
    )
    import subprocess

    subprocess.run([python, "-c", code, str(cfg), str(ckpt)], check=True, timeout=300)
    return cfg, ckpt


def test_hps_in_process(tmp_path):
    pytest.importorskip("open_clip", reason="open_clip lives in .venvs/openclip (scripts/test_backends.sh)")
    cfg, ckpt = make_tiny_hps(tmp_path, sys.executable)
    reward = build_reward("hpsv2", checkpoint=str(ckpt), model_name="margrpo-tiny-hps",
                          model_config=str(cfg), batch_size=3)
    images = random_images(4, 40, 24)
    pix = reward.preprocess(images)
    assert pix.shape == (4, 3, 32, 32)
    # zero padding left/right of the resized 40x24 -> 32x19 image, in normalised units
    pad_value = (0 - 0.48145466) / 0.26862954
    assert torch.allclose(pix[:, 0, :, 0], torch.full((4, 32), pad_value), atol=1e-5)
    s = reward(images, PROMPTS, [{}] * 4)
    assert s.shape == (4,) and torch.isfinite(s).all() and (s.abs() <= 1).all()
    import open_clip

    m = reward.model
    tok = open_clip.get_tokenizer("margrpo-tiny-hps")(PROMPTS)
    with torch.no_grad():
        img = torch.nn.functional.normalize(m.encode_image(pix), dim=-1)
        txt = torch.nn.functional.normalize(m.encode_text(tok), dim=-1)
    torch.testing.assert_close(s, (img * txt).sum(-1), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(s, reward(images, PROMPTS[::-1], [{}] * 4))
    with pytest.raises(RuntimeError, match="Missing key|Unexpected key"):
        bad = tmp_path / "bad.pt"
        torch.save({"state_dict": {"nope": torch.zeros(1)}}, bad)
        build_reward("hpsv2", checkpoint=str(bad), model_name="margrpo-tiny-hps", model_config=str(cfg))


def test_hps_through_server_from_core(tmp_path):
    if not OPENCLIP_PY.exists():
        pytest.skip(f"{OPENCLIP_PY} missing: run scripts/setup_backend_env.sh openclip")
    cfg, ckpt = make_tiny_hps(tmp_path, str(OPENCLIP_PY))
    reward = build_reward("hpsv2", python=str(OPENCLIP_PY), checkpoint=str(ckpt),
                          model_name="margrpo-tiny-hps", model_config=str(cfg),
                          workdir=str(tmp_path / "w"))
    try:
        s = reward(random_images(4, 32, 32), PROMPTS, [{}] * 4)
        assert s.shape == (4,) and torch.isfinite(s).all() and s.std() > 0
    finally:
        reward.close()
