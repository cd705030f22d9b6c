"""dsched node agent: finds instance threads, measures them, caps them with cgroups,
and talks to the controller over one gRPC stream."""

__version__ = "0.2.0"
