"""Each pod binding keeps its own expiry (its bind time plus the binding TTL then), so a later change of
SCHEDULER_EXTENDER_BINDING_TTL_S changes no binding's expiry, reservation or cost. Existing bindings expire
at their bind time plus the TTL configured when this migration runs (what they were counted with); 0005
makes the column required (its own transaction: no ALTER after the updates here)."""

import datetime as dt

from django.conf import settings
from django.db import migrations, models


def _expiry_of_existing(apps, schema_editor):
    PodBinding = apps.get_model("scheduling", "PodBinding")
    ttl = dt.timedelta(seconds=float(settings.SCHEDULER_EXTENDER_BINDING_TTL_S))
    for binding in PodBinding.objects.filter(expires_at__isnull=True).only("pk", "bound_at").iterator():
        PodBinding.objects.filter(pk=binding.pk).update(expires_at=binding.bound_at + ttl)


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0003_gpu_job_kind_replacements'),
    ]

    operations = [
        migrations.AddField(
            model_name='podbinding',
            name='expires_at',
            field=models.DateTimeField(db_index=True, null=True,
                                       help_text='Unreleased, it counts as load and cost until then.'),
        ),
        migrations.RunPython(_expiry_of_existing, migrations.RunPython.noop),
    ]
