"""Store: the root location for materialized data and run artifacts."""
from sparkddl.store.store import Store, decode_hadoop_uri, normalize_uri

__all__ = ["Store", "decode_hadoop_uri", "normalize_uri"]
