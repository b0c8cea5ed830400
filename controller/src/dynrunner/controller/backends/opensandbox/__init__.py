"""The `opensandbox` backend: one OpenSandbox sandbox (a microVM booting the VM image from vm/)
per job (docs/opensandbox.md). Importing the package loads nothing: only `api` imports the
`opensandbox` SDK."""
