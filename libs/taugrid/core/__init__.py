"""Pure domain core: contracts, events, state machine, admission math. Imports no I/O library."""
