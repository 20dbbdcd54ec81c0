"""The data loop: run(cfg), prepare, batches and the forward call, the loop, the kinds, the estimate, losses.
It ties config/, hooks/, output/ and store/ together; only cli/ and the package root import it."""
