"""taugrid: run AI workloads on GPU clusters through event-driven services on NATS JetStream."""

__version__ = "0.1.0"
