"""What every job imports: errors, atomic files and hashes, tables, the machine's facts; small and
stable, since a change to its code reruns every job that computes results (docs/reruns.md)."""
