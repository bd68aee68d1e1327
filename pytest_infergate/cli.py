"""The `infergate` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_fetch_model(args: argparse.Namespace) -> int:
    from pytest_infergate.models import resolve_model

    source = resolve_model(args.model, Path(args.cache_dir).expanduser())
    print(f"{args.model}: {source.path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pytest_infergate.options import default_cache_dir

    parser = argparse.ArgumentParser(prog="infergate", description="pytest-infergate utilities")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch-model", help="resolve (download/convert once) a model into the cache and print its path")
    fetch.add_argument("model", nargs="?", default="smollm2-135m")
    fetch.add_argument("--cache-dir", default=str(default_cache_dir()))
    fetch.set_defaults(func=_cmd_fetch_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    from pytest_infergate.errors import InfergateError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InfergateError as exc:
        print(f"infergate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
