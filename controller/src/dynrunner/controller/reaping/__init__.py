"""Reaping: finished environments deleted, failed ones finalized, orphans collected."""
