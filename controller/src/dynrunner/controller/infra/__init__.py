"""The process around the flow: NATS, sealing at rest, health, metrics, logging and supervised loops."""
