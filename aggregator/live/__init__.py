"""The live controller, `hypertopo-aggregator run`, and its parts: the feed from the informers'
caches, reconcile of HyperNodes, leader election and the service loop, Node marks, Kueue's and
KAI's Topology objects, the structural hold-down, slim records and the /metrics endpoint."""
