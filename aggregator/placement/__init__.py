"""hypertopo placement plugin: gang, topology-aware scheduling on HyperNodes."""
