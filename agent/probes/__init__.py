"""Pure probes: each takes injected host paths or backends and returns a ProbeResult."""
