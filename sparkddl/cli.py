"""The ``sparkddl`` console script."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkddl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="train an MLP on digits with sparkddl.run on local[2]")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from sparkddl.demo import main as demo
        demo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
