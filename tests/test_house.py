"""The house's measurable shape (issue #57's done-when), held so that no change quietly undoes it: small modules,
the served model as a strategy (no gate branches on `is_endpoint`), the perf gates' faces small, and no dated
measurement in a code comment (docs/measurements.md holds those)."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest_infergate

PACKAGE = Path(pytest_infergate.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
MOST_LINES = 350


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_350_lines():
    assert MODULES and {_name(p): _lines(p) for p in MODULES if _lines(p) > MOST_LINES} == {}


def test_is_endpoint_is_read_at_most_four_times_and_never_by_a_gate():
    reads = [f"{_name(p)}:{node.lineno}" for p in MODULES for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "is_endpoint"]
    assert len(reads) <= 4, reads
    assert not [where for where in reads if where.startswith("gates/")], reads


def test_the_perf_and_endpoint_gates_are_small_together():
    assert _lines(PACKAGE / "gates" / "perf.py") + _lines(PACKAGE / "gates" / "endpoint.py") <= 450


def test_no_code_comment_holds_a_dated_measurement():
    dated = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    found = []
    for path in MODULES:
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.COMMENT and dated.search(token.string):
                found.append(f"{_name(path)}:{token.start[0]}: {token.string}")
    assert found == [], "measurement history belongs in docs/measurements.md:\n" + "\n".join(found)
