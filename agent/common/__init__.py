"""What all three programs share: the node report contract (NodeTopology, its CRD schema, the
probe-plan row), the Kubernetes client layer, and the command-line and serving helpers.

It lives inside `agent/` because the top level is fixed (docs: Layout) and the agent package is
the base layer every program already depends on: the aggregator and the scheduler import
`agent.common`, never the agent's probes or its runtime. The pure modules sit here; the adapters
(the API client, the HTTP server) sit in `agent.common.adapters`, which the pure ones never import.
"""
