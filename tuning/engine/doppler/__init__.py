"""DOPpler: the degree-of-parallelism rule, one measuring round, and the parallel-vs-serial error."""
