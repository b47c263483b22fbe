"""GPU node health: probes (NVML, declared), the XID table, kernel-log parsing, pure fault rules, the monitor.

Layering: ``xid``, ``kmsg``, ``wire`` and ``rules`` do no bus I/O; ``probe`` touches only NVML, psutil and the
kernel log; ``monitor`` and ``agent`` use the bus. NVML exceptions never leave ``probe``.
"""
