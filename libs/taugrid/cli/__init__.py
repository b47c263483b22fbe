"""The ``tau`` command line, built on the public client (``taugrid.client``); it talks only to NATS."""
