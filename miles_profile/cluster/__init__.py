"""Recording Ray jobs (docs/ray.md): the run reaches every worker through Ray's runtime environment, one
host sampler per node runs as a Ray actor pinned to it, and node-local logs are gathered to the driver.

Recorder layer: imports neither plotly nor dash, and imports `ray` only inside a Ray process that has it.
"""
