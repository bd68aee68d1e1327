"""The golden regression gate's parts: near-tie / drift classification, policy keys, header provenance, the fixed
generation composition and batch invariance (tiny-random-llama where a model is needed)."""

import json

import pytest
import torch

from pytest_infergate.quality.golden_files import GoldenSample, load_samples
from pytest_infergate.quality.golden_generation import (
    BatchInvariance,
    check_variants,
    composition_id,
    fixed_outputs,
    golden_engine_config,
    rotate,
    run_samples,
)
from pytest_infergate.quality.golden_machines import (
    SAME_KERNELS,
    SAME_MACHINE,
    environment_mismatch,
    numerics_key,
    path_to_update,
    recorded_elsewhere,
    select_accepted,
    variant_tag,
    variants,
)
from pytest_infergate.quality.metrics import compare_sample
from pytest_infergate.quality.policy import (
    MAX_ACCEPTED_KL,
    NEAR_TIE_MARGIN,
    QualityPolicyError,
    RegressionPolicy,
    ResolvedPolicy,
    parse_ini_policies,
    parse_policy,
    threshold_checks,
)
from pytest_infergate.quality.regression import (
    DRIFT,
    NEAR_TIE,
    GoldenRegression,
    classify_change,
    divergence_margin,
    margin_as_generated,
)
from pytest_infergate.quality.scoring import topk_kl
from pytest_infergate.quality.travel import (
    ACCEPTED_HERE,
    SampleFigures,
    TravelFigure,
    TravelMargins,
    decide_against,
    decide_travel,
)
from pytest_infergate.results.records import BatchInvarianceRecord, GoldenRecord, record_from_dict
from pytest_infergate.status import Status

TEXTS = ["capital?", "def f():", "春天", "hello there", "count to ten", "what is 2+2", "tell me a story", "json please"]


def chat(i: int, text: str, category: str = "chat", max_new_tokens: int = 16) -> dict:
    return {"id": f"q{i}", "category": category, "messages": [{"role": "user", "content": text}],
            "max_new_tokens": max_new_tokens}


@pytest.fixture
def sample_file(tmp_path):
    path = tmp_path / "set.jsonl"
    categories = ["chat", "code"] * 4
    path.write_text("\n".join(json.dumps(chat(i, t, categories[i]), ensure_ascii=False)
                              for i, t in enumerate(TEXTS)) + "\n")
    return path


# ---- classification --------------------------------------------------------------------------------------------

def test_margin_at_the_first_divergence():
    logprobs = torch.log_softmax(torch.tensor([[2.0, 1.9, -1.0], [0.0, 3.0, 0.0]]), dim=-1)
    assert divergence_margin([1, 1], [0, 1], logprobs) == pytest.approx(0.1, abs=1e-5)  # accepted 1, top 0
    assert divergence_margin([0, 0], [0, 1], logprobs) == pytest.approx(3.0, abs=1e-5)  # accepted 0 at token 1
    assert divergence_margin([0, 1], [0, 1, 2], logprobs) is None  # a prefix: no token to compare


def test_margin_read_from_the_generation_where_it_was_recorded():
    top = [([5, 6], [-0.1, -0.4]), ([7, 1], [-0.2, -0.3])]  # per generated token: (ids, log-probs), best first
    assert margin_as_generated([5, 1], [5, 7], top) == pytest.approx(0.1)  # accepted 1 was second, 0.1 below
    assert margin_as_generated([5, 9], [5, 7], top) is None  # accepted token outside the recorded top: scored alone
    assert margin_as_generated([5, 1], [5, 7], []) is None  # not recorded (HF generate)
    assert margin_as_generated([5], [5, 7], top) is None  # a prefix


def test_generation_records_the_distribution_each_token_was_drawn_from(tiny_fp32, sample_file):
    samples = load_samples(sample_file)
    run = run_samples(tiny_fp32, samples)
    for generated in run.outputs:
        assert len(generated.top_logprobs) == len(generated.token_ids)
        for token, (ids, values) in zip(generated.token_ids, generated.top_logprobs):
            assert ids[0] == token and len(ids) == 8 and values == sorted(values, reverse=True)  # greedy: the top
    # the recorded log-probabilities are the model's own: the first token's, against a plain forward of the prompt
    first = run.outputs[0]
    with torch.no_grad():
        logits = tiny_fp32.model(torch.tensor([first.prompt_ids])).logits[0, -1]
    expected = torch.log_softmax(logits.float(), -1).topk(8)
    assert first.top_logprobs[0][0] == expected.indices.tolist()
    assert first.top_logprobs[0][1] == pytest.approx(expected.values.tolist(), abs=1e-4)


