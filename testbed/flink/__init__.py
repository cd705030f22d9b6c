"""A real Apache Flink session cluster for the testbed, started from the PyPI wheels.

* :mod:`testbed.flink.install` -- where the distribution lives, what is missing
  (Flink, java, javac, jcmd) and ``python -m testbed.flink.install``;
* :mod:`testbed.flink.cluster` -- :class:`~testbed.flink.cluster.FlinkCluster`: one
  JobManager and N TaskManagers on loopback, with their own conf, log and pid dirs;
* :mod:`testbed.flink.job` -- the DschedWordCount streaming SQL job, compiled on demand;
* :mod:`testbed.flink.load` -- :class:`~testbed.flink.load.TraceFeeder`, the input
  following a rate trace;
* :mod:`testbed.flink.metrics` -- Flink's own record counts through REST, draining,
  and the sink's per-record latency files.

Nothing here is in the wheel; it needs a source checkout and ``make flink``.
"""
