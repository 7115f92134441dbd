"""``bucketsearch compare``: methods compared on the same queries with paired significance
tests (the ``--compare`` mode of ``bucketsearch eval``, named as researchers look for it).

Runs are eval JSON outputs written with ``--per-query`` or ``.npz`` codes (``db_codes``,
``query_codes``) with the labels given; the tests, corrections and exports are those of
:mod:`bucketsearch.index.evaluation.significance` (docs/evaluation.md).
"""
from __future__ import annotations

from bucketsearch.index.evaluation import evalcmd as eval_cli

HELP = "compare methods on the same queries: paired t, Wilcoxon, randomization; Holm/Bonferroni"
EPILOG = """examples:
  bucketsearch compare lsh=lsh.json itq=itq.json --compare-metric ranking.map_tie_aware@100
  bucketsearch compare lsh.npz itq.npz --db-labels yb.npy --query-labels yq.npy --latex t.tex
  (the other options are those of 'bucketsearch eval --compare'; see 'bucketsearch eval --help')
"""


def add_arguments(parser) -> None:
    parser.add_argument("runs", nargs="+", metavar="[NAME=]RUN",
                        help="eval JSON runs (--per-query) or .npz codes; at least 2")
    eval_cli.add_arguments(parser)


def run(args) -> int:
    args.compare = args.runs
    return eval_cli.run(args)
