"""The similarity kind: representational similarity (CKA, RSA) between hook points (docs/similarity.md)."""