def test_near_tie_needs_a_small_margin_and_a_small_accepted_kl():
    policy = RegressionPolicy(max_accepted_kl=0.01, near_tie_margin=0.25)
    assert classify_change(0.1, 0.001, policy).verdict == NEAR_TIE
    assert classify_change(0.25, 0.01, policy).verdict == NEAR_TIE  # the bounds are inclusive
    wide = classify_change(0.3, 0.001, policy)
    assert wide.verdict == DRIFT and "margin 0.300 > near_tie_margin 0.25" in wide.reason
    moved = classify_change(0.0, 0.02, policy)
    assert moved.verdict == DRIFT and "> max_accepted_kl 0.01" in moved.reason
    assert "prefix" in classify_change(None, 0.001, policy).reason
    assert "not scored" in classify_change(0.1, None, policy).reason


def test_topk_kl_is_zero_against_itself_and_grows_with_a_shift():
    logprobs = torch.log_softmax(torch.randn(5, 50, generator=torch.Generator().manual_seed(0)), dim=-1)
    values, indices = logprobs.topk(10, dim=-1)
    stored = [[[int(t), float(v)] for t, v in zip(ti, tv)] for ti, tv in zip(indices.tolist(), values.tolist())]
    assert max(topk_kl(stored, logprobs)) < 1e-6
    shifted = torch.log_softmax(logprobs + 0.3 * torch.randn(5, 50, generator=torch.Generator().manual_seed(1)), -1)
    assert min(topk_kl(stored, shifted)) > 1e-4


def changed(id_: str, margin, kl):
    quality = compare_sample(GoldenSample(id_, "chat", None, "p", 4), [1, 2], "a b", [1, 3], "a c", None)
    quality.divergence_margin, quality.mean_kl = margin, kl
    return quality


def test_the_gate_fails_on_drift_beyond_policy_and_on_any_change_when_exact():
    regression = GoldenRegression("int8", [changed("tie", 0.05, 0.001), changed("moved", 1.2, 0.05)], [], 10, None)
    regression.classify(RegressionPolicy.of({}, "int8"))
    assert [s.id for s in regression.near_ties] == ["tie"] and [s.id for s in regression.drift] == ["moved"]
    assert "drift in 1 of 10 outputs (10.0%), policy max_drift_share 0" in regression.problems()[0]
    assert regression.classify(RegressionPolicy.of({"max_drift_share": 0.1}, "int8")).ok
    ties_only = GoldenRegression("int8", [changed("tie", 0.05, 0.001)], [], 10, None)
    assert ties_only.classify(RegressionPolicy.of({}, "int8")).ok
    assert "exact=1: 1 of 10 outputs changed (1 of them near-ties)" in ties_only.classify(
        RegressionPolicy.of({"exact": 1}, "int8")).problems()[0]
    missing = GoldenRegression("int8", [], ["gone"], 9, None).classify(RegressionPolicy())
    assert "1 samples have no accepted output: gone" in missing.problems()[0]
    elsewhere = GoldenRegression("int8", [], [], 10, None)
    assert elsewhere.classify(RegressionPolicy.of({}, "int8"), ["cpu_flags: ..."]).ok
    assert "same_environment=1" in elsewhere.classify(RegressionPolicy.of({"same_environment": 1}, "int8"),
                                                      ["cpu_flags: ..."]).problems()[0]


def figures(top1=0.95, kl=0.02, task=1.0, reference_task=1.0, n=48, shift=0.0, every=1):
    """Per-sample figures of `n` samples spread as a quantized model's are (KL 0.5x-1.5x its mean, top-1 within
    0.05); `shift` worsens every `every`-th sample's KL by that many nats and its top-1 by shift/2."""
    out = {}
    for i in range(n):
        moved = shift if i % every == 0 else 0.0
        spread_top1, spread_kl = 0.05 * ((i * 7) % 5) / 4, 0.5 + (i * 3 % 11) / 10
        out[f"q{i}"] = SampleFigures(top1 - spread_top1 - moved / 2, kl * spread_kl + moved, task, reference_task)
    return out


