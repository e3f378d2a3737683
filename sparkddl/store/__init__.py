"""Store: the root location for materialized data and run artifacts."""
from sparkddl.store.store import Store, normalize_uri

__all__ = ["Store", "normalize_uri"]
