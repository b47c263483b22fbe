"""The embedded stack: a private nats-server and every service as its own supervised process."""

# The previous stack's ``stack.json``, moved aside by `tau up` before it starts one: the new stack listens where
# that one did when it can (``supervisor.last_ports``), so logins and portal links survive a restart.
LAST_STATE = "stack.last.json"
