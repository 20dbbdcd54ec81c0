"""The object-store scheme (`s3://` and any other fsspec URL: store/paths.py's OBJECTS), whole:
its writer, lock, resume, source and reader.

    python -m hookrun experiment=sae_cache output.path=s3://acts/gpt2/captures.h5   # written here
    hookrun.open_run("s3://acts/gpt2/captures.h5").loader("res/transformer.h.3/output")   # read here

| module             | what it holds                                                                    |
|--------------------|----------------------------------------------------------------------------------|
| `destination.py`   | `StoreParts`, the scheme's Destination: checks, lock, resume (`PartsResume`), many ranks (`PartsShards`) |
| `parts.py`         | `PartedStore`, the RunStore the loop writes to: HDF5 parts in a staging folder; what a resume finds |
| `upload.py`        | `ObjectStoreOutput` (the URL, staging folder and names), the upload worker, retries |
| `object_folder.py` | `RemoteFolder`: one prefix of an fsspec URL, verified uploads (size, ETag or read-back) |
| `remote_lock.py`   | `RemoteLock`: one writer per URL, a lock object held as a renewed lease           |
| `manifest.py`      | `Manifest`, `PartEntry`: the parts a cache has, their rows, sizes and MD5s        |
| `ranked.py`        | many ranks: each rank's manifest and the top one, checked before any batch        |
| `fetch.py`         | `Parts`: the manifest read, each part fetched into a local cache and verified     |
| `source.py`        | `PartsSource`, the scheme's RunSource: the manifest at once, a view over the parts |
| `remote_run.py`    | `RemoteRun`, the scheme's reader: the Run interface over the manifest and parts   |
| `parts_loader.py`  | `PartsLoader`, RemoteRun's shuffled loader, parts fetched ahead of use            |

Nothing outside reaches this folder but through the scheme registry (store/paths.py, when an
object-store URL asks), so a local run never loads it; the runner catches errors.py's StoreError.
"""
