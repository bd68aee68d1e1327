"""Sampled output quality (guide, best practice 6: "对输出质量做抽样回归"): each precision against the reference
precision under the quality policy, and against its own accepted golden outputs, so a library upgrade that
changes answers is caught even where the precision was already known to differ from the reference."""


def test_against_reference(infergate_golden, not_the_reference):
    infergate_golden.check()


def test_against_accepted_golden(infergate_golden):
    infergate_golden.check_regression()
