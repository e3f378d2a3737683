"""Executor side: barrier bootstrap, rendezvous, GPU mapping, output forwarding, cleanup."""
from sparkddl.task.context import RankContext, current
from sparkddl.task.dist import device, init_process_group

__all__ = ["RankContext", "current", "device", "init_process_group"]
