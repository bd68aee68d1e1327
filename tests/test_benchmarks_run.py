"""The scripts of benchmarks/ end to end, each in a process of its own as a user runs it, at its smallest: exit code 0
and a line it prints with a real figure. Two of them once broke unnoticed after refactors (an attribute they read
was removed); figure_power, gate_trace, stored_replay and emulate_avx2 have tests of their own."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from openai_servers import built_llama_server, require_llama_server

ROOT = Path(__file__).resolve().parents[1]
FIGURE = r"-?\d+(?:\.\d+)?"  # a number as the scripts print it


def run_script(script: str, *args, cache_dir: Path) -> str:
    """benchmarks/`script` run with `args` from the repository's root; its stdout, once it exited 0."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *map(str, args)], cwd=ROOT,
                          env={**os.environ, "INFERGATE_CACHE_DIR": str(cache_dir)}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def line(pattern: str, out: str) -> re.Match:
    """The first line of `out` that `pattern` matches from its start."""
    found = re.search(pattern, out, re.MULTILINE)
    assert found is not None, f"no line matches {pattern!r} in:\n{out[-3000:]}"
    return found


def json_lines(out: str) -> list[dict]:
    return [json.loads(text) for text in out.splitlines() if text.startswith("{")]


@pytest.mark.slow
def test_corpus_kl_scores_int8_against_fp32_and_its_noise_fails_the_rise_gate(cache_dir, tmp_path):
    figures = tmp_path / "corpus.json"
    out = run_script("corpus_kl.py", "--model", "tiny-random-llama", "--precisions", "int8", "--chunk-tokens", 128,
                     "--chunks", 4, "--noise", 0.1, "--layer", 1, "--json", figures, cache_dir=cache_dir)
    line(rf"^int8 vs fp32: {FIGURE} s wall, {FIGURE} s CPU", out)
    line(rf"^ +[\d,]+ tokens in 4 chunks: mean KL {FIGURE}", out)
    line(r"^  noise 0\.1 on layer 1: FAIL under max_corpus_kl_rise=0\.5", out)
    saved = json.loads(figures.read_text())
    unchanged, noisy = saved["int8"]["summary"], saved["int8 noise 0.1"]
    assert unchanged["mean_kl"] > 0 and noisy["status"] == "fail", saved
    assert noisy["summary"]["mean_kl"] > unchanged["mean_kl"], saved


@pytest.mark.slow
def test_endpoint_capacity_finds_a_capacity_on_llama_server(cache_dir):
    require_llama_server()
    out = run_script("endpoint_capacity.py", "--low", 1, "--high", 4, "--point-s", 2, "--min-requests", 4,
                     "--budget-s", 30, "--slots", 2, "--ttft-ms", 10000, "--tpot-ms", 1000, cache_dir=cache_dir)
    line(rf"^ +1 +\d+ +{FIGURE}% +{FIGURE}%- *{FIGURE}% +{FIGURE} +\d+/\d+ +\d+/\d+ +\d+/\d+ +(pass|FAIL|cut)", out)
    line(rf"^capacity {FIGURE} req/s: SLO met by {FIGURE}% \(95% CI", out)


@pytest.mark.slow
def test_endpoint_client_measures_its_overhead_per_streamed_token(cache_dir):
    out = run_script("endpoint_client.py", "--requests", 8, "--tokens", 32, "--concurrency", 4, "--server-tokens", 16,
                     cache_dir=cache_dir)
    ours = line(rf"^infergate client, fast local server +(\d+) chunks +CPU +{FIGURE} us/token", out)
    assert int(ours.group(1)) == 8 * 32, ours.group(0)  # the stub server streams exactly max_tokens tokens
    line(rf"^raw httpx \+ json\.loads, fast local server +\d+ chunks +CPU +{FIGURE} us/token", out)
    line(rf"^overhead over the raw floor: {FIGURE} us/token \(x{FIGURE}\)", out)
    if built_llama_server() is None:
        line(r"^llama-server not built \(bash setup\.sh test\): real-server figure skipped", out)
        return
    real = line(rf"^infergate client, llama\.cpp server \(embedded\) +(\d+) chunks +CPU +{FIGURE} us/token", out)
    assert 0 < int(real.group(1)) <= 4 * 16, real.group(0)
    line(rf"^  fixed per run: \d+ ms CPU; client CPU is {FIGURE}% of the wall time", out)
    line(rf"^raw httpx \+ json\.loads, llama\.cpp server +\d+ chunks +CPU +{FIGURE} us/token", out)


