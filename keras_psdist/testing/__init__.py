"""Tools for testing and measuring a cluster job on one machine.

- `hosts`: `NamespaceHosts`, separate hosts made of Linux network
  namespaces on a private bridge (each its own address, a link that can be
  limited in rate, cut and restored, and byte counters), for the cross-host
  tests, the network-fault tests and `benchmarks/scaling.py`. Needs root and
  iproute2.

Nothing here is imported by the library itself.
"""
