"""Durable job-to-job artifacts: refs, the store seam and its drivers, upload collection and safe staging."""
