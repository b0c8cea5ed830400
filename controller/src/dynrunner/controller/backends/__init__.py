"""Backends: where an assignment runs (one subpackage per backend, chosen by `registry`)."""
