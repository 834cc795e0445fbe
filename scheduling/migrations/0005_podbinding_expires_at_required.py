from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0004_podbinding_expires_at'),
    ]

    operations = [
        migrations.AlterField(
            model_name='podbinding',
            name='expires_at',
            field=models.DateTimeField(db_index=True, help_text='Unreleased, it counts as load and cost until then.'),
        ),
    ]