def test_quality_that_travels_passes_numerics_and_fails_a_real_drop():
    """Another machine: this machine's figures against its own reference against the accepted machine's, paired
    per sample. Numerics-sized differences (last digits of KL, a sample's top-1) are equivalent: PASS; a real
    quality drop fails naming the figure, the categories and the samples; a drop near the margin is inconclusive."""
    accepted = figures()
    categories = {f"q{i}": ("chat" if i < 24 else "code") for i in range(48)}
    numerics = {id_: SampleFigures(f.top1 - (0.01 if i % 3 == 0 else 0.0), f.mean_kl * 1.05, f.task, f.reference_task)
                for i, (id_, f) in enumerate(accepted.items())}
    same = decide_travel(accepted, numerics, categories, TravelMargins())
    assert same.status == Status.PASS and [note.split(" ")[0] for note in same.notes[0].split("; ")] == [
        "top1", "mean_kl", "task"]
    assert same.problems == [] and same.undecided == []
    # the figures it rests on, typed (benchmarks/quality_power.py reads them so)
    assert [f.metric for f in same.figures] == ["top1", "mean_kl", "task deficit"]
    assert all(f.low <= f.worsening <= f.high and f.margin > 0 for f in same.figures)

    broken = {id_: SampleFigures(f.top1 - (0.4 if categories[id_] == "chat" else 0.0),
                                 f.mean_kl + (1.0 if categories[id_] == "chat" else 0.0),
                                 0.0 if categories[id_] == "chat" and int(id_[1:]) % 2 else f.task, f.reference_task)
              for id_, f in accepted.items()}
    fell = decide_travel(accepted, broken, categories, TravelMargins())
    assert fell.status == Status.FAIL
    (why,) = fell.problems
    assert "top1 " in why and "> margin 0.05" in why and "code" not in why
    assert "chat (top1 worse by 0.4, mean_kl worse by 1, task deficit worse by 0.5)" in why
    assert "samples: q" in why and "[chat]" in why

    near = decide_travel(accepted, figures(shift=0.03, every=3), categories, TravelMargins())  # KL +0.01 on average
    assert near.status == Status.INCONCLUSIVE and "straddles margin 0.00996" in near.undecided[0]
    assert decide_travel(accepted, figures(shift=0.03, every=3), categories,
                         TravelMargins(kl_rise=1.0)).status == Status.PASS
    assert decide_travel({}, numerics, categories, TravelMargins()).status == Status.INCONCLUSIVE  # nothing paired


def test_drift_against_another_machine_is_decided_by_what_travels():
    """Quantized precisions (gate_other_machine=0 by default) against another machine: the token changes are
    listed, the travel decision decides; without figures to decide on, drift is inconclusive naming the action.
    The reference precision and gate_other_machine=1 gate tokens as before; exact=1 everywhere."""
    accepted = figures()
    for precision in ("int8", "nf4"):
        elsewhere = drifted(precision).classify(RegressionPolicy.of({}, precision), ["cpu: ..."], "AMD EPYC; kernels")
        assert elsewhere.by_quality and elsewhere.problems() == []
        (why,) = elsewhere.undecided()  # no accepted file records figures
        assert "drift in 1 of 10 outputs (10.0%) against outputs accepted on another machine (AMD EPYC; kernels)" in why
        assert "--infergate-update-golden" in why and "records no quality figures" in why
        elsewhere.travel = decide_travel(accepted, accepted, {}, elsewhere.policy.travel)
        assert elsewhere.ok and elsewhere.undecided() == []
        assert "quality against the reference, this machine's vs" in elsewhere.decided_by()
        elsewhere.travel = decide_travel(accepted, figures(shift=1.0), {}, elsewhere.policy.travel)
        (fell,) = elsewhere.problems()
        assert "fell beyond the margins compared with the accepted machine's" in fell and elsewhere.undecided() == []
    for precision in ("fp32", "fp16"):  # the reference precisions: their tokens are reproduced across machines
        other = drifted(precision).classify(RegressionPolicy.of({}, precision), [], "AMD EPYC")
        assert not other.by_quality and other.undecided() == [] and other.problems()
    gated = drifted("int8").classify(RegressionPolicy.of({"gate_other_machine": 1}, "int8"), [], "AMD EPYC")
    assert not gated.by_quality and gated.undecided() == [] and gated.problems()
    exact = drifted("int8").classify(RegressionPolicy.of({"exact": 1}, "int8"), [], "AMD EPYC")
    assert "exact=1" in exact.problems()[0] and exact.undecided() == []


def drifted(precision: str, near_ties: int = 1, drift: int = 1, compared: int = 10) -> GoldenRegression:
    changes = [changed(f"tie{i}", 0.05, 0.001) for i in range(near_ties)]
    changes += [changed(f"moved{i}", 1.2, 0.05) for i in range(drift)]
    return GoldenRegression(precision, changes, [], compared, None)


def noisy(base: dict[str, SampleFigures], top1: float, kl: float, seed: int) -> dict[str, SampleFigures]:
    """`base`'s samples moved to the means `top1` and `kl`, each sample jittered as a rerun of changed numerics
    moves it (seeded)."""
    import random

    rng = random.Random(seed)
    mean_top1 = sum(f.top1 for f in base.values()) / len(base)
    mean_kl = sum(f.mean_kl for f in base.values()) / len(base)
    return {id_: SampleFigures(min(1.0, f.top1 - mean_top1 + top1 + rng.gauss(0, 0.01)),
                               max(0.0, f.mean_kl * kl / mean_kl * (1 + rng.gauss(0, 0.1))), f.task, f.reference_task)
            for id_, f in base.items()}


