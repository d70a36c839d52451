"""hypertopo node agent: probes this node's GPU interconnect, RDMA ports, interfaces, LLDP
neighbours and health, and publishes them as one NodeTopology object per node."""

__version__ = "0.1.0"
