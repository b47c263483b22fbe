"""Health monitor: turns node samples into conditions, cordon/uncordon decisions and ``health.degraded``."""