@pytest.mark.slow
def test_engine_benchmark_runs_the_engine_and_the_alternatives(cache_dir):
    """transformers' own continuous batching (`cb`) is left out: its manager polls, 20-90 s of mostly system CPU
    time on two requests of tiny-random-llama, where the rest of the script takes 15 s."""
    out = run_script("engine.py", "--model", "tiny-random-llama", "--requests", 2, "--batch", 2, "--skip", "cb",
                     cache_dir=cache_dir)
    line(rf"^engine self-check on construction: median {FIGURE} ms", out)
    for name in (r"engine continuous +", r"engine \+ prefix caching", r"HF generate, static +2 ",
                 "HF generate, sequential"):
        useful = line(rf"^{name}: +(\d+) useful tokens in +{FIGURE} s = +{FIGURE} tok/s", out)
        assert int(useful.group(1)) > 0, useful.group(0)
    line(rf"^batch-1, 32-token prompt \+ 128 tokens \(best of 3\): engine {FIGURE} tok/s, model\.generate {FIGURE}",
         out)
    for mode in ("continuous", "dynamic"):
        line(rf"^  {mode} *: TTFT p50 +{FIGURE} ms, p90 +{FIGURE} ms", out)
    line(rf"^  batch-1 engine / model\.generate += +{FIGURE}x", out)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ab", "baseline", "env"])
def test_gate_power_decides_each_condition_in_every_mode(mode, cache_dir, tmp_path):
    """baseline: a child process saves the baseline as --infergate-save-baseline does; env: a worker process runs
    the baseline side as --infergate-baseline-python does (gate_power read a PerfRecord attribute a refactor moved
    into its outcome, and crashed in both)."""
    trials = tmp_path / "trials.json"
    out = run_script("gate_power.py", "--model", "tiny-random-llama", "--mode", mode, "--trials", 1, "--slowdowns",
                     "0,0.25", *(["--json", trials] if mode == "baseline" else []), cache_dir=cache_dir)
    for slowdown in ("  0%", " 25%"):
        line(rf"^  slowdown {slowdown} trial  1: (pass|inconclusive|fail) +itl_ms x{FIGURE} \[{FIGURE}, {FIGURE}\], "
             rf"tokens_per_s x{FIGURE} \[{FIGURE}, {FIGURE}\]", out)
    line(r"^false failures with no change: [01]/1 \(target 0\)", out)
    line(rf"^time per trial: median {FIGURE} s, max {FIGURE} s", out)
    if mode == "baseline":
        line(rf"^baseline saved to .*: \d+ repetitions, itl p50 {FIGURE} ms, {FIGURE} tok/s", out)
        saved = json.loads(trials.read_text())
        assert [t["slowdown"] for t in saved["trials"]] == [0.0, 0.25], saved["trials"]
        assert all(t["record"]["measurement"] for t in saved["trials"]) and saved["baseline"], saved


