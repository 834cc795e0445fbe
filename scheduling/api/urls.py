from core.api.router import router

from . import views

router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GPUViewSet, basename="gpu")
router.register("gpu-telemetry", views.GpuTelemetryViewSet, basename="gputelemetry")
router.register("gpu-profiles", views.GpuProfileViewSet, basename="gpuprofile")
router.register("predictors", views.PredictorVersionViewSet, basename="predictorversion")
router.register("gpu-jobs", views.GpuJobViewSet, basename="gpujob")
router.register("placements", views.PlacementViewSet, basename="placement")
router.register("traces", views.TraceUploadViewSet, basename="traceupload")
router.register("simulations", views.SimulationRunViewSet, basename="simulationrun")

urlpatterns: list = []
