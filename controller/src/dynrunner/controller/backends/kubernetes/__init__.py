"""The `kubernetes` backend: one Pod per job, a Secret with its assignment, a ClusterStaticEntry
for its SPIFFE identity (docs/kubernetes.md). Importing the package loads nothing: `config` and
`permissions` stay free of the Kubernetes client; only `api` imports it."""
