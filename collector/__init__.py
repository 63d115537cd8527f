"""The hopline collector: ingests hop events, joins them per request, exposes /metrics, stores events.

Modules: ``app`` (``create_app(config) -> FastAPI``), ``cli`` (``hopline collector``), ``config``,
``ingest`` (body -> validated events -> store -> join), ``store`` and ``compaction`` (the durable
hive-partitioned event store), ``join`` (per-request state, completion, timelines), ``metrics`` and
``histogram`` (Prometheus, with ``request_id`` exemplars), ``metric_names`` (what dashboards
import), ``dedup``, ``tail`` (following file-sink files), ``kv_cache`` (``--model-config``).
"""
