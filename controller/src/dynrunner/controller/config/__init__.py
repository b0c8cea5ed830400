"""The controller's configuration: one YAML file plus `DYNRUNNER_*` environment overrides."""
