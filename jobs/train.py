"""spark-submit entry point: `spark-submit jobs/train.py [PRESET] [--set section.key=value ...]`
(the same as `sparkddl train`)."""
import sys

from sparkddl.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
