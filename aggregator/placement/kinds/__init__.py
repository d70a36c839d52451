"""The gang kinds hypertopo-scheduler reads: Volcano's PodGroup, scheduler-plugins' PodGroup and
Kubernetes' own (upstream) PodGroup, their annotations and sub-groups, read once into one spec
(`gang_spec`) that the core places."""
