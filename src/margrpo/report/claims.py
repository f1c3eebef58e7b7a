"""The claims table of method.md §6, decided from the measured numbers.

Rule (stated in the report): for a difference d between two groups of seeds, with
standard error se = sqrt(sa^2/na + sb^2/nb) (std over seeds, ddof=1), a part of a claim
"holds" if d > 2 se in the claimed direction, "does not hold" if d < -2 se (significant
the other way), and is "inconclusive" otherwise or with fewer than 2 seeds per group.
A claim holds if all its parts hold, does not hold if any part does not, else inconclusive.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from margrpo.config import BUDGET_DEFAULTS
from margrpo.stats import mean_std

HOLDS, FAILS, UNSURE = "holds", "does not hold", "inconclusive"
# Claims of method.md §6 that one study cannot decide, with the reason the report prints.
NOT_JUDGED = {
    4: ("k = 0.3 is the best trade-off; tau = 0 is best",
        "needs studies at other k and tau, which one `dvc repro` does not run: run them as experiments "
        "(dvc exp run --temp -S k=0.1, -S k=0.5, -S tau=0.5 ...) and compare them with python scripts/exp_table.py, "
        "which applies the same 2-standard-error rule across experiments"),
}
RULE = ("difference d of seed means vs its standard error se = sqrt(sa²/na + sb²/nb): "
        "holds if d > 2·se in the claimed direction, does not hold if d < −2·se, "
        "inconclusive otherwise or with < 2 seeds per group; a claim holds if every part holds "
        "and does not hold if any part does not")


@dataclass
class Part:
    text: str
    d: float | None = None
    se: float | None = None
    status: str = UNSURE

    def render(self) -> str:
        """One short evidence line: what is compared, the difference, 2 se, the verdict."""
        if self.d is None:
            return f"{self.text}: not measured"
        if self.se is None or math.isnan(self.se):
            return f"{self.text}: d {self.d:+.3f}, one seed ({self.status})"
        return f"{self.text}: d {self.d:+.3f}, 2se {2 * self.se:.3f} ({self.status})"


@dataclass
class Claim:
    number: int
    claim: str
    parts: list[Part] = field(default_factory=list)
    note: str = ""

    @property
    def status(self) -> str:
        statuses = [p.status for p in self.parts]
        if not statuses:
            return UNSURE
        if FAILS in statuses:
            return FAILS
        return HOLDS if all(s == HOLDS for s in statuses) else UNSURE


def _verdict(text: str, d: float, se: float) -> Part:
    return Part(text, d, se, HOLDS if d > 2 * se else FAILS if d < -2 * se else UNSURE)


def compare(text: str, better: list[float] | None, worse: list[float] | None) -> Part:
    """Part claiming mean(better) > mean(worse) (pass values negated for "lower is better")."""
    if not better or not worse:
        return Part(text)
    return compare_stats(text, mean_std(better), mean_std(worse))


def compare_stats(text: str, better: tuple[float, float, int], worse: tuple[float, float, int]) -> Part:
    """compare() from (mean, std with ddof=1, n) per group, e.g. a metrics.json's mean / std /
    replicates when the per-seed values are not at hand."""
    (mb, sb, nb), (mw, sw, nw) = better, worse
    if nb < 2 or nw < 2:
        return Part(text, mb - mw, math.nan, UNSURE)
    return _verdict(text, mb - mw, math.sqrt(sb ** 2 / nb + sw ** 2 / nw))


def one_sample(text: str, values: list[float] | None) -> Part:
    """Part claiming mean(values) > 0 (se = std / sqrt(n))."""
    if not values:
        return Part(text)
    m, sd, n = mean_std(values)
    if n < 2:
        return Part(text, m, math.nan, UNSURE)
    return _verdict(text, m, sd / math.sqrt(n))


def _neg(vals: list[float] | None) -> list[float] | None:
    return None if vals is None else [-v for v in vals]


def _speculative_claim(train: dict, evals: dict, methods: dict) -> Claim:
    """Claim 6 (method.md §3.3): the authors' speculative loss tokens add noise. Compares the
    committed-only frozen-head method with the one that differs only in token_scope."""
    c6 = Claim(6, "Scoring only committed tokens beats adding the consistency-filtered speculative tokens "
                  "(method.md §3.3; the authors' NOVA code adds them)")
    spec = next((m for m, c in methods.items() if "speculative" in c.get("token_scope", "")), None)
    committed = next((m for m, c in methods.items() if spec and c.get("token_scope", "committed") == "committed"
                      and all(c.get(k) == methods[spec].get(k) for k in ("freeze_head", "estimator"))), None)
    if not spec or not committed:
        c6.note = "needs a committed-only method and one that adds speculative tokens with the same head and estimator"
        return c6

    def tr(method, key):
        return train.get(method, {}).get("final", {}).get(key)

    snr_c, snr_f = tr(spec, "probe/snr_committed"), tr(spec, "probe/snr")
    c6.parts = [compare(f"GenEval overall, {committed} − {spec}", evals.get(committed, {}).get("eval/geneval/overall"),
                        evals.get(spec, {}).get("eval/geneval/overall")),
                compare(f"final reward, {committed} − {spec}", tr(committed, "reward/mean"), tr(spec, "reward/mean")),
                one_sample("gradient SNR on the same rollouts, committed only − with the filtered speculative tokens",
                           None if not snr_c or not snr_f else [a - b for a, b in zip(snr_c, snr_f)])]
    c6.note = (f"{spec} differs from {committed} only in token_scope; SNR from {spec}'s gradient probe "
               "(probe/snr_committed vs probe/snr, per seed mean over probe steps)")
    return c6


def build_claims(train: dict, evals: dict, methods: dict, timing: dict) -> list[Claim]:
    """train: method -> {'growth': {metric: [per seed]}, 'final': {metric: [per seed]}};
    evals: target -> {metric: [per replicate]}; methods: name -> MethodConfig dict;
    timing: method -> [time/step per seed]."""

    # Every comparison is at the same training budget and schedule: a method trained longer,
    # on larger batches or under its own LR schedule is in the report's tables, not the claims.
    methods = {m: c for m, c in methods.items() if all(c.get(k, v) == v for k, v in BUDGET_DEFAULTS.items())}

    def tr(method, kind, key):
        return train.get(method, {}).get(kind, {}).get(key)

    def ev(target, key):
        return evals.get(target, {}).get(key)

    claims = []
    c1 = Claim(1, "End-to-end GRPO on MAR is unstable: KL and gradient norm grow (reward saturates or collapses)")
    c1.parts = [one_sample("grpo KL, final − early window", tr("grpo", "growth", "loss/kl")),
                one_sample("grpo AR grad norm, final − early", tr("grpo", "growth", "diag/grad_norm_ar"))]
    drop = tr("grpo", "final", "reward/peak_drop")
    c1.note = "" if not drop else f"reward drop from peak (final window vs best step): {sum(drop) / len(drop):.3f}"
    claims.append(c1)

    frozen = next((m for m, c in methods.items() if c.get("freeze_head") and c.get("estimator") == "single"), None)
    other = frozen or next((m for m, c in methods.items() if c.get("freeze_head")), None)
    c2 = Claim(2, "Freezing the diffusion head stabilises training")
    if other:
        c2.parts = [compare(f"final KL, grpo − {other}", _neg(tr(other, "final", "loss/kl")), _neg(tr("grpo", "final", "loss/kl"))),
                    compare(f"AR grad-norm growth, grpo − {other}", _neg(tr(other, "growth", "diag/grad_norm_ar")),
                            _neg(tr("grpo", "growth", "diag/grad_norm_ar")))]
        if not frozen:
            c2.note = f"{other} also uses MTE: head freezing and MTE are confounded (add a frozen-head single-estimator method to separate them)"
    claims.append(c2)

    mte = next((m for m, c in methods.items() if c.get("estimator") not in (None, "single")), None)
    c3 = Claim(3, "MTE reduces gradient variance and improves reward and benchmark scores")
    if mte:
        ratio = tr(mte, "final", "probe/var_ratio_vs_single")
        # Against the frozen-head single-chain method when the study has one: it differs from
        # the MTE method only in the estimate and selection, so the comparison isolates MTE.
        ref = frozen or "grpo"
        c3.parts = [one_sample(f"{mte} gradient-noise variance, 1 − ratio to single chain",
                               None if ratio is None else [1 - r for r in ratio]),
                    compare(f"final reward, {mte} − {ref}", tr(mte, "final", "reward/mean"), tr(ref, "final", "reward/mean")),
                    compare(f"GenEval overall, {mte} − {ref}", ev(mte, "eval/geneval/overall"), ev(ref, "eval/geneval/overall")),
                    compare(f"T2I mean, {mte} − {ref}", ev(mte, "eval/t2i/mean"), ev(ref, "eval/t2i/mean"))]
        c3.note = ("variance from the trainer's gradient probe (probe/var_ratio_vs_single); reward and scores compare against "
                   + (f"{ref}, which freezes the head too" if frozen else "grpo, which also differs in head freezing"))
    claims.append(c3)

    c5 = Claim(5, "MAR-GRPO beats the base model and vanilla GRPO on compositional benchmarks at little extra compute")
    if "mar_grpo" in evals:
        for metric in ("eval/geneval/overall", "eval/geneval/position", "eval/t2i/mean", "eval/t2i/spatial", "eval/t2i/complex"):
            for ref in ("base", "grpo"):
                if ev("mar_grpo", metric) is not None and ev(ref, metric) is not None:
                    c5.parts.append(compare(f"{metric.removeprefix('eval/')}, mar_grpo − {ref}", ev("mar_grpo", metric), ev(ref, metric)))
        t_m, t_g = timing.get("mar_grpo"), timing.get("grpo")
        if t_m and t_g:
            c5.note = (f"time per step mar_grpo / grpo = {(sum(t_m) / len(t_m)) / (sum(t_g) / len(t_g)):.2f}; "
                       "preference metrics are not measured here (world reward only)")
    claims.append(c5)
    claims.append(_speculative_claim(train, evals, methods))
    return claims