def test_on_this_machine_quality_decides_and_the_changed_tokens_are_listed():
    """Issue #55 point 3 in synthetic figures of the embedded model's int8 (48 samples against fp32: top-1 0.94, KL
    0.02 as accepted). A numerics change that moved 35 of 48 outputs (33 drift) but kept top-1 0.936 and KL 0.020
    passes, its changes listed; a change that dropped top-1 to 0.795 with KL 0.277 fails naming the figures; a drop
    of about the margin is undecided, naming the action; exact=1 and gate_tokens=1 gate the tokens."""
    accepted = noisy(figures(n=48), 0.938, 0.021, seed=0)
    categories = {f"q{i}": ("chat", "code", "factual", "format")[i % 4] for i in range(48)}
    regression = drifted("int8", near_ties=2, drift=33, compared=48).classify(RegressionPolicy.of({}, "int8"))
    assert regression.by_quality and not regression.other_machine
    regression.travel = decide_travel(accepted, noisy(accepted, 0.936, 0.020, seed=1), categories,
                                      regression.policy.travel, ACCEPTED_HERE)
    regression.travel_source = "cpu-int8.jsonl"
    assert regression.ok and regression.undecided() == [] and len(regression.drift) == 33
    assert regression.decided_by() == ("quality against the reference, this run's vs as accepted in cpu-int8.jsonl "
                                       "(changed tokens listed)")

    regression.travel = decide_travel(accepted, noisy(accepted, 0.795, 0.277, seed=2), categories,
                                      regression.policy.travel, ACCEPTED_HERE)
    (why,) = regression.problems()
    assert why.startswith("quality against the reference fell beyond the margins compared with those accepted with "
                          "the outputs: top1 0.939 accepted → 0.792 now, worse by 0.147 (95% CI of the worsening ")
    assert "> margin 0.05" in why and "mean_kl 0.0204 accepted → 0.269 now" in why and "> margin 0.0102" in why
    assert "categories that fell most: " in why and "samples: q" in why

    # a top-1 drop of about the margin: undecided, naming the action
    regression.travel = decide_travel(accepted, noisy(accepted, 0.89, 0.021, seed=3), categories,
                                      regression.policy.travel, ACCEPTED_HERE)
    (undecided,) = regression.undecided()
    assert "straddles margin 0.05" in undecided and "If the change is intended, accept this run's outputs" in undecided

    for rules, failure in (({"exact": 1}, "exact=1: 35 of 48 outputs changed (2 of them near-ties)"),
                           ({"gate_tokens": 1}, "drift in 33 of 48 outputs (68.8%), policy max_drift_share 0")):
        tokens = drifted("int8", near_ties=2, drift=33, compared=48).classify(RegressionPolicy.of(rules, "int8"))
        tokens.travel = decide_travel(accepted, accepted, categories, tokens.policy.travel, ACCEPTED_HERE)
        assert not tokens.by_quality and tokens.problems() == [failure]
        assert tokens.decided_by() == "token for token against this machine's accepted outputs"


def test_a_loss_against_the_accepted_figures_fails_where_an_absolute_threshold_holds():
    """nf4 accepted at top-1 0.80, KL 0.28 (the embedded model's); a change to top-1 0.72, KL 0.45 still clears the
    suite's absolute nf4 policy (min_top1=0.7, max_mean_kl=0.5) but lost more than the margins allow."""
    accepted = noisy(figures(n=48), 0.80, 0.28, seed=4)
    now = noisy(accepted, 0.72, 0.45, seed=5)
    assert sum(f.top1 for f in now.values()) / 48 > 0.7 and sum(f.mean_kl for f in now.values()) / 48 < 0.5
    regression = drifted("nf4", drift=20, compared=48).classify(RegressionPolicy.of({}, "nf4"))
    regression.travel = decide_travel(accepted, now, {}, regression.policy.travel, ACCEPTED_HERE)
    (why,) = regression.problems()
    assert "top1 0.8" in why and "mean_kl 0.2" in why and why.count("> margin") == 2


def test_without_figures_to_decide_on_this_machine_the_tokens_decide_and_say_why():
    """An accepted file from before figures were stored, or the reference precision itself: the token rule decides,
    and the verdict says why."""
    old_file = drifted("nf4").classify(RegressionPolicy.of({}, "nf4"))
    old_file.token_rule_why = "cpu-nf4.jsonl was accepted before quality figures were stored: its tokens decide"
    assert old_file.by_quality and old_file.travel is None and old_file.undecided() == []
    (why,) = old_file.problems()
    assert why == ("drift in 1 of 10 outputs (10.0%), policy max_drift_share 0; cpu-nf4.jsonl was accepted before "
                   "quality figures were stored: its tokens decide")
    assert old_file.decided_by() == ("token for token against this machine's accepted outputs (cpu-nf4.jsonl was "
                                     "accepted before quality figures were stored: its tokens decide)")
    reference = drifted("fp32").classify(RegressionPolicy.of({}, "fp32"))
    assert not reference.by_quality and reference.problems() == ["drift in 1 of 10 outputs (10.0%), policy "
                                                                 "max_drift_share 0"]
    assert reference.decided_by() == "token for token against this machine's accepted outputs"
    ties_only = drifted("int8", drift=0).classify(RegressionPolicy.of({}, "int8"))
    assert ties_only.ok  # near-ties pass under the token rule as before


