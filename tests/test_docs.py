"""The documentation cannot drift from the code: the README's size and its first gate, the generated reference,
the CI recipes' options, the modules the README names."""

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = README.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    commands = "\n".join(lines[:6])
    assert "bash setup.sh && .venv/bin/pytest suites/" in commands
    assert "bash setup.sh test && .venv/bin/pytest tests" in commands


def test_every_option_metric_policy_key_marker_and_command_is_in_the_generated_reference():
    from pytest_infergate.cli import build_parser
    from pytest_infergate.measurement import METRICS
    from pytest_infergate.options import OPTION_SPECS
    from pytest_infergate.plugin import MARKERS
    from pytest_infergate.quality.policy import POLICY_KEYS

    docs = hooks()
    options = docs.options_table()
    for spec in OPTION_SPECS:
        assert f"`{spec.flag}`" in options and f"`{spec.ini_key}`" in options
        assert spec.help.strip(), f"{spec.flag} has no help text: the reference page would say nothing"
    metrics = docs.metrics_table()
    assert all(f"`{name}`" in metrics for name in METRICS)
    policy = docs.policy_table()
    assert all(f"`{key}`" in policy for key in POLICY_KEYS)
    markers = docs.markers_list()
    assert all(line.split("(")[0].split(":")[0] in markers for line in MARKERS)
    cli = docs.cli_help()
    for action in build_parser()._subparsers._group_actions:
        assert all(f"`infergate {name}`" in cli for name in action.choices)


def test_every_docs_page_holds_its_generated_tables_as_the_code_generates_them_now():
    """The reference reads in the repository as on the site: each generated block is committed in its page, and
    a block that differs from what the code generates now fails here (`python docs/hooks.py` rewrites them)."""
    docs = hooks()
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert len(pages) >= 15
    asked = set()
    for page in pages:
        text = page.read_text()
        asked |= set(docs.GENERATED.findall(text))
        assert docs.render(text) == text, f"{page} holds a stale generated table: run python docs/hooks.py"
        assert text.count("<!-- generated:") == text.count("<!-- end generated:"), page
    assert asked == set(docs.GENERATORS), "a generated table no page shows, or a page asking for an unknown one"
    with pytest.raises(ValueError, match="unknown generated table 'nope'"):
        docs.render("<!-- generated: nope -->")
    # a page that only asks for a table gets it, closed, the rest of the page untouched; rendering twice is a no-op
    asked_only = "# T\n\n<!-- generated: markers -->\n\nAfter.\n"
    once = docs.render(asked_only)
    assert once.endswith("<!-- end generated: markers -->\n\nAfter.\n") and docs.render(once) == once


def test_mkdocs_nav_names_only_pages_that_exist():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(items):
        for item in items:
            for value in item.values() if isinstance(item, dict) else [item]:
                yield from pages(value) if isinstance(value, list) else [value]

    named = list(pages(config["nav"]))
    assert named and all((ROOT / "docs" / page).is_file() for page in named)


@pytest.mark.parametrize("recipe", sorted((ROOT / "docs" / "ci").glob("*.yml")), ids=lambda p: p.name)
def test_ci_recipes_parse_and_use_only_options_that_exist(recipe):
    from pytest_infergate.cli import build_parser
    from pytest_infergate.options import OPTION_SPECS

    yaml.safe_load(recipe.read_text())  # valid YAML
    text = recipe.read_text()
    flags = set(re.findall(r"--infergate-[a-z-]+", text))
    assert flags, f"{recipe.name} uses no infergate option"
    known = {spec.flag for spec in OPTION_SPECS}
    assert flags <= known, f"{recipe.name} uses unknown options {sorted(flags - known)}"
    commands = set(re.findall(r"\binfergate (\w[\w-]*)", text))
    subcommands = {name for action in build_parser()._subparsers._group_actions for name in action.choices}
    assert commands <= subcommands, f"{recipe.name} runs unknown commands {sorted(commands - subcommands)}"
    assert "pytest" in text and "--infergate-report" in text


def test_the_modules_the_readme_names_exist():
    package = ROOT / "pytest_infergate"
    section = README[README.index("## Development"):]
    named = re.findall(r"`([a-z_]+(?:/|\.py))`", section)
    assert len(named) >= 8
    missing = [name for name in named if not (package / name.rstrip("/")).exists()]
    assert not missing, f"README names modules that do not exist: {missing}"


FIRST_GATE = re.search(r"## A first gate.*?```python\n(.*?)```", README, re.DOTALL).group(1)


@pytest.mark.embedded
@pytest.mark.load_evidence  # as a user runs it: on a busy runner a budget missed by time is inconclusive
def test_the_readme_first_gate_passes_as_written_on_the_cpu(pytester, cache_dir):
    pytester.makepyfile(test_first_gate=FIRST_GATE)
    result = pytester.runpytest(f"--infergate-cache-dir={cache_dir}", "--infergate-precisions=fp32",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    # PASS on a 2-core CPU; where other jobs kept this machine busy, INCONCLUSIVE saying so (never FAIL)
    assert "infergate verdict: PASS" in text or ("infergate verdict: INCONCLUSIVE" in text
                                                 and "the runner was busy" in text), text[-3000:]


def test_the_package_map_in_the_development_page_names_modules_that_exist():
    # issue #33 point 6: the map is regenerated by hand; this keeps it honest
    package = ROOT / "pytest_infergate"
    page = (ROOT / "docs" / "development.md").read_text()
    table = page[page.index("| layer |"):page.index("## The path of one request")]
    rows = [row for row in table.splitlines()[2:] if row.startswith("|")]
    named = {name for row in rows for name in re.findall(r"`([a-z_]+(?:/|\.py))`", row.split("|")[2])}
    assert len(named) >= 25
    missing = sorted(name for name in named if not (package / name.rstrip("/")).exists())
    assert not missing, f"docs/development.md names modules that do not exist: {missing}"
    on_disk = {p.name + "/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    on_disk |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    assert not on_disk - named, f"modules the package map leaves out: {sorted(on_disk - named)}"


def test_the_drawn_house_has_no_circle():
    """Issue #33: the layers contract forbids imports back up; this forbids a circle within a layer or package as
    well (imports inside functions count, and so do imports for type checking only: issue #42, a circle a reader
    must follow is a circle even where it never runs)."""
    import grimp

    graph = grimp.build_graph("pytest_infergate", exclude_type_checking_imports=False)
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if module < imported and graph.chain_exists(importer=imported, imported=module):
                circles.append(f"{module} ⇄ {imported}: "
                               + " → ".join(graph.find_shortest_chain(importer=imported, imported=module)))
    assert circles == []
