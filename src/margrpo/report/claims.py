"""The claims table of method.md §6, decided from the measured numbers.

Two rules (both stated in the report, RULE):

- Score parts (GenEval, T2I-CompBench) where the evaluate stage wrote per-prompt scores
  (reports/eval/<target>/per_prompt.json): the paired bootstrap interval of the
  difference over seeds and prompts (report/intervals.py). "holds" if the 95% interval
  lies above 0 in the claimed direction, "does not hold" if it lies below 0, "no
  difference larger than δ" if it lies within (−δ, +δ), δ = DELTA, else "inconclusive"
  (with the seeds the comparison would need: intervals.seeds_needed).
- Training-curve parts (KL, gradient norm, reward, gradient probes: no prompts to
  resample), and score parts of records without per-prompt scores: for a difference d
  between two groups of seeds, with standard error se = sqrt(sa^2/na + sb^2/nb) (std
  over seeds, ddof=1), "holds" if d > 2 se in the claimed direction, "does not hold" if
  d < -2 se, and "inconclusive" otherwise (with the seeds per group beyond which the measured
  d would exceed 2 se: an even chance of a decision if the true difference is d) or with
  fewer than 2 seeds per group.

A claim does not hold if any part does not hold, holds if every part holds, is "no
difference larger than δ" if every score part is, else inconclusive.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from margrpo.config import BUDGET_DEFAULTS
from margrpo.report.intervals import DRAWS, LEVEL, Interval, score_interval, seeds_needed
from margrpo.stats import mean_std

HOLDS, FAILS, UNSURE = "holds", "does not hold", "inconclusive"
NO_DIFF = "no difference larger than δ"
# The smallest score difference the study cares about (GenEval / T2I scores in [0, 1]): an
# interval inside ±DELTA shows the methods equal for practical purposes.
DELTA = 0.03
# Seed counts above this print as "> MAX_SEEDS": past it the count only says "unreachable".
MAX_SEEDS = 1000
# reports/summary.json's numeric coding of a claim's status (`dvc metrics diff` compares numbers).
STATUS_CODE = {HOLDS: 1, UNSURE: 0, FAILS: -1, NO_DIFF: 2}
CLAIM4 = "k = 0.3 is the best trade-off; tau = 0 is best"
# Claims of method.md §6 that one study cannot decide, with the reason the report prints.
# Claim 4 is judged once the ablation experiments have committed records (reports/ablation/).
NOT_JUDGED = {
    4: (CLAIM4,
        "needs studies at other k and tau, which one `dvc repro` does not run: python scripts/ablation.py queues "
        "them as DVC experiments and commits their results to reports/ablation/, from which this report judges "
        "it (docs/ablation.md)"),
}
RULE = (f"score parts (GenEval, T2I) with per-prompt scores: the paired bootstrap interval of the difference d "
        f"({DRAWS} draws resampling seeds and, independently, prompts within each tag or category; "
        f"{LEVEL:.0%} percentile interval): holds if the interval lies above 0 in the claimed direction, "
        f"does not hold if it lies below 0, {NO_DIFF} if it lies within (−δ, +δ) with δ = {DELTA}, "
        f"inconclusive otherwise, with the seeds that would narrow the interval to a half-width below δ/2 "
        f"(enough to exclude 0 or to lie within ±δ whatever d), assuming the measured seed-to-seed variance and "
        f"the same prompts; training-curve parts (KL, gradient norm, reward, gradient probes), and score parts "
        f"without per-prompt scores: d of seed means vs its standard error se = sqrt(sa²/na + sb²/nb), "
        f"holds if d > 2·se in the claimed direction, does not hold if d < −2·se, inconclusive otherwise (with the "
        f"seeds per group beyond which the measured d would exceed 2·se, 4·(sa² + sb²)/d², or 4·s²/d² for one "
        f"group: an even chance of a decision if the true difference is d) or with < 2 seeds per group; "
        f"a claim does not hold if any part does not hold, holds if every part holds, "
        f"is {NO_DIFF} if every score part is, and is inconclusive otherwise")


@dataclass
class Part:
    text: str
    d: float | None = None
    se: float | None = None
    status: str = UNSURE
    score: bool = False  # a benchmark-score part (the claim's "no difference" reads these)
    interval: Interval | None = None  # the bootstrap interval of d (score parts with per-prompt scores)
    # Seed-rule parts: seeds per group that would make 2 se < |d| at the measured d and spread
    # (None where the replicates are not seeds, e.g. the blocks of one run).
    needed: float | None = None

    def render(self) -> str:
        """One short evidence line: what is compared, the difference, 2 se or the interval,
        the verdict (and the seeds an inconclusive interval would need)."""
        if self.d is None:
            return f"{self.text}: not measured"
        if self.interval is not None:
            iv, extra = self.interval, ""
            if self.status == UNSURE:
                n = seeds_needed(iv, DELTA)
                extra = ("; one seed: seeds needed unknown" if n is None
                         else f"; more seeds alone do not reach ±{DELTA} (prompt spread)" if math.isinf(n)
                         else f"; ~{int(n)} seeds for ±{DELTA}")
            return f"{self.text}: d {iv.cell(signed=True)} ({self.status}{extra})"
        if self.se is None or math.isnan(self.se):
            return f"{self.text}: d {self.d:+.3f}, one seed ({self.status})"
        extra = ""
        if self.status == UNSURE and self.needed is not None:
            n = self.needed
            extra = ("; no difference measured" if not math.isfinite(n)
                     else f"; > {MAX_SEEDS} seeds per group for 2se < |d|" if n >= MAX_SEEDS
                     else f"; {math.floor(n) + 1} seeds per group for 2se < |d|")
        return f"{self.text}: d {self.d:+.3f}, 2se {2 * self.se:.3f} ({self.status}{extra})"


@dataclass
class Claim:
    number: int
    claim: str
    parts: list[Part] = field(default_factory=list)
    note: str = ""

    @property
    def status(self) -> str:
        statuses = [p.status for p in self.parts]
        scores = [p.status for p in self.parts if p.score]
        if not statuses:
            return UNSURE
        if FAILS in statuses:
            return FAILS
        if all(s == HOLDS for s in statuses):
            return HOLDS
        return NO_DIFF if scores and all(s == NO_DIFF for s in scores) else UNSURE


@dataclass
class BestClaim(Claim):
    """A claim that one setting is the best of several, from parts "this setting − another":
    does not hold if another is better (a part does not hold), holds if every other is worse
    or within ±δ and at least one is worse, is "no difference larger than δ" if all are within
    ±δ, and is inconclusive if any part is."""

    @property
    def status(self) -> str:
        statuses = [p.status for p in self.parts]
        if not statuses or UNSURE in statuses and FAILS not in statuses:
            return UNSURE
        if FAILS in statuses:
            return FAILS
        return NO_DIFF if all(s == NO_DIFF for s in statuses) else HOLDS


def _verdict(text: str, d: float, se: float) -> Part:
    return Part(text, d, se, HOLDS if d > 2 * se else FAILS if d < -2 * se else UNSURE)


def interval_verdict(iv: Interval, delta: float = DELTA) -> str:
    """The score rule on the interval of better − worse. One seed: inconclusive, as in the
    seed rule. Its interval resamples prompts only, and where the prompts are the whole
    split it has no width, though nothing measured how another seed would land."""
    if iv.seeds < 2:
        return UNSURE
    if iv.low > 0:
        return HOLDS
    if iv.high < 0:
        return FAILS
    return NO_DIFF if -delta < iv.low and iv.high < delta else UNSURE


def interval_part(text: str, better: dict, worse: dict, metric: str) -> Part | None:
    """Part claiming metric(better) > metric(worse), from two targets' per_prompt.json
    (final checkpoints, paired by seed and prompt); None when they have no such scores."""
    iv = score_interval(better, metric, minus=worse)
    if iv is None:
        return None
    return Part(text, iv.point, None, interval_verdict(iv), score=True, interval=iv)


def score_part(text: str, better: str, worse: str, metric: str, evals: dict, per_prompt: dict | None) -> Part:
    """A score comparison: the interval rule where both targets have per-prompt scores,
    else the seed rule on the per-replicate values in `evals`."""
    pp = per_prompt or {}
    if pp.get(better) and pp.get(worse) and (part := interval_part(text, pp[better], pp[worse], metric)):
        return part
    part = compare(text, evals.get(better, {}).get(metric), evals.get(worse, {}).get(metric))
    part.score = True
    return part


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
    part = _verdict(text, mb - mw, math.sqrt(sb ** 2 / nb + sw ** 2 / nw))
    part.needed = _seeds_for(part.d, sb ** 2 + sw ** 2)
    return part


def one_sample(text: str, values: list[float] | None) -> Part:
    """Part claiming mean(values) > 0 (se = std / sqrt(n))."""
    if not values:
        return Part(text)
    m, sd, n = mean_std(values)
    if n < 2:
        return Part(text, m, math.nan, UNSURE)
    part = _verdict(text, m, sd / math.sqrt(n))
    part.needed = _seeds_for(m, sd ** 2)
    return part


def _seeds_for(d: float, var: float) -> float:
    """n with 2 sqrt(var / n) = |d| (var = the sum of the groups' per-seed variances): more
    seeds per group than n would put the measured difference beyond two standard errors. An
    even chance of a decision if the true difference is d; inf where no difference was
    measured (d = 0, not finite, or too small for the spread to ever resolve)."""
    if not math.isfinite(d) or not math.isfinite(var) or abs(d) < 1e-12 * max(1.0, math.sqrt(var)):
        return math.inf
    return 4 * var / d ** 2


def _neg(vals: list[float] | None) -> list[float] | None:
    return None if vals is None else [-v for v in vals]


def _speculative_claim(train: dict, evals: dict, roles: dict, per_prompt: dict | None = None) -> Claim:
    """Claim 6 (method.md §3.3): the authors' speculative loss tokens add noise. Compares the
    committed-only frozen-head method (role grpo_frozen) with the one that adds the filtered
    speculative tokens (role speculative)."""
    c6 = Claim(6, "Scoring only committed tokens beats adding the consistency-filtered speculative tokens "
                  "(method.md §3.3; the authors' NOVA code adds them)")
    spec, committed = roles.get("speculative"), roles.get("grpo_frozen")
    if not spec or not committed:
        c6.note = ("needs the roles grpo_frozen and speculative (params.yaml claims): a committed-only method and one "
                   "that adds speculative tokens with the same head and estimator")
        return c6

    def tr(method, key):
        return train.get(method, {}).get("final", {}).get(key)

    snr_c, snr_f = tr(spec, "probe/snr_committed"), tr(spec, "probe/snr")
    c6.parts = [score_part(f"GenEval overall, {committed} − {spec}", committed, spec, "eval/geneval/overall", evals,
                           per_prompt),
                compare(f"final reward, {committed} − {spec}", tr(committed, "reward/mean"), tr(spec, "reward/mean")),
                one_sample("gradient SNR on the same rollouts, committed only − with the filtered speculative tokens",
                           None if not snr_c or not snr_f else [a - b for a, b in zip(snr_c, snr_f)])]
    c6.note = (f"{spec} differs from {committed} only in token_scope; SNR from {spec}'s gradient probe "
               "(probe/snr_committed vs probe/snr, per seed mean over probe steps)")
    return c6


def build_claims(train: dict, evals: dict, methods: dict, roles: dict[str, str], timing: dict,
                 per_prompt: dict[str, dict] | None = None) -> list[Claim]:
    """train: method -> {'growth': {metric: [per seed]}, 'final': {metric: [per seed]}};
    evals: target -> {metric: [per replicate]}; methods: name -> MethodConfig dict; roles:
    role -> method (params.yaml `claims`: grpo, grpo_frozen, resample, speculative);
    timing: method -> [time/step per seed]; per_prompt: target -> its per_prompt.json
    (targets without one use the seed rule for their scores)."""

    # Every comparison is at the same training budget and schedule: a method trained longer,
    # on larger batches or under its own LR schedule is in the report's tables, not the claims.
    roles = {r: m for r, m in roles.items()
             if m in methods and all(methods[m].get(k, v) == v for k, v in BUDGET_DEFAULTS.items())}
    grpo, frozen, mte = roles.get("grpo"), roles.get("grpo_frozen"), roles.get("resample")

    def tr(method, kind, key):
        return train.get(method, {}).get(kind, {}).get(key)

    def ev(target, key):
        return evals.get(target, {}).get(key)

    claims = []
    c1 = Claim(1, "End-to-end GRPO on MAR is unstable: KL and gradient norm grow (reward saturates or collapses)")
    if grpo:
        c1.parts = [one_sample(f"{grpo} KL, final − early window", tr(grpo, "growth", "loss/kl")),
                    one_sample(f"{grpo} AR grad norm, final − early", tr(grpo, "growth", "diag/grad_norm_ar"))]
        drop = tr(grpo, "final", "reward/peak_drop")
        c1.note = "" if not drop else f"reward drop from peak (final window vs best step): {sum(drop) / len(drop):.3f}"
    claims.append(c1)

    # Without a frozen-head single-chain method, the frozen-head MTE method stands in (confounded).
    other = frozen or mte
    c2 = Claim(2, "Freezing the diffusion head stabilises training")
    if other and grpo:
        c2.parts = [compare(f"final KL, {grpo} − {other}", _neg(tr(other, "final", "loss/kl")),
                            _neg(tr(grpo, "final", "loss/kl"))),
                    compare(f"AR grad-norm growth, {grpo} − {other}", _neg(tr(other, "growth", "diag/grad_norm_ar")),
                            _neg(tr(grpo, "growth", "diag/grad_norm_ar")))]
        if not frozen:
            c2.note = f"{other} also uses MTE: head freezing and MTE are confounded (add a frozen-head single-estimator method to separate them)"
    claims.append(c2)

    c3 = Claim(3, "MTE reduces gradient variance and improves reward and benchmark scores")
    if mte and (ref := frozen or grpo):
        ratio = tr(mte, "final", "probe/var_ratio_vs_single")
        # Against the frozen-head single-chain method when the study has one: it differs from
        # the MTE method only in the estimate and selection, so the comparison isolates MTE.
        c3.parts = [one_sample(f"{mte} gradient-noise variance, 1 − ratio to single chain",
                               None if ratio is None else [1 - r for r in ratio]),
                    compare(f"final reward, {mte} − {ref}", tr(mte, "final", "reward/mean"), tr(ref, "final", "reward/mean")),
                    score_part(f"GenEval overall, {mte} − {ref}", mte, ref, "eval/geneval/overall", evals, per_prompt),
                    score_part(f"T2I mean, {mte} − {ref}", mte, ref, "eval/t2i/mean", evals, per_prompt)]
        c3.note = ("variance from the trainer's gradient probe (probe/var_ratio_vs_single); reward and scores compare against "
                   + (f"{ref}, which freezes the head too" if frozen else f"{ref}, which also differs in head freezing"))
    claims.append(c3)

    c5 = Claim(5, "MAR-GRPO beats the base model and vanilla GRPO on compositional benchmarks at little extra compute")
    if mte and (mte in evals or (per_prompt or {}).get(mte)):
        for metric in ("eval/geneval/overall", "eval/geneval/position", "eval/t2i/mean", "eval/t2i/spatial", "eval/t2i/complex"):
            for ref in ("base", grpo) if grpo else ("base",):
                part = score_part(f"{metric.removeprefix('eval/')}, {mte} − {ref}", mte, ref, metric, evals,
                                  per_prompt)
                if part.d is not None:
                    c5.parts.append(part)
        t_m, t_g = timing.get(mte), timing.get(grpo)
        if t_m and t_g:
            c5.note = (f"time per step {mte} / {grpo} = {(sum(t_m) / len(t_m)) / (sum(t_g) / len(t_g)):.2f}; "
                       "preference metrics are not measured here (world reward only)")
    claims.append(c5)
    claims.append(_speculative_claim(train, evals, roles, per_prompt))
    return claims


def knob_claim(parts: dict[str, list[Part]], todo: list[str]) -> Claim | None:
    """Claim 4 from the ablation's paired comparisons (report/ablation.py): parts per
    estimator, each "centre value − other value" of the test GenEval overall by the
    interval rule. Judged on the paper's estimator (resample); the corrected posterior's
    verdict by the same rule goes in the note. todo: grid points without a record yet.
    None when neither estimator has a comparison."""
    paper, corrected = parts.get("resample", []), parts.get("posterior", [])
    if not paper and not corrected:
        return None
    c = BestClaim(4, CLAIM4, list(paper))
    notes = [] if paper else ["no comparison of the paper's resample estimator yet"]
    notes.append("best = no other setting better: holds if every other setting is worse or within ±δ (one at "
                 "least worse), does not hold if one is better")
    if corrected:
        notes.append(f"the corrected posterior estimator by the same rule: {BestClaim(0, '', corrected).status} "
                     f"({'; '.join(p.render() for p in corrected)})")
    if todo:
        notes.append("not yet run: " + ", ".join(todo) + " (python scripts/ablation.py)")
    notes.append("each part compares two settings on the same seeds, prompts and image seeds; the tau parts score "
                 "the committed and the filtered speculative tokens (tau filters only those); the training "
                 "minutes of each setting, its cost, are in the ablation table")
    c.note = "; ".join(notes)
    return c
