"""The state directory: every file name, the boot id, atomic writes, and each file's format (stdlib only)."""
