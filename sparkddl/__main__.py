"""``python -m sparkddl``: the ``sparkddl`` command, for a Python whose scripts folder is not
on the PATH."""
import sys

from sparkddl.cli import main

sys.exit(main())
