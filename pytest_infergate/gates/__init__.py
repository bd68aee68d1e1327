"""The objects the fixtures hand a test: `infergate_bench` and `infergate_endpoint` (perf.PerfBench, over a target's
runs: local_runs, endpoint), `infergate_golden` (golden, pair). They drive the mechanics (engine, models, endpoint
client), decide through perf/ and quality/, and record results/ records: the one package of gate objects."""
