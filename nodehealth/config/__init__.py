"""Configuration: the schema, the loader and the fast path's lean reader."""
