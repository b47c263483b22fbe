"""The embedded stack: a private nats-server and every service as its own supervised process."""
