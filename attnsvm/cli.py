"""The ``attnsvm`` command line (placeholder until the CLI issue lands)."""

from __future__ import annotations

import argparse
import sys

PLAN = """attnsvm reproduce will run, on an embedded default size:
  - convergence of normalized and plain GD to the Att-SVM direction,
  - local vs. global token selection,
  - the regularization path against GD,
  - Att-SVM solver accuracy and speed,
  - Lipschitz bounds and estimates of softmax, linear and normalized-linear attention,
  - the SymPy identities,
and write report.md, report.html, PNG figures and results.json."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnsvm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("reproduce", help="run the experiments and write the report")
    args = parser.parse_args(argv)
    if args.command == "reproduce":
        print(PLAN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
