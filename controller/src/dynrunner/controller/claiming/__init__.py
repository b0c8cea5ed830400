"""Claiming: reserve a permit, FetchTask with an armed runner, publish the sealed Assignment."""
