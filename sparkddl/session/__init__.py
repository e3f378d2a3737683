"""Spark sessions, classic or Spark Connect: the one place that tells them apart.

Everything above (data, launch, ml, the job) asks :func:`is_connect` of whatever it holds
(a SparkSession, or the context the launch path uses: a SparkContext or a
:class:`ConnectContext`) and :func:`cluster_context` for a context, instead of testing
types or attributes itself. This package imports nothing of sparkddl but its errors, so
``data`` and ``launch`` can both stand on it.
"""
from __future__ import annotations

from sparkddl.session.connect import (ConnectContext, channel_host, cluster_context,
                                      is_connect)

__all__ = ["ConnectContext", "channel_host", "cluster_context", "is_connect"]
