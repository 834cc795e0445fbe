"""DOPpler: the degree-of-parallelism rules (fixed, DOPpler's, the platform's), one measuring round, and the
parallel-vs-serial error."""
