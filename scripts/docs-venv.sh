#!/usr/bin/env bash
# .venv-docs: MkDocs, Material and mkdocstrings, from constraints-docs.txt
exec "$(dirname "$0")/tool-venv.sh" docs mkdocs \
  python -c "import mkdocs, material, mkdocstrings_handlers.python"
