__version__ = "0.2.0"

# The version of the JSON documents nodehealth prints or writes for others (check --format json, status,
# previews, xid scan, nccl, validate-nvml): their "schema_version" key. Within one version keys are only
# added; a key removed or renamed, or a value whose type or meaning changes, is a new version
# (docs/output.md, "Stability").
SCHEMA_VERSION = 1
