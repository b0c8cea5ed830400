"""SPIRE doubles: the agents' Workload API (gRPC over a unix socket, callers attested by
their peer credentials), the server's registration entries and X.509 CA, and
spire-controller-manager's ClusterStaticEntry reconciliation. See docs/kubernetes-doubles.md.

Layout (one small module per part; the SPIRE Server API double for join tokens and
agent/entry deletion lives beside these, in its own modules):
  ca.py                  trust domain CA, X509-SVIDs (cryptography)
  entries.py             registration entries, agents, and which entries a workload gets
  attestor.py            pid → selectors (unix, and k8s through the kubelet double)
  workload_api.py        the Workload API server of one agent
  controller_manager.py  ClusterStaticEntry → entries, as spire-controller-manager does
"""
