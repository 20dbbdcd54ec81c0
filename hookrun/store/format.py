"""The file format's constants: versions and reserved names (docs/format.md is the full description).

    f.attrs["format_version"] == FORMAT_VERSION
    f"captures/{hook}/{module or MODEL_NODE}/{role}"
"""

FORMAT_VERSION = "1"  # the layout version written to every file's `format_version` attribute
HOOKRUN_VERSION = "0.1.0"  # hookrun's own version (hookrun.__version__), written to `hookrun_version`
MODEL_NODE = "__model__"  # the group name for the whole model (module path '')
