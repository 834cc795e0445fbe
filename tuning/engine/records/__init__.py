"""Tuning records: the import check, the platform-wide record cache (engine side), the cost-model file format."""
