"""The consistency filter's score (method.md §3.3): cosine of tokens centred on the policy's
reference value, its rules, its tau, and the per-step diagnostics of the token plan."""
from __future__ import annotations

import pytest
import torch

from margrpo.models.mar import TINY_CONSISTENCY_REFERENCE
from margrpo.hostsync import read_all
from margrpo.method.plan import CONSISTENCY_KEYS, loss_tokens, plan_tokens
from margrpo.training.stepstats import plan_stats, stat_tensors
from margrpo.models.chains import ChainScorer
from margrpo.method.selection import (DIAG_QUANTILES, DIAG_TAUS, consistency_diagnostics, consistency_keep,
                                  consistency_score, content_cos, loss_token_mask)
from conftest import tiny_params

R = TINY_CONSISTENCY_REFERENCE
P = 8  # TinyMAR patch side: tokens are [3 * P * P] with (c, y, x) inside, value = 2 * pixel - 1


def token(rgb=(1.0, 1.0, 1.0), rows: int = P) -> torch.Tensor:
    """One pixel-patch token [3 * P * P]: white background with its top `rows` rows painted
    in pixel colour rgb (in [0, 1])."""
    px = torch.ones(3, P, P)
    px[:, :rows] = torch.tensor(rgb).view(3, 1, 1)
    return (px * 2 - 1).reshape(-1)


