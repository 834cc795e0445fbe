"""Filters and sorting of the runs list (django-filter), limited to the user's teams."""
from __future__ import annotations

import django_filters
from django import forms

from core.models import DLModel, Team
from tuning.models import TuningRun


class RunListFilter(django_filters.FilterSet):
    model = django_filters.ModelChoiceFilter(queryset=DLModel.objects.none(), empty_label="any model")
    target_kind = django_filters.ChoiceFilter(
        label="Target", choices=[("llvm", "CPU (llvm)"), ("cuda", "GPU (cuda)")], empty_label="any target")
    status = django_filters.ChoiceFilter(choices=TuningRun.Status.choices, empty_label="any status")
    measurement_mode = django_filters.ChoiceFilter(
        label="Mode", choices=[(v, v if v == "stock" else "DOPpler") for v in TuningRun.Mode.values],
        empty_label="any mode")
    team = django_filters.ModelChoiceFilter(queryset=Team.objects.none(), empty_label="any team (in scope)")
    created_after = django_filters.DateFilter(
        field_name="created_at", lookup_expr="date__gte", label="Created from",
        widget=forms.DateInput(attrs={"type": "date"}))
    created_before = django_filters.DateFilter(
        field_name="created_at", lookup_expr="date__lte", label="to",
        widget=forms.DateInput(attrs={"type": "date"}))
    sort = django_filters.OrderingFilter(
        label="Sort by",
        fields=(("created_at", "created"), ("status", "status"), ("trials_done", "trials"),
                ("wall_seconds", "wall"), ("estimated_latency_s", "estimate"), ("tuned_latency_s", "tuned"),
                ("model__name", "model")),
        field_labels={"created": "created", "status": "status", "trials": "trials done", "wall": "wall time",
                      "estimate": "estimated latency", "tuned": "tuned latency", "model": "model name"},
        empty_label="newest first",
    )

    class Meta:
        model = TuningRun
        fields: list[str] = []

    def __init__(self, *args, teams=(), models=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.filters["team"].queryset = Team.objects.filter(pk__in=[t.pk for t in teams]).order_by("name")
        self.filters["model"].queryset = models if models is not None else DLModel.objects.none()
        self.filters["model"].field.label_from_instance = lambda m: f"{m.name} ({m.team.name})"

    @property
    def qs(self):
        qs = super().qs
        ordering = list(qs.query.order_by)  # set by the "sort" filter when given
        if not ordering:
            return qs.order_by("-created_at", "-pk")
        return qs.order_by(*ordering, "-pk")
