"""Job containers, service containers and container actions (docs/containers.md): the specs
(`spec`), the agent client that runs step processes in the job container (`agent`), podman
for local and VM pools (`podman`, `actions`)."""
