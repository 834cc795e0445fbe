"""Dashboard pages. Thin: read through selectors, render templates."""
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from core import selectors


@login_required
def home(request):
    models = selectors.models_for_user(request.user).order_by("team__name", "name")
    teams = selectors.teams_for_user(request.user)
    return render(request, "frontend/home.html", {"models": models, "teams": teams})


@login_required
def model_detail(request, pk: int):
    model = selectors.models_for_user(request.user).filter(pk=pk).first()
    if model is None:
        raise Http404("No such model in your teams.")
    histogram = sorted(model.op_histogram.items(), key=lambda kv: -kv[1])
    return render(request, "frontend/model_detail.html", {"model": model, "histogram": histogram})
