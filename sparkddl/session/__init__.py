"""Spark sessions, classic or Spark Connect: the one place that tells them apart.

Everything above (data, launch, ml, the job) takes :func:`cluster_context` of its session
and asks it (task slots, barrier stages, job groups, broadcasts, the channel's address: see
:mod:`sparkddl.session.cluster`) instead of testing types or attributes itself. This
package imports nothing of sparkddl but its errors, so ``data`` and ``launch`` can both
stand on it.
"""
from __future__ import annotations

from sparkddl.session.cluster import ClassicContext, Inline
from sparkddl.session.connect import ConnectContext, channel_host, cluster_context, is_connect

__all__ = ["ClassicContext", "ConnectContext", "Inline", "channel_host", "cluster_context",
           "is_connect"]
