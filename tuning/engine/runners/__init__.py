"""Builders and runners: the pooled/distributed measuring runners, the persistent builder, the plug-point registry."""