def test_figures_against_another_reference_do_not_compare():
    from pytest_infergate.quality.golden_files import GoldenOutput, GoldenOutputs

    recorded = GoldenOutputs({"figures_against": "bf16"}, {"q0": GoldenOutput("q0", [1], "a", [], {"top1": 1.0})})
    decision, why = decide_against(recorded, "cpu-int8.jsonl", "fp32", figures(n=1), {}, TravelMargins(), False)
    assert decision is None and why == ("cpu-int8.jsonl records figures against bf16, this run measures against "
                                        "fp32: its tokens decide")
    decision, why = decide_against(GoldenOutputs({"figures_against": "fp32"}, {}), "f", "fp32", figures(n=1), {},
                                   TravelMargins(), False)
    assert why == "" and decision.status == Status.INCONCLUSIVE and decision.undecided == [
        f"quality against the reference neither equivalent nor fallen compared with {ACCEPTED_HERE} (no sample has "
        "figures on both sides)"]


# ---- policy keys -------------------------------------------------------------------------------------------------

def test_regression_policy_keys_are_validated():
    assert parse_policy({"exact": 1, "max_drift_share": 0.1, "max_accepted_kl": 0.02, "near_tie_margin": 0.5,
                         "same_environment": 0, "gate_other_machine": 1, "gate_tokens": 1,
                         "max_batch_variant_share": 1}) == {
        "exact": 1.0, "max_drift_share": 0.1, "max_accepted_kl": 0.02, "near_tie_margin": 0.5,
        "same_environment": 0.0, "gate_other_machine": 1.0, "gate_tokens": 1.0, "max_batch_variant_share": 1.0}
    with pytest.raises(QualityPolicyError, match=r"gate_tokens=2 is a switch"):
        parse_policy({"gate_tokens": 2})
    with pytest.raises(QualityPolicyError, match=r"gate_other_machine=0.5 is a switch"):
        parse_policy({"gate_other_machine": 0.5})
    with pytest.raises(QualityPolicyError, match=r"exact=2 is a switch: 1 \(on\) or 0 \(off\)"):
        parse_policy({"exact": 2})
    with pytest.raises(QualityPolicyError, match="max_drift_share=1.5 is a share of the samples"):
        parse_policy({"max_drift_share": 1.5})
    with pytest.raises(QualityPolicyError, match="near_tie_margin=-0.1 must be a non-negative number"):
        parse_policy({"near_tie_margin": -0.1})
    with pytest.raises(QualityPolicyError, match="unknown quality key 'max_drift'.*max_drift_share"):
        parse_policy({"max_drift": 0})
    scoped = parse_ini_policies(["int8: max_drift_share=0, max_accepted_kl=0.01", "*: exact=1"])
    assert scoped["int8"] == {"max_drift_share": 0.0, "max_accepted_kl": 0.01} and scoped["*"] == {"exact": 1.0}
    # the comparison with the reference ignores the other gates' keys
    assert threshold_checks({"top1": 0.5}, ResolvedPolicy.given({"exact": 1.0, "max_drift_share": 0.0})) == []


def test_regression_policy_defaults_per_precision():
    assert RegressionPolicy.of({}, "int8").max_accepted_kl == MAX_ACCEPTED_KL["int8"]
    assert RegressionPolicy.of({}, "fp32").max_accepted_kl == MAX_ACCEPTED_KL["fp32"]
    default = RegressionPolicy.of({}, "fp32")
    assert (default.exact, default.gate_tokens, default.max_drift_share, default.near_tie_margin,
            default.same_environment, default.gate_other_machine) == (False, True, 0.0, NEAR_TIE_MARGIN, False, True)
    assert RegressionPolicy.of({}, "nf4").gate_other_machine is False
    assert RegressionPolicy.of({}, "nf4").gate_tokens is False and RegressionPolicy.of({}, "int8").gate_tokens is False
    assert RegressionPolicy.of({"gate_tokens": 1}, "int8").gate_tokens is True
    assert RegressionPolicy.of({}, "int8").travel == TravelMargins(0.05, 0.5, 0.1)
    assert RegressionPolicy.of({"max_top1_drop": 0.1, "max_kl_rise": 2}, "int8").travel == TravelMargins(0.1, 2, 0.1)
    assert RegressionPolicy.of({}, "int8").gate_other_machine is False
    assert RegressionPolicy.of({"max_accepted_kl": 0.5}, "nf4").max_accepted_kl == 0.5


# ---- header provenance -------------------------------------------------------------------------------------------

