"""The live scheduler, `hypertopo-scheduler run`: its view of the cluster, admission, binding,
evictions, events, the gang watch, PodGroup status and its metrics."""
