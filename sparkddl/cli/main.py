"""The ``sparkddl`` console script: prepare, train, evaluate and plan from a TOML preset.

Errors in what the user gave (a missing preset, an unknown key, a model that cannot be
imported, data that does not exist, an output location that cannot be written) print one
line and exit with status 2; ``--debug`` adds the traceback.
"""
from __future__ import annotations

import argparse
import logging
import sys
import traceback
from pathlib import Path

from sparkddl.errors import SparkDDLError, TrainingFailedError

EXIT_USER_ERROR = 2
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkddl", description="Train PyTorch models on "
                                     "Spark from a TOML preset; with none, the embedded "
                                     "default (scikit-learn's digits) runs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("prepare", "materialize the training data as Parquet (cached)"),
                       ("train", "prepare, train, evaluate on the held-out split, save the run"),
                       ("evaluate", "evaluate a saved model on the held-out split"),
                       ("plan", "calibrate on this cluster and predict time per epoch and "
                                "speed-up for N workers and each strategy")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("preset", nargs="?", default=None,
                       help="TOML preset: a path, or a name in ./conf (default: the embedded "
                            "default preset, scikit-learn's digits)")
        p.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="SECTION.KEY=VALUE", help="override a preset value (repeatable)")
        p.add_argument("--debug", action="store_true", help="show tracebacks")
        if name == "evaluate":
            p.add_argument("--model", default=None,
                           help="saved model path (default: the latest run under output.dir)")
        if name == "plan":
            p.add_argument("--workers", default="1,2,4,8,16,32,64",
                           help="worker counts to predict, comma-separated")
    return parser


def resolve_preset(name: str | None) -> str | None:
    if name is None or Path(name).exists() or name.endswith(".toml"):
        return name
    return str(Path("conf") / f"{name}.toml")


def _workers(text: str) -> tuple[int, ...]:
    from sparkddl.errors import ConfigError
    try:
        workers = tuple(int(w) for w in text.split(","))
    except ValueError:
        workers = ()
    if not workers or min(workers) < 1:
        raise ConfigError(f"--workers must be positive integers separated by commas, got "
                          f"{text!r}")
    return workers


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        from sparkddl.cli import job, preset
        cfg = preset.load(resolve_preset(args.preset), args.overrides)
        if args.command == "prepare":
            job.run_prepare(cfg)
        elif args.command == "train":
            job.run_train(cfg)
        elif args.command == "plan":
            job.run_plan(cfg, _workers(args.workers))
        else:
            job.run_evaluate(cfg, args.model)
        return 0
    except TrainingFailedError as exc:
        print(f"sparkddl: training failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except SparkDDLError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"sparkddl: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
