"""Celery application.

Broker: Redis when REDIS_URL is set (deployment), otherwise kombu's SQLAlchemy
transport over a local SQLite file, so a fresh machine needs no server.
Workers are always real processes; eager mode is used nowhere in the product.
"""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("dlopt")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
