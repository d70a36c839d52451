"""The pure placement core: one decision for one gang (capacity, free index, topology, nesting,
ranks, spares, degraded nodes, the fault breaker, gang health, fault rescheduling). No API client."""
