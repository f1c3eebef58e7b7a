"""Shared helpers of the real reward backends: start-up checks, devices, image conversion,
offline mode, and the CLIP BPE tokenizer files built from the gz vocabulary.

Only light imports here (stdlib, torch, numpy, PIL): every backend module imports this at
module level, and the core must never import transformers / open_clip by accident.
"""
from __future__ import annotations

import gzip
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

# OpenAI CLIP normalisation (used by CLIP, HPS, PickScore's processor, the aesthetic head).
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def set_offline() -> None:
    """Forbid hub downloads: every backend must read its weights from explicit local paths."""
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[key] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def require_module(module: str, backend: str, extra: str) -> Any:
    """Import `module` or fail with the install command for the backend's extra / env."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"reward backend {backend!r} needs the Python package {module!r}, which is not "
            f"importable in {sys.executable} ({exc}). Install it with: {extra}"
        ) from exc


def require_paths(backend: str, extra: str, **params: str | os.PathLike | None) -> dict[str, Path]:
    """Check every `param=path` exists; the error names the path, the param and the extra.

    Backends call this first thing, before importing or loading anything heavy, so a wrong
    params.yaml fails in milliseconds with a message that says what to fix.
    """
    out: dict[str, Path] = {}
    for param, value in params.items():
        if value is None or str(value) == "":
            raise FileNotFoundError(
                f"reward backend {backend!r}: param {param!r} is not set. Put the local path "
                f"of the weights in params.yaml under rewards[].{param} (weights are never "
                f"downloaded; backend install: {extra})."
            )
        path = Path(os.path.expanduser(str(value)))
        if not path.exists():
            raise FileNotFoundError(
                f"reward backend {backend!r}: {path} (param rewards[].{param}) does not exist. "
                f"Place the weights there or set rewards[].{param} in params.yaml to where they "
                f"are (backend install: {extra})."
            )
        out[param] = path
    return out


def pick_device(device: str | None = "auto") -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(device: torch.device, dtype: str | None = "auto") -> torch.dtype:
    """bf16 on GPU (the reward backends' inference precision), float32 on CPU unless asked otherwise."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
            "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}[dtype]


def chunks(n: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n, max(1, int(batch_size))):
        yield slice(start, min(n, start + int(batch_size)))


def check_batch(images: torch.Tensor, prompts: Sequence[str]) -> None:
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W] RGB in [0, 1], got {tuple(images.shape)}")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")


def batched_scores(images: torch.Tensor, prompts: Sequence[str], batch_size: int,
                   score: Callable[[slice], torch.Tensor]) -> torch.Tensor:
    """Scores [B] on the CPU: check the batch, then score(slice) of at most batch_size
    images at a time (each call returns that slice's [n] scores on the CPU)."""
    check_batch(images, prompts)
    out = [score(sl) for sl in chunks(images.shape[0], batch_size)]
    return torch.cat(out) if out else torch.zeros(0)


def to_uint8_hwc(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] floats in [0, 1] -> [B, H, W, 3] uint8 (what a PNG would hold)."""
    arr = images.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8)
    return arr.permute(0, 2, 3, 1).cpu().numpy()


def to_pil(images: torch.Tensor) -> list:
    from PIL import Image

    return [Image.fromarray(a) for a in to_uint8_hwc(images)]


def resize_pad_square(images: torch.Tensor, size: int, fill: float = 0.0) -> torch.Tensor:
    """HPS preprocessing on [B, 3, H, W] in [0, 1]: bicubic resize so the long side is
    `size`, then pad the short side symmetrically with `fill` to a `size` x `size` square."""
    _, _, h, w = images.shape
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    x = torch.nn.functional.interpolate(
        images.float(), size=(nh, nw), mode="bicubic", align_corners=False, antialias=True
    ).clamp(0, 1)
    top, left = (size - nh) // 2, (size - nw) // 2
    return torch.nn.functional.pad(
        x, (left, size - nw - left, top, size - nh - top), value=fill
    )


def normalize(images: torch.Tensor, mean=OPENAI_MEAN, std=OPENAI_STD) -> torch.Tensor:
    m = torch.tensor(mean, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    return (images - m) / s


def _bytes_to_unicode() -> dict[int, str]:
    # The GPT-2 / CLIP byte-level alphabet: printable bytes map to themselves, the others
    # to code points from 256 up, so every byte has a visible, unambiguous symbol. Order
    # matters (it fixes token ids): the printable bytes first, then the rest ascending.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    mapping = {b: chr(b) for b in keep}
    rest = [b for b in range(256) if b not in mapping]
    for extra, b in enumerate(rest):
        mapping[b] = chr(256 + extra)
    return mapping


def clip_vocab_from_merges(merges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """CLIP's vocabulary order: 256 byte symbols, the same with the end-of-word mark, one
    token per merge, then the two special tokens (49408 entries with the full merge list)."""
    symbols = list(_bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(tokens)}


def read_bpe_merges(gz_path: str | os.PathLike, n_merges: int | None = None) -> list[tuple[str, str]]:
    """Merges of `bpe_simple_vocab_16e6.txt.gz` (skip the version line; CLIP uses the first
    49152 - 256 - 2 = 48894 merges)."""
    lines = gzip.open(gz_path, "rt", encoding="utf-8").read().split("\n")
    n = (49152 - 256 - 2) if n_merges is None else n_merges
    return [tuple(line.split()) for line in lines[1 : n + 1]]  # type: ignore[misc]


def write_clip_tokenizer_files(
    out_dir: str | os.PathLike, gz_path: str | os.PathLike | None, n_merges: int | None = None
) -> int:
    """Write `vocab.json` + `merges.txt` for transformers' CLIPTokenizer into `out_dir`.

    gz_path None builds a byte-level tokenizer with no merges (514 tokens): same format,
    used by tests when no CLIP gz file is installed anywhere. Returns the vocabulary size.
    """
    merges = read_bpe_merges(gz_path, n_merges) if gz_path else []
    vocab = clip_vocab_from_merges(merges)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    with open(out / "merges.txt", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    return len(vocab)


def find_clip_bpe_gz() -> Path | None:
    """The CLIP BPE gz shipped inside open-clip-torch or clip-anytorch, found without
    importing either (their import needs torchvision). MARGRPO_CLIP_BPE overrides."""
    env = os.environ.get("MARGRPO_CLIP_BPE")
    if env and Path(env).is_file():
        return Path(env)
    name = "bpe_simple_vocab_16e6.txt.gz"
    for pkg in ("open_clip", "clip"):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            if (Path(loc) / name).is_file():
                return Path(loc) / name
    root = Path(__file__).resolve().parents[3] / ".venvs"
    for cand in sorted(root.glob(f"*/lib/python*/site-packages/open_clip/{name}")):
        return cand
    return None


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine of [B, D] embeddings, in float32."""
    a = torch.nn.functional.normalize(a.float(), dim=-1)
    b = torch.nn.functional.normalize(b.float(), dim=-1)
    return (a * b).sum(-1)
