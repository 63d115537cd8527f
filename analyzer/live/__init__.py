"""Live detection: the analysis on a moving horizon of finished requests, on event time, with
incidents that fire and resolve, sent to Alertmanager and served as findings and metrics."""
