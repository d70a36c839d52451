"""LLDP (IEEE 802.1AB) decoding, kept pure: frame bytes in, frozen dataclasses out.

`frame` parses one LLDPDU (with or without its Ethernet header), `pcap` reads capture files for
tests and tools, `lldpcli` reads what a host lldpd prints. None of them touches a socket."""
