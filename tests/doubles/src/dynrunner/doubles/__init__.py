"""Test doubles that speak the real protocols; used by tests and `make demo`, never by the product."""
