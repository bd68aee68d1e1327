"""Defaults for the ready-made gate suites. Run them with `pytest suites/` (see the README)."""