BLANK = token()
RED = token((0.90, 0.10, 0.10))
BLUE = token((0.15, 0.25, 0.95))
HALF_RED = token((0.90, 0.10, 0.10), rows=P // 2)


def score(a: torch.Tensor, b: torch.Tensor, reference=R) -> float:
    return content_cos(a.view(1, 1, -1), b.view(1, 1, -1), reference).item()


def test_centred_score_compares_what_tokens_depict():
    assert score(BLANK, BLANK) == pytest.approx(1.0)
    assert score(RED, RED) == pytest.approx(1.0)
    assert score(RED, BLANK) < -0.5 and score(BLUE, BLANK) < -0.5  # object vs background disagree
    # another colour, or the same ink over half the patch, lies in between
    for other in (BLUE, HALF_RED):
        assert score(RED, BLANK) < score(RED, other) < 0.5
    # the raw cosine (reference 0) calls a half-inked patch and a blank one similar, and
    # ranks a red vs a blue patch below a red patch vs background
    assert score(HALF_RED, BLANK, 0.0) > 0.4 and score(HALF_RED, BLANK) < 0.0
    assert score(RED, BLUE, 0.0) < score(RED, BLANK, 0.0)


def test_tau_changes_the_kept_set():
    final = torch.stack([BLANK, RED, RED, RED, BLANK]).unsqueeze(0)  # [1, 5, D]
    spec = torch.stack([BLANK, HALF_RED, BLUE, BLANK, HALF_RED]).unsqueeze(0)
    none = torch.zeros(1, 5, dtype=torch.bool)
    s = consistency_score(spec, final, "paper", reference=R)[0]
    assert s[0] > 0.5 > s[1] > s[2] > 0.0 > s[4] > s[3] > -1.0
    keep = {t: consistency_keep(spec, final, t, "paper", none, reference=R)[0].tolist() for t in DIAG_TAUS}
    assert keep == {-1.0: [True] * 5, 0.0: [True, True, True, False, False], 0.5: [True, False, False, False, False]}
    # the raw cosine keeps the half-inked prediction of a blank token at tau = 0
    assert consistency_keep(spec, final, 0.0, "paper", none)[0].tolist() == [True, True, False, False, True]


def test_reference_default_is_the_plain_cosine():
    g = torch.Generator().manual_seed(0)
    spec, final, prev = (torch.randn(2, 5, 6, generator=g) for _ in range(3))
    none = torch.zeros(2, 5, dtype=torch.bool)
    raw = torch.nn.functional.cosine_similarity(spec, final, dim=-1)
    assert torch.allclose(consistency_score(spec, final, "paper"), raw)
    for rule in ("paper", "code"):
        for tau in (-0.3, 0.0, 0.4):
            assert torch.equal(consistency_keep(spec, final, tau, rule, none, prev),
                               consistency_keep(spec, final, tau, rule, none, prev, reference=0.0))
    # a [D] reference works like a scalar one repeated
    assert torch.allclose(consistency_score(spec, final, "paper", reference=0.3),
                          consistency_score(spec, final, "paper", reference=torch.full((6,), 0.3)))


def test_code_rule_scores_the_improvement_of_the_centred_cosine():
    final = torch.stack([RED, RED, BLANK]).unsqueeze(0)
    prev = torch.stack([BLANK, RED, RED]).unsqueeze(0)
    spec = torch.stack([RED, BLANK, BLANK]).unsqueeze(0)
    s = consistency_score(spec, final, "code", prev, R)[0]
    want = [1.0 - score(BLANK, RED), score(BLANK, RED) - 1.0, 1.0 - score(RED, BLANK)]
    assert s.tolist() == pytest.approx(want, abs=1e-5)
    committed = torch.tensor([[False, True, False]])
    assert consistency_keep(spec, final, 0.0, "code", committed, prev, R).tolist() == [[True, True, True]]
    none = torch.zeros_like(committed)
    assert consistency_keep(spec, final, 0.0, "code", none, prev, R).tolist() == [[True, False, True]]
    # step 0 (no previous prediction): the paper rule's score
    assert torch.equal(consistency_score(spec, final, "code", None, R),
                       consistency_score(spec, final, "paper", None, R))


def test_diagnostics_kept_fractions_and_quantiles():
    s = torch.linspace(-1.0, 1.0, 101).view(1, -1)
    d = consistency_diagnostics(s).tolist()
    kept, q = d[: len(DIAG_TAUS)], d[len(DIAG_TAUS):]
    assert kept == pytest.approx([(s > t).float().mean().item() for t in DIAG_TAUS])
    assert q == pytest.approx([2 * p - 1 for p in DIAG_QUANTILES], abs=1e-6)


def test_tiny_mar_exposes_its_reference(tiny_model):
    assert tiny_model.consistency_reference == R
    assert 0.0 < R < 1.0  # a grey between object ink and the white background (+1)


def test_loss_tokens_logs_diagnostics_without_changing_the_tokens(tiny_model):
    spec = {"methods.spec.freeze_head": True, "methods.spec.token_scope": "committed+speculative",
            "methods.spec.consistency": True}
    method = tiny_params(**spec).method("spec")
    ro = tiny_model.rollout(["a red circle", "two blue squares"], seeds=torch.tensor([1, 2]),
                            speculative_steps=range(tiny_model.num_ar_steps))
    hs = torch.tensor([0, 1])
    scorer = ChainScorer(tiny_model, ro.cfg_scale)
    for i in range(tiny_model.num_ar_steps - 1):
        plan = plan_tokens(scorer, ro, [i], [hs], method)[0]
        stats = plan_stats([plan], read_all(stat_tensors([plan])))[0]
        st = ro.steps[i]
        assert sorted(stats) == sorted(CONSISTENCY_KEYS)
        # the loss tokens are those of the filter alone
        committed = torch.zeros(2, tiny_model.num_tokens, dtype=torch.bool).scatter_(1, st.commit_idx, True)
        prev = ro.steps[i - 1].speculative if i else None
        keep = consistency_keep(st.speculative, ro.tokens, method.tau, "paper", committed, prev, R)
        full = loss_token_mask(committed, keep, method.token_scope, st.known)
        assert torch.equal(plan.mask, torch.gather(full, 1, plan.positions))
        kept = [stats[f"select/consistency_kept_tau{t:g}"] for t in DIAG_TAUS]
        assert kept == sorted(kept, reverse=True)
        assert stats["select/consistency_frac"] == pytest.approx(stats["select/consistency_kept_tau0"])
        qs = [stats[f"select/consistency_score_q{round(100 * q)}"] for q in DIAG_QUANTILES]
        assert qs == sorted(qs) and -1.0 <= qs[0] and qs[-1] <= 1.0
    # the last step has no speculative tokens, so no statistics
    assert loss_tokens(ro, tiny_model.num_ar_steps - 1, hs, method, R).stat_values is None
    last = plan_tokens(scorer, ro, [tiny_model.num_ar_steps - 1], [hs], method)
    assert plan_stats(last, read_all(stat_tensors(last))) == [{}]
    # the plan uses the policy's reference
    first = plan_tokens(scorer, ro, [0], [hs], method)
    [stats] = plan_stats(first, read_all(stat_tensors(first)))
    assert stats == dict(zip(CONSISTENCY_KEYS, loss_tokens(ro, 0, hs, method, R).stat_values.tolist()))
    assert stats != dict(zip(CONSISTENCY_KEYS, loss_tokens(ro, 0, hs, method, 0.0).stat_values.tolist()))
