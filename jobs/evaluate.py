"""spark-submit entry point: `spark-submit jobs/evaluate.py [PRESET] [--set section.key=value ...]`
(the same as `sparkddl evaluate`)."""
import sys

from sparkddl.cli import main

if __name__ == "__main__":
    sys.exit(main(["evaluate", *sys.argv[1:]]))
