"""dsched: an online feedback controller for stream-processing clusters."""

__version__ = "0.2.0"
