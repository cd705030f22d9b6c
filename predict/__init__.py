"""Pure prediction models for dsched: load forecasts, CPU cost per tuple, queueing
latency, task performance models and memory-bandwidth interference.

No I/O and no network: the controller, the simulator and outside users call these
functions with plain numbers and arrays. See docs/prediction.md.
"""

from predict.cost import cpu_per_tuple
from predict.interference import InterferenceModel, fit_interference
from predict.intervals import ConformalBank, WithConformalUpper
from predict.load import Arima, Forecast, LastValue, LinearTrend, combine, propagate
from predict.queueing import (
    allen_cunneen_wait,
    erlang_c_wait,
    kingman_wait,
    min_service_rate,
    min_service_rate_for_sojourn,
)

# Registers "seasonal" and "max_rule" beside the forecasters of predict.load, so
# that every name the configuration accepts is known once predict is imported.
from predict.seasonal import MaxRule, Seasonal  # noqa: E402

__all__ = [
    "Arima",
    "ConformalBank",
    "MaxRule",
    "Seasonal",
    "WithConformalUpper",
    "Forecast",
    "InterferenceModel",
    "LastValue",
    "LinearTrend",
    "allen_cunneen_wait",
    "combine",
    "cpu_per_tuple",
    "erlang_c_wait",
    "fit_interference",
    "kingman_wait",
    "min_service_rate",
    "min_service_rate_for_sojourn",
    "propagate",
]
