"""The FLOP accounting of benchmarks/step_time.py --flops (margrpo/benchtools.py; docs/method.md
"What MTE costs"): the head's split into a shared conditioning and a per-chain part covers the whole
head, and the uncertainty chains are all that mar_grpo's batch adds to grpo_frozen's."""
from __future__ import annotations

from pathlib import Path

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from conftest import TINY, randomize_head
from margrpo.benchtools import count_flops, head_flops
from margrpo.config import parse_params
from margrpo.training.trainer import Trainer
from margrpo.world.grammar import VOCAB
from margrpo.world.prompts import make_prompt_set

ROOT = Path(__file__).resolve().parents[1]


def study_methods_params():
    """TINY sizes with the study's own methods (params.yaml's grpo_frozen and resample mar_grpo)."""
    study = yaml.safe_load((ROOT / "params.yaml").read_text())
    return parse_params(dict(TINY, methods=study["methods"]), "test_bench_flops", {})


def trainer(params, method: str) -> Trainer:
    from margrpo.models.loading import new_model

    torch.manual_seed(0)
    policy = randomize_head(new_model(params, VOCAB))
    return Trainer.from_params(params, method, 0, make_prompt_set("train", 2, seed=0), policy=policy)


def test_head_split_covers_the_whole_head():
    params = study_methods_params()
    policy = trainer(params, "grpo_frozen").policy
    cond, apply = head_flops(policy)
    t = torch.full((3,), policy.sampler.time_input(0))
    x, z = torch.randn(3, policy.token_dim), torch.randn(3, params.model.cond_dim)
    with torch.no_grad(), FlopCounterMode(display=False) as whole:
        policy.head_output(x, t, z)
    assert cond > 0 and apply > 0
    assert whole.get_total_flops() == 3 * (cond + apply)


def test_uncertainty_chains_are_what_mar_grpo_adds_to_the_batch():
    params = study_methods_params()
    frozen, mar = trainer(params, "grpo_frozen"), trainer(params, "mar_grpo")
    (c0, l0, _), (c1, l1, batch) = count_flops(frozen), count_flops(mar)
    _, apply = head_flops(mar.policy)
    rows = sum(p.n_committed for p in batch.plans) * len(batch.adv)  # committed tokens at the loss AR steps
    m, t_head = params.num_trajectories, mar.policy.sampler.num_steps
    assert c1 - c0 == m * t_head * 2 * rows * apply  # M chains x T head steps x (prompt, null) rows
    assert l1 > l0  # the loss scores the selected tokens' M chains too
