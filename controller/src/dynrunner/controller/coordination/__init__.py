"""What replicas share: leases, the pool's capacity permits."""
