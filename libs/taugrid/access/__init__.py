"""Who may do what: the bus permissions rendered into nats-server's configuration (``permissions``), people's
delegated requests (``delegation``) and the signers a stage trusts (``signers``).

Above the bus adapter (it reads the platform's users and signs through it), below the stack and the services that
render or check these grants. No module here imports nats-py.
"""
