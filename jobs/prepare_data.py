"""spark-submit entry point:
`spark-submit jobs/prepare_data.py [PRESET] [--set section.key=value ...]`
(the same as `sparkddl prepare`)."""
import sys

from sparkddl.cli import main

if __name__ == "__main__":
    sys.exit(main(["prepare", *sys.argv[1:]]))
