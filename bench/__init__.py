"""Benchmarks, run as `dsched bench NAME`. Each module bench/<name>.py (dashes in
NAME become underscores) defines ``add_arguments(parser)`` and ``run(args) -> int``
and writes its figures with :func:`bench.common.write_result`."""
