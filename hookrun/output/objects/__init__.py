"""The object-store scheme (`s3://` and any other fsspec URL: store/schemes.py's OBJECTS), whole:
where its runs are written and how they are read back.

    python -m hookrun experiment=sae_cache output.path=s3://acts/gpt2/captures.h5   # written here
    hookrun.open_run("s3://acts/gpt2/captures.h5").loader("res/transformer.h.3/output")   # read here

| module            | what it holds                                                                  |
|-------------------|--------------------------------------------------------------------------------|
| `destination.py`  | `StoreParts`, the Destination: lock, checks, resume (`PartsResume`), many ranks |
| `remote_run.py`   | `RemoteRun`, the scheme's reader: the Run interface over the manifest and parts |
| `parts_loader.py` | `PartsLoader`, RemoteRun's shuffled loader, parts fetched ahead of use          |

Nothing imports this folder by name but the scheme registry (store/schemes.py, lazily), the
runner's and readers' type hints, and these modules among themselves.
"""
