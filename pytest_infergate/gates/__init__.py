"""The objects the fixtures hand a test: `infergate_bench` (bench.PerfBench), `infergate_golden` (golden), the
endpoint's (endpoint, pair, endpoint_golden). They drive the mechanics (engine, models, endpoint client), decide
through perf/ and quality/, and record results/ records: the one package of pytest-facing gate objects."""
