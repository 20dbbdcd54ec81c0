"""Bytes on disk: the HDF5 store, the writer thread, host transfer, the capture records, the
format constants. It knows nothing of hooks, models or the runner."""
