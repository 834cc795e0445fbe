from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("tuning", "0007_run_target_and_onnxruntime"),
    ]

    operations = [
        migrations.AddField(
            model_name="tuningrun",
            name="builds_in_flight",
            field=models.PositiveIntegerField(default=0, help_text="Candidates being built now."),
        ),
        migrations.AddField(
            model_name="tuningrun",
            name="measurements_in_flight",
            field=models.PositiveIntegerField(
                default=0, help_text="Candidates built and waiting for (or in) measurement now."),
        ),
    ]
