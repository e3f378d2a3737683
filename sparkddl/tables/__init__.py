"""Tables read in place, whatever their format: everything sparkddl reads of a table's
metadata (Parquet footers and folders, the Delta log, Iceberg's manifests, deletion vectors
and positional delete files) is read here, and what the rest needs of it is one
:class:`~sparkddl.tables.table.Table`. Every error reading a table's metadata is a DataError
naming the file. Stands on :mod:`sparkddl.store` and :mod:`sparkddl.errors` alone: the data
plane (:mod:`sparkddl.data`) builds on it, never the other way round."""
