"""`dsched-history`: the history job as its own daemon, and batch model fitting.

  dsched-history run [--config FILE] [--master URL] [--state-dir DIR]
      run the streaming job until SIGTERM/SIGINT (the systemd unit's ExecStart)
  dsched-history fit [--config FILE] [--master URL] [--state-dir DIR]
      fit per-operator ARIMA orders and task performance models once, write the model
      tables the controller loads, and exit

The configuration file is the controller's TOML (or any TOML) with a `[history]`
table; without one, every path lives under --state-dir (default /var/lib/dsched).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import tomllib
from dataclasses import asdict
from typing import TYPE_CHECKING

from dsched.config import ConfigError, from_dict, override
from dsched.signals import STOPPED, StopOnSignals
from spark_stream.config import DEFAULT_STATE_DIR, HistoryConfig

if TYPE_CHECKING:
    # For the annotation only: run imports the module itself when it starts.
    from spark_stream.embedded import HistoryStatus

# How long Spark may take to start the query before `run` gives up.
START_TIMEOUT_SECONDS = 120.0


def load_history_config(
    path: str | None, state_dir: str | None, master: str | None
) -> HistoryConfig:
    data: dict = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError("--config", f"file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from None
        table = doc.get("history", {})
        if not isinstance(table, dict):
            raise ConfigError("history", "expected a table")
        data = dict(table)
    config = from_dict(HistoryConfig, data, prefix="history.")
    if state_dir is not None:
        config = config.rebase(state_dir)
    return override(config, spark_master=master)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsched-history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", help="TOML file with a [history] table (e.g. /etc/dsched/controller.toml)"
    )
    common.add_argument(
        "--state-dir", help=f"base of the default paths (default {DEFAULT_STATE_DIR})"
    )
    common.add_argument(
        "--master", help="Spark master URL: local[2], spark://HOST:PORT, yarn, k8s://..."
    )
    common.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "run",
        parents=[common],
        help="run the streaming history job until stopped",
        description="Run the streaming history job until SIGTERM or SIGINT.",
    )
    sub.add_parser(
        "fit",
        parents=[common],
        help="fit ARIMA orders and task performance models once",
        description="Fit per-operator ARIMA orders and task performance models "
        "with applyInPandas and write the model tables.",
    )
    return parser


def _run(config: HistoryConfig) -> int:
    # SIGTERM and SIGINT stop the job (exit status 0), also while Spark starts.
    with StopOnSignals() as stop:
        return _run_until_stopped(config, stop)


def _run_until_stopped(config: HistoryConfig, stop: StopOnSignals) -> int:
    from spark_stream.embedded import EmbeddedHistory

    history = EmbeddedHistory(config)
    history.start()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not history.wait_running(timeout=0.5):
        if stop.is_set():
            history.stop()
            return STOPPED
        # The query may have started since wait_running gave up: only a state
        # other than starting and running is an end. fit_counts reads the state
        # without status()'s table reads, which a start has no use for.
        state = history.fit_counts().state
        if state == "running":
            break
        if state != "starting" or time.monotonic() > deadline:
            # A stop sent to the whole process group (systemd, `timeout`) can end
            # Spark's JVM a moment before this process sees its own signal: an end
            # that a stop follows within a second is that stop, not a failure.
            if stop.wait(1.0):
                history.stop()
                return STOPPED
            why = _why_not_running(history.status())
            print(f"dsched-history: failed to start: {why}", file=sys.stderr)
            history.stop()
            return 1
    logging.info("history job running on %s, spool %s", config.spark_master, config.spool_dir)
    while not stop.wait(10.0):
        status = history.status()
        if status.state == "failed":
            if stop.wait(1.0):  # the JVM saw the group's stop first
                break
            print(f"dsched-history: job failed: {status.error}", file=sys.stderr)
            history.stop()
            return 1
        logging.info("history: batch %s, lag %s s", status.last_batch_id, status.lag_seconds)
    history.stop()
    return STOPPED


def _why_not_running(status: HistoryStatus) -> str:
    """The job's own error, else what state it was left in."""
    if status.error:
        return status.error
    if status.state == "starting":
        return f"not running after {START_TIMEOUT_SECONDS:g} s"
    return f"the job is {status.state} and gave no error"


def _fit(config: HistoryConfig) -> int:
    from spark_stream import job
    from spark_stream.fit import fit_models

    if not config.operators_dir.is_dir():
        print(
            f"dsched-history fit: no history table at {config.operators_dir}: nothing to fit yet",
            file=sys.stderr,
        )
        return 1
    spark = job.spark_session(config, app_name="dsched-history-fit")
    try:
        counts = fit_models(spark, config)
    finally:
        spark.stop()
    print(json.dumps({"spark_master": config.spark_master, **counts}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_history_config(args.config, args.state_dir, args.master)
    except ConfigError as exc:
        print(f"dsched-history: {exc}", file=sys.stderr)
        return 2
    logging.debug("config: %s", {k: str(v) for k, v in asdict(config).items()})
    if args.command == "run":
        return _run(config)
    return _fit(config)


if __name__ == "__main__":
    sys.exit(main())