@pytest.mark.slow
@pytest.mark.embedded
@pytest.mark.parametrize("command, args", [
    ("costs", ["--samples", 1]),
    ("classify", ["--samples", 8]),
    ("noise", ["--scales", 0.1, "--samples", 8]),
], ids=["costs", "classify", "noise"])
def test_golden_gate_commands_on_the_embedded_model(command, args, cache_dir):
    rows = json_lines(run_script("golden_gate.py", command, "--precisions", "fp32", *args, cache_dir=cache_dir))
    assert rows and all(row["precision"] == "fp32" for row in rows), rows
    if command == "costs":
        assert [row["what"] for row in rows] == ["generation, whole file (2)", "scoring 2, batches of 8",
                                                 "scoring 2, alone", "batch invariance, suite subset (1)"], rows
        assert all(row["wall_s"] >= 0 and row["cpu_s"] > 0 for row in rows), rows
        assert set(rows[-1]["variants"]) == {"batch", "rotated"}, rows[-1]
        return
    (row,) = rows
    assert row["against"] == "cpu-fp32.jsonl" and row["generation_cpu_s"] > 0, row
    assert len(row["samples"]) == row["changed"], row
    if command == "noise":  # 10% noise on a norm weight changes the greedy answers
        assert row["scale"] == 0.1 and row["changed"] > 0, row


@pytest.mark.slow
def test_load_evidence_prints_every_estimate_quiet_and_under_a_hog(cache_dir):
    out = run_script("load_evidence.py", "--model", "tiny-random-llama", "--rounds", 1, "--repeats", 1,
                     "--hog-processes", 1, cache_dir=cache_dir)
    line(rf"^round 1: quiet/same wall {FIGURE} s, quiet/x2 wall {FIGURE} s, busy/same wall {FIGURE} s, "
         rf"busy/x2 wall {FIGURE} s", out)
    cell = rf"(?:{FIGURE} \[ *{FIGURE}, *{FIGURE}\]|-)"  # "-": no positive denominator (an estimate below zero)
    for name in ("wall", "wall-rq main", "wall-rq mean", "wall-rq max", "wall-rq sum", "cpu main", "cpu mean",
                 "team"):
        line(rf"^{re.escape(name)} +{cell} +{cell} +{cell} +{cell}$", out)
    line(rf"^wall +{FIGURE} \[", out)  # the wall time is always a figure


@pytest.mark.slow
def test_preempted_cpu_time_prints_each_co_tenants_move_against_quiet_blocks(cache_dir):
    out = run_script("preempted_cpu_time.py", "--kinds", "1 loop + 1 stream", "--repeats", 2, cache_dir=cache_dir)
    found = line(rf"^  1 loop \+ 1 stream +load-free share ({FIGURE}) +cost ×({FIGURE}) median, ×({FIGURE}) least +"
                 rf"\(quiet blocks moved ×({FIGURE})\)$", out)
    assert 0 < float(found[1]) <= 1 and all(float(found[i]) > 0 for i in (2, 3, 4)), found[0]


@pytest.mark.slow
def test_repetition_count_prints_each_window_sizes_bias_against_the_whole_run(cache_dir):
    out = run_script("repetition_count.py", "--repetitions", 6, "--sizes", "3,6", "--kinds", "1 loop",
                     cache_dir=cache_dir)
    line(r"^  1 loop, load-free share " + FIGURE + ":$", out)
    found = line(rf"^ +3 repetitions: as measured ×({FIGURE}) \[({FIGURE}), ({FIGURE})\] +load-corrected ×{FIGURE}",
                 out)
    assert float(found[2]) <= float(found[1]) <= float(found[3]), found[0]
    whole = line(rf"^ +6 repetitions: as measured ×({FIGURE}) \[", out)
    assert float(whole[1]) == 1.0, whole[0]  # the one window of the whole run is the run


@pytest.mark.slow
def test_lockstep_spread_prints_per_round_ratios_and_their_spread(cache_dir):
    out = run_script("lockstep_spread.py", "--model", "tiny-random-llama", "--rounds", 2, "--slowdown", 0.25,
                     cache_dir=cache_dir)
    for index in (1, 2):
        line(rf"^  round +{index}: by repetition x{FIGURE} \(ITL x{FIGURE}\) \| step-locked x{FIGURE} "
             rf"\(ITL x{FIGURE}\)", out)
    line(rf"^  tokens/s cost, step-locked +median x{FIGURE} +range {FIGURE}-{FIGURE} +sd\(log\) {FIGURE}", out)
    line(rf"^step-locked / by repetition, sd\(log\): tokens/s {FIGURE}, ITL {FIGURE}", out)


