"""Word-level prompt tokenizer over a vocabulary the model is given (and saves with itself).

Convention: vocab[0] pads, vocab[1] is the null prompt of classifier-free guidance; every
other entry is a word. A prompt is split on whitespace; each word must be in the vocabulary
(a clear error names the word otherwise). The empty prompt is the null prompt
[null, pad, pad, ...]. Which vocabulary to use is the caller's business (the embedded study
passes margrpo.world.grammar.VOCAB); the model stores it in its config, so a checkpoint
tokenizes with the words it was trained on.
"""
from __future__ import annotations

from typing import Sequence

import torch

PAD_ID, NULL_ID = 0, 1


class WordTokenizer:
    def __init__(self, vocab: Sequence[str], max_len: int):
        if len(vocab) < 3 or len(set(vocab)) != len(vocab):
            raise ValueError("the vocabulary needs a pad token, a null token and at least one word, "
                             f"all distinct; got {len(vocab)} entries ({len(set(vocab))} distinct)")
        self.vocab = list(vocab)
        self.words = self.vocab[2:]
        self.max_len = int(max_len)
        self._ids = {w: i for i, w in enumerate(self.words, start=2)}

    def encode(self, prompt: str) -> list[int]:
        """Word ids padded with PAD_ID to max_len."""
        words = prompt.split()
        if not words:
            return [NULL_ID] + [PAD_ID] * (self.max_len - 1)
        for w in words:
            if w not in self._ids:
                raise ValueError(f"unknown word {w!r} in prompt {prompt!r}; vocabulary: {self.words}")
        if len(words) > self.max_len:
            raise ValueError(f"prompt has {len(words)} words, more than max_len={self.max_len}: {prompt!r}")
        return [self._ids[w] for w in words] + [PAD_ID] * (self.max_len - len(words))

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.vocab[i] for i in ids if i not in (PAD_ID, NULL_ID))

    def __call__(self, prompts: Sequence[str]) -> torch.Tensor:
        """Word ids [B, max_len], int64."""
        return torch.tensor([self.encode(p) for p in prompts], dtype=torch.long)
