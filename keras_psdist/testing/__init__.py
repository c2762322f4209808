"""Tools for testing and measuring a cluster job on one machine.

- `hosts`: `NamespaceHosts`, separate hosts made of Linux network
  namespaces on a private bridge (each its own address, a link that can be
  limited in rate, cut and restored, and byte counters), for the cross-host
  tests, the network-fault tests and `benchmarks/scaling.py`. Needs root and
  iproute2.
- `combinations`: one small training run per cell of the combination
  matrix (every compressor with every rule and pre-aggregation, with and
  without an attack, and the axes that multiply), for
  `tests/test_combinations.py` and `benchmarks/combinations.py`.

Nothing here is imported by the library itself.
"""
