"""Verdicts with known error rates: t-intervals over seeds, one-sided tests, Holm, TOST, power.

The unit of replication is the training seed. A seed's score is itself an average over the
evaluation (test prompts x images per prompt), so under the nested model

    Y_s = mu + T_s + E_s,   Var(T_s) = sigma_T^2   (training noise; 0 for the untrained base)
                            Var(E_s) = sigma_E^2 / eval_scale   (evaluation noise; eval_scale = the
                                       evaluation's size relative to the reference allocation)

the seed scores are independent draws with variance sigma_T^2 + sigma_E^2 / eval_scale, so a
t-interval over seeds covers at its nominal level whatever the two components are. The test
prompts are fixed: the interval is about this prompt set, not about prompts in general.

Two designs of a comparison A − B:
- paired: both arms use the same seeds, image seeds and prompts, so their evaluation noise at
  one seed is correlated (rho_E). A one-sample t on the per-seed differences (df n − 1) is
  valid whatever that correlation and whatever the two arms' variances;
- two-sample: arms on different seeds; pooled variance (df n_a + n_b − 2) where the arms'
  variances agree (a two-sided F test at AGREE), Welch-Satterthwaite otherwise.

A part claims d > 0. Each test is one-sided at ALPHA = 0.025, so for one part the verdict can
be read off its 95% interval:
- "holds": H0 d <= 0 rejected (interval above 0);
- "does not hold": H0 d >= −delta rejected (interval below −delta): a difference inside ±delta
  never refutes the claim;
- "no difference larger than δ": two one-sided tests (TOST) reject d <= −delta and d >= delta
  (interval inside ±delta);
- else "inconclusive".
A claim "holds" when every part holds, an intersection-union test: its error rate is at most
ALPHA with no correction. It "does not hold" when any part does not hold: a union, so those
p-values are Holm-adjusted within the claim (family-wise error at most ALPHA). Under a null of
no difference, a wrong verdict either way has probability at most 2 ALPHA = 5%.

Every function takes numpy arrays with the seeds (or a claim's parts) on the last axis and
broadcasts over the leading axes, so tests/test_calibration.py runs thousands of simulated
studies through the same code the report uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as st

ALPHA = 0.025  # one-sided level of every test (= a 95% two-sided interval)
LEVEL = 1 - 2 * ALPHA
AGREE = 0.05  # two-sided level of the F test below which two arms' variances count as different
HOLDS, FAILS, UNSURE, NO_DIFF = "holds", "does not hold", "inconclusive", "no difference larger than δ"
TARGET_POWER = 0.8
MAX_SEEDS = 10_000  # seeds_for_power searches up to here; beyond it "unreachable"


@dataclass(frozen=True)
class Estimate:
    """A difference d with its standard error and degrees of freedom (arrays broadcast alike).
    kind: 'one-sample' / 'paired' / 'pooled' / 'welch'; n: seeds per arm."""
    d: np.ndarray
    se: np.ndarray
    df: np.ndarray
    n: int
    kind: str

    def interval(self, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
        half = st.t.ppf((1 + level) / 2, self.df) * self.se
        return self.d - half, self.d + half

    def p_greater(self, margin: float = 0.0) -> np.ndarray:
        """p-value of H0: d <= margin (small when d is clearly above the margin). se = 0 (a
        constant difference): 0 or 1 by the sign of d − margin, NaN where it is 0."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return st.t.sf((self.d - margin) / self.se, self.df)

    def p_less(self, margin: float = 0.0) -> np.ndarray:
        """p-value of H0: d >= margin (small when d is clearly below the margin)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return st.t.cdf((self.d - margin) / self.se, self.df)


def _as(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


def one_sample(x) -> Estimate:
    """Mean of per-seed values x [..., n] against 0; NaN with one seed."""
    x = _as(x)
    n = x.shape[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = x.std(axis=-1, ddof=1) if n > 1 else np.full(x.shape[:-1], np.nan)
    return Estimate(x.mean(axis=-1), sd / np.sqrt(n), np.full(x.shape[:-1], n - 1.0), n, "one-sample")


def paired(a, b) -> Estimate:
    """mean(a − b) over seeds that pair (a[..., s] and b[..., s] share seed s)."""
    est = one_sample(_as(a) - _as(b))
    return Estimate(est.d, est.se, est.df, est.n, "paired")


def variances_agree(a, b, level: float = AGREE) -> np.ndarray:
    """Two-sided F test of equal variances over seeds (last axis); True where not rejected."""
    a, b = _as(a), _as(b)
    f = a.var(axis=-1, ddof=1) / b.var(axis=-1, ddof=1)
    p = st.f.cdf(f, a.shape[-1] - 1, b.shape[-1] - 1)
    return 2 * np.minimum(p, 1 - p) > level


def two_sample(a, b, pooled=None) -> Estimate:
    """mean(a) − mean(b) of arms on independent seeds. pooled: True / False, or None to pool
    where variances_agree (per study, broadcast)."""
    a, b = _as(a), _as(b)
    na, nb = a.shape[-1], b.shape[-1]
    va, vb = a.var(axis=-1, ddof=1), b.var(axis=-1, ddof=1)
    pool = variances_agree(a, b) if pooled is None else np.broadcast_to(bool(pooled), va.shape)
    vp = ((na - 1) * va + (nb - 1) * vb) / (na + nb - 2)
    se_p, df_p = np.sqrt(vp * (1 / na + 1 / nb)), np.full(va.shape, na + nb - 2.0)
    se_w = np.sqrt(va / na + vb / nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        df_w = se_w ** 4 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    kind = "pooled" if np.all(pool) else "welch" if not np.any(pool) else "pooled/welch"
    return Estimate(a.mean(axis=-1) - b.mean(axis=-1), np.where(pool, se_p, se_w), np.where(pool, df_p, df_w),
                    min(na, nb), kind)


def holm(p) -> np.ndarray:
    """Holm step-down adjusted p-values over the last axis (a claim's parts): the i-th
    smallest is max over j <= i of (m − j) p_(j), capped at 1; reject where adjusted <= alpha."""
    p = _as(p)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    adj = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, axis=-1)
    return out


@dataclass(frozen=True)
class Tests:
    """The three one-sided p-values of a part (arrays): holds (H0 d <= 0), fails (H0 d >=
    −delta) and equivalence (TOST: the larger of H0 d <= −delta and H0 d >= delta)."""
    holds: np.ndarray
    fails: np.ndarray
    equiv: np.ndarray


def part_tests(est: Estimate, delta: float) -> Tests:
    return Tests(est.p_greater(0.0), est.p_less(-delta), np.maximum(est.p_greater(-delta), est.p_less(delta)))


def verdict(p_holds, p_fails, p_equiv, alpha: float = ALPHA) -> np.ndarray:
    """A part's verdict from its p-values (NaN p: inconclusive). "holds" wins over "no
    difference" when the interval lies in (0, delta); "holds" and "does not hold" exclude
    each other (their regions are d > 0 and d < −delta)."""
    p_holds, p_fails, p_equiv = (np.nan_to_num(_as(p), nan=1.0) for p in (p_holds, p_fails, p_equiv))
    return np.select([p_holds <= alpha, p_fails <= alpha, p_equiv <= alpha], [HOLDS, FAILS, NO_DIFF], UNSURE)


def part_verdicts(tests: list[Tests], alpha: float = ALPHA) -> np.ndarray:
    """Each part's verdict within its claim [..., parts]: its "does not hold" p-value Holm-
    adjusted over the claim's parts, the other two at their own level."""
    if not tests:
        return np.empty((0,), dtype="<U32")
    fails = holm(np.stack([np.nan_to_num(_as(t.fails), nan=1.0) for t in tests], axis=-1))
    return np.stack([verdict(t.holds, fails[..., i], t.equiv, alpha) for i, t in enumerate(tests)], axis=-1)


def claim_verdict(tests: list[Tests], score: list[bool] | None = None, best: bool = False,
                  alpha: float = ALPHA) -> np.ndarray:
    """A claim's verdict from its parts' tests.

    Ordinary claim (every part claims d > 0): does not hold if a part does not hold (Holm);
    holds if every part holds; "no difference" if every score part (score[i]) is within
    ±delta; else inconclusive. best=True: "this setting is the best" from parts "this − other":
    does not hold if another is better by more than delta (Holm); holds if every other is worse
    or within ±delta and Holm finds at least one worse (so a null of equal settings is not read
    as "best"); "no difference" if every part is within ±delta; else inconclusive."""
    if not tests:
        return np.array(UNSURE)
    parts = part_verdicts(tests, alpha)
    score = [True] * len(tests) if score is None else list(score)
    failed = (parts == FAILS).any(axis=-1)
    if best:
        ok = ((parts == HOLDS) | (parts == NO_DIFF)).all(axis=-1)
        some_worse = (holm(np.stack([np.nan_to_num(_as(t.holds), nan=1.0) for t in tests], axis=-1)) <= alpha).any(-1)
        all_equal = (np.stack([np.nan_to_num(_as(t.equiv), nan=1.0) for t in tests], axis=-1) <= alpha).all(-1)
        return np.select([failed, ok & some_worse, all_equal], [FAILS, HOLDS, NO_DIFF], UNSURE)
    held = (parts == HOLDS).all(axis=-1)
    scores = parts[..., np.array(score, dtype=bool)]
    equal = (scores == NO_DIFF).all(axis=-1) & (scores.shape[-1] > 0)
    return np.select([failed, held, equal], [FAILS, HOLDS, NO_DIFF], UNSURE)


# ---- power and design -------------------------------------------------------------------

def seed_var(sigma_t: float, sigma_e: float, eval_scale: float = 1.0) -> float:
    """Variance of one seed's score under the nested model (score units squared)."""
    return sigma_t ** 2 + sigma_e ** 2 / eval_scale


def diff_sd(sigma_t: tuple[float, float], sigma_e: float, rho_e: float = 0.0, eval_scale: float = 1.0) -> float:
    """sd of one seed's paired difference A − B: each arm's training noise (sigma_t per arm;
    0 for the base) plus the two arms' evaluation noise, correlated rho_e at a shared seed."""
    return float(np.sqrt(sigma_t[0] ** 2 + sigma_t[1] ** 2 + 2 * (1 - rho_e) * sigma_e ** 2 / eval_scale))


def _se_df(sd: float, n, design: str) -> tuple[np.ndarray, np.ndarray]:
    """se and df of a comparison at n seeds per arm. paired / one-sample: sd of the per-seed
    difference (or value); pooled: sd of one arm's seed score (equal in both arms)."""
    n = _as(n)
    if design == "pooled":
        return sd * np.sqrt(2 / n), 2 * n - 2
    return sd / np.sqrt(n), n - 1


def power(effect: float, sd: float, n, margin: float = 0.0, design: str = "paired", alpha: float = ALPHA):
    """Probability that the one-sided t test of H0: d <= margin rejects at level alpha when the
    true difference is `effect` (noncentral t), at n seeds per arm."""
    se, df = _se_df(sd, n, design)
    return st.nct.sf(st.t.ppf(1 - alpha, df), df, (effect - margin) / se)


def tost_power(effect: float, sd: float, n, delta: float, design: str = "paired", alpha: float = ALPHA):
    """A lower bound on the probability that TOST shows |d| < delta when the true difference is
    `effect`: P(both one-sided tests reject) >= P(first) + P(second) − 1 (Bonferroni)."""
    up = power(effect, sd, n, -delta, design, alpha)
    down = power(-effect, sd, n, -delta, design, alpha)
    return np.maximum(up + down - 1, 0.0)


def seeds_for_power(effect: float, sd: float, target: float = TARGET_POWER, design: str = "paired",
                    alpha: float = ALPHA) -> int | None:
    """The fewest seeds per arm (>= 2) at which power(effect) >= target; None past MAX_SEEDS
    (no effect, or an effect the noise swamps)."""
    n = np.arange(2, MAX_SEEDS + 1)
    ok = np.nonzero(power(effect, sd, n, design=design, alpha=alpha) >= target)[0]
    return int(n[ok[0]]) if ok.size else None


def claim_power(parts: list[tuple[float, float, str]], n) -> np.ndarray:
    """Probability that a claim holds at n seeds when every part's true difference is its
    smallest effect of interest: parts [(effect, sd, design)]. The product of the parts'
    powers, which is exact for independent parts; parts that share an arm are positively
    correlated, which makes "all hold" more likely, so this errs low."""
    out = np.ones_like(_as(n))
    for effect, sd, design in parts:
        out = out * power(effect, sd, n, design=design)
    return out


def seeds_for_claim(parts: list[tuple[float, float, str]], target: float = TARGET_POWER) -> int | None:
    """The fewest seeds (>= 2) at which claim_power >= target; None past MAX_SEEDS."""
    n = np.arange(2, MAX_SEEDS + 1)
    ok = np.nonzero(claim_power(parts, n) >= target)[0]
    return int(n[ok[0]]) if ok.size else None
