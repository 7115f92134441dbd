"""The ``bucketsearch`` command: one subcommand per job, each defined in the module that owns it.

Subcommands are entry points of the group ``bucketsearch.commands`` (pyproject.toml), so the
engine package never names the service or the load tester. A subcommand module exposes
``HELP`` (one line), ``EPILOG`` (examples), ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

from bucketsearch import __version__

GROUP = "bucketsearch.commands"

EXAMPLES = """examples:
  bucketsearch demo                       # the main job: server + load test, measured vs modeled
  bucketsearch engine-demo                # the engine alone, radius by radius
  bucketsearch eval --db-codes db.npy --query-codes q.npy --db-labels l.npy --query-labels m.npy
  bucketsearch reproduce                  # the RAMAP paper's tables on the embedded data
  bucketsearch compare lsh=lsh.json itq=itq.json   # methods, paired significance tests
  bucketsearch repair --data-dir data --index photos   # salvage a corrupt index
  bucketsearch serve --data-dir data --port 8000
  bucketsearch backup photos photos.bsbackup           # a server's index to a file
  bucketsearch restore photos2 photos.bsbackup         # ... and back, as a new index
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bucketsearch", description="Hamming-space bucket search and hashing evaluation.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"bucketsearch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        module = ep.load()
        p = sub.add_parser(ep.name, help=module.HELP, description=module.HELP,
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
    except (ValueError, TypeError, OSError, RuntimeError) as exc:  # one line, exit 2
        print(f"bucketsearch {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
