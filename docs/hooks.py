"""The reference tables, generated from the code, written into the pages themselves so that they read in the
repository as on the site, and kept current: `python docs/hooks.py` rewrites every page's generated blocks;
tests/test_docs.py (in CI) fails when a committed block differs from what the code generates now, and the mkdocs
hook renders them again at build time.

A block is `<!-- generated: NAME -->`, the table, `<!-- end generated: NAME -->`; NAME is a key of GENERATORS. A
page may ask for a table with the opening line alone (the block is filled in then). An unknown NAME fails the
build (mkdocs build --strict turns the error into a failure). tests/test_docs.py also checks that each option,
metric, policy key, marker and CLI command is in its table.
"""

from __future__ import annotations

import re

GENERATED = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
# a block: the opening line, the generated text (absent where the page only asks for it), the closing line
BLOCK = re.compile(r"^<!-- generated: ([a-z-]+) -->(?:\n(?:.*\n)*?<!-- end generated: \1 -->)?$", re.MULTILINE)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def options_table() -> str:
    from pytest_infergate.options import OPTION_SPECS

    rows = ["| option | ini key | default | meaning |", "| --- | --- | --- | --- |"]
    for spec in OPTION_SPECS:
        flag = f"`{spec.flag}`" + (f" `{spec.metavar}`" if spec.metavar else "")
        default = "off" if spec.kind == "bool" else "–" if spec.default is None else f"`{spec.default}`"
        rows.append(f"| {flag} | `{spec.ini_key}` | {default} | {_cell(spec.help)} |")
    return "\n".join(rows)


def metrics_table() -> str:
    from pytest_infergate.measurement import METRICS, PERCENTILES, percentile_suffix

    suffixes = ", ".join(f"`_{percentile_suffix(p)}`" for p in PERCENTILES)
    rows = [f"Per-request metrics take a percentile suffix in budget keys ({suffixes}; none: the budget's "
            "`percentile`, default 50). A `min_` or `max_` prefix says the direction explicitly.", "",
            "| metric | unit | better | samples |", "| --- | --- | --- | --- |"]
    for name, (unit, higher_is_better, per_request) in METRICS.items():
        rows.append(f"| `{name}` | {unit} | {'higher' if higher_is_better else 'lower'} | "
                    f"{'one per request' if per_request else 'one per repetition'} |")
    return "\n".join(rows)


def policy_table() -> str:
    from pytest_infergate.quality import policy

    rows = ["| key | gate | checks | range |", "| --- | --- | --- | --- |"]
    for key, (figure, direction) in policy.AGGREGATE_KEYS.items():
        bound = "0 to 1" if key in policy.FRACTION_KEYS else "≥ 0"
        rows.append(f"| `{key}` | `check()` against the reference | {direction}imum `{figure}` | {bound} |")
    for key in policy.CATEGORY_KEYS:
        rows.append(f"| `{key}` | `check()`, per sample category | minimum `task_ratio` of every category | ≥ 0 |")
    for key in policy.REGRESSION_KEYS:
        bound = "0 or 1" if key in policy.FLAG_KEYS else "0 to 1" if key in policy.SHARE_KEYS else "≥ 0"
        rows.append(f"| `{key}` | `check_regression()` against accepted outputs | see the golden gate | {bound} |")
    for key, (figure, direction) in policy.CORPUS_KEYS.items():
        bound = "0 to 1" if key in policy.FRACTION_KEYS else "≥ 0"
        what = ("rise of the mean KL over the accepted corpus figures, relative to them" if figure == "kl_rise"
                else f"{direction}imum `{figure}` over the corpus")
        rows.append(f"| `{key}` | `check_corpus()` over a text corpus | {what} | {bound} |")
    for key in policy.BATCH_KEYS:
        rows.append(f"| `{key}` | `check_batch_invariance()` | share of samples that change with the batch | 0 to 1 |")
    return "\n".join(rows)


def default_policy_table() -> str:
    from pytest_infergate.quality.policy_defaults import DEFAULT_POLICIES

    rows = ["| class | precisions | thresholds of `check()` | of `check_corpus()` |", "| --- | --- | --- | --- |"]
    for policy in DEFAULT_POLICIES:
        rows.append(f"| {policy.name} | {', '.join(f'`{p}`' for p in policy.precisions)} | "
                    + ", ".join(f"`{key}={value:g}`" for key, value in policy.rules.items()) + " | "
                    + ", ".join(f"`{key}={value:g}`" for key, value in policy.corpus_rules.items()) + " |")
    return "\n".join(rows)


def markers_list() -> str:
    from pytest_infergate.plugin import MARKERS

    return "\n".join(f"- `@pytest.mark.{line.split(':', 1)[0]}`: {line.split(':', 1)[1].strip()}" for line in MARKERS)


def cli_help() -> str:
    from pytest_infergate.cli import build_parser

    parser = build_parser()
    parts = ["```text", parser.format_help().rstrip(), "```"]
    for action in parser._subparsers._group_actions:  # argparse keeps its sub-commands there
        for name, sub in action.choices.items():
            parts += ["", f"### `infergate {name}`", "", "```text", sub.format_help().rstrip(), "```"]
    return "\n".join(parts)


GENERATORS = {"options": options_table, "metrics": metrics_table, "policy-keys": policy_table,
              "default-policies": default_policy_table, "markers": markers_list, "cli": cli_help}


def render(markdown: str) -> str:
    """`markdown` with every generated block holding the table the code generates now."""
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"docs: unknown generated table {name!r}; known: {', '.join(GENERATORS)}")
        return f"<!-- generated: {name} -->\n{GENERATORS[name]().rstrip()}\n<!-- end generated: {name} -->"

    return BLOCK.sub(replace, markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return render(markdown)


def write_pages(root) -> list:
    """Rewrite each page under `root` whose generated blocks are not current; the pages rewritten."""
    from pathlib import Path

    changed = []
    for page in sorted(Path(root).rglob("*.md")):
        text = page.read_text()
        current = render(text)
        if current != text:
            page.write_text(current)
            changed.append(page)
    return changed


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    for page in write_pages(Path(__file__).resolve().parent):
        print(f"rewrote {page}")
