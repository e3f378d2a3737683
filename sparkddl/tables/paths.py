"""Files named by a table's metadata, as paths of the table's filesystem."""
from __future__ import annotations

import posixpath
from urllib.parse import unquote, urlparse

from sparkddl.store import Store


def fs_path(location: str, root: str = "") -> str:
    """A file a Delta log names (an absolute URI, or a path relative to ``root``; both
    %-encoded, as the protocol writes them) as a path of the table's filesystem."""
    if urlparse(location).scheme:
        store = Store.from_uri(unquote(location))
        return store.fs_path(store.url())
    return posixpath.join(root, unquote(location)) if root else unquote(location)
