"""The web portal: runs, their phases, live logs and events, evidence; queues, nodes and usage, as each signed-in
person may see them. Read-only but for cancel."""
