#!/usr/bin/env bash
# .venv-lint: ruff, pyright and the Node.js pyright runs on, from constraints-lint.txt
exec "$(dirname "$0")/tool-venv.sh" lint ruff sh -c "ruff --version && pyright --version"
