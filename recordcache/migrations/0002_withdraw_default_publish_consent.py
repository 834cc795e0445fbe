"""Publishing to the shared record cache became opt-in (carried over from the pre-squash chain)."""
from django.db import migrations


def withdraw_default_consent(apps, schema_editor):
    """Publishing becomes opt-in. A stored ``publish=True`` may be the old default (an owner who changed
    only ``read`` kept it), not a choice: every team stops publishing until its owners opt in, and the
    entries it published are not served meanwhile (``selectors.PUBLISHED``)."""
    apps.get_model("recordcache", "TeamCacheSettings").objects.filter(publish=True).update(publish=False)


class Migration(migrations.Migration):

    dependencies = [
        ('recordcache', '0001_initial'),
    ]

    operations = [
        migrations.RunPython(withdraw_default_consent, migrations.RunPython.noop),
    ]
