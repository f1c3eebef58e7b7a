"""Writes a tiny, randomly initialised CLIP-FlanT5 weight set in the layout t2v-metrics 1.2
loads, so VQAScore's real loading / prompting / tokenisation / scoring code runs on CPU:

    OUT/tower/      transformers CLIPVisionModel (2 layers, width 32, 32 px, patch 8 -> 16
                    patch tokens) + CLIPImageProcessor at 32 px
    OUT/tokenizer/  a T5 sentencepiece tokenizer (spiece.model, unigram, ~160 pieces,
                    T5's ids pad 0 / eos 1 / unk 2), trained here on the prompt template
    OUT/model/      the package's CLIPT5ForConditionalGeneration (1+1 layer T5, d_model 32,
                    gated-gelu as Flan-T5) whose config.json `mm_vision_tower` is OUT/tower

Run in the env that has t2v-metrics (.venvs/legacy): `python tests/backends/vqa_fixture.py OUT`
prints the reward params as JSON on its last line. Nothing is downloaded.
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

# Text the tokenizer is trained on: the system message + question template the package
# wraps every prompt in, the answer, and the test prompts (so pieces are not all bytes).
CORPUS = [
    "A chat between a curious user and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the user's questions.",
    "USER: Does this figure show \"a red cube\"? Please answer yes or no. ASSISTANT: Yes",
    "a red cube", "two dogs on a bench", "a photo of a cat", "a blue car behind a tree",
    "Yes", "No", "yes", "no",
] + ["Yes"] * 10  # frequent enough to become one piece, '▁Yes', as in Flan-T5's vocabulary
VOCAB = 160


def train_spiece(path: Path) -> None:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20), model_writer=buf, vocab_size=VOCAB,
        model_type="unigram", hard_vocab_limit=False, character_coverage=1.0,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1,  # T5's special ids (no BOS)
        minloglevel=2, num_threads=1,
    )
    path.write_bytes(buf.getvalue())


def write(out: Path) -> dict[str, str]:
    import torch
    import transformers
    from t2v_metrics.models.vqascore_models.clip_t5.model import CLIPT5Config, CLIPT5ForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    tower, tok_dir, model_dir = out / "tower", out / "tokenizer", out / "model"

    torch.manual_seed(0)
    vcfg = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, image_size=32, patch_size=8)
    transformers.CLIPVisionModel(vcfg).save_pretrained(tower)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32},
                                    crop_size={"height": 32, "width": 32}).save_pretrained(tower)

    tok_dir.mkdir(exist_ok=True)
    train_spiece(tok_dir / "spiece.model")
    # extra_ids=0: no <extra_id_*> sentinels (unused for scoring), keeps the vocab tiny.
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "legacy": True, "model_max_length": 2048}))
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir), use_fast=False)

    cfg = CLIPT5Config(
        vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
        num_heads=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0,
        # the fields a released clip-flant5 config.json carries for its vision side
        mm_vision_tower=str(tower.resolve()), mm_hidden_size=32, mm_projector_type="mlp2x_gelu",
        mm_vision_select_layer=-2, mm_vision_select_feature="patch", use_mm_proj=True,
    )
    torch.manual_seed(1)
    model = CLIPT5ForConditionalGeneration(cfg)  # builds + loads the tower from `tower`
    # T5's default lm_head init (std 1) gives logits of std ~6 and scores ~1e-20; std 0.3
    # keeps the scores in a readable range (~1e-3..1e-1) that still varies with image + text.
    torch.nn.init.normal_(model.lm_head.weight, std=0.3)
    # safetensors refuses the package's extra alias `embed_tokens` of the shared embedding
    model.save_pretrained(model_dir, safe_serialization=False)
    return {"model_path": str(model_dir), "tokenizer_path": str(tok_dir),
            "vision_tower_path": str(tower)}


if __name__ == "__main__":
    print(json.dumps(write(Path(sys.argv[1]))))
