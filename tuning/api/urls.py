from core.api.router import router

from . import views

router.register("runs", views.TuningRunViewSet, basename="tuningrun")

urlpatterns: list = []
