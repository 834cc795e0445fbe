"""PostgreSQL trigger that keeps the usage ledger append-only (carried over from the pre-squash chain).

On other databases only the model's own refusal of updates and deletes (core.models.UsageCharge) holds.
"""
from django.db import migrations

# PostgreSQL refuses to delete a charge, or to change one except to unlink it from a deleted model, run,
# job or simulation (on_delete=SET_NULL). TRUNCATE (test database flushes) is not a row event.
APPEND_ONLY_SQL = """
CREATE FUNCTION core_usagecharge_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'usage charges are append-only: they cannot be deleted';
    END IF;
    IF (NEW.id, NEW.team_id, NEW.kind, NEW.amount, NEW.source, NEW.meter, NEW.grid_intensity_g_per_kwh,
        NEW.idempotency_key, NEW.label, NEW.created_at)
       IS DISTINCT FROM
       (OLD.id, OLD.team_id, OLD.kind, OLD.amount, OLD.source, OLD.meter, OLD.grid_intensity_g_per_kwh,
        OLD.idempotency_key, OLD.label, OLD.created_at)
       OR (NEW.model_id IS NOT NULL AND NEW.model_id IS DISTINCT FROM OLD.model_id)
       OR (NEW.run_id IS NOT NULL AND NEW.run_id IS DISTINCT FROM OLD.run_id)
       OR (NEW.job_id IS NOT NULL AND NEW.job_id IS DISTINCT FROM OLD.job_id)
       OR (NEW.simulation_id IS NOT NULL AND NEW.simulation_id IS DISTINCT FROM OLD.simulation_id) THEN
        RAISE EXCEPTION 'usage charges are append-only: they cannot be updated';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER core_usagecharge_append_only BEFORE UPDATE OR DELETE ON core_usagecharge
    FOR EACH ROW EXECUTE FUNCTION core_usagecharge_append_only();
"""
DROP_APPEND_ONLY_SQL = """
DROP TRIGGER IF EXISTS core_usagecharge_append_only ON core_usagecharge;
DROP FUNCTION IF EXISTS core_usagecharge_append_only();
"""


def guard_append_only(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(APPEND_ONLY_SQL)


def unguard_append_only(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_APPEND_ONLY_SQL)


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0003_backfill_usage_ledger'),
    ]

    operations = [
        migrations.RunPython(guard_append_only, unguard_append_only),
    ]
