"""Saved programs: what a fitted model becomes on disk and how it is read back safely.

- :mod:`.program`: export a model to torch.export's serialized form and load it back
  (checked first, see :mod:`.program_check`).
- :mod:`.portable`: the code that runs a saved program on executors and in a logged MLflow
  model; it imports nothing from sparkddl, so it can be copied into a model.
- :mod:`.program_check`: the allow-list a saved program is checked against before torch
  deserializes it (torch turns some of its text into code).
"""
