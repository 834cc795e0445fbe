from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0005_podbinding_expires_at_required'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='cpu_llc_bytes',
            field=models.PositiveBigIntegerField(blank=True, help_text="The node's last-level CPU cache as one core sees it, in bytes (sysfs); empty where unknown. Runs measured on its CPU queue time their candidates cold when the model's weights outgrow it.", null=True),
        ),
    ]
