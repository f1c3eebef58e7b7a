"""Builders of tiny, randomly initialised models saved in the real on-disk layouts, so each
backend's real loading / preprocessing / tokenisation / scoring code runs on CPU in
seconds with no download. Skips (with the reason) when a needed package is missing."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from margrpo.rewards.clip_common import find_clip_bpe_gz, write_clip_tokenizer_files

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def need(module: str, how: str):
    """Skip the calling test unless `module` is importable here (how: what installs it)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this interpreter; {how}")


NEED_TRANSFORMERS = "pip install -e '.[transformers]' or run scripts/test_backends.sh"


def tiny_clip_dir(root: Path, projection_dim: int = 16, image_size: int = 32, seed: int = 0) -> Path:
    """A transformers CLIPModel + CLIPProcessor folder: 2-layer towers of width 32, the CLIP
    BPE vocabulary from the gz that open-clip-torch ships (byte-level fallback when none is
    installed anywhere), and a CLIP image processor at `image_size`."""
    import transformers

    out = root / "tiny_clip"
    tok_dir = root / "tiny_clip_tok_files"
    vocab_size = write_clip_tokenizer_files(tok_dir, find_clip_bpe_gz())
    # from_pretrained on vocab.json + merges.txt: the files a real CLIP repo ships.
    tokenizer = transformers.CLIPTokenizer.from_pretrained(str(tok_dir))
    image_processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    transformers.CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    torch.manual_seed(seed)
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=77,
                         eos_token_id=vocab_size - 1, bos_token_id=vocab_size - 2, pad_token_id=vocab_size - 1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=image_size, patch_size=8),
        projection_dim=projection_dim,
    )
    transformers.CLIPModel(cfg).save_pretrained(out)
    return out


LEGACY_PY = Path(__file__).resolve().parents[2] / ".venvs" / "legacy" / "bin" / "python"


def legacy_fixture(script: str, dst: Path) -> dict:
    """Run a tiny-model fixture script (tests/backends/<script>) in .venvs/legacy, which
    builds the model in dst and prints the reward params as its last line; skip when that
    venv is absent (it is built by scripts/setup_backend_env.sh legacy, not in CI)."""
    import json
    import subprocess

    if not LEGACY_PY.exists():
        pytest.skip(f"{LEGACY_PY} missing: run scripts/setup_backend_env.sh legacy")
    out = subprocess.run([str(LEGACY_PY), str(Path(__file__).with_name(script)), str(dst)],
                         check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def random_images(n: int, h: int = 40, w: int = 48, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, h, w, generator=g)
