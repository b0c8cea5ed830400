"""The assignment log and the records kept beside it: deliveries, launch and finalize records."""
