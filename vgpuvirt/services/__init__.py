"""Services: decisions about one host (read a snapshot, compute, write a batch)."""
