"""Hooks on a model: the plan (which modules), hook types, the session that owns the handles,
events, actions, ops and patching. It may import config/ and store/records; never HDF5 writing."""