def test_environment_mismatch_names_what_differs():
    env = {"cpu": "Xeon", "cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "gpu": None, "torch": "2.13.0",
           "transformers": "5.24.0", "bitsandbytes": "0.50.2", "kernels": {"bnb_nf4": "avx512-bf16"}, "threads": 2}
    header = {"environment": env, "method": {"generation": "whole file"}, "compositions": {"default.jsonl": "abc"}}
    assert environment_mismatch(header, header) == []
    assert environment_mismatch(header, {**header, "environment": {**env, "threads": 1}}) == []  # informational
    other_cpu = {**env, "cpu_flags": ["avx2"], "kernels": {"bnb_nf4": "dequantize"}}
    assert environment_mismatch(header, {**header, "environment": other_cpu}) == [
        "cpu_flags: accepted ['avx2', 'avx512f', 'avx512_bf16'], now ['avx2']",
        "kernels: accepted {'bnb_nf4': 'avx512-bf16'}, now {'bnb_nf4': 'dequantize'}"]
    edited = environment_mismatch(header, {**header, "compositions": {"default.jsonl": "def"}})
    assert len(edited) == 1 and "sample set default.jsonl changed" in edited[0]
    assert "record no environment" in environment_mismatch({"versions": {}}, header)[0]


def _accepted_file(path, environment):
    path.write_text(json.dumps({"schema_version": 1, **({"environment": environment} if environment else {})})
                    + "\n")
    return path


def test_accepted_file_is_chosen_by_machine_then_kernel_path_and_updates_never_overwrite_another(tmp_path):
    avx512 = {"cpu": "Xeon", "gpu": None, "torch": "2.13.0", "kernels": {"bnb_int8": "torch._int_mm",
                                                                          "torch_cpu_capability": "AVX512"}}
    avx2 = {**avx512, "cpu": "EPYC", "kernels": {"bnb_int8": "fp32 matmul", "torch_cpu_capability": "AVX2"}}
    intel_avx2 = {**avx2, "cpu": "Xeon E5"}  # the same kernel path on another CPU model
    default = tmp_path / "cpu-int8.jsonl"
    assert select_accepted(default, avx2) == (default, None)  # nothing accepted yet
    assert path_to_update(default, avx2) == default

    _accepted_file(default, avx512)
    assert select_accepted(default, {**avx512, "torch": "2.14.0"}) == (default, SAME_MACHINE)  # versions: gated
    assert select_accepted(default, {**avx512, "cpu": "other Xeon"}) == (default, SAME_KERNELS)
    assert select_accepted(default, avx2) == (default, None)  # fallback: the default, with a warning
    tagged = path_to_update(default, avx2)
    assert tagged.name == f"cpu-int8.{variant_tag(avx2)}.jsonl" and variant_tag(avx2).startswith("avx2-")
    assert variant_tag(avx2) != variant_tag({**avx2, "kernels": {**avx2["kernels"], "bnb_int8": "x"}})
    assert variant_tag(avx2) != variant_tag(intel_avx2)
    assert variant_tag({**avx2, "gpu": "NVIDIA H200"}).startswith("nvidia-h200-")

    _accepted_file(tagged, avx2)
    assert select_accepted(default, avx2) == (tagged, SAME_MACHINE)
    assert select_accepted(default, avx512) == (default, SAME_MACHINE)
    assert select_accepted(default, intel_avx2) == (tagged, SAME_KERNELS)  # compared, but not this machine's
    assert path_to_update(default, avx2) == tagged
    intel_file = path_to_update(default, intel_avx2)  # its own file: the EPYC's is kept
    assert intel_file not in (default, tagged)
    assert variants(default) == [default, tagged]
    _accepted_file(intel_file, intel_avx2)
    assert select_accepted(default, intel_avx2) == (intel_file, SAME_MACHINE)
    assert select_accepted(default, avx2) == (tagged, SAME_MACHINE)

    _accepted_file(default, None)  # an older file without an environment is rewritten in place
    assert path_to_update(default, {**avx512, "kernels": {"torch_cpu_capability": "NEON"}}) == default
    assert numerics_key(None) is None and numerics_key({"cpu": "x"}) is None
    default.unlink()  # only tagged files: the first is the fallback, and an update writes the default
    assert select_accepted(default, {**avx512, "kernels": {}}) == (sorted([tagged, intel_file])[0], None)
    assert path_to_update(default, {**avx512, "kernels": {}}) == default


def test_where_accepted_outputs_were_recorded_is_said_unless_it_is_this_machine():
    header = {"environment": {"cpu": "AMD EPYC", "gpu": None, "kernels": {"bnb_int8": "fp32 matmul",
                                                                         "torch_cpu_capability": "AVX2"}}}
    assert recorded_elsewhere(header, SAME_MACHINE) == ""
    assert recorded_elsewhere(header, SAME_KERNELS) == "AMD EPYC; bnb_int8 fp32 matmul, torch_cpu_capability AVX2"
    assert recorded_elsewhere({"environment": {"gpu": "NVIDIA H200", "cpu": "x", "kernels": {}}}, None) \
        == "NVIDIA H200"
    assert "does not record" in recorded_elsewhere({}, None)


