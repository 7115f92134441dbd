"""The ``bucketsearch`` command: one subcommand per job, each defined in the module that owns it.

A subcommand module exposes ``HELP`` (one line), ``EPILOG`` (examples), ``add_arguments(parser)``
and ``run(args) -> int``. Modules are imported only when their subcommand runs, so ``--help``
stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand name -> module implementing it
SUBCOMMANDS = {
    "demo": "loadtest.demo",
    "engine-demo": "index.demo",
    "eval": "index.metrics.cli",
    "repair": "index.repair",
    "reproduce": "index.reproduce",
    "serve": "app.cli",
}

EXAMPLES = """examples:
  bucketsearch demo                       # the main job: server + load test, measured vs modeled
  bucketsearch engine-demo                # the engine alone, radius by radius
  bucketsearch eval --db-codes db.npy --query-codes q.npy --db-labels l.npy --query-labels m.npy
  bucketsearch reproduce                  # the RAMAP paper's tables on the embedded data
  bucketsearch repair --data-dir data --index photos   # salvage a corrupt index
  bucketsearch serve --data-dir data --port 8000
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bucketsearch", description="Hamming-space bucket search and hashing evaluation.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # subcommand not built yet
            raise
        p = sub.add_parser(name, help=module.HELP, description=module.HELP,
                           epilog=getattr(module, "EPILOG", None),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as exc:
        print(f"bucketsearch {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
