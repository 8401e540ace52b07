"""The regression gate: absolute floors, and tolerated drops against the baseline judged with a paired
bootstrap over questions, so a drop inside the noise passes and a real one fails."""

from __future__ import annotations

from collections.abc import Mapping

from evaluation.metrics import is_quality_metric, paired_bootstrap
from schemas.eval import GateCheck

PerQuestion = Mapping[str, Mapping[str, float]]  # question id -> {metric: value}


def lookup(table: Mapping[str, float], goldset: str, metric: str) -> float | None:
    """A threshold for `goldset:metric` overrides one for `metric`."""
    return table.get(f"{goldset}:{metric}", table.get(metric))


def gate_checks(
    goldset: str,
    mode: str,
    candidate: PerQuestion,
    baseline: PerQuestion | None,
    *,
    tolerances: Mapping[str, float],
    floors: Mapping[str, float],
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[GateCheck]:
    """One check per gated metric (those with a tolerance or a floor; latency thresholds are ignored: latency
    is reported beside the quality metrics, but a floor or a tolerated drop does not apply to it).

    Fails on a floor when the candidate's mean is below it. Fails on a tolerance when the mean paired
    drop is larger than the tolerance AND the bootstrap interval lies wholly below zero (the drop is
    not noise). Questions are paired by id; questions only on one side are left out of the comparison.
    """
    metrics = sorted({m.split(":")[-1] for m in [*tolerances, *floors]
                      if (":" not in m or m.split(":", 1)[0] == goldset) and is_quality_metric(m.split(":")[-1])})
    checks = []
    for metric in metrics:
        cand_vals = [q[metric] for q in candidate.values() if metric in q]
        cand_mean = sum(cand_vals) / len(cand_vals) if cand_vals else 0.0
        tol, floor = lookup(tolerances, goldset, metric), lookup(floors, goldset, metric)
        check = GateCheck(goldset=goldset, mode=mode, metric=metric, candidate=cand_mean, tolerance=tol,
                          floor=floor, passed=True)
        reasons = []
        if floor is not None and cand_mean < floor:
            check.passed = False
            reasons.append(f"{cand_mean:.3f} is below the floor {floor:.3f}")
        if baseline is not None and tol is not None:
            paired = [qid for qid in candidate if qid in baseline and metric in baseline[qid]]
            c = [candidate[qid][metric] for qid in paired]
            b = [baseline[qid][metric] for qid in paired]
            delta, lo, hi = paired_bootstrap(c, b, samples=samples, confidence=confidence, seed=seed)
            check.baseline = sum(b) / len(b) if b else None
            check.delta, check.ci_low, check.ci_high, check.n_paired = delta, lo, hi, len(paired)
            if not paired:
                reasons.append("no question in common with the baseline: not compared")
            elif delta < -tol and hi < 0:
                check.passed = False
                reasons.append(f"dropped {-delta:.3f} (95% CI {lo:+.3f}..{hi:+.3f}), more than the "
                               f"tolerated {tol:.3f}")
            elif delta < -tol:
                reasons.append(f"dropped {-delta:.3f} but the interval {lo:+.3f}..{hi:+.3f} includes 0 (noise)")
        check.reason = "; ".join(reasons)
        checks.append(check)
    return checks