# ---- fixed composition -------------------------------------------------------------------------------------------

def test_subsets_are_selected_from_the_whole_file_run(tiny_fp32, sample_file):
    samples = load_samples(sample_file)
    whole = run_samples(tiny_fp32, samples).outputs
    cache: dict = {}
    subset = [s for s in samples if s.category == "code"][::-1]  # categories, in another order
    picked = fixed_outputs(tiny_fp32, subset, cache)
    assert [g.id for g in picked] == [s.id for s in subset]
    assert {g.id: g.token_ids for g in picked} == {g.id: g.token_ids for g in whole if g.id in {s.id for s in subset}}
    assert fixed_outputs(tiny_fp32, samples[:2], cache) == whole[:2]
    assert len(cache) == 1  # one run per sample set and precision, whatever the subsets asked
    assert composition_id(samples) != composition_id(samples[::-1])


def test_samples_built_in_code_are_their_own_composition(tiny_fp32):
    samples = [GoldenSample(f"c{i}", "chat", ({"role": "user", "content": t},), None, 8) for i, t in enumerate(TEXTS)]
    assert fixed_outputs(tiny_fp32, samples, {}) == run_samples(tiny_fp32, samples).outputs


# ---- batch invariance --------------------------------------------------------------------------------------------

def test_batch_invariance_variants_on_tiny(tiny_fp32, sample_file):
    samples = load_samples(sample_file)
    result = check_variants(tiny_fp32, samples, fixed_outputs(tiny_fp32, samples, {}), 2048)
    assert [v.name for v in result.variants] == ["batch", "rotated"]
    assert all(v.samples == len(samples) and 0 <= v.share <= 1 for v in result.variants)
    assert all(v.mean_kl is not None and 0 <= v.mean_kl < 1e-3 for v in result.variants)
    assert result.samples == [s.id for s in samples] and 0 <= result.variant_share <= 1
    assert rotate([1, 2, 3, 4, 5]) == [3, 4, 5, 1, 2]
    record = BatchInvarianceRecord("t::x[fp32]", Status.PASS, result, {"max_batch_variant_share": 0.0})
    back = record_from_dict(json.loads(json.dumps(record.to_dict())))
    assert isinstance(back, BatchInvarianceRecord) and back.to_dict() == record.to_dict()
    # without its policy key the check gates nothing: its line says so, not a bare pass (a new user read "PASS int8:
    # 4 of 4 samples change" as a contradiction)
    from pytest_infergate.results.summary import batch_invariance_line

    assert "not gated" not in batch_invariance_line(record).text
    assert batch_invariance_line(BatchInvarianceRecord("t::x[int8]", Status.PASS, result)).text.endswith(
        "; measured, not gated (no max_batch_variant_share)")


def test_batch_invariance_on_the_first_tokens(tiny_fp32, sample_file):
    """A cap compares each sample's first tokens: alone they are the uncapped alone run's first tokens, and the
    fixed-composition outputs are cut to them; the cap travels with the result."""
    samples = load_samples(sample_file)[:4]
    fixed = fixed_outputs(tiny_fp32, samples, {})
    capped = check_variants(tiny_fp32, samples, fixed, 2048, max_new_tokens=5)
    assert capped.max_new_tokens == 5 and capped.notes[0] == "each sample compared on its first 5 tokens"
    assert BatchInvariance.from_dict(capped.to_dict()).max_new_tokens == 5
    alone = run_samples(tiny_fp32, samples, config=golden_engine_config(max_batch_size=1)).outputs
    alone_capped = run_samples(tiny_fp32, samples, config=golden_engine_config(max_batch_size=1),
                               max_new_tokens=5).outputs
    assert all(len(g.token_ids) <= 5 for g in alone_capped)
    assert [g.token_ids for g in alone_capped] == [g.token_ids[:5] for g in alone]
    # what the capped check compares is the uncapped comparison cut at 5 tokens: a change after token 5 is not seen
    full = check_variants(tiny_fp32, samples, fixed, 2048)
    assert {d.id for d in capped.variants[0].changed} == {d.id for d in full.variants[0].changed if d.token < 5}


def test_batch_invariance_reports_a_changed_sample():
    from pytest_infergate.quality.golden_generation import Divergence, VariantResult

    variant = VariantResult("batch", "whole file", [Divergence("q3", 5, 0.04, "alone text", "batched text")], 4,
                            0.02, 0.05)
    result = BatchInvariance("int8", ["q1", "q2", "q3", "q4"], [variant, VariantResult("rotated", "", [], 4)])
    assert result.variant_ids == ["q3"] and result.variant_share == 0.25 and result.example().id == "q3"
    assert BatchInvariance.from_dict(result.to_dict()).to_dict() == result.to_dict()


