#!/usr/bin/env bash
# The built site checked in a real headless Chromium (scripts/docs_check.py): the home page
# and the API page render with navigation and search, and a search lists results. Chromium
# comes from Debian's packages, installed here when it is absent (needs root).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$root/site/index.html" ] || { echo "no built site in $root/site: run make docs-build" >&2; exit 1; }
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  [ "$(id -u)" = 0 ] || { echo "Chromium is missing and this is not root: apt-get install chromium" >&2; exit 1; }
  echo "installing Chromium from Debian's packages" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  browser=$(command -v chromium)
fi
exec "$root/.venv-docs/bin/python" "$root/scripts/docs_check.py" "$browser" "$root/site"