@pytest.mark.slow
def test_memory_repro_counts_the_held_allocation_in_every_fresh_process(cache_dir):
    out = run_script("memory_repro.py", "--model", "tiny-random-llama", "--precisions", "int8", "--processes", 2,
                     "--repeats", 1, "--extra-mb", 8, cache_dir=cache_dir)
    for index in (1, 2):
        peak = line(rf"^int8 process {index}: peak_mem_mb per repetition ({FIGURE}) \(within ×{FIGURE}\); weights "
                    rf"{FIGURE}, KV allocated {FIGURE}, serving's rise {FIGURE} MiB", out)
        assert float(peak.group(1)) >= 8, peak.group(0)  # the 8 MiB held through the repetition count
    line(rf"^int8: median per process {FIGURE}, {FIGURE} MiB; spread across 2 processes {FIGURE}%", out)


@pytest.mark.slow
def test_quality_power_passes_the_unchanged_candidate_and_fails_every_change(cache_dir, tmp_path):
    trials = tmp_path / "trials.json"
    out = run_script("quality_power.py", "--model", "tiny-random-llama", "--levels", 0.2, "--seeds", 1, "--samples",
                     4, "--layer", 1, "--layer-levels", 0.3, "--layer-seeds", 1, "--windows", 32, "--json", trials,
                     cache_dir=cache_dir)
    line(rf"^none 0 seed 0 \(engine\): .* \| golden top-1 {FIGURE} KL {FIGURE} .* \| corpus KL {FIGURE}", out)
    saved = json.loads(trials.read_text())["trials"]
    assert [t["change"] for t in saved] == ["none", "norms", "layer 1", "window"], saved
    unchanged, *changed = saved
    # the relative gates, against what was accepted at s = 0: the unchanged candidate is what they accepted
    assert unchanged["verdicts"]["accepted outputs"] == "pass", unchanged
    assert unchanged["verdicts"]["corpus, rise"] == "pass", unchanged
    for trial in changed:
        assert trial["verdicts"]["accepted outputs"] == trial["verdicts"]["corpus, rise"] == "fail", trial
        assert trial["corpus"]["kl_rise"] > 0.5, trial
    again = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality_power.py"), "--table-from", trials],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    line(r"^\| none \| 0 \| 1 \| .* \| 1/0/0 \| 1/0/0 \|$", again.stdout)
    line(r"^\| window \| W=32 \| 1 \| .* \| 0/0/1 \|$", again.stdout)


@pytest.mark.slow
@pytest.mark.embedded
def test_self_check_costs_on_the_embedded_model_and_a_gemma3_shape(cache_dir):
    out = run_script("self_check.py", "--repeats", 1, cache_dir=cache_dir)
    line(rf"^embedded model \(SmolLM2-135M, 30 layers, no window\): self-check {FIGURE} s \(\d+ probe tokens\)", out)
    line(rf"^Gemma 3 270M-shaped, window 512, long probe through one layer per pattern \(layers \[0, 5\]\): "
         rf"self-check {FIGURE} s, window crossed True", out)
    line(rf"^Gemma 3 270M-shaped, window 512, long probe through every layer .*: self-check {FIGURE} s, window "
         rf"crossed True", out)
    line(rf"^one layer per pattern / every layer: ×{FIGURE} the time", out)


@pytest.mark.slow
def test_thread_speed_probes_each_fresh_process(cache_dir):
    out = run_script("thread_speed.py", "--processes", 2, "--repetitions", 1, cache_dir=cache_dir)
    rows = re.findall(rf"^  tokens/s +{FIGURE} +TTFT p50 +{FIGURE} ms +probe +({FIGURE}) ms", out, re.MULTILINE)
    assert len(rows) == 2 and all(float(probe) > 0 for probe in rows), out
    for name in ("tokens/s as measured", "tokens/s × thread probe", "TTFT p50 as measured", "TTFT p50 / thread probe"):
        line(rf"^  {re.escape(name)} +max/min ×{FIGURE}, c\.v\. {FIGURE}%", out)
