"""The actions cache service (`actions/cache` v1 and v2 protocols), see docs/cache.md."""
