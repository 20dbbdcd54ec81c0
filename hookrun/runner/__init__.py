"""The data loop: run(cfg), prepare, batches, the loop, the estimate, resume, signals, losses.
It ties config/, capture/ and store/ together; only cli/ and the package root import it."""
