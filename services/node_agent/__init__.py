"""Node agent: samples this machine's GPUs on a timer and publishes ``node.<node>.sample``."""
