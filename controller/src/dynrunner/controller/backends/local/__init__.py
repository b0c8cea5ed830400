"""The `local` backend: the executor as a child process in a fresh directory per assignment."""
