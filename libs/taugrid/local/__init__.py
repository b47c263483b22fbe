"""The embedded local backend: Kueue-equivalent admission over this machine, pods as real OS processes, and
Kubernetes-shaped watch events, so everything above the backend cannot tell it from a cluster."""
