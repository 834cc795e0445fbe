"""Django-free helpers every layer may import (the engines included): units, JSON safety, series
thinning. Nothing here imports Django, Celery or an app; import-linter holds it to that."""
