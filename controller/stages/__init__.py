"""The epoch's pure stages: evaluate, forecast, demand, allocation, hysteresis (no I/O)."""