def test_golden_record_keeps_near_ties_and_policy():
    tie = changed("tie", 0.05, 0.001)
    tie.regression = NEAR_TIE
    record = GoldenRecord("t", Status.INCONCLUSIVE, "int8", "p", compared=10, changed=[tie],
                          policy=RegressionPolicy.of({}, "int8").to_dict(), environment_mismatch=["cpu: x"],
                          undecided=["drift against another machine"])
    data = json.loads(json.dumps(record.to_dict()))
    assert data["near_ties"] == 1 and data["drift"] == 0 and data["changed"][0]["divergence_margin"] == 0.05
    assert data["policy"]["gate_other_machine"] == 0.0
    back = GoldenRecord.from_dict(data)
    assert back.near_ties[0].id == "tie" and back.policy == record.policy and back.environment_mismatch == ["cpu: x"]
    assert back.status == Status.INCONCLUSIVE and back.undecided == ["drift against another machine"]


# ---- the reference's log-probabilities, scored once ---------------------------------------------------------------

def test_reference_scores_are_computed_once_and_capped(tiny_fp32, monkeypatch):
    from pytest_infergate.quality import scoring
    from pytest_infergate.quality.scoring import ScoreCache

    rows = [([1, 2, 3], [4, 5]), ([6, 7], [8, 9, 10])]
    forwards = []
    real = scoring.continuation_logprobs

    def counted(model, batch):
        forwards.append(batch)
        return real(model, batch)

    monkeypatch.setattr(scoring, "continuation_logprobs", counted)
    cache = ScoreCache()
    first = cache.logprobs(tiny_fp32.model, rows)
    again = cache.logprobs(tiny_fp32.model, rows[::-1])
    assert len(forwards) == 2  # one forward per row, the first time only
    assert all(torch.equal(a, b) for a, b in zip(first, again[::-1]))
    assert all(torch.equal(a, b) for a, b in zip(first, scoring.score_rows(tiny_fp32.model, rows)))
    assert cache.bytes == sum(t.numel() * t.element_size() for t in first)
    # the same stats through teacher_forced with and without the cache
    with_cache, _ = scoring.teacher_forced(tiny_fp32.model, tiny_fp32.model, rows, reference_scores=cache)
    without, _ = scoring.teacher_forced(tiny_fp32.model, tiny_fp32.model, rows)
    assert [s.ref_nll for s in with_cache] == [s.ref_nll for s in without]
    small = ScoreCache(max_bytes=1)  # nothing fits: every call scores again, and still answers
    forwards.clear()
    small.logprobs(tiny_fp32.model, rows)
    small.logprobs(tiny_fp32.model, rows)
    assert len(forwards) == 4 and small.bytes == 0


# ---- another machine, emulated -------------------------------------------------------------------------------------

@pytest.mark.slow  # builds a model, starts processes or runs many bootstraps
def test_avx2_emulation_reaches_the_kernel_path_every_process_reports(tmp_path):
    """benchmarks/emulate_avx2.py: a process it starts runs ATen on AVX2 and bitsandbytes on its AVX2-only paths, so
    the golden header records (and the gate picks) the AVX2 kernel path; on an AVX2-only CPU nothing changes."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    probe = ("import torch; import bitsandbytes.functional as f; from bitsandbytes.backends.cpu import ops; "
             "print(torch.backends.cpu.get_cpu_capability(), f.has_avx512bf16(), ops._has_avx512)")
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "emulate_avx2.py"), sys.executable, "-c", probe],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split()[-3:] == ["AVX2", "False", "False"], out.stderr
    usage = subprocess.run([sys.executable, str(root / "benchmarks" / "emulate_avx2.py")], capture_output=True,
                           text=True, timeout=60)
    assert usage.returncode != 0 and "emulate_avx2.py .venv/bin/pytest suites/" in usage.stderr


def test_a_figure_the_same_up_to_float_noise_reads_unchanged_and_a_gain_reads_better():
    """The suites' golden line read 'worse by -6.7×10⁻⁸ (95% CI -1.5×10⁻⁷ to 1.7×10⁻⁸)': a change a thousandth of
    the margin or less is float noise and reads 0; a figure that improved says so."""
    same = TravelFigure("mean_kl", 0.277, 0.277, -6.7e-8, -1.5e-7, 1.7e-8, 0.138, 48)
    assert same.describe() == ("mean_kl 0.277 accepted → 0.277 now, unchanged (95% CI of the worsening 0 to 0) "
                               "≤ margin 0.138 (48 samples)")
    better = TravelFigure("top1", 0.80, 0.83, -0.03, -0.05, -0.01, 0.05, 48)
    assert better.describe() == ("top1 0.8 accepted → 0.83 now, better by 0.03 (95% CI of the worsening -0.05 to "
                                 "-0.01) ≤ margin 0.05 (48 samples)")
    worse = TravelFigure("top1", 0.94, 0.79, 0.15, 0.11, 0.19, 0.05, 48)
    assert worse.status == Status.FAIL and "worse by 0.15 (95% CI of the worsening 0.11 to 0.19) > margin" in \
        worse.describe()
