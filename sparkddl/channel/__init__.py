"""Driver <-> rank messages: logs, errors, metrics, snapshots and stop flags."""
from sparkddl.channel.client import RankChannel
from sparkddl.channel.protocol import ProtocolError, new_secret
from sparkddl.channel.server import DriverChannel, Message

__all__ = ["DriverChannel", "Message", "ProtocolError", "RankChannel", "new_secret"]
