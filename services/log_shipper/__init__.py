"""log-shipper: Kubernetes pod logs onto the LOGS stream, as the local backend ships its own.

Its own service rather than a part of kube-bridge: it holds one long-lived log stream per running container
(the bridge holds a handful of watches), needs a different grant (``pods/log`` get), and a flood of log lines
must never delay the object changes the run state depends on; restarting one leaves the other alone.
"""
