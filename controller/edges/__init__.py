"""The controller's I/O edges: gRPC server, SQLite store, cap actuators, metrics, report ingest, history."""
