"""Quality policy: the thresholds a precision's outputs must meet against the reference (`min_top1=0.9,
max_mean_kl=0.05`), where they come from (ini lines by scope, then the test's markers), and which ones a comparison
broke."""

from __future__ import annotations

import math
from typing import Any

from pytest_infergate.errors import OptionError
from pytest_infergate.scopes import applicable_scopes, parse_scoped_lines

# key -> (aggregate name, "min" or "max")
POLICY_KEYS = {
    "min_rouge_l": ("rougeL", "min"), "min_rouge_1": ("rouge1", "min"), "min_rouge_2": ("rouge2", "min"),
    "min_exact_match": ("exact_match", "min"), "max_mean_kl": ("mean_kl", "max"), "max_p99_kl": ("p99_kl", "max"),
    "min_top1": ("top1", "min"), "max_delta_ppl": ("delta_ppl_rel", "max"), "min_task_ratio": ("task_ratio", "min"),
    "min_length_ratio": ("length_ratio", "min"), "max_length_ratio": ("length_ratio", "max"),
}


class QualityPolicyError(OptionError):
    """An infergate_quality marker or ini policy with an unknown key or a wrong value."""


def parse_policy(values: dict[str, Any], where: str = "infergate_quality") -> dict[str, float]:
    policy = {}
    for key, value in values.items():
        if key not in POLICY_KEYS:
            raise QualityPolicyError(f"{where}: unknown quality key {key!r}; allowed: {', '.join(POLICY_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            finite = "" if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isfinite(value) \
                else "; a threshold of nan or inf would never be checked"
            raise QualityPolicyError(f"{where}: {key}={value!r} must be a non-negative number{finite}")
        policy[key] = float(value)
    return policy


def parse_ini_policies(lines: list[str]) -> dict[str, dict[str, float]]:
    """ini `infergate_quality_policy`: `PRECISION: key=value, ...` per line (`*` for every precision)."""
    return {scope: parse_policy(line.values, f"{line.where} ({scope})")
            for scope, line in parse_scoped_lines(lines, "infergate_quality_policy", QualityPolicyError).items()}


def resolve_policy(ini_lines: list[str], marker_kwargs: list[dict[str, Any]], precision: str, key: str
                   ) -> tuple[dict[str, float], list[str]]:
    """The policy of one comparison: ini lines whose scope applies (see scopes.py), then the test's markers
    (outermost first). Returns it with the ini scopes that applied."""
    scoped = parse_ini_policies(ini_lines)
    scopes = applicable_scopes(scoped, precision, key)
    policy: dict[str, float] = {}
    for scope in scopes:
        policy.update(scoped[scope])
    for kwargs in marker_kwargs:
        policy.update(parse_policy(kwargs))
    return policy, scopes


def policy_violations(summary: dict[str, Any], policy: dict[str, float]) -> list[str]:
    problems = []
    for key, threshold in policy.items():
        name, direction = POLICY_KEYS[key]
        if name not in summary:
            problems.append(f"{key}: {name} was not measured")
            continue
        value = summary[name]
        bad = value < threshold if direction == "min" else value > threshold
        if bad:
            ci = summary.get(name + "_ci")
            ci_text = f" (95% CI {ci[0]:.4g}-{ci[1]:.4g})" if ci else ""
            bound = ">=" if direction == "min" else "<="
            problems.append(f"{key}: {name} = {value:.4g}{ci_text}, policy {bound} {threshold:g}")
    return problems
