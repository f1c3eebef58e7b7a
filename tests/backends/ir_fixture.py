"""Writes a tiny ImageReward weight set: med_config.json (1-layer BERT, width 768 as the head
needs), a bert tokenizer folder with a 20-word vocabulary, and ImageReward.pt from the
package's own model class with the head re-initialised (the package's init std is so small
that a random model scores every image the same). Run in the env that has image-reward:
    python tests/backends/ir_fixture.py OUT_DIR
The BLIP image encoder stays ViT-L/16 (the package hard-codes it): ~300 M random weights."""
from __future__ import annotations

import json
import sys
from pathlib import Path

WORDS = ["a", "red", "cube", "two", "dogs", "on", "bench", "photo", "of", "cat", "blue", "car"]


def write(out: Path) -> dict[str, str]:
    import importlib

    import torch
    import transformers
    from ImageReward.models.BLIP import blip_pretrain

    # the package's __init__ shadows the module name with the class: fetch the module
    ir = importlib.import_module("ImageReward.ImageReward")

    out.mkdir(parents=True, exist_ok=True)
    bert = out / "bert"
    bert.mkdir(exist_ok=True)
    (bert / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    (bert / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    med = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.0, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.0, "hidden_size": 768, "initializer_range": 0.02,
           "intermediate_size": 64, "layer_norm_eps": 1e-12, "max_position_embeddings": 64,
           "model_type": "bert", "num_attention_heads": 4, "num_hidden_layers": 1, "pad_token_id": 0,
           "type_vocab_size": 2, "vocab_size": 5 + len(WORDS) + 2, "encoder_width": 1024,
           "add_cross_attention": True}
    (out / "med_config.json").write_text(json.dumps(med))

    def tok():
        t = transformers.BertTokenizer.from_pretrained(str(bert))
        t.add_special_tokens({"bos_token": "[DEC]"})
        t.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
        t.enc_token_id = t.additional_special_tokens_ids[0]
        return t

    orig, blip_pretrain.init_tokenizer = blip_pretrain.init_tokenizer, tok
    try:
        torch.manual_seed(0)
        model = ir.ImageReward(device="cpu", med_config=str(out / "med_config.json"))
    finally:
        blip_pretrain.init_tokenizer = orig
    for name, p in model.mlp.named_parameters():
        torch.nn.init.normal_(p, std=0.2) if "weight" in name else torch.nn.init.zeros_(p)
    torch.save(model.state_dict(), out / "ImageReward.pt")
    return {"checkpoint": str(out / "ImageReward.pt"), "med_config": str(out / "med_config.json"),
            "bert_tokenizer": str(bert)}


if __name__ == "__main__":
    print(json.dumps(write(Path(sys.argv[1]))))
