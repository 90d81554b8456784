"""Fleet memory in Prometheus: each host's recorded run as OpenMetrics (docs/prometheus.md).

A view over the recorder's files: imports the log format and recorder layers, never plotly or dash;
prometheus_client only when a port is asked for.
"""
from miles_profile.metrics.server import METRICS_PORT_ENV, MetricsServer, serve, serve_from_env

__all__ = ["METRICS_PORT_ENV", "MetricsServer", "serve", "serve_from_env"]
