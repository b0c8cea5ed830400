"""Job containers, service containers and container actions (docs/containers.md): the specs
(`spec`), the agent client that runs step processes in the job container (`agent`), where the
job container comes from (`source`): podman for local and VM pools (`podman`, `actions`) or the
job's Pod (`pod`), and `stage`, which puts the agent and Node where a Pod's job container finds them."""
